// The chunk manager against the rows it must produce: order, shuffling, sharding, memory budget,
// column-chunked stores, errors, cancellation, and training from a stream equal to training from
// memory.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>

#include "chunk_manager.h"
#include "cuda/cuda_device.h"
#include "tandem/tandem.h"
#include "test_support.h"

namespace tandem {
namespace {

// Writes `data`'s pixels as images [rows, features] chunked (chunk_rows, chunk_cols) and its
// labels as int64 [rows] chunked (label_chunk), like a Dask-written store would be. With
// `inner_chunks` (v3), the image chunks are shards of such inner chunks.
DatasetStore::Split write_split(const std::string& dir, const Dataset& data, int64_t chunk_rows,
                                int64_t chunk_cols, int64_t label_chunk, zarr::Format format,
                                const std::string& compressor = "zstd",
                                std::vector<int64_t> inner_chunks = {}) {
  const int64_t rows = data.rows(), features = data.features();
  const size_t px = data.pixel_type() == PixelType::UInt8 ? 1 : 4;
  zarr::ArrayMeta images;
  images.format = format;
  images.dtype = px == 1 ? zarr::DType::UInt8 : zarr::DType::Float32;
  images.shape = {rows, features};
  images.chunks = {chunk_rows, chunk_cols};
  images.compressor = zarr::Compressor::parse(compressor);
  images.inner_chunks = std::move(inner_chunks);
  const zarr::Array image_array = zarr::Array::create(dir + "/images", images);
  std::vector<uint8_t> chunk(images.chunk_bytes());
  for (int64_t r = 0; r * chunk_rows < rows; ++r)
    for (int64_t c = 0; c * chunk_cols < features; ++c) {
      std::fill(chunk.begin(), chunk.end(), 0);
      for (int64_t i = 0; i < chunk_rows && r * chunk_rows + i < rows; ++i)
        for (int64_t j = 0; j < chunk_cols && c * chunk_cols + j < features; ++j)
          std::memcpy(&chunk[(i * chunk_cols + j) * px],
                      data.pixel_data() + ((r * chunk_rows + i) * features + c * chunk_cols + j) * px, px);
      image_array.write_chunk({r, c}, chunk.data());
    }
  zarr::ArrayMeta labels;
  labels.format = format;
  labels.dtype = zarr::DType::Int64;
  labels.shape = {rows};
  labels.chunks = {label_chunk};
  const zarr::Array label_array = zarr::Array::create(dir + "/labels", labels);
  std::vector<int64_t> label_chunk_data(static_cast<size_t>(label_chunk));
  for (int64_t k = 0; k * label_chunk < rows; ++k) {
    for (int64_t i = 0; i < label_chunk; ++i)
      label_chunk_data[i] = k * label_chunk + i < rows ? data.label_data()[k * label_chunk + i] : 0;
    label_array.write_chunk({k}, reinterpret_cast<const uint8_t*>(label_chunk_data.data()));
  }
  DatasetStore::Split split{zarr::Array::open(dir + "/images"), zarr::Array::open(dir + "/labels"), rows, features};
  return split;
}

// A row's identity: its pixels and label as one string, to compare row multisets.
using RowKey = std::string;
RowKey row_key(const DatasetView& v, int64_t r) {
  const size_t bytes = static_cast<size_t>(v.features) * v.pixel_bytes();
  RowKey key(static_cast<const char*>(v.pixels) + r * bytes, bytes);
  key.push_back(static_cast<char>(v.labels[r]));
  return key;
}

// Every row the epoch already started streams, in order (and each batch's size).
std::vector<RowKey> streamed_rows(ChunkManager& cm, std::vector<int64_t>* batch_sizes = nullptr) {
  std::vector<RowKey> rows;
  DatasetView batch;
  while (cm.next(batch)) {
    if (batch_sizes) batch_sizes->push_back(batch.rows);
    for (int64_t r = 0; r < batch.rows; ++r) rows.push_back(row_key(batch, r));
  }
  return rows;
}

std::vector<RowKey> epoch_rows(ChunkManager& cm, int64_t epoch,
                               std::vector<int64_t>* batch_sizes = nullptr) {
  cm.start_epoch(epoch);
  return streamed_rows(cm, batch_sizes);
}

// The rows as a multiset, to compare streams whatever their order.
std::vector<RowKey> sorted_rows(std::vector<RowKey> rows) {
  std::sort(rows.begin(), rows.end());
  return rows;
}

struct Fixture {
  test::TempDir dir;
  Dataset data = test::random_dataset(PixelType::UInt8, 413, 24, 10, 3);
  std::vector<RowKey> all_rows() const {
    std::vector<RowKey> rows;
    for (int64_t r = 0; r < data.rows(); ++r) rows.push_back(row_key(data.view(), r));
    return rows;
  }
};

TEST(ChunkManager, InOrderBatchesSpanChunks) {
  // Uncompressed chunks are mapped from the page cache, compressed ones decompressed: both paths.
  for (const char* compressor : {"none", "zstd"})
  for (zarr::Format format : {zarr::Format::V2, zarr::Format::V3}) {
    Fixture f;
    const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 64, format, compressor);
    ChunkManagerOptions o;
    o.batch_rows = 37;
    o.shuffle = false;
    ChunkManager cm(split, 10, o);
    EXPECT_EQ(cm.rows_per_epoch(), 413);
    std::vector<int64_t> sizes;
    EXPECT_EQ(epoch_rows(cm, 0, &sizes), f.all_rows());
    EXPECT_EQ(sizes.size(), 12u);  // 11 x 37 + 6
    EXPECT_EQ(sizes.back(), 413 - 11 * 37);
  }
}

TEST(ChunkManager, ColumnChunkedStoresAreAssembled) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 64, 7, 100, zarr::Format::V2);
  ChunkManagerOptions o;
  o.batch_rows = 100;
  o.shuffle = false;
  ChunkManager cm(split, 10, o);
  EXPECT_EQ(epoch_rows(cm, 0), f.all_rows());
}

