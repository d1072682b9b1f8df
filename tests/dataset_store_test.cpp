// Dataset stores (tandem prepare's Zarr groups): written and read back byte for byte in both Zarr
// formats, every compressor and both pixel types; refusal, overwrite and failure semantics;
// column statistics against a float64 two-pass reference; corrupt chunks; PNG output.
#include <gtest/gtest.h>
#include <png.h>

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "array_stats.h"
#include "chunk_manager.h"
#include "dataset_store.h"
#include "png_writer.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

// The default write options, named: GCC 12 warns (-Wmaybe-uninitialized, inside libstdc++'s
// string) on a StoreWriteOptions temporary such as a {} argument, wrongly.
const StoreWriteOptions kDefaults;

DataSplits small_splits(PixelType type = PixelType::UInt8) {
  DataSplits s;
  s.train = test::random_dataset(type, 137, 12, 10, 11);
  s.validation = test::random_dataset(type, 23, 12, 10, 12);
  s.test = test::random_dataset(type, 31, 12, 10, 13);
  s.source = "synthetic";
  return s;
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// The bytes row `r` of the stored split should hold: source row r % rows, converted as written.
void expect_split_equals(const Dataset& got, const Dataset& source, int copies, PixelType stored) {
  ASSERT_EQ(got.rows(), source.rows() * copies);
  ASSERT_EQ(got.features(), source.features());
  ASSERT_EQ(got.pixel_type(), stored);
  const int64_t f = source.features();
  for (int64_t r = 0; r < got.rows(); ++r) {
    const int64_t s = r % source.rows();
    ASSERT_EQ(got.label_data()[r], source.label_data()[s]) << "row " << r;
    if (stored == source.pixel_type()) {
      const size_t bytes = size_t(f) * (stored == PixelType::UInt8 ? 1 : 4);
      ASSERT_EQ(std::memcmp(got.pixel_data() + size_t(r) * bytes,
                            source.pixel_data() + size_t(s) * bytes, bytes),
                0)
          << "row " << r;
    } else {  // uint8 source stored as float32
      const auto* px = reinterpret_cast<const float*>(got.pixel_data());
      for (int64_t j = 0; j < f; ++j) {
        const float want = float(source.pixel_data()[s * f + j]) * (1.0f / 255.0f);
        ASSERT_EQ(std::memcmp(&px[r * f + j], &want, 4), 0) << "row " << r << " feature " << j;
      }
    }
  }
}

struct RoundTripCase {
  zarr::Format format;
  const char* compressor;
  PixelType type;
};

class StoreRoundTrip : public ::testing::TestWithParam<RoundTripCase> {};

TEST_P(StoreRoundTrip, EveryByteReadsBack) {
  const RoundTripCase c = GetParam();
  TempDir dir;
  const DataSplits splits = small_splits();
  const std::string out = dir.file("store.zarr");
  StoreWriteOptions o;
  o.format = c.format;
  o.pixel_type = c.type;
  o.chunk_rows = 50;
  o.copies = 3;
  o.compressor = zarr::Compressor::parse(c.compressor);
  int64_t last_done = -1, last_total = -1, calls = 0;
  o.progress = [&](int64_t done, int64_t total) {
    EXPECT_GE(done, last_done);
    last_done = done;
    last_total = total;
    ++calls;
  };
  write_dataset_store(splits, out, o, {{"source", "synthetic"}, {"image_shape", {3, 4}}});
  EXPECT_EQ(last_done, 137 * 3 + 23 + 31);
  EXPECT_EQ(last_total, 137 * 3 + 23 + 31);
  EXPECT_GE(calls, 2);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});  // nothing partial

  const DatasetStore store = DatasetStore::open(out);
  EXPECT_EQ(store.train.rows, 411);
  EXPECT_EQ(store.validation.rows, 23);
  EXPECT_EQ(store.test.rows, 31);
  EXPECT_EQ(store.train.features, 12);
  EXPECT_EQ(store.num_classes, 10);
  EXPECT_EQ(store.attributes["tandem_dataset"], 1);
  // Every chunk written: a missing one is damage to the chunk manager, not fill values.
  EXPECT_TRUE(store.train.every_chunk_written && store.validation.every_chunk_written &&
              store.test.every_chunk_written);
  EXPECT_EQ(store.attributes["copies"], 3);
  EXPECT_EQ(store.attributes["source"], "synthetic");
  EXPECT_EQ(store.attributes["image_shape"], nlohmann::json({3, 4}));
  EXPECT_EQ(store.attributes["pixel_dtype"], c.type == PixelType::UInt8 ? "uint8" : "float32");
  EXPECT_EQ(store.train.images.meta().chunks, (std::vector<int64_t>{50, 12}));
  EXPECT_EQ(store.validation.images.meta().chunks, (std::vector<int64_t>{23, 12}));
  EXPECT_EQ(store.train.images.meta().compressor.describe(), o.compressor.describe());
  EXPECT_EQ(int(store.train.images.meta().format), int(c.format));

  expect_split_equals(read_split(store.train, store.num_classes, "train"), splits.train, 3, c.type);
  expect_split_equals(read_split(store.validation, store.num_classes, "validation"),
                      splits.validation, 1, c.type);
  expect_split_equals(read_split(store.test, store.num_classes, "test"), splits.test, 1, c.type);
}

std::vector<RoundTripCase> round_trip_cases() {
  std::vector<RoundTripCase> cases;
  for (zarr::Format f : {zarr::Format::V2, zarr::Format::V3})
    for (const char* comp : {"none", "zstd", "zstd:7", "blosc-lz4", "blosc-zstd", "blosc-zstd:5"})
      for (PixelType t : {PixelType::UInt8, PixelType::Float32}) cases.push_back({f, comp, t});
  return cases;
}

std::string case_name(const ::testing::TestParamInfo<RoundTripCase>& info) {
  std::string name = std::string("v") + (info.param.format == zarr::Format::V2 ? "2" : "3") + "_" +
                     info.param.compressor + "_" +
                     (info.param.type == PixelType::UInt8 ? "uint8" : "float32");
  for (char& ch : name)
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(AllFormats, StoreRoundTrip, ::testing::ValuesIn(round_trip_cases()),
                         case_name);

TEST(DatasetStore, Float32SourceIsStoredAsIs) {
  TempDir dir;
  const DataSplits splits = small_splits(PixelType::Float32);
  StoreWriteOptions o;
  o.pixel_type = PixelType::Float32;
  o.chunk_rows = 40;
  write_dataset_store(splits, dir.file("s"), o, nlohmann::json::object());
  const DatasetStore store = DatasetStore::open(dir.file("s"));
  expect_split_equals(read_split(store.train, 10, "train"), splits.train, 1, PixelType::Float32);
  // A float32 source cannot be narrowed to uint8.
  o.pixel_type = PixelType::UInt8;
  EXPECT_THROW(write_dataset_store(splits, dir.file("t"), o, nullptr), InputError);
  EXPECT_FALSE(fs::exists(dir.file("t")));
}

TEST(DatasetStore, SquareFeaturesGiveASquareImageShape) {
  TempDir dir;
  DataSplits s;
  s.train = test::random_dataset(PixelType::UInt8, 10, 16, 10, 3);
  s.validation = Dataset(PixelType::UInt8, 0, 16, 10);
  s.test = Dataset(PixelType::UInt8, 0, 16, 10);
  write_dataset_store(s, dir.file("s"), kDefaults, nullptr);
  const DatasetStore store = DatasetStore::open(dir.file("s"));
  EXPECT_EQ(store.attributes["image_shape"], nlohmann::json({4, 4}));
  EXPECT_EQ(store.validation.rows, 0);
  EXPECT_EQ(read_split(store.test, 10, "test").rows(), 0);
  // An image shape that does not describe the features is refused.
  EXPECT_THROW(write_dataset_store(s, dir.file("t"), kDefaults, {{"image_shape", {3, 4}}}),
               InputError);
  // Sides whose product overflows 64 bits are refused too: 16 x (2^60 + 1) wraps to 16.
  const int64_t wraps = (int64_t{1} << 60) + 1;
  EXPECT_THROW(
      write_dataset_store(s, dir.file("t"), kDefaults, {{"image_shape", {16, wraps}}}),
      InputError);
}

TEST(DatasetStore, RefusesAnExistingOut) {
  TempDir dir;
  const DataSplits splits = small_splits();
  const std::string out = dir.file("store.zarr");
  write_dataset_store(splits, out, kDefaults, nullptr);
  try {
    write_dataset_store(splits, out, kDefaults, nullptr);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(out), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--overwrite"), std::string::npos) << e.what();
  }
  // A file or a directory that is not a store is refused even with overwrite.
  std::ofstream(dir.file("file")) << "x";
  StoreWriteOptions o;
  o.overwrite = true;
  EXPECT_THROW(write_dataset_store(splits, dir.file("file"), o, nullptr), InputError);
  fs::create_directory(dir.file("notes"));
  std::ofstream(dir.file("notes/a.txt")) << "keep me";
  EXPECT_THROW(write_dataset_store(splits, dir.file("notes"), o, nullptr), InputError);
  EXPECT_TRUE(fs::exists(dir.file("notes/a.txt")));
}

TEST(DatasetStore, OverwriteReplacesTheStore) {
  TempDir dir;
  const DataSplits splits = small_splits();
  const std::string out = dir.file("store.zarr");
  StoreWriteOptions o;
  o.format = zarr::Format::V2;
  write_dataset_store(splits, out, o, nullptr);
  o.overwrite = true;
  o.copies = 2;
  o.format = zarr::Format::V3;  // a v2 store replaced by a v3 one: no v2 file may survive
  write_dataset_store(splits, out, o, nullptr);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});
  EXPECT_FALSE(fs::exists(out + "/.zgroup"));
  const DatasetStore store = DatasetStore::open(out);
  EXPECT_EQ(store.train.rows, 274);
  expect_split_equals(read_split(store.train, 10, "train"), splits.train, 2, PixelType::UInt8);
}