// Chunks wider than a row (zarr-python keeps chunks=(4, 4) for shape (N, 3)): each chunk row
// has padding past the shape. Before, the band was taken to be the chunk itself: read at the
// chunk's row stride when mapped, and written past the band's buffer when decompressed.
TEST(ChunkManager, ChunksPaddedPastTheRowAreCutToIt) {
  for (const char* compressor : {"none", "zstd"}) {
    Fixture f;
    const auto split = write_split(f.dir.file("s"), f.data, 50, 32, 64, zarr::Format::V2,
                                   compressor);
    ChunkManagerOptions o;
    o.batch_rows = 37;
    o.shuffle = false;
    ChunkManager cm(split, 10, o);
    EXPECT_EQ(epoch_rows(cm, 0), f.all_rows()) << compressor;
  }
}

// Images [rows, 4, 6] chunked after the row dimension, edge chunks included: every chunk of a
// row band is read and its part put where it belongs in the rows. Chunked along dimension 1
// only, the old code read just the band's first chunk and left the rest of the band as the
// reused buffer held it; chunked along dimension 2 too, it refused the store.
TEST(ChunkManager, ImagesChunkedAfterTheRowDimensionAreAssembled) {
  for (const int64_t c2 : {6, 4}) {
    Fixture f;
    const int64_t rows = f.data.rows(), d1 = 4, d2 = 6, c0 = 50, c1 = 3;
    zarr::ArrayMeta images;
    images.format = zarr::Format::V3;
    images.dtype = zarr::DType::UInt8;
    images.shape = {rows, d1, d2};
    images.chunks = {c0, c1, c2};
    images.compressor = zarr::Compressor::parse("zstd");
    const std::string dir = f.dir.file("s");
    const zarr::Array array = zarr::Array::create(dir + "/images", images);
    std::vector<uint8_t> chunk(images.chunk_bytes());
    for (int64_t a = 0; a * c0 < rows; ++a)
      for (int64_t b = 0; b * c1 < d1; ++b)
        for (int64_t c = 0; c * c2 < d2; ++c) {
          std::fill(chunk.begin(), chunk.end(), 0xEE);  // padding: must never reach a batch
          for (int64_t i = 0; i < c0 && a * c0 + i < rows; ++i)
            for (int64_t j = 0; j < c1 && b * c1 + j < d1; ++j)
              for (int64_t k = 0; k < c2 && c * c2 + k < d2; ++k)
                chunk[size_t((i * c1 + j) * c2 + k)] =
                    f.data.pixel_data()[(a * c0 + i) * d1 * d2 + (b * c1 + j) * d2 + c * c2 + k];
          array.write_chunk({a, b, c}, chunk.data());
        }
    // The labels from the 2-D writer; its images are replaced by the 3-D array.
    DatasetStore::Split split = write_split(f.dir.file("flat"), f.data, 50, 24, 64,
                                            zarr::Format::V3);
    split.images = zarr::Array::open(dir + "/images");
    for (const bool shuffle : {false, true}) {
      ChunkManagerOptions o;
      o.batch_rows = 64;
      o.shuffle = shuffle;
      o.memory_budget = 1;  // two bands: buffers reused from band to band
      ChunkManager cm(split, 10, o);
      auto rows_seen = epoch_rows(cm, 0);
      auto expected = f.all_rows();
      if (shuffle) {
        rows_seen = sorted_rows(rows_seen);
        expected = sorted_rows(expected);
      }
      EXPECT_EQ(rows_seen, expected) << "chunks {50, 3, " << c2 << "}, "
                                     << (shuffle ? "shuffled" : "in order");
    }
  }
}