// Through a symbolic link the store it points to is replaced, and the link stays a link.
TEST(DatasetStore, OverwriteThroughASymlinkReplacesItsTarget) {
  TempDir dir;
  const DataSplits splits = small_splits();
  fs::create_directory(dir.file("scratch"));
  const std::string target = dir.file("scratch/store.zarr"), link = dir.file("store.zarr");
  StoreWriteOptions o;
  write_dataset_store(splits, target, o, nullptr);
  fs::create_directory_symlink(target, link);
  EXPECT_THROW(write_dataset_store(splits, link, o, nullptr), InputError);  // no --overwrite
  o.overwrite = true;
  o.copies = 2;
  write_dataset_store(splits, link + "/", o, nullptr);
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(entries(dir.path()), (std::vector<std::string>{"scratch", "store.zarr"}));
  EXPECT_EQ(entries(dir.file("scratch")), std::vector<std::string>{"store.zarr"});
  EXPECT_EQ(DatasetStore::open(target).train.rows, 274);
}

TEST(DatasetStore, FailureMidWriteLeavesNothingAtOut) {
  TempDir dir;
  const DataSplits splits = small_splits();
  const std::string out = dir.file("store.zarr");
  StoreWriteOptions o;
  o.chunk_rows = 20;
  o.progress = [](int64_t done, int64_t) {
    if (done > 0) throw IoError("injected failure");
  };
  EXPECT_THROW(write_dataset_store(splits, out, o, nullptr), IoError);
  EXPECT_TRUE(entries(dir.path()).empty()) << entries(dir.path())[0];

  // With overwrite, the old store survives a failed replacement untouched.
  StoreWriteOptions first;
  write_dataset_store(splits, out, first, nullptr);
  o.overwrite = true;
  o.copies = 5;
  EXPECT_THROW(write_dataset_store(splits, out, o, nullptr), IoError);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});
  const DatasetStore store = DatasetStore::open(out);
  EXPECT_EQ(store.train.rows, 137);
  expect_split_equals(read_split(store.train, 10, "train"), splits.train, 1, PixelType::UInt8);
}

// A write still in progress is no store: the root group's metadata comes last, so the
// temporary directory of a prepare killed part way (kill -9: no cleanup runs) cannot be read as a
// store whose missing chunks are zeros.
TEST(DatasetStore, AWriteInProgressIsNoStore) {
  for (const zarr::Format format : {zarr::Format::V2, zarr::Format::V3}) {
    TempDir dir;
    const DataSplits splits = small_splits();
    const std::string out = dir.file("store.zarr");
    const std::string partial = partial_store_path(out);
    StoreWriteOptions o;
    o.format = format;
    // Progress is reported from share 0's chunks only: many small chunks, so that it writes
    // some of them however the threads are scheduled (with 11, a ThreadSanitizer run's other
    // thread once wrote them all).
    o.chunk_rows = 4;
    int checked = 0;
    o.progress = [&](int64_t done, int64_t total) {
      if (done == 0 || done == total) return;
      ++checked;
      ASSERT_TRUE(fs::is_directory(partial));
      EXPECT_FALSE(zarr::Group::exists(partial));
      EXPECT_FALSE(DatasetStore::looks_like_store(partial));
      try {
        DatasetStore::open(partial);
        ADD_FAILURE() << "a partial store opened";
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("killed"), std::string::npos) << e.what();
      }
    };
    write_dataset_store(splits, out, o, nullptr);
    EXPECT_GT(checked, 0);
    EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});
    EXPECT_EQ(DatasetStore::open(out).train.rows, 137);
  }
}

// StoreWriteOptions::stop (a stop signal in `tandem prepare`) ends the write between chunks and
// leaves nothing behind; an existing store being replaced stays as it was.
TEST(DatasetStore, StopFlagEndsTheWriteAndLeavesNothing) {
  TempDir dir;
  const DataSplits splits = small_splits();
  const std::string out = dir.file("store.zarr");
  std::atomic<bool> stop{false};
  StoreWriteOptions o;
  o.chunk_rows = 20;
  o.stop = &stop;
  int64_t last_done = 0;
  o.progress = [&](int64_t done, int64_t) {
    last_done = done;
    if (done > 0) stop.store(true);
  };
  EXPECT_THROW(write_dataset_store(splits, out, o, nullptr), StoreWriteStopped);
  EXPECT_LT(last_done, 137 + 23 + 31);
  EXPECT_TRUE(entries(dir.path()).empty()) << entries(dir.path())[0];

  stop.store(false);
  write_dataset_store(splits, out, kDefaults, nullptr);
  o.overwrite = true;
  o.copies = 4;
  EXPECT_THROW(write_dataset_store(splits, out, o, nullptr), StoreWriteStopped);
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});
  EXPECT_EQ(DatasetStore::open(out).train.rows, 137);

  stop.store(true);  // set before the write starts: nothing is written at all
  o.progress = nullptr;
  EXPECT_THROW(write_dataset_store(splits, out, o, nullptr), StoreWriteStopped);
  EXPECT_EQ(DatasetStore::open(out).train.rows, 137);
}