// An unsigned 64-bit label past INT64_MAX is no class (it once passed the check as a negative
// int64 and was kept as its low byte).
TEST(ChunkManager, WideUnsignedLabelsOutsideTheClassesAreRefused) {
  Fixture f;
  DatasetStore::Split split = write_split(f.dir.file("s"), f.data, 50, 24, 64, zarr::Format::V3);
  for (const uint64_t bad : {~uint64_t{0}, (uint64_t{1} << 63) + 3, uint64_t{10}}) {
    zarr::ArrayMeta meta;
    meta.format = zarr::Format::V3;
    meta.dtype = zarr::DType::UInt64;
    meta.shape = {f.data.rows()};
    meta.chunks = {f.data.rows()};
    const std::string path = f.dir.file("labels-" + std::to_string(bad));
    const zarr::Array labels = zarr::Array::create(path, meta);
    std::vector<uint64_t> values(size_t(f.data.rows()));
    for (size_t i = 0; i < values.size(); ++i) values[i] = f.data.label_data()[i];
    values[7] = bad;
    labels.write_chunk({0}, reinterpret_cast<const uint8_t*>(values.data()));
    split.labels = zarr::Array::open(path);
    try {
      ChunkManager cm(split, 10, ChunkManagerOptions{});
      FAIL() << "label " << bad << " accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("label at index 7 is " + std::to_string(bad)),
                std::string::npos) << e.what();
    }
  }
}

TEST(ChunkManager, ShuffleIsAPermutationPerEpochAndRepeatable) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3);
  ChunkManagerOptions o;
  o.batch_rows = 64;
  o.seed = 9;
  ChunkManager a(split, 10, o), b(split, 10, o);
  const auto e0 = epoch_rows(a, 0), e1 = epoch_rows(a, 1);
  EXPECT_EQ(epoch_rows(b, 0), e0) << "same seed and epoch, same order";
  EXPECT_NE(e0, e1) << "another epoch, another order";
  EXPECT_NE(e0, f.all_rows());
  EXPECT_EQ(sorted_rows(e0), sorted_rows(f.all_rows()));
  EXPECT_EQ(sorted_rows(e1), sorted_rows(f.all_rows()));
}