// The temporary directories that killed runs left beside the store are removed by the next write
// of that store, unless their process still runs (another prepare of the same store), they
// belong to another store, or they were made on another machine (a shared filesystem: whether
// that process runs cannot be told from here). A name with a number alone is no name a write
// gives (a user's backup, `store.zarr.old-20240101`), and is kept.
TEST(DatasetStore, NextWriteRemovesTheTemporaryDirectoriesOfKilledRuns) {
  TempDir dir;
  const std::string out = dir.file("store.zarr");
  const pid_t dead = ::fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(dead, nullptr, 0), dead);  // reaped: its pid names no process now
  // partial_store_path names this process's; the same name with another PID is another's.
  const std::string ours = partial_store_path(out).substr(out.size() + std::strlen(".partial-"));
  const std::string host_and = ours.substr(0, ours.rfind('-') + 1);  // "HOST-"
  ASSERT_EQ(ours, host_and + std::to_string(::getpid()));
  const std::string d = std::to_string(dead), parent = std::to_string(::getppid());
  const std::vector<std::string> removed = {"store.zarr.partial-" + host_and + d};
  const std::vector<std::string> kept = {
      "other.zarr.partial-" + host_and + d,           // another store's
      "store.zarr.old-" + host_and + d,               // see below
      "store.zarr.old-" + d,                          // no HOST-: not a name a write gives
      "store.zarr.partial-" + d,                      // the same
      "store.zarr.partial-" + host_and + parent,      // a live process's
      "store.zarr.partial-another-machine-" + d,      // another machine's
      "store.zarr.partial-" + host_and + "x-" + d,    // host HOST-x's
      "store.zarr.partial-" + host_and.substr(0, host_and.size() - 1) + "2-" + d,  // HOST2's
      "store.zarr.partial-" + host_and,               // no PID
      "store.zarr.partial-" + host_and + "0",         // no process has PID 0
      "store.zarr.partial-" + host_and + "0" + d};    // not a PID as written
  for (const auto* names : {&removed, &kept})
    for (const std::string& name : *names) {
      fs::create_directories(dir.file(name + "/images/c/0"));
      std::ofstream(dir.file(name + "/images/c/0/0")) << "x";
    }
  // A whole store under a temporary name (its metadata written: killed just before its rename,
  // or named so by hand) is kept.
  const std::string whole = "store.zarr.partial-" + host_and + d + "1";
  write_dataset_store(small_splits(), dir.file(whole), kDefaults, nullptr);
  write_dataset_store(small_splits(), out, kDefaults, nullptr);
  std::vector<std::string> want = kept;
  want.push_back(whole);
  want.push_back("store.zarr");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(entries(dir.path()), want);
  // A store renamed aside by a replacing run killed before it removed it: with no store in
  // place it may be the one whole copy (killed between the two renames), so it stayed. Replacing
  // the store now in place removes it (a live process's would stay, as above).
  StoreWriteOptions replace;
  replace.overwrite = true;
  write_dataset_store(small_splits(), out, replace, nullptr);
  want.erase(std::find(want.begin(), want.end(), "store.zarr.old-" + host_and + d));
  EXPECT_EQ(entries(dir.path()), want);
}

// Two writes of one store from one process would share its temporary directory (named by host
// and process): the second, started while the first runs (here from its progress callback, so
// certainly during it), is refused, and the first completes.
TEST(DatasetStore, ASecondWriteOfTheSameStoreInTheProcessIsRefused) {
  TempDir dir;
  const std::string out = dir.file("store.zarr");
  StoreWriteOptions o;
  std::string second;
  o.progress = [&](int64_t, int64_t) {
    if (!second.empty()) return;
    StoreWriteOptions again;
    again.overwrite = true;
    second = test::error_of<InputError>(
        [&] { write_dataset_store(small_splits(), dir.file("./store.zarr/"), again, nullptr); });
  };
  write_dataset_store(small_splits(), out, o, nullptr);
  EXPECT_TRUE(test::contains(second, "is being written already, by another write of this"))
      << second;
  EXPECT_EQ(DatasetStore::open(out).train.rows, small_splits().train.rows());
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"store.zarr"});
  StoreWriteOptions replace;  // the claim was released: the store can be written again
  replace.overwrite = true;
  write_dataset_store(small_splits(), out, replace, nullptr);
}

TEST(DatasetStore, RefusesBadOptions) {
  TempDir dir;
  const DataSplits splits = small_splits();
  StoreWriteOptions o;
  o.chunk_rows = 0;
  EXPECT_THROW(write_dataset_store(splits, dir.file("a"), o, nullptr), InputError);
  o.chunk_rows = 10;
  o.copies = 0;
  EXPECT_THROW(write_dataset_store(splits, dir.file("a"), o, nullptr), InputError);
  // More training rows than a reader takes (2^31 - 1): refused before a byte is written.
  o.copies = int(std::numeric_limits<int32_t>::max() / splits.train.rows()) + 1;
  try {
    write_dataset_store(splits, dir.file("a"), o, nullptr);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("a split holds at most 2147483647 rows"),
              std::string::npos) << e.what();
  }
  EXPECT_TRUE(entries(dir.path()).empty());
}

// A store written by hand the way Dask or zarr-python might: other chunkings and dtypes.
void write_array(const zarr::Array& a, const std::vector<uint8_t>& data, size_t esize) {
  const zarr::ArrayMeta& m = a.meta();
  const std::vector<int64_t> grid = m.grid();
  std::vector<uint8_t> chunk(m.chunk_bytes());
  const int64_t features = matrix_features(m);
  for (int64_t c = 0; c < chunk_count(grid); ++c) {
    const std::vector<int64_t> index = chunk_index_of(grid, c);
    const ChunkLayout layout = chunk_layout(m, index);
    std::fill(chunk.begin(), chunk.end(), 0xAB);  // padding is never read
    for (int64_t r = 0; r < layout.rows; ++r)
      for (const auto& run : layout.runs)
        std::memcpy(chunk.data() + size_t(r * layout.chunk_row_elements + run.chunk_offset) * esize,
                    data.data() + size_t((layout.row_begin + r) * features + run.feature) * esize,
                    size_t(run.length) * esize);
    a.write_chunk(index, chunk.data());
  }
}

zarr::ArrayMeta meta_of(zarr::Format f, zarr::DType t, std::vector<int64_t> shape,
                        std::vector<int64_t> chunks, const char* compressor = "none") {
  zarr::ArrayMeta m;
  m.format = f;
  m.dtype = t;
  m.shape = std::move(shape);
  m.chunks = std::move(chunks);
  m.compressor = zarr::Compressor::parse(compressor);
  m.separator = f == zarr::Format::V2 ? '.' : '/';
  return m;
}

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(gen());
  return v;
}

TEST(DatasetStore, ReadsColumnChunkingAnd3DImagesAndWideLabels) {
  for (zarr::Format f : {zarr::Format::V2, zarr::Format::V3}) {
    TempDir dir;
    const std::string root = dir.file("hand.zarr");
    zarr::Group::create(root, f, {{"num_classes", 7}});
    const int64_t rows = 101;
    // images [101, 5, 6] chunked (40, 2, 4): edges along every dimension.
    const std::vector<uint8_t> pixels = random_bytes(size_t(rows * 30), 5);
    write_array(zarr::Array::create(root + "/images", meta_of(f, zarr::DType::UInt8, {rows, 5, 6},
                                                              {40, 2, 4}, "zstd")),
                pixels, 1);
    std::vector<int32_t> labels(static_cast<size_t>(rows));
    for (int64_t i = 0; i < rows; ++i) labels[size_t(i)] = int32_t((i * 3) % 7);
    std::vector<uint8_t> label_bytes(labels.size() * 4);
    std::memcpy(label_bytes.data(), labels.data(), label_bytes.size());
    write_array(zarr::Array::create(root + "/labels", meta_of(f, zarr::DType::Int32, {rows}, {30})),
                label_bytes, 4);
    // validation: float32 [20, 30] chunked along columns only.
    zarr::Group::create(root + "/validation", f);
    std::vector<float> vpix(20 * 30);
    for (size_t i = 0; i < vpix.size(); ++i) vpix[i] = float(i) * 0.25f;
    std::vector<uint8_t> vbytes(vpix.size() * 4);
    std::memcpy(vbytes.data(), vpix.data(), vbytes.size());
    write_array(zarr::Array::create(root + "/validation/images",
                                    meta_of(f, zarr::DType::Float32, {20, 30}, {20, 7})),
                vbytes, 4);
    write_array(zarr::Array::create(root + "/validation/labels",
                                    meta_of(f, zarr::DType::UInt8, {20}, {8})),
                std::vector<uint8_t>(20, 6), 1);

    const DatasetStore store = DatasetStore::open(root);
    EXPECT_EQ(store.num_classes, 7);
    EXPECT_EQ(store.train.features, 30);
    EXPECT_EQ(store.test.rows, 0);
    const Dataset train = read_split(store.train, store.num_classes, "train");
    ASSERT_EQ(train.rows(), rows);
    EXPECT_EQ(std::memcmp(train.pixel_data(), pixels.data(), pixels.size()), 0);
    for (int64_t i = 0; i < rows; ++i) ASSERT_EQ(train.label_data()[i], labels[size_t(i)]);
    const Dataset val = read_split(store.validation, store.num_classes, "validation");
    ASSERT_EQ(val.pixel_type(), PixelType::Float32);
    EXPECT_EQ(std::memcmp(val.pixel_data(), vpix.data(), vbytes.size()), 0);

    // Statistics and rows of the 3-D array agree with the flattened reference.
    const ColumnStats st = column_stats(store.train.images, 3);
    for (int64_t j = 0; j < 30; ++j) {
      double sum = 0;
      for (int64_t r = 0; r < rows; ++r) sum += pixels[size_t(r * 30 + j)];
      EXPECT_NEAR(st.mean[size_t(j)], sum / double(rows), 1e-12);
    }
    const std::vector<double> row = read_matrix_row(store.train.images, 77);
    for (int64_t j = 0; j < 30; ++j) EXPECT_EQ(row[size_t(j)], pixels[size_t(77 * 30 + j)]);
    const IntegerHistogram h = integer_histogram(store.train.labels, 2);
    EXPECT_EQ(h.count, rows);
    EXPECT_EQ(h.min, 0);
    EXPECT_EQ(h.max, 6);
    EXPECT_EQ(h.counts.at(0), 15);  // i*3 % 7 == 0 for i = 0, 7, ..., 98
  }
}

// A v3 store at dir/name with random uint8 images [rows, features] in chunks of chunk_rows rows,
// and no labels yet.
std::string store_with_images(const TempDir& dir, const std::string& name, int64_t rows,
                              int64_t features, int64_t chunk_rows) {
  const std::string root = dir.file(name);
  zarr::Group::create(root, zarr::Format::V3);
  write_array(zarr::Array::create(root + "/images", meta_of(zarr::Format::V3, zarr::DType::UInt8,
                                                            {rows, features},
                                                            {chunk_rows, features})),
              random_bytes(size_t(rows * features), 1), 1);
  return root;
}

TEST(DatasetStore, LabelOutOfRangeNamesStoreIndexAndValue) {
  TempDir dir;
  const std::string root = store_with_images(dir, "bad.zarr", 10, 4, 4);
  std::vector<int16_t> labels = {0, 1, 2, 3, 4, 5, 6, -3, 8, 9};
  std::vector<uint8_t> bytes(20);
  std::memcpy(bytes.data(), labels.data(), 20);
  write_array(zarr::Array::create(root + "/labels",
                                  meta_of(zarr::Format::V3, zarr::DType::Int16, {10}, {4})),
              bytes, 2);
  const DatasetStore store = DatasetStore::open(root);
  try {
    read_split(store.train, 10, root + " train");
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(root), std::string::npos) << m;
    EXPECT_NE(m.find("index 7"), std::string::npos) << m;
    EXPECT_NE(m.find("-3"), std::string::npos) << m;
  }
}

// The seed's layout: labels as one-hot rows (float32 from TensorFlow's reader, persisted by Dask
// as they are), here chunked along the classes too. The store's classes come from their width.
TEST(DatasetStore, OneHotLabelsReadAsTheirClasses) {
  for (zarr::Format f : {zarr::Format::V2, zarr::Format::V3}) {
    TempDir dir;
    const std::string root = dir.file("seed.zarr");
    zarr::Group::create(root, f);  // no num_classes attribute
    const int64_t rows = 60, classes = 10;
    write_array(zarr::Array::create(root + "/images",
                                    meta_of(f, zarr::DType::UInt8, {rows, 12}, {25, 12})),
                random_bytes(size_t(rows * 12), 3), 1);
    std::vector<float> one_hot(size_t(rows * classes), 0.0f);
    std::vector<uint8_t> expected(static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      expected[size_t(r)] = uint8_t((r * 7) % classes);
      one_hot[size_t(r * classes + expected[size_t(r)])] = 1.0f;
    }
    const auto write_labels = [&](const std::vector<float>& values) {
      std::vector<uint8_t> bytes(values.size() * 4);
      std::memcpy(bytes.data(), values.data(), bytes.size());
      fs::remove_all(root + "/labels");
      write_array(zarr::Array::create(root + "/labels", meta_of(f, zarr::DType::Float32,
                                                                {rows, classes}, {25, 4}, "zstd")),
                  bytes, 4);
    };
    write_labels(one_hot);
    const DatasetStore store = DatasetStore::open(root);
    EXPECT_EQ(store.num_classes, 10);
    const Dataset train = read_split(store.train, store.num_classes, "train");
    EXPECT_EQ(std::vector<uint8_t>(train.label_data(), train.label_data() + rows), expected);
    ChunkManagerOptions o;
    o.batch_rows = 16;
    o.shuffle = false;
    ChunkManager cm(store.train, store.num_classes, o);
    cm.start_epoch(0);
    std::vector<uint8_t> streamed;
    for (DatasetView v; cm.next(v);) streamed.insert(streamed.end(), v.labels, v.labels + v.rows);
    EXPECT_EQ(streamed, expected);

    // A row's class is its largest entry, as the Python package reads fed rows: smoothed labels
    // name their class; a row holding NaN, or nothing above 0, names none.
    std::vector<float> smoothed(one_hot.size());
    for (size_t i = 0; i < smoothed.size(); ++i) smoothed[i] = one_hot[i] * 0.9f + 0.01f;
    write_labels(smoothed);
    const Dataset from_smoothed = read_split(DatasetStore::open(root).train, 10, "train");
    EXPECT_EQ(std::vector<uint8_t>(from_smoothed.label_data(), from_smoothed.label_data() + rows),
              expected);
    const std::vector<std::pair<float, std::string>> bad = {
        {NAN, "one-hot label row 7 names no class (it holds NaN)"},
        {0.0f, "one-hot label row 7 names no class (no entry above 0)"}};
    for (const auto& [value, message] : bad) {
      std::vector<float> spoiled = one_hot;
      spoiled[size_t(7 * classes + expected[7])] = value;
      write_labels(spoiled);
      const DatasetStore reopened = DatasetStore::open(root);
      try {
        read_split(reopened.train, reopened.num_classes, root + " train");
        ADD_FAILURE() << "expected InputError: " << message;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      }
      EXPECT_THROW(ChunkManager(reopened.train, 10, o), InputError);
    }
    // A width other than the store's classes is refused on open.
    write_labels(one_hot);
    zarr::Group::create(root, f, {{"num_classes", 12}});
    try {
      DatasetStore::open(root);
      ADD_FAILURE() << "expected InputError";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("one-hot labels of 10 classes"), std::string::npos)
          << e.what();
    }
  }
}

// float64 images (what Dask's `x / 255.` makes) are read narrowed to float32: a store of them
// reads, streams (a band of one chunk and of several) and is summarised exactly as the same store
// cast to float32.
TEST(DatasetStore, Float64ImagesReadAsTheirFloat32Cast) {
  TempDir dir;
  const int64_t rows = 57, features = 12;
  std::vector<double> wide(size_t(rows * features));
  std::mt19937 gen(9);
  for (double& v : wide) v = double(gen() % 256) / 255.0 + 1e-12 * double(gen() % 7);
  std::vector<float> narrow(wide.begin(), wide.end());
  std::vector<uint8_t> labels(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) labels[size_t(r)] = uint8_t(r % 10);
  // Column chunks (several chunks per band) and whole rows (one, uncompressed: a float32 band
  // of one plain chunk is mapped, a float64 one cannot be).
  for (const int64_t column_chunk : {int64_t{5}, features}) {
    SCOPED_TRACE(column_chunk);
    const char* compressor = column_chunk == features ? "none" : "zstd";
    const auto make = [&](const std::string& name, zarr::DType type, const void* values,
                          size_t esize) {
      const std::string root = dir.file(name + std::to_string(column_chunk));
      zarr::Group::create(root, zarr::Format::V3);
      std::vector<uint8_t> bytes(size_t(rows * features) * esize);
      std::memcpy(bytes.data(), values, bytes.size());
      write_array(zarr::Array::create(root + "/images",
                                      meta_of(zarr::Format::V3, type, {rows, features},
                                              {20, column_chunk}, compressor)),
                  bytes, esize);
      write_array(zarr::Array::create(root + "/labels",
                                      meta_of(zarr::Format::V3, zarr::DType::UInt8, {rows}, {20})),
                  labels, 1);
      return DatasetStore::open(root);
    };
    const DatasetStore f64 = make("f64-", zarr::DType::Float64, wide.data(), 8);
    const DatasetStore f32 = make("f32-", zarr::DType::Float32, narrow.data(), 4);
    const Dataset a = read_split(f64.train, 10, "f64"), b = read_split(f32.train, 10, "f32");
    ASSERT_EQ(a.pixel_type(), PixelType::Float32);
    EXPECT_EQ(std::memcmp(a.pixel_data(), b.pixel_data(), narrow.size() * 4), 0);
    for (const bool shuffle : {false, true}) {
      ChunkManagerOptions o;
      o.batch_rows = 8;
      o.shuffle = shuffle;
      ChunkManager from_wide(f64.train, 10, o), from_narrow(f32.train, 10, o);
      from_wide.start_epoch(1);
      from_narrow.start_epoch(1);
      DatasetView x, y;
      while (from_narrow.next(y)) {
        ASSERT_TRUE(from_wide.next(x));
        ASSERT_EQ(x.pixel_type, PixelType::Float32);
        ASSERT_EQ(x.rows, y.rows);
        EXPECT_EQ(std::memcmp(x.pixels, y.pixels, size_t(y.rows * features) * 4), 0);
        EXPECT_EQ(std::memcmp(x.labels, y.labels, size_t(y.rows)), 0);
      }
      EXPECT_FALSE(from_wide.next(x));
    }
    const ColumnStats sa = column_stats(f64.train.images, 2);
    const ColumnStats sb = column_stats(f32.train.images, 2);
    EXPECT_EQ(sa.mean, sb.mean);
    EXPECT_EQ(sa.variance, sb.variance);
  }
}