// The shards of an epoch cover every row once between them, shuffled or not, and batch b of
// the whole sequence (one manager's, same seed) is shard b % 3's: each shard draws the row
// order of only the bands it reads, the same order the whole sequence draws.
TEST(ChunkManager, ShardsSplitTheBatchSequence) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3);
  for (const bool shuffle : {false, true}) {
    ChunkManagerOptions whole_options;
    whole_options.batch_rows = 30;
    whole_options.shuffle = shuffle;
    whole_options.seed = 5;
    ChunkManager whole(split, 10, whole_options);
    const auto all = epoch_rows(whole, shuffle ? 2 : 0);
    if (!shuffle) {
      EXPECT_EQ(all, f.all_rows());
    }
    std::vector<RowKey> together;
    int64_t rows = 0;
    for (int shard = 0; shard < 3; ++shard) {
      ChunkManagerOptions o;
      o.batch_rows = 30;
      o.shard_index = shard;
      o.shard_count = 3;
      o.shuffle = shuffle;
      o.seed = 5;
      ChunkManager cm(split, 10, o);
      rows += cm.rows_per_epoch();
      std::vector<int64_t> sizes;
      const auto mine = epoch_rows(cm, shuffle ? 2 : 0, &sizes);
      EXPECT_EQ(static_cast<int64_t>(mine.size()), cm.rows_per_epoch());
      for (size_t k = 0; k < sizes.size(); ++k) {
        const int64_t b = shard + 3 * static_cast<int64_t>(k);
        for (int64_t r = 0; r < sizes[k]; ++r)
          EXPECT_EQ(mine[k * 30 + r], all[b * 30 + r]) << "shard " << shard << " batch " << b;
      }
      together.insert(together.end(), mine.begin(), mine.end());
    }
    EXPECT_EQ(rows, 413);
    EXPECT_EQ(sorted_rows(together), sorted_rows(all)) << (shuffle ? "shuffled" : "in order");
  }
}

// A cluster worker's assignment: the listed batches of the epoch's stream, in ascending order,
// each the same rows as in the whole epoch (same seed), duplicates ignored; rows_per_epoch()
// then counts the list's rows. A batch outside the epoch is refused.
TEST(ChunkManager, AListOfBatchesStreamsThoseOfTheEpoch) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3);
  ChunkManagerOptions o;
  o.batch_rows = 30;
  o.seed = 4;
  ChunkManager whole(split, 10, o), listed(split, 10, o);
  const auto all = epoch_rows(whole, 3);  // 14 batches: 13 x 30 + 23
  listed.start_epoch(3, {13, 1, 1, 6});
  const std::vector<RowKey> got = streamed_rows(listed);
  std::vector<RowKey> expected;
  for (const int64_t b : {1, 6, 13})
    for (int64_t r = b * 30; r < std::min<int64_t>(413, (b + 1) * 30); ++r)
      expected.push_back(all[size_t(r)]);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(listed.rows_per_epoch(), 30 + 30 + 23);
  EXPECT_THROW(listed.start_epoch(3, {0, 14}), InputError);
}

TEST(ChunkManager, TinyMemoryBudgetAndOneReaderStillStream) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 20, 24, 413, zarr::Format::V3);
  ChunkManagerOptions o;
  o.batch_rows = 7;
  o.shuffle = false;
  o.memory_budget = 1;
  o.readers = 1;
  o.ring_slots = 2;
  // Two bands are held whatever the budget: said once, as the manager is made.
  testing::internal::CaptureStderr();
  ChunkManager cm(split, 10, o);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(test::contains(said, "the memory budget (0.0 MiB) holds fewer than two of the "
                                   "20-row bands of " + split.images.path()))
      << said;
  EXPECT_EQ(epoch_rows(cm, 0), f.all_rows());
  // A budget that holds two says nothing.
  o.memory_budget = 2 * 20 * 24;  // two bands of 20 rows of 24 uint8 pixels
  testing::internal::CaptureStderr();
  ChunkManager enough(split, 10, o);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
}

TEST(ChunkManager, CorruptChunkSurfacesInTheConsumer) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3);
  const std::string key = f.dir.file("s") + "/images/c/3/0";
  ASSERT_TRUE(std::filesystem::exists(key));
  { std::ofstream(key, std::ios::binary | std::ios::trunc) << "not zstd at all"; }
  ChunkManagerOptions o;
  o.batch_rows = 64;
  o.shuffle = false;
  ChunkManager cm(split, 10, o);
  try {
    epoch_rows(cm, 0);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("c/3/0"), std::string::npos) << e.what();
  }
}