// Class indices as whole numbers in a float array, [rows] or [rows, 1] (pandas and NumPy
// pipelines often leave them so), and integer indices [rows, 1]: read as their classes; a float
// that is no whole number in range is refused naming it.
TEST(DatasetStore, ClassIndicesInFloatsOrAColumnReadAsTheirClasses) {
  struct Case {
    zarr::DType type;
    std::vector<int64_t> shape;
  };
  for (const Case& c : {Case{zarr::DType::Float64, {20}}, Case{zarr::DType::Float32, {20, 1}},
                        Case{zarr::DType::Int16, {20, 1}}}) {
    SCOPED_TRACE(zarr::dtype_name(c.type) + std::string(" ") + std::to_string(c.shape.size()));
    TempDir dir;
    const std::string root = store_with_images(dir, "s.zarr", 20, 3, 8);
    const auto write_labels = [&](double spoil) {
      std::vector<uint8_t> bytes(20 * zarr::dtype_size(c.type));
      for (int i = 0; i < 20; ++i) {
        const double v = i == 13 ? spoil : double(i % 10);
        uint8_t* p = bytes.data() + size_t(i) * zarr::dtype_size(c.type);
        if (c.type == zarr::DType::Float64) std::memcpy(p, &v, 8);
        if (c.type == zarr::DType::Float32) { const float f = float(v); std::memcpy(p, &f, 4); }
        if (c.type == zarr::DType::Int16) { const int16_t k = int16_t(v); std::memcpy(p, &k, 2); }
      }
      fs::remove_all(root + "/labels");
      std::vector<int64_t> chunks = c.shape;
      chunks[0] = 8;
      write_array(zarr::Array::create(root + "/labels",
                                      meta_of(zarr::Format::V3, c.type, c.shape, chunks)),
                  bytes, zarr::dtype_size(c.type));
    };
    write_labels(3.0);
    const DatasetStore store = DatasetStore::open(root);
    EXPECT_EQ(store.num_classes, 10);
    const Dataset d = read_split(store.train, 10, "train");
    for (int i = 0; i < 20; ++i) EXPECT_EQ(d.label_data()[i], i == 13 ? 3 : i % 10) << i;
    if (c.type == zarr::DType::Int16) continue;
    for (const double bad : {3.5, 10.0, -1.0}) {
      write_labels(bad);
      try {
        read_split(DatasetStore::open(root).train, 10, "train");
        ADD_FAILURE() << "expected InputError for " << bad;
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("label at index 13 is "), std::string::npos)
            << e.what();
      }
    }
  }
}

// dask.array.to_zarr writing each array to its own path ('s.zarr/images', 's.zarr/labels',
// 's.zarr/test/images', ...) leaves no group metadata above them: such a directory is a store
// (no attributes), its splits found by their images. Group metadata that is there must read.
TEST(DatasetStore, ArraysWrittenWithoutAGroupAreAStore) {
  for (zarr::Format f : {zarr::Format::V2, zarr::Format::V3}) {
    TempDir dir;
    const std::string root = dir.file("dask.zarr");
    EXPECT_FALSE(DatasetStore::looks_like_store(root));
    for (const std::string split : {"", "test/"}) {
      const int64_t rows = split.empty() ? 30 : 12;
      write_array(zarr::Array::create(root + "/" + split + "images",
                                      meta_of(f, zarr::DType::UInt8, {rows, 6}, {10, 6})),
                  random_bytes(size_t(rows * 6), 4), 1);
      write_array(zarr::Array::create(root + "/" + split + "labels",
                                      meta_of(f, zarr::DType::UInt8, {rows}, {10})),
                  std::vector<uint8_t>(size_t(rows), 3), 1);
    }
    EXPECT_FALSE(zarr::Group::exists(root));
    EXPECT_TRUE(DatasetStore::looks_like_store(root));
    const DatasetStore store = DatasetStore::open(root);
    EXPECT_EQ(store.num_classes, 10);
    EXPECT_EQ(store.train.rows, 30);
    EXPECT_EQ(store.test.rows, 12);
    EXPECT_EQ(store.validation.rows, 0);
    EXPECT_EQ(read_split(store.test, 10, "test").label_data()[11], 3);
    // A damaged zarr.json where a group's would be is an error, not a store without attributes.
    const std::string damaged = f == zarr::Format::V3 ? "/zarr.json" : "/.zgroup";
    test::write_bytes(root + damaged, std::string("{not json"));
    EXPECT_THROW(DatasetStore::open(root), InputError);
    fs::remove(root + damaged);
    test::write_bytes(root + "/test" + damaged, std::string("{not json"));
    EXPECT_THROW(DatasetStore::open(root), InputError);
    // v2 attributes without their .zgroup are damage, not a store without attributes.
    test::write_bytes(root + "/.zattrs", std::string("{\"num_classes\": 20}"));
    EXPECT_THROW(DatasetStore::open(root), InputError);
    fs::remove(root + "/.zattrs");
    // Labels alone are no store.
    fs::remove_all(root + "/images");
    EXPECT_FALSE(DatasetStore::looks_like_store(root));
  }
}