// A missing chunk is its fill value in Zarr, but a store `tandem prepare` wrote has every chunk:
// there, one missing means the store is being removed under the reader (`rm -rf` deletes the
// chunk files before their directory), and its rows were trained as zeros beside their real
// labels. Both kinds of chunk (mapped uncompressed, and decompressed).
TEST(ChunkManager, AMissingChunkOfAStoreThatHasThemAllIsAnError) {
  for (const char* compressor : {"none", "zstd"}) {
    Fixture f;
    auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3, compressor);
    std::filesystem::remove(f.dir.file("s") + "/images/c/2/0");
    ChunkManagerOptions o;
    o.batch_rows = 64;
    o.shuffle = false;
    {
      ChunkManager fill(split, 10, o);  // anyone's store: the fill value (zeros) stands
      EXPECT_EQ(epoch_rows(fill, 0).size(), 413u) << compressor;
    }
    split.every_chunk_written = true;
    ChunkManager cm(split, 10, o);
    const std::string why = test::error_of<InputError>([&] { epoch_rows(cm, 0); });
    EXPECT_TRUE(test::contains(why, "chunk c/2/0 is missing, and a store `tandem prepare` wrote "
                                    "has every chunk"))
        << compressor << ": " << why;
  }
}

// The other two readers of such a store say the same: a band put together from chunks narrower
// than a row, and a split read whole into memory (tandem train without --stream).
TEST(ChunkManager, AMissingChunkOfANarrowBandOrOfAWholeSplitIsAnError) {
  Fixture f;
  auto split = write_split(f.dir.file("s"), f.data, 50, 7, 413, zarr::Format::V3);
  ASSERT_TRUE(std::filesystem::remove(f.dir.file("s") + "/images/c/2/1"));
  ChunkManagerOptions o;
  o.batch_rows = 64;
  o.shuffle = false;
  split.every_chunk_written = true;
  const std::string images = "zarr store '" + f.dir.file("s") + "/images': ";
  ChunkManager cm(split, 10, o);
  std::string why = test::error_of<InputError>([&] { epoch_rows(cm, 0); });
  EXPECT_TRUE(test::contains(why, images + "a chunk of row band 2 is missing, and a store "
                                           "`tandem prepare` wrote has every chunk"))
      << why;
  why = test::error_of<InputError>([&] { read_split(split, 10, "train"); });
  EXPECT_TRUE(test::contains(why, images + "chunk c/2/1 is missing")) << why;
}

// The same for the labels: a missing labels chunk of such a store read as class 0 for its rows.
TEST(ChunkManager, AMissingLabelsChunkOfAStoreThatHasThemAllIsAnError) {
  Fixture f;
  auto split = write_split(f.dir.file("s"), f.data, 50, 24, 100, zarr::Format::V3);
  std::filesystem::remove(f.dir.file("s") + "/labels/c/1");
  ChunkManagerOptions o;
  o.batch_rows = 64;
  { ChunkManager fill(split, 10, o); }  // anyone's store: the fill value stands
  split.every_chunk_written = true;
  const std::string why = test::error_of<InputError>([&] { ChunkManager cm(split, 10, o); });
  EXPECT_TRUE(test::contains(why, "labels: zarr store '" + f.dir.file("s") +
                                      "/labels': a chunk of row band 1 is missing"))
      << why;
}

TEST(ChunkManager, UncompressedChunkOfTheWrongSizeSurfacesInTheConsumer) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3, "none");
  const std::string key = f.dir.file("s") + "/images/c/2/0";
  ASSERT_TRUE(std::filesystem::exists(key));
  std::filesystem::resize_file(key, 1000);
  ChunkManagerOptions o;
  o.batch_rows = 64;
  ChunkManager cm(split, 10, o);
  try {
    epoch_rows(cm, 0);
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("c/2/0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("1000 bytes"), std::string::npos) << e.what();
  }
  // A missing uncompressed chunk reads as the fill value (zero), as zarr-python reads it.
  std::filesystem::remove(key);
  ChunkManagerOptions in_order = o;
  in_order.shuffle = false;
  ChunkManager again(split, 10, in_order);
  const auto rows = epoch_rows(again, 0);
  ASSERT_EQ(rows.size(), 413u);
  EXPECT_EQ(rows[100].substr(0, 24), std::string(24, '\0'));
  EXPECT_EQ(rows[99], f.all_rows()[99]);
}

// Whether this process maps `path` now (a line of /proc/self/maps ends with it).
bool process_maps(const std::string& path) {
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);) {
    const size_t n = path.size();
    if (line.size() >= n && line.compare(line.size() - n, n, path) == 0) return true;
  }
  return false;
}

// An uncompressed chunk already mapped, waiting for the assembler, then cut short in place (cp
// onto it): reading it faulted with SIGBUS and killed the process. Now the consumer gets an error.
TEST(ChunkManager, AMappedChunkCutShortSurfacesInTheConsumer) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3, "none");
  const std::string key = f.dir.file("s") + "/images/c/2/0";
  ChunkManagerOptions o;
  o.batch_rows = 50;
  o.shuffle = false;
  o.readers = 1;
  o.assemblers = 1;
  // The consumer holds batch 0's slot, batch 1 fills the other: band 2 waits, mapped.
  o.ring_slots = 2;
  o.pin_for_device = -1;
  ChunkManager cm(split, 10, o);
  cm.start_epoch(0);
  DatasetView batch;
  ASSERT_TRUE(cm.next(batch));
  for (int i = 0; i < 1000 && !process_maps(key); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(process_maps(key)) << "the reader never mapped " << key;
  std::filesystem::resize_file(key, 0);
  try {
    while (cm.next(batch)) {
    }
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("the file '" + key + "' shrank below its 1200 mapped bytes"),
              std::string::npos) << text;
  }
}

TEST(ChunkManager, CancelsMidEpochAndRestarts) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 10, 24, 413, zarr::Format::V3);
  ChunkManagerOptions o;
  o.batch_rows = 5;
  o.shuffle = false;
  for (int repeat = 0; repeat < 20; ++repeat) {
    ChunkManager cm(split, 10, o);
    cm.start_epoch(0);
    DatasetView batch;
    ASSERT_TRUE(cm.next(batch));
    if (repeat % 2) {
      cm.start_epoch(0);  // restart mid-epoch: a whole fresh epoch follows
      std::vector<RowKey> rows;
      while (cm.next(batch))
        for (int64_t r = 0; r < batch.rows; ++r) rows.push_back(row_key(batch, r));
      EXPECT_EQ(rows, f.all_rows());
    }
  }  // destroyed mid-epoch on even repeats: must not hang
}

// Trains 2 epochs on the same rows from memory and from the chunk manager's stream on `backend`:
// the same bits.
void expect_stream_trains_like_memory(BackendKind backend) {
  Fixture f;
  Dataset data = test::separable_dataset(400, 40, 4, 5);
  const auto split = write_split(f.dir.file("s"), data, 64, 40, 400, zarr::Format::V3);
  TrainConfig c;
  c.model = ModelConfig::parse("40-16-4");
  c.backend = backend;
  c.batch = 32;
  c.epochs = 2;
  c.threads = 2;
  c.shuffle = false;
  Trainer from_memory(c), from_stream(c);
  const TrainSummary a = from_memory.fit(data.view(), data.view(), {});
  ChunkManagerOptions o;
  o.batch_rows = 32;
  o.shuffle = false;
  ChunkManager stream(split, 4, o);
  const TrainSummary b = from_stream.fit(stream, data.view(), {});
  EXPECT_EQ(a.validation.loss_sum, b.validation.loss_sum);
  EXPECT_EQ(a.samples, b.samples);
  const Model ma = from_memory.model(), mb = from_stream.model();
  for (size_t i = 0; i < ma.parameters().size(); ++i)
    EXPECT_EQ(ma.parameters()[i].values, mb.parameters()[i].values);
  // On a GPU the ring is page-locked, so the batches' copies to the device are direct.
  if (backend == BackendKind::Cuda) {
    EXPECT_TRUE(stream.page_locked());
  }
}