// `prepare --overwrite` replaces a store Dask wrote array by array, as it replaces its own,
// unless other files are beside its arrays; a lone array (no `images` in it) is still no store
// to replace.
TEST(DatasetStore, OverwriteReplacesAStoreWrittenWithoutAGroup) {
  TempDir dir;
  const std::string root = dir.file("dask.zarr");
  write_array(zarr::Array::create(root + "/images",
                                  meta_of(zarr::Format::V3, zarr::DType::UInt8, {30, 6}, {10, 6})),
              random_bytes(180, 4), 1);
  write_array(zarr::Array::create(root + "/labels",
                                  meta_of(zarr::Format::V3, zarr::DType::UInt8, {30}, {10})),
              std::vector<uint8_t>(30, 3), 1);
  const DataSplits splits = small_splits();
  StoreWriteOptions o;
  EXPECT_THROW(write_dataset_store(splits, root, o, nullptr), InputError);  // no --overwrite
  o.overwrite = true;
  // The user's own file beside the arrays: not a store's, so the directory is not replaced.
  test::write_bytes(root + "/notes.txt", std::string("keep me"));
  try {
    write_dataset_store(splits, root, o, nullptr);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("holds notes.txt"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::read_bytes(root + "/notes.txt"), "keep me");
  fs::remove(root + "/notes.txt");
  write_dataset_store(splits, root, o, nullptr);
  EXPECT_TRUE(zarr::Group::exists(root));
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"dask.zarr"});
  expect_split_equals(read_split(DatasetStore::open(root).train, 10, "train"), splits.train, 1,
                      PixelType::UInt8);

  // A Zarr group of other arrays (a predictions group here) is no dataset store: its directory
  // is not replaced.
  const std::string results = dir.file("results.zarr");
  zarr::Group::create(results, zarr::Format::V3);
  zarr::Array::create(results + "/classes",
                      meta_of(zarr::Format::V3, zarr::DType::UInt8, {30}, {10}));
  const auto refusal = [&](const std::string& out) {
    return test::error_of<InputError>([&] { write_dataset_store(splits, out, o, nullptr); });
  };
  std::string why = refusal(results);
  EXPECT_TRUE(test::contains(why, "holds classes")) << why;
  EXPECT_TRUE(fs::exists(results + "/classes/zarr.json"));
  // ... nor is a store with someone's arrays in a split (predictions written into its test
  // group), until they are gone.
  write_dataset_store(splits, root, o, nullptr);
  fs::create_directories(root + "/test/preds");
  test::write_bytes(root + "/test/preds/zarr.json", std::string("{}"));
  why = refusal(root);
  EXPECT_TRUE(test::contains(why, "holds test/preds")) << why;
  EXPECT_TRUE(fs::exists(root + "/test/preds/zarr.json"));
  fs::remove_all(root + "/test/preds");
  write_dataset_store(splits, root, o, nullptr);
  // ... nor a store with a file of theirs in an array's directory, beside its chunks or among
  // them (v3's c/0/...).
  for (const std::string file : {"images/notes.txt", "images/c/0/notes.txt", "labels/c.txt"}) {
    test::write_bytes(root + "/" + file, std::string("keep me"));
    why = refusal(root);
    EXPECT_TRUE(test::contains(why, "holds " + file)) << why;
    EXPECT_EQ(test::read_bytes(root + "/" + file), "keep me");
    fs::remove(root + "/" + file);
  }
  write_dataset_store(splits, root, o, nullptr);
  // v3 arrays of the "." separator (chunks c.0.0 at the array's top) are a store's.
  const std::string dotted = dir.file("dotted.zarr");
  const auto write_dotted = [&](const std::string& name, std::vector<int64_t> shape,
                                 std::vector<int64_t> chunks, size_t bytes) {
    zarr::ArrayMeta m = meta_of(zarr::Format::V3, zarr::DType::UInt8, shape, chunks);
    m.separator = '.';
    write_array(zarr::Array::create(dotted + "/" + name, m), std::vector<uint8_t>(bytes, 1), 1);
  };
  write_dotted("images", {30, 6}, {10, 6}, 180);
  write_dotted("labels", {30}, {10}, 30);
  EXPECT_TRUE(fs::exists(dotted + "/images/c.0.0")) << "not the layout this case is about";
  write_dataset_store(splits, dotted, o, nullptr);
  EXPECT_TRUE(zarr::Group::exists(dotted));

  const std::string lone = dir.file("lone.zarr");
  zarr::Array::create(lone, meta_of(zarr::Format::V2, zarr::DType::UInt8, {30}, {10}));
  why = refusal(lone);
  EXPECT_TRUE(test::contains(why, "not a dataset store")) << why;
  EXPECT_TRUE(fs::exists(lone + "/.zarray"));
}

TEST(DatasetStore, OpenChecksShapesAndCounts) {
  TempDir dir;
  const std::string root = dir.file("s.zarr");
  zarr::Group::create(root, zarr::Format::V2);
  zarr::Array::create(root + "/images", meta_of(zarr::Format::V2, zarr::DType::UInt8, {10, 4}, {5, 4}));
  zarr::Array::create(root + "/labels", meta_of(zarr::Format::V2, zarr::DType::UInt8, {9}, {5}));
  try {
    DatasetStore::open(root);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(root), std::string::npos) << m;
    EXPECT_NE(m.find("10 images"), std::string::npos) << m;
    EXPECT_NE(m.find("9 labels"), std::string::npos) << m;
  }
  EXPECT_THROW(DatasetStore::open(dir.file("missing")), InputError);
  // Labels of three dimensions are no labels.
  const std::string root2 = dir.file("t.zarr");
  zarr::Group::create(root2, zarr::Format::V3);
  zarr::Array::create(root2 + "/images", meta_of(zarr::Format::V3, zarr::DType::UInt8, {10, 4}, {5, 4}));
  zarr::Array::create(root2 + "/labels",
                      meta_of(zarr::Format::V3, zarr::DType::Float32, {10, 2, 5}, {5, 2, 5}));
  EXPECT_THROW(DatasetStore::open(root2), InputError);
  EXPECT_FALSE(DatasetStore::looks_like_store(dir.file("missing")));
  EXPECT_TRUE(DatasetStore::looks_like_store(root2));
}

// A declared shape of 2^40 rows is valid Zarr with every chunk missing (the fill value), and
// inspect walked its trillions of chunks; a split is at most 2^31-1 rows (and features).
TEST(DatasetStore, RefusesSplitsPastInt32RowsOrFeatures) {
  TempDir dir;
  const auto u8 = zarr::DType::UInt8;
  const int64_t huge = int64_t{1} << 40;
  for (const bool wide : {false, true}) {
    const std::string root = dir.file(wide ? "wide.zarr" : "long.zarr");
    zarr::Group::create(root, zarr::Format::V3);
    const std::vector<int64_t> shape = wide ? std::vector<int64_t>{10, huge}
                                            : std::vector<int64_t>{huge, 4};
    zarr::Array::create(root + "/images", meta_of(zarr::Format::V3, u8, shape, {5, 4}));
    zarr::Array::create(root + "/labels", meta_of(zarr::Format::V3, u8, {shape[0]}, {5}));
    const std::string why = test::error_of<InputError>([&] { DatasetStore::open(root); });
    EXPECT_TRUE(test::contains(why, std::to_string(huge) + (wide ? " features" : " rows")))
        << why;
    EXPECT_TRUE(test::contains(why, "at most 2147483647")) << why;
  }
}

// A Dataset too large for the machine is an engine error (error.h: the base of every exception
// the engine throws), not std::bad_alloc, and one past the address space is refused before its
// byte count wraps around.
TEST(Dataset, TooLargeIsAnEngineError) {
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
  // (The sanitizers' allocators end the process on a request this large instead of failing it.)
  EXPECT_THROW(Dataset(PixelType::UInt8, int64_t{1} << 46, 784, 3), Error);
#endif
  const std::string why = test::error_of<InputError>(
      [] { Dataset(PixelType::Float32, int64_t{1} << 60, 784, 3); });
  EXPECT_TRUE(test::contains(why, "more bytes than this machine addresses")) << why;
}

// Images of no pixels ([rows, 0], [rows, 28, 0]): refused when opened, not as a model of width 0
// or an image of 0x0 pixels far from the store.
TEST(DatasetStore, RefusesImagesWithoutFeatures) {
  TempDir dir;
  const auto u8 = zarr::DType::UInt8;
  for (const std::vector<int64_t>& shape : {std::vector<int64_t>{20, 0},
                                            std::vector<int64_t>{20, 28, 0}}) {
    const std::string root = dir.file("none" + std::to_string(shape.size()) + ".zarr");
    zarr::Group::create(root, zarr::Format::V3);
    std::vector<int64_t> chunks(shape.size(), 5);
    zarr::Array::create(root + "/images", meta_of(zarr::Format::V3, u8, shape, chunks));
    zarr::Array::create(root + "/labels", meta_of(zarr::Format::V3, u8, {20}, {5}));
    const std::string why = test::error_of<InputError>([&] { DatasetStore::open(root); });
    EXPECT_TRUE(test::contains(why, "no features")) << why;
  }
}

// Prediction opens a split without labels (new images to classify); everything else needs them,
// and a labels array that is there must fit even for prediction.
TEST(DatasetStore, LabelsMayBeAbsentOnlyWhenOptional) {
  TempDir dir;
  const std::string root = dir.file("s.zarr");
  zarr::Group::create(root, zarr::Format::V3);
  const auto u8 = zarr::DType::UInt8;
  zarr::Array::create(root + "/images", meta_of(zarr::Format::V3, u8, {10, 4}, {5, 4}));
  EXPECT_THROW(DatasetStore::open(root), InputError);
  const DatasetStore store = DatasetStore::open(root, DatasetStore::Labels::Optional);
  EXPECT_FALSE(store.train.has_labels);
  EXPECT_EQ(store.train.rows, 10);
  EXPECT_EQ(store.train.features, 4);
  zarr::Array::create(root + "/labels", meta_of(zarr::Format::V3, u8, {9}, {5}));
  EXPECT_THROW(DatasetStore::open(root, DatasetStore::Labels::Optional), InputError);
  fs::remove_all(root + "/labels");
  fs::create_directory(root + "/labels");  // there, but no array
  EXPECT_THROW(DatasetStore::open(root, DatasetStore::Labels::Optional), InputError);
}

// A split whose metadata is damaged was taken as no split: training ran without validation and
// kept "the best" epoch of zero samples. Only a split that is not there at all is absent.
TEST(DatasetStore, ADamagedOptionalSplitIsAnErrorNotAbsent) {
  TempDir dir;
  const std::string root = dir.file("s.zarr");
  zarr::Group::create(root, zarr::Format::V3);
  const auto u8 = zarr::DType::UInt8;
  for (const std::string& group : {std::string(), std::string("/validation")}) {
    if (!group.empty()) zarr::Group::create(root + group, zarr::Format::V3);
    zarr::Array::create(root + group + "/images", meta_of(zarr::Format::V3, u8, {10, 4}, {5, 4}));
    zarr::Array::create(root + group + "/labels", meta_of(zarr::Format::V3, u8, {10}, {5}));
  }
  EXPECT_EQ(DatasetStore::open(root).validation.rows, 10);
  const std::string metadata = root + "/validation/zarr.json";
  test::write_bytes(metadata, test::read_bytes(metadata).substr(0, 30));  // cut short
  const std::string why = test::error_of<InputError>([&] { DatasetStore::open(root); });
  EXPECT_TRUE(test::contains(why, root + "/validation")) << why;
  fs::remove_all(root + "/validation");
  EXPECT_EQ(DatasetStore::open(root).validation.rows, 0);  // none: fine
  fs::create_directory(root + "/test");  // a stray empty directory: no split, as before
  EXPECT_EQ(DatasetStore::open(root).test.rows, 0);
}

TEST(DatasetStore, CorruptChunkNamesStoreAndKey) {
  for (const char* comp : {"zstd", "none", "blosc-lz4"}) {
    TempDir dir;
    const std::string out = dir.file("store.zarr");
    StoreWriteOptions o;
    o.chunk_rows = 50;
    o.compressor = zarr::Compressor::parse(comp);
    write_dataset_store(small_splits(), out, o, nullptr);
    const std::string chunk = out + "/images/c/1/0";
    ASSERT_TRUE(fs::exists(chunk)) << chunk;
    std::ofstream(chunk, std::ios::binary | std::ios::trunc) << "this is not a chunk";
    const DatasetStore store = DatasetStore::open(out);
    try {
      read_split(store.train, 10, "train");
      FAIL() << "expected InputError for " << comp;
    } catch (const InputError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find(out), std::string::npos) << m;
      EXPECT_NE(m.find("c/1/0"), std::string::npos) << m;
    }
    EXPECT_THROW(column_stats(store.train.images), InputError);
  }
}

// Reference: float64 two-pass mean and population variance per column.
void reference_stats(const std::vector<double>& x, int64_t rows, int64_t cols,
                     std::vector<double>& mean, std::vector<double>& var) {
  mean.assign(size_t(cols), 0.0);
  var.assign(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) mean[size_t(j)] += x[size_t(r * cols + j)];
  for (auto& m : mean) m /= double(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const double d = x[size_t(r * cols + j)] - mean[size_t(j)];
      var[size_t(j)] += d * d;
    }
  for (auto& v : var) v /= double(rows);
}

TEST(ArrayStats, MatchesTwoPassFloat64WithEdgeChunks) {
  TempDir dir;
  const int64_t rows = 1003, cols = 37;
  for (zarr::DType t : {zarr::DType::UInt8, zarr::DType::Float32}) {
    const std::string path = dir.file(std::string("a_") + zarr::dtype_name(t));
    const zarr::Array a = zarr::Array::create(
        path, meta_of(zarr::Format::V3, t, {rows, cols}, {97, 10}, "blosc-lz4"));
    std::vector<double> x(size_t(rows * cols));
    std::vector<uint8_t> bytes(x.size() * zarr::dtype_size(t));
    std::mt19937 gen(42);
    std::normal_distribution<float> normal(1000.0f, 3.0f);  // large mean, small spread
    for (size_t i = 0; i < x.size(); ++i) {
      if (t == zarr::DType::UInt8) {
        bytes[i] = static_cast<uint8_t>(gen());
        x[i] = bytes[i];
      } else {
        const float v = (i % cols == 5) ? 7.0f : normal(gen);  // one constant column
        std::memcpy(&bytes[i * 4], &v, 4);
        x[i] = v;
      }
    }
    write_array(a, bytes, zarr::dtype_size(t));
    std::vector<double> mean, var;
    reference_stats(x, rows, cols, mean, var);
    const ColumnStats s1 = column_stats(a, 1);
    const ColumnStats s4 = column_stats(a, 4);
    ASSERT_EQ(s1.features, cols);
    EXPECT_EQ(s1.rows, rows);
    EXPECT_TRUE(test::all_close(s1.mean, mean, 0.0, 1e-12));
    EXPECT_TRUE(test::all_close(s1.variance, var, 1e-12, 1e-9));
    // The merge order is fixed by the shape: threads do not change a bit.
    EXPECT_EQ(std::memcmp(s1.mean.data(), s4.mean.data(), size_t(cols) * 8), 0);
    EXPECT_EQ(std::memcmp(s1.variance.data(), s4.variance.data(), size_t(cols) * 8), 0);
    EXPECT_EQ(*std::min_element(x.begin(), x.end()), s4.min);
    EXPECT_EQ(*std::max_element(x.begin(), x.end()), s4.max);
    double all = 0;
    for (double v : x) all += v;
    EXPECT_NEAR(s4.overall_mean, all / double(x.size()), 1e-9 * std::fabs(all / double(x.size())));
    if (t == zarr::DType::Float32) {
      EXPECT_EQ(s4.variance[5], 0.0);
    }
  }
}

// Values far from zero with a tiny spread (1e4 +- 1e-3): the chunks' means were merged as they
// were, each off by about 1e-12 (the precision of 1e4), and the variance came out 7e-10 off,
// relative, in chunks of 7 rows. They are merged relative to a value of the column now.
TEST(ArrayStats, ATinySpreadFarFromZeroKeepsItsPrecisionAcrossChunks) {
  TempDir dir;
  const int64_t rows = 700, cols = 3;
  const zarr::Array a = zarr::Array::create(
      dir.file("far"), meta_of(zarr::Format::V3, zarr::DType::Float32, {rows, cols}, {7, 3}));
  std::mt19937 gen(3);
  std::normal_distribution<float> normal(1e4f, 1e-3f);
  std::vector<float> x(size_t(rows * cols));
  for (float& v : x) v = normal(gen);
  std::vector<uint8_t> bytes(x.size() * 4);
  std::memcpy(bytes.data(), x.data(), bytes.size());
  write_array(a, bytes, 4);
  const ColumnStats s = column_stats(a, 1);
  for (int64_t j = 0; j < cols; ++j) {
    long double sum = 0, sum_sq = 0;  // the reference: two passes in 80-bit long double
    for (int64_t r = 0; r < rows; ++r) sum += x[size_t(r * cols + j)];
    const long double mean = sum / rows;
    for (int64_t r = 0; r < rows; ++r) {
      const long double d = x[size_t(r * cols + j)] - mean;
      sum_sq += d * d;
    }
    const double var = double(sum_sq / rows);
    ASSERT_GT(var, 0.0);
    EXPECT_NEAR(s.variance[size_t(j)], var, 1e-12 * var) << "column " << j;
    EXPECT_NEAR(s.mean[size_t(j)], double(mean), 1e-15 * double(mean)) << "column " << j;
  }
}

// A column holding infinities has NumPy's mean across chunks (inf, or NaN for +inf with -inf)
// and a NaN variance; the merge of chunk results made every infinite mean NaN.
TEST(ArrayStats, InfiniteColumnsHaveNumPysMean) {
  TempDir dir;
  const zarr::Array a = zarr::Array::create(
      dir.file("inf"), meta_of(zarr::Format::V3, zarr::DType::Float32, {4, 3}, {2, 3}));
  const float inf = std::numeric_limits<float>::infinity();
  // Column 0 +inf in both chunks, column 1 +inf then -inf, column 2 finite.
  const std::vector<float> x = {inf, inf, 1, inf, inf, 2, inf, -inf, 3, inf, -inf, 4};
  std::vector<uint8_t> bytes(x.size() * 4);
  std::memcpy(bytes.data(), x.data(), bytes.size());
  write_array(a, bytes, 4);
  const ColumnStats s = column_stats(a, 1);
  EXPECT_EQ(s.mean[0], double(inf));
  EXPECT_TRUE(std::isnan(s.mean[1]));
  EXPECT_DOUBLE_EQ(s.mean[2], 2.5);
  EXPECT_TRUE(std::isnan(s.variance[0]));
  EXPECT_TRUE(std::isnan(s.variance[1]));
  EXPECT_DOUBLE_EQ(s.variance[2], 1.25);
}