TEST(ChunkManager, TrainingFromTheStreamEqualsTrainingFromMemory) {
  expect_stream_trains_like_memory(BackendKind::Cpu);
}

// The design's feed path end to end on a GPU (bench/gpu_check.sh runs it there).
TEST(ChunkManager, TrainingFromTheStreamOnTheGpuEqualsTrainingFromMemory) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  expect_stream_trains_like_memory(BackendKind::Cuda);
}
}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// The epoch's row stream depends on the seed and epoch alone: not on how many threads assemble
// it, nor on the batch size (which decides whether a batch is gathered row by row or scattered
// from a band read in order, and whether small shuffled batches are filled in units: batch 7,
// in units of 7 batches). The slots here are small, so rows are copied with ordinary stores;
// the next test covers the streaming stores of slots larger than the cache.
// A sharded store (zarr-python's `shards=`) streams as its shards: the same rows in the same
// order as a store chunked like the shards, shuffled and not.
TEST(ChunkManager, ShardedStoresStreamAsStoresChunkedLikeTheirShards) {
  for (const char* compressor : {"none", "zstd"}) {
    Fixture f;
    const auto plain = write_split(f.dir.file("plain"), f.data, 50, 24, 64, zarr::Format::V3);
    const auto sharded = write_split(f.dir.file("sharded"), f.data, 50, 24, 64, zarr::Format::V3,
                                     compressor, {10, 12});
    ASSERT_TRUE(sharded.images.meta().sharded());
    for (const bool shuffle : {false, true}) {
      ChunkManagerOptions o;
      o.batch_rows = 37;
      o.shuffle = shuffle;
      ChunkManager from_plain(plain, 10, o), from_shards(sharded, 10, o);
      const auto rows = epoch_rows(from_shards, 1);
      EXPECT_EQ(rows, epoch_rows(from_plain, 1)) << compressor << (shuffle ? " shuffled" : "");
      EXPECT_EQ(sorted_rows(rows), sorted_rows(f.all_rows()));
    }
  }
}

TEST(ChunkManager, StreamOrderIndependentOfAssemblersAndBatchSize) {
  for (int64_t features : {24, 32})
    for (const char* compressor : {"none", "zstd"}) {
      test::TempDir dir;
      const Dataset data = test::random_dataset(PixelType::UInt8, 413, features, 10, 5);
      const auto split = write_split(dir.file("s"), data, 50, features, 64, zarr::Format::V3, compressor);
      std::vector<RowKey> reference;
      for (int assemblers : {1, 2, 4})
        for (int64_t batch : {7, 64, 413}) {
          ChunkManagerOptions o;
          o.batch_rows = batch;
          o.seed = 4;
          o.assemblers = assemblers;
          o.ring_slots = assemblers == 4 ? 2 : 3;  // fewer slots than assemblers must still flow
          ChunkManager cm(split, 10, o);
          const auto rows = epoch_rows(cm, 2);
          if (reference.empty()) reference = rows;
          EXPECT_EQ(rows, reference) << features << " " << compressor << " assemblers "
                                     << assemblers << " batch " << batch;
        }
    }
}