// Readers hold a chunk buffer or two per thread, and a chunk may be up to 2 GB: the threads are
// capped by a 1 GiB budget of buffers (one thread at least), as well as by the jobs.
TEST(ArrayStats, ReadThreadsFitTheBufferBudget) {
  const size_t mb = size_t{1} << 20;
  EXPECT_EQ(chunk_read_threads(4, 100, 100 * mb, 2), 4);   // 800 MB of buffers: all four
  EXPECT_EQ(chunk_read_threads(8, 100, 256 * mb, 2), 2);   // 512 MB a thread: two
  EXPECT_EQ(chunk_read_threads(8, 100, 2000 * mb, 1), 1);  // one 2 GB chunk: one thread
  EXPECT_EQ(chunk_read_threads(8, 3, mb, 1), 3);           // three jobs: three threads
  EXPECT_THROW(chunk_read_threads(-1, 3, mb, 1), InputError);
}

TEST(ArrayStats, RefusesOtherDtypesAndShapes) {
  TempDir dir;
  const zarr::Array a = zarr::Array::create(
      dir.file("f64"), meta_of(zarr::Format::V2, zarr::DType::Float64, {4, 4}, {2, 2}));
  const zarr::Array i32 = zarr::Array::create(
      dir.file("i32"), meta_of(zarr::Format::V2, zarr::DType::Int32, {4, 4}, {2, 2}));
  EXPECT_THROW(column_stats(i32), InputError);
  const zarr::Array b = zarr::Array::create(
      dir.file("labels"), meta_of(zarr::Format::V2, zarr::DType::UInt8, {4}, {2}));
  EXPECT_THROW(column_stats(b), InputError);
  EXPECT_THROW(integer_histogram(a), InputError);
  EXPECT_THROW(read_matrix_row(b, 4), InputError);
  // Missing chunks read as the fill value.
  const IntegerHistogram h = integer_histogram(b);
  EXPECT_EQ(h.count, 4);
  EXPECT_EQ(h.counts.at(0), 4);
  // A uint64 value past INT64_MAX would be counted as a negative one: refused, naming it.
  const zarr::Array c = zarr::Array::create(
      dir.file("wide"), meta_of(zarr::Format::V3, zarr::DType::UInt64, {2}, {2}));
  const uint64_t values[2] = {3, ~uint64_t{0}};
  c.write_chunk({0}, reinterpret_cast<const uint8_t*>(values));
  try {
    integer_histogram(c);
    FAIL() << "a value past INT64_MAX was counted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("18446744073709551615"), std::string::npos) << e.what();
  }
}

uint32_t big_endian(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

TEST(PngWriter, WritesAValidScaledGrayscalePng) {
  TempDir dir;
  std::vector<double> image(28 * 28);
  for (size_t i = 0; i < image.size(); ++i) image[i] = -3.0 + double(i) * 0.01;
  const std::string path = dir.file("mean.png");
  write_gray_png(path, image.data(), 28, 28);
  const std::vector<unsigned char> bytes = test::read_bytes<std::vector<unsigned char>>(path);
  ASSERT_GE(bytes.size(), 33u);
  const unsigned char signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  EXPECT_EQ(std::memcmp(bytes.data(), signature, 8), 0);
  EXPECT_EQ(std::memcmp(bytes.data() + 12, "IHDR", 4), 0);
  EXPECT_EQ(big_endian(bytes.data() + 16), 280u);  // width
  EXPECT_EQ(big_endian(bytes.data() + 20), 280u);  // height
  EXPECT_EQ(bytes[24], 8);                         // bit depth
  EXPECT_EQ(bytes[25], 0);                         // grayscale
  EXPECT_EQ(entries(dir.path()), std::vector<std::string>{"mean.png"});

  // Decoded: the minimum is black, the maximum white, each value a 10x10 block.
  png_image decoded{};
  decoded.version = PNG_IMAGE_VERSION;
  ASSERT_TRUE(png_image_begin_read_from_file(&decoded, path.c_str()));
  decoded.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> px(PNG_IMAGE_SIZE(decoded));
  ASSERT_TRUE(png_image_finish_read(&decoded, nullptr, px.data(), 0, nullptr));
  EXPECT_EQ(px[0], 0);
  EXPECT_EQ(px[9 * 280 + 9], 0);
  EXPECT_EQ(px.back(), 255);
  EXPECT_EQ(px[279 * 280 + 270], 255);
  // Value i is round(0.01 i / 7.83 * 255): 8 for i = 26 (columns 260-269), 9 for i = 27.
  EXPECT_EQ(px[269], 8);
  EXPECT_EQ(px[270], 9);
  EXPECT_EQ(px[9 * 280 + 279], 9);

  // Float input with a given range and scale 1; a constant image is black.
  std::vector<float> flat(6, 2.0f);
  PngOptions o;
  o.scale = 1;
  write_gray_png(dir.file("flat.png"), flat.data(), 2, 3, o);
  o.has_range = true;
  o.lo = 0.0;
  o.hi = 4.0;
  write_gray_png(dir.file("ranged.png"), flat.data(), 2, 3, o);
  png_image r{};
  r.version = PNG_IMAGE_VERSION;
  ASSERT_TRUE(png_image_begin_read_from_file(&r, dir.file("ranged.png").c_str()));
  r.format = PNG_FORMAT_GRAY;
  std::vector<uint8_t> rp(PNG_IMAGE_SIZE(r));
  ASSERT_TRUE(png_image_finish_read(&r, nullptr, rp.data(), 0, nullptr));
  EXPECT_EQ(r.width, 3u);
  EXPECT_EQ(r.height, 2u);
  EXPECT_EQ(rp[0], 128);
}

// An image write killed before its rename (`tandem inspect` killed) left its temporary file for
// good: the next write of the same image removes it once its process has ended and it has not
// been written to for a minute (another image's is left alone).
TEST(PngWriter, TheNextWriteRemovesWhatAKilledWriteLeft) {
  TempDir dir;
  std::vector<double> image(4, 1.0);
  const std::string dead = std::to_string(test::ended_process_id());
  const std::string killed = dir.file("sample.png.tmp-" + dead + "-0");
  const std::string other = dir.file("mean.png.tmp-" + dead + "-0");
  for (const std::string& f : {killed, other}) {
    test::write_bytes(f, "partial");
    test::make_older(f, 2);
  }
  write_gray_png(dir.file("sample.png"), image.data(), 2, 2);
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_TRUE(fs::exists(other));
  EXPECT_TRUE(fs::exists(dir.file("sample.png")));
}

TEST(PngWriter, ErrorsNameTheFile) {
  TempDir dir;
  std::vector<double> image(4, 1.0);
  const std::string path = dir.file("no/such/dir/x.png");
  try {
    write_gray_png(path, image.data(), 2, 2);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
  }
  PngOptions o;
  o.scale = 0;
  EXPECT_THROW(write_gray_png(dir.file("x.png"), image.data(), 2, 2, o), InputError);
  EXPECT_THROW(write_gray_png(dir.file("x.png"), image.data(), 0, 2), InputError);
  EXPECT_TRUE(entries(dir.path()).empty());
  // A FIFO in the image's place is refused, not replaced; through a link the file it names is
  // written and the link kept (as every atomic write does).
  ASSERT_EQ(::mkfifo(dir.file("fifo.png").c_str(), 0644), 0);
  EXPECT_THROW(write_gray_png(dir.file("fifo.png"), image.data(), 2, 2), IoError);
  EXPECT_TRUE(fs::is_fifo(dir.file("fifo.png")));
  write_gray_png(dir.file("real.png"), image.data(), 2, 2);
  fs::create_symlink(dir.file("real.png"), dir.file("link.png"));
  write_gray_png(dir.file("link.png"), image.data(), 2, 1);
  EXPECT_TRUE(fs::is_symlink(dir.file("link.png")));
  EXPECT_EQ(entries(dir.path()).size(), 3u);
}

}  // namespace
}  // namespace tandem