// A slot over a megabyte is written with non-temporal stores (whole 16-byte words: rows of 32
// bytes) or, where the bytes do not allow them, plain copies (rows of 24 bytes); a smaller slot
// with ordinary stores. Batches of either size carry the same rows in the same order, shuffled
// (scattered from a band read in order, or gathered) and not.
TEST(ChunkManager, SlotsLargerThanTheCacheStreamTheSameRows) {
  for (int64_t features : {24, 32})
    for (bool shuffle : {true, false}) {
      test::TempDir dir;
      const Dataset data = test::random_dataset(PixelType::UInt8, 210000, features, 10, 6);
      const auto split = write_split(dir.file("s"), data, 200000, features, 200000,
                                     zarr::Format::V3, "none");
      std::vector<RowKey> reference;
      // 1,000 rows: shuffled, units of 200 batches (large slots, scattered), a small slot
      // unshuffled; 45,000 rows (over 1 MiB at 24 bytes): shuffled, units of 4 batches, the
      // second's rows in band 0 gathered (under a quarter of it); 100,000 rows: a large slot,
      // scattered.
      for (int64_t batch : {1000, 45000, 100000}) {
        ChunkManagerOptions o;
        o.batch_rows = batch;
        o.shuffle = shuffle;
        o.seed = 8;
        o.pin_for_device = -1;
        ChunkManager cm(split, 10, o);
        const auto rows = epoch_rows(cm, 1);
        if (reference.empty()) {
          reference = rows;
          std::vector<RowKey> all;
          for (int64_t r = 0; r < data.rows(); ++r) all.push_back(row_key(data.view(), r));
          EXPECT_EQ(sorted_rows(rows), sorted_rows(all)) << features << " " << shuffle;
        }
        EXPECT_EQ(rows, reference) << features << " shuffle " << shuffle << " batch " << batch;
      }
    }
}

// Small shuffled batches are filled in units (here 6 batches of 8 rows, bands of 50): a listed
// assignment whose batches are not all consecutive (units of several runs, the epoch's last,
// short batch among them) streams the same rows as the whole epoch; a unit's batches are ready
// together; an epoch cancelled, restarted or dropped in the middle of a unit goes on cleanly.
TEST(ChunkManager, SmallShuffledBatchesFilledInUnitsKeepTheirRows) {
  Fixture f;
  const auto split = write_split(f.dir.file("s"), f.data, 50, 24, 413, zarr::Format::V3, "none");
  ChunkManagerOptions o;
  o.batch_rows = 8;  // 52 batches: 51 x 8 + 5
  o.seed = 12;
  ChunkManager whole(split, 10, o), listed(split, 10, o);
  const auto all = epoch_rows(whole, 1);
  EXPECT_EQ(sorted_rows(all), sorted_rows(f.all_rows()));
  const std::vector<int64_t> batches = {0, 1, 2, 5, 9, 10, 11, 12, 13, 14, 15, 30, 51};
  listed.start_epoch(1, batches);
  std::vector<int64_t> sizes;
  const std::vector<RowKey> got = streamed_rows(listed, &sizes);
  std::vector<RowKey> expected;
  for (const int64_t b : batches)
    for (int64_t r = b * 8; r < std::min<int64_t>(413, (b + 1) * 8); ++r)
      expected.push_back(all[size_t(r)]);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(sizes.back(), 5);

  // The first batch out, and its unit's other five are ready with it.
  whole.start_epoch(1);
  DatasetView batch;
  ASSERT_TRUE(whole.next(batch));
  EXPECT_GE(whole.ready_batches(), 5u);
  std::vector<RowKey> rest;
  for (int64_t r = 0; r < batch.rows; ++r) rest.push_back(row_key(batch, r));
  const std::vector<RowKey> after = streamed_rows(whole);
  rest.insert(rest.end(), after.begin(), after.end());
  EXPECT_EQ(rest, all);
  EXPECT_EQ(whole.ready_batches(), 0u);

  for (int repeat = 0; repeat < 10; ++repeat) {
    ChunkManager cm(split, 10, o);
    cm.start_epoch(1);
    for (int k = 0; k < 1 + repeat % 4; ++k) ASSERT_TRUE(cm.next(batch));  // inside a unit
    if (repeat % 3 == 0) {
      cm.cancel();
      EXPECT_FALSE(cm.next(batch));
    } else if (repeat % 3 == 1) {
      EXPECT_EQ(epoch_rows(cm, 1), all);  // restarted mid-unit: the whole epoch again
    }
  }  // the others dropped mid-unit: must not hang
}

}  // namespace
}  // namespace tandem
