// Zarr v2/v3 arrays and groups: round trips over formats, compressors, dtypes and shapes (with
// edge chunks), chunk keys, fill values for missing chunks, every kind of bad chunk and bad
// metadata (an InputError naming the store and the key or file), and a bounded fuzz test that
// feeds random and mutated chunks and metadata to the readers.
#include "zarr/zarr_array.h"
#include "zarr/zarr_metadata.h"

#include <blosc.h>
#include <sys/stat.h>
#include <gtest/gtest.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <random>
#include <thread>
#include <tuple>

#include "crc32c.h"
#include "tandem/error.h"
#include "test_support.h"
#include "zarr_test_arrays.h"

namespace tandem::zarr {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::read_bytes;
using test::TempDir;
using test::write_bytes;
using test_arrays::element_count;
using test_arrays::for_each_chunk;
using test_arrays::for_each_run;
using test_arrays::put_element;
using test_arrays::read_logical;
using detail::dims_text;

// ---- helpers ----

std::string as_string(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

ArrayMeta make_meta(Format format, DType dtype, std::vector<int64_t> shape,
                    std::vector<int64_t> chunks, const std::string& compressor = "none",
                    double fill_value = 0.0) {
  ArrayMeta m;
  m.format = format;
  m.dtype = dtype;
  m.shape = std::move(shape);
  m.chunks = std::move(chunks);
  m.compressor = Compressor::parse(compressor);
  m.fill_value = fill_value;
  m.separator = format == Format::V2 ? '.' : '/';
  m.v3_default_key_encoding = format == Format::V3;
  return m;
}

// Writes a whole C-order array chunk by chunk; edge chunks are padded with 0xAB bytes, which
// readers must never return.
void write_logical(const Array& a, const std::vector<uint8_t>& data) {
  const ArrayMeta& m = a.meta();
  const size_t es = dtype_size(m.dtype);
  std::vector<uint8_t> chunk(m.chunk_bytes());
  for_each_chunk(m, [&](const std::vector<int64_t>& index) {
    std::fill(chunk.begin(), chunk.end(), 0xAB);
    for_each_run(m, index, [&](size_t ao, size_t co, size_t n) {
      std::memcpy(chunk.data() + co * es, data.data() + ao * es, n * es);
    });
    a.write_chunk(index, chunk.data());
  });
}

// Values with runs (so compressors have something to compress) and random ones mixed in; signed
// types get negatives, floats fractions.
std::vector<uint8_t> make_values(DType type, size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  const size_t es = dtype_size(type);
  const bool is_signed = type == DType::Int8 || type == DType::Int16 || type == DType::Int32 ||
                         type == DType::Int64 || type == DType::Float32 || type == DType::Float64;
  const bool is_float = type == DType::Float32 || type == DType::Float64;
  std::vector<uint8_t> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    double v = gen() % 4 == 0 ? double(gen() % 120) : double(i / 3 % 11);
    if (is_signed && gen() % 3 == 0) v = -v;
    if (is_float) v += 0.125 * double(gen() % 8);
    put_element(type, out.data() + i * es, v);
  }
  return out;
}

// Runs f, expecting an InputError whose message holds every one of `parts`; returns the message.
std::string expect_input_error(const std::function<void()>& f,
                               const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) {
      EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\": " << msg;
    }
    return msg;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected InputError, got another exception: " << e.what();
    return "";
  }
  ADD_FAILURE() << "expected InputError, nothing was thrown";
  return "";
}

// ---- round trips ----

struct Case {
  Format format;
  std::string compressor;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<int64_t> chunks;
};

class RoundTrip : public ::testing::TestWithParam<std::tuple<Format, std::string, DType, int>> {};

Case case_of(const RoundTrip::ParamType& p) {
  static const std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> shapes = {
      // Few chunks each: every chunk write is fsynced, and that is most of these tests' time.
      {{10}, {4}},             // 1-D, last chunk half full
      {{7, 10}, {4, 6}},       // 2-D, edge chunks in both dimensions
      {{5, 3, 9}, {3, 2, 5}},  // 3-D, edge chunks in all three
      {{6, 8}, {6, 8}},        // one chunk, exactly full
  };
  const auto& [format, compressor, dtype, shape] = p;
  return {format, compressor, dtype, shapes[size_t(shape)].first, shapes[size_t(shape)].second};
}

TEST_P(RoundTrip, WriteReopenRead) {
  const Case c = case_of(GetParam());
  TempDir dir;
  const std::string path = dir.file("a");
  const ArrayMeta meta = make_meta(c.format, c.dtype, c.shape, c.chunks, c.compressor);
  const Array created = Array::create(path, meta);
  const std::vector<uint8_t> data = make_values(c.dtype, element_count(meta), 42);
  write_logical(created, data);

  const Array opened = Array::open(path);
  const ArrayMeta& m = opened.meta();
  EXPECT_EQ(m.format, c.format);
  EXPECT_EQ(m.dtype, c.dtype);
  EXPECT_EQ(m.shape, c.shape);
  EXPECT_EQ(m.chunks, c.chunks);
  EXPECT_EQ(m.compressor.describe(), meta.compressor.describe());
  EXPECT_EQ(m.separator, meta.separator);
  EXPECT_TRUE(read_logical(opened) == data) << "data differs after the round trip";
  // Every chunk was stored (none read as fill) and reads back as exactly what was written.
  for_each_chunk(m, [&](const std::vector<int64_t>& index) {
    std::vector<uint8_t> chunk(m.chunk_bytes());
    EXPECT_TRUE(opened.read_chunk(index, chunk.data())) << opened.chunk_key(index);
  });
}

std::string round_trip_name(const ::testing::TestParamInfo<RoundTrip::ParamType>& info) {
  const auto& [format, compressor, dtype, shape] = info.param;
  std::string name = std::string(format == Format::V2 ? "v2_" : "v3_") + compressor + "_" +
                     dtype_name(dtype) + "_shape" + std::to_string(shape);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(
    FormatsCompressorsDtypes, RoundTrip,
    ::testing::Combine(::testing::Values(Format::V2, Format::V3),
                       ::testing::Values("none", "zstd", "zstd:0", "blosc-lz4",
                                         "blosc-zstd:5"),
                       ::testing::Values(DType::UInt8, DType::Int64, DType::Float32),
                       ::testing::Values(0, 1, 2, 3)),
    round_trip_name);

INSTANTIATE_TEST_SUITE_P(
    OtherDtypesAndShuffles, RoundTrip,
    ::testing::Combine(::testing::Values(Format::V2, Format::V3),
                       ::testing::Values("blosc-lz4-bitshuffle:3", "blosc-blosclz-noshuffle"),
                       ::testing::Values(DType::Int8, DType::UInt16, DType::Int16, DType::UInt32,
                                         DType::Int32, DType::UInt64, DType::Float64),
                       ::testing::Values(1)),
    round_trip_name);

// gzip in both formats; zlib is a v2 compressor only (DeflateStreams checks v3 refuses it).
INSTANTIATE_TEST_SUITE_P(
    Gzip, RoundTrip,
    ::testing::Combine(::testing::Values(Format::V2, Format::V3),
                       ::testing::Values("gzip", "gzip:0"),
                       ::testing::Values(DType::UInt8, DType::Float32), ::testing::Values(1, 2)),
    round_trip_name);
INSTANTIATE_TEST_SUITE_P(
    Zlib, RoundTrip,
    ::testing::Combine(::testing::Values(Format::V2), ::testing::Values("zlib", "zlib:9"),
                       ::testing::Values(DType::UInt8, DType::Float32), ::testing::Values(1, 2)),
    round_trip_name);

// Deflate streams as other writers make them: Python's gzip module reads a gzip stream of several
// members, with zero bytes between or after them, as one (numcodecs' GZip decodes with it), so
// Tandem does too; anything else after the end is refused, as is a stream cut short.
TEST(Zarr, DeflateStreamsFromOtherWritersAndTheirDamage) {
  const std::vector<uint8_t> plain = make_values(DType::Float32, 300, 8);
  const auto gzip_member = [](const uint8_t* data, size_t size) {
    z_stream s{};
    EXPECT_EQ(deflateInit2(&s, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
    gz_header header{};
    header.name = reinterpret_cast<Bytef*>(const_cast<char*>("chunk.bin"));  // as gzip(1) does
    header.time = 1700000000;
    EXPECT_EQ(deflateSetHeader(&s, &header), Z_OK);
    std::string out(deflateBound(&s, uLong(size)) + 64, '\0');
    s.next_in = const_cast<Bytef*>(data);
    s.avail_in = uInt(size);
    s.next_out = reinterpret_cast<Bytef*>(out.data());
    s.avail_out = uInt(out.size());
    EXPECT_EQ(deflate(&s, Z_FINISH), Z_STREAM_END);
    out.resize(s.total_out);
    deflateEnd(&s);
    return out;
  };
  const Compressor gzip = Compressor::parse("gzip"), zlib = Compressor::parse("zlib");
  const auto decode = [&](const Compressor& c, const std::string& stored) {
    std::vector<uint8_t> out(plain.size());
    decompress(c, reinterpret_cast<const uint8_t*>(stored.data()), stored.size(), out.data(),
               out.size(), "chunk 'x'");
    return out;
  };
  const size_t half = plain.size() / 2;
  const std::string one = gzip_member(plain.data(), plain.size());
  const std::string two = gzip_member(plain.data(), half) +
                          gzip_member(plain.data() + half, plain.size() - half);
  EXPECT_EQ(decode(gzip, one), plain);
  EXPECT_EQ(decode(gzip, two), plain);
  EXPECT_EQ(decode(gzip, two + std::string(7, '\0')), plain);
  const std::string first = gzip_member(plain.data(), half);
  EXPECT_EQ(decode(gzip, first + std::string(3, '\0') + two.substr(first.size())), plain);
  expect_input_error([&] { decode(gzip, two + "junk"); }, {"chunk 'x'", "gzip", "expected"});
  expect_input_error([&] { decode(gzip, one + one); },
                     {"chunk 'x'", "gzip data decompresses to more than 1200 bytes"});
  expect_input_error([&] { decode(gzip, one.substr(0, one.size() - 3)); },
                     {"chunk 'x'", "gzip data is truncated"});
  // A zlib stream has one member; a gzip stream is not a zlib one, nor the other way round.
  const std::vector<uint8_t> z = compress(zlib, plain.data(), plain.size(), 4);
  EXPECT_EQ(decode(zlib, as_string(z)), plain);
  expect_input_error([&] { decode(zlib, as_string(z) + std::string(1, '\0')); },
                     {"chunk 'x'", "zlib data is followed by 1 bytes after its end"});
  expect_input_error([&] { decode(zlib, one); }, {"chunk 'x'", "zlib data is corrupt"});
  expect_input_error([&] { decode(gzip, as_string(z)); }, {"chunk 'x'", "gzip data is corrupt"});
  // zlib in Zarr v3 would be a document no reader knows: refused before anything is written.
  TempDir dir;
  expect_input_error(
      [&] { Array::create(dir.file("a"), make_meta(Format::V3, DType::UInt8, {4}, {2}, "zlib")); },
      {dir.file("a"), "zlib is a Zarr v2 compressor", "gzip"});
  EXPECT_FALSE(fs::exists(dir.file("a")));
}

// ---- sharding (Zarr v3's sharding_indexed codec) ----

ArrayMeta sharded_meta(DType dtype, std::vector<int64_t> shape, std::vector<int64_t> shards,
                       std::vector<int64_t> inner, const std::string& compressor) {
  ArrayMeta m = make_meta(Format::V3, dtype, std::move(shape), std::move(shards), compressor);
  m.inner_chunks = std::move(inner);
  return m;
}

// Shards whose inner chunks are whole rows of the shard (decoded in place) and ones that are not
// (through a scratch buffer), edge shards, every compressor, the index at either end, with and
// without its checksum: written, reopened from the metadata, read back.
TEST(Zarr, ShardedArraysRoundTrip) {
  struct Shape {
    std::vector<int64_t> shape, shards, inner;
  };
  const std::vector<Shape> shapes = {
      {{10, 6}, {4, 6}, {2, 6}},           // inner chunks are rows of the shard
      {{7, 10}, {6, 8}, {3, 4}},           // 2 x 2 inner chunks per shard, edge shards
      {{5, 3, 9}, {4, 2, 6}, {2, 1, 3}},   // 3-D
      {{9}, {9}, {3}},                     // 1-D, one shard
  };
  for (const Shape& sh : shapes) {
    for (const std::string compressor : {"none", "zstd", "gzip", "blosc-lz4"}) {
      for (const bool at_start : {false, true}) {
        for (const bool crc : {true, false}) {
          SCOPED_TRACE(::testing::Message() << dims_text(sh.shape) << " shards "
                                            << dims_text(sh.shards) << " inner "
                                            << dims_text(sh.inner) << " " << compressor
                                            << (at_start ? " index first" : " index last")
                                            << (crc ? " crc32c" : ""));
          TempDir dir;
          ArrayMeta meta = sharded_meta(DType::Float32, sh.shape, sh.shards, sh.inner, compressor);
          meta.shard_index_at_start = at_start;
          meta.shard_index_crc32c = crc;
          const std::vector<uint8_t> data = make_values(DType::Float32, element_count(meta), 3);
          write_logical(Array::create(dir.file("a"), meta), data);
          const Array opened = Array::open(dir.file("a"));
          EXPECT_EQ(opened.meta().inner_chunks, sh.inner);
          EXPECT_EQ(opened.meta().shard_index_at_start, at_start);
          EXPECT_EQ(opened.meta().shard_index_crc32c, crc);
          EXPECT_EQ(opened.meta().compressor.describe(), meta.compressor.describe());
          EXPECT_FALSE(opened.meta().stored_plain());
          EXPECT_TRUE(read_logical(opened) == data);
        }
      }
    }
  }
}

// What zarr-python leaves out (inner chunks holding only the fill value) reads as the fill
// value; a damaged shard is an InputError naming the store, the shard and, where one is at
// fault, the inner chunk.
TEST(Zarr, ShardsWithInnerChunksMissingOrDamaged) {
  TempDir dir;
  const ArrayMeta meta = sharded_meta(DType::Int32, {4, 6}, {4, 6}, {2, 3}, "zstd");
  const Array a = Array::create(dir.file("a"), meta);
  const std::vector<uint8_t> data = make_values(DType::Int32, 24, 4);
  write_logical(a, data);
  const std::string file = dir.file("a/c/0/0");
  const std::string good = read_bytes(file);
  const size_t index_at = good.size() - (4 * 16 + 4);  // four entries and the checksum
  const auto with_entry = [&](size_t k, uint64_t offset, uint64_t size) {
    std::string bytes = good;
    for (int b = 0; b < 8; ++b) {
      bytes[index_at + k * 16 + size_t(b)] = char(offset >> (8 * b));
      bytes[index_at + k * 16 + 8 + size_t(b)] = char(size >> (8 * b));
    }
    const uint32_t sum = crc32c(reinterpret_cast<const uint8_t*>(bytes.data()) + index_at, 64);
    for (int b = 0; b < 4; ++b) bytes[index_at + 64 + size_t(b)] = char(sum >> (8 * b));
    return bytes;
  };
  // Inner chunk [1, 0] (rows 2-3, columns 0-2) not stored: the fill value there, data elsewhere.
  const uint64_t none = ~uint64_t{0};
  write_bytes(file, with_entry(2, none, none));
  std::vector<uint8_t> chunk(meta.chunk_bytes());
  EXPECT_TRUE(a.read_chunk({0, 0}, chunk.data()));
  for (int64_t row = 0; row < 4; ++row) {
    for (int64_t col = 0; col < 6; ++col) {
      const size_t at = size_t(row * 6 + col) * 4;
      const bool filled = row >= 2 && col < 3;
      const uint8_t zeros[4] = {};
      EXPECT_EQ(std::memcmp(chunk.data() + at, filled ? zeros : data.data() + at, 4), 0)
          << "row " << row << ", column " << col;
    }
  }
  const std::vector<std::string> where = {"zarr store '" + dir.file("a") + "'", "chunk 'c/0/0'"};
  const auto expect_bad = [&](const std::string& bytes, const std::string& why) {
    SCOPED_TRACE(why);
    write_bytes(file, bytes);
    std::vector<std::string> parts = where;
    parts.push_back(why);
    expect_input_error([&] { a.read_chunk({0, 0}, chunk.data()); }, parts);
  };
  expect_bad(good.substr(good.size() - 60), "shorter than its 68-byte index of 4 inner chunks");
  std::string flipped = good;
  flipped[index_at + 3] ^= 0x10;
  expect_bad(flipped, "shard index crc32c checksum");
  expect_bad(with_entry(1, index_at - 2, 8), "places inner chunk [0, 1] at bytes");
  expect_bad(with_entry(3, 0, none), "places inner chunk [1, 1]");
  // Every inner chunk claiming the whole data: the same bytes would be decoded four times.
  {
    std::string all = good;
    for (size_t k = 0; k < 4; ++k) {
      for (int b = 0; b < 8; ++b) {
        all[index_at + k * 16 + size_t(b)] = 0;
        all[index_at + k * 16 + 8 + size_t(b)] = char(uint64_t(index_at) >> (8 * b));
      }
    }
    const uint32_t sum = crc32c(reinterpret_cast<const uint8_t*>(all.data()) + index_at, 64);
    for (int b = 0; b < 4; ++b) all[index_at + 64 + size_t(b)] = char(sum >> (8 * b));
    expect_bad(all, "more bytes in all than the shard's data holds");
  }
  std::string damaged = good;
  damaged[0] ^= 0xFF;  // inner chunk [0, 0]'s zstd frame starts the shard
  expect_bad(damaged, "inner chunk [0, 0]: not a zstd frame");
  expect_bad(good + std::string(200000, 'x'), "chunk file is");  // larger than any shard
  write_bytes(file, good);
  EXPECT_TRUE(a.read_chunk({0, 0}, chunk.data()));
}

TEST(Zarr, ZeroDimensionalArrays) {
  for (const Format format : {Format::V2, Format::V3}) {
    TempDir dir;
    const Array a = Array::create(dir.file("s"), make_meta(format, DType::Int64, {}, {}, "zstd"));
    EXPECT_EQ(a.chunk_key({}), format == Format::V2 ? "0" : "c");
    EXPECT_EQ(a.meta().chunk_elements(), 1u);
    const std::vector<uint8_t> data = make_values(DType::Int64, 1, 7);
    a.write_chunk({}, data.data());
    EXPECT_TRUE(fs::is_regular_file(dir.file(format == Format::V2 ? "s/0" : "s/c")));
    EXPECT_TRUE(read_logical(Array::open(dir.file("s"))) == data);
  }
}

TEST(Zarr, EmptyArrayHasNoChunks) {
  TempDir dir;
  const Array a = Array::create(dir.file("e"), make_meta(Format::V3, DType::UInt8, {0, 5}, {4, 4}));
  EXPECT_EQ(a.meta().grid(), (std::vector<int64_t>{0, 2}));
  expect_input_error([&] { a.chunk_key({0, 0}); }, {dir.file("e"), "outside the chunk grid"});
}

TEST(Zarr, ThreadsWriteAndReadDifferentChunks) {
  TempDir dir;
  const Array a = Array::create(dir.file("t"),
                                make_meta(Format::V3, DType::Float32, {64, 30}, {4, 30}, "blosc-lz4"));
  const std::vector<uint8_t> data = make_values(DType::Float32, 64 * 30, 3);
  const size_t chunk = a.meta().chunk_bytes();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = t; i < 16; i += 4) a.write_chunk({i, 0}, data.data() + size_t(i) * chunk);
    });
  }
  for (auto& th : threads) th.join();
  threads.clear();
  std::vector<uint8_t> back(data.size());
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int64_t i = t; i < 16; i += 4) a.read_chunk({i, 0}, back.data() + size_t(i) * chunk);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_TRUE(back == data);
  // No temporary files are left behind.
  for (const auto& entry : fs::recursive_directory_iterator(dir.file("t"))) {
    EXPECT_EQ(entry.path().string().find(".tmp-"), std::string::npos) << entry.path();
  }
}

// ---- chunk keys ----

TEST(Zarr, ChunkKeyFormats) {
  struct KeyCase {
    Format format;
    bool v3_default;
    char separator;
    std::vector<int64_t> shape, chunks, index;
    std::string key;
  };
  const std::vector<KeyCase> cases = {
      {Format::V2, false, '.', {10, 10}, {5, 4}, {1, 2}, "1.2"},
      {Format::V2, false, '/', {10, 10}, {5, 4}, {1, 2}, "1/2"},
      {Format::V2, false, '.', {10}, {4}, {2}, "2"},
      {Format::V2, false, '.', {4, 4, 4}, {2, 2, 1}, {1, 0, 3}, "1.0.3"},
      {Format::V3, true, '/', {10, 10}, {5, 4}, {1, 2}, "c/1/2"},
      {Format::V3, true, '.', {10, 10}, {5, 4}, {1, 2}, "c.1.2"},
      {Format::V3, true, '/', {10}, {4}, {2}, "c/2"},
      {Format::V3, false, '.', {10, 10}, {5, 4}, {1, 2}, "1.2"},
      {Format::V3, false, '/', {10, 10}, {5, 4}, {1, 2}, "1/2"},
      {Format::V3, false, '.', {}, {}, {}, "0"},
  };
  for (const KeyCase& k : cases) {
    TempDir dir;
    ArrayMeta m = make_meta(k.format, DType::UInt8, k.shape, k.chunks, "zstd");
    m.separator = k.separator;
    m.v3_default_key_encoding = k.v3_default;
    const Array a = Array::create(dir.file("k"), m);
    EXPECT_EQ(a.chunk_key(k.index), k.key);
    std::vector<uint8_t> chunk(m.chunk_bytes(), 5);
    a.write_chunk(k.index, chunk.data());
    EXPECT_TRUE(fs::is_regular_file(dir.file("k/" + k.key))) << k.key;
    // The encoding survives the metadata round trip.
    const Array b = Array::open(dir.file("k"));
    EXPECT_EQ(b.chunk_key(k.index), k.key);
    EXPECT_TRUE(b.read_chunk(k.index, chunk.data()));
  }
}

TEST(Zarr, ChunkIndexOutsideGridIsRefused) {
  TempDir dir;
  const Array a = Array::create(dir.file("a"), make_meta(Format::V2, DType::UInt8, {10, 10}, {4, 4}));
  std::vector<uint8_t> chunk(16);
  for (const std::vector<int64_t>& bad : std::vector<std::vector<int64_t>>{{3, 0}, {0, -1}, {0}, {0, 0, 0}}) {
    expect_input_error([&] { a.read_chunk(bad, chunk.data()); }, {dir.file("a"), "chunk index"});
    expect_input_error([&] { a.write_chunk(bad, chunk.data()); }, {dir.file("a"), "chunk grid"});
  }
}

// ---- fill values ----

TEST(Zarr, MissingChunksReadAsFillValue) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (const Format format : {Format::V2, Format::V3}) {
    {
      TempDir dir;
      const Array a = Array::create(dir.file("u8"),
                                    make_meta(format, DType::UInt8, {5, 5}, {2, 3}, "zstd", 7));
      const Array b = Array::open(dir.file("u8"));
      std::vector<uint8_t> chunk(b.meta().chunk_bytes());
      EXPECT_FALSE(b.read_chunk({2, 1}, chunk.data()));
      EXPECT_EQ(chunk, std::vector<uint8_t>(6, 7));
    }
    {
      TempDir dir;
      Array::create(dir.file("i64"), make_meta(format, DType::Int64, {5}, {3}, "blosc-lz4", -3));
      const Array b = Array::open(dir.file("i64"));
      std::vector<int64_t> chunk(3);
      EXPECT_FALSE(b.read_chunk({1}, reinterpret_cast<uint8_t*>(chunk.data())));
      EXPECT_EQ(chunk, std::vector<int64_t>(3, -3));
    }
    {
      TempDir dir;
      Array::create(dir.file("f32"), make_meta(format, DType::Float32, {4, 4}, {2, 2}, "none", nan));
      const std::string text = read_bytes(dir.file(format == Format::V2 ? "f32/.zarray" : "f32/zarr.json"));
      EXPECT_NE(text.find("\"NaN\""), std::string::npos) << text;
      const Array b = Array::open(dir.file("f32"));
      EXPECT_TRUE(std::isnan(b.meta().fill_value));
      std::vector<float> chunk(4, 1.0f);
      EXPECT_FALSE(b.read_chunk({1, 1}, reinterpret_cast<uint8_t*>(chunk.data())));
      for (const float v : chunk) EXPECT_TRUE(std::isnan(v));
    }
    {
      TempDir dir;
      Array::create(dir.file("f64"), make_meta(format, DType::Float64, {3}, {2}, "zstd",
                                               -std::numeric_limits<double>::infinity()));
      const Array b = Array::open(dir.file("f64"));
      std::vector<double> chunk(2);
      EXPECT_FALSE(b.read_chunk({0}, reinterpret_cast<uint8_t*>(chunk.data())));
      EXPECT_EQ(chunk, std::vector<double>(2, -std::numeric_limits<double>::infinity()));
    }
  }
}

// Metadata as zarr-python writes it, edited by `edit` and written to dir/a; returns the path.
std::string write_v2(const TempDir& dir, const std::function<void(json&)>& edit) {
  json doc = {{"zarr_format", 2},  {"shape", {7, 10}},  {"chunks", {3, 4}},
              {"dtype", "<f4"},    {"fill_value", 0.0}, {"order", "C"},
              {"filters", nullptr},
              {"compressor",
               {{"id", "blosc"}, {"cname", "lz4"}, {"clevel", 5}, {"shuffle", 1}, {"blocksize", 0}}}};
  edit(doc);
  fs::create_directories(dir.file("a"));
  write_bytes(dir.file("a/.zarray"), doc.dump(4));
  return dir.file("a");
}

std::string write_v3(const TempDir& dir, const std::function<void(json&)>& edit) {
  json doc = json::parse(R"({
    "shape": [7, 10], "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [3, 4]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0.0,
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
               {"name": "zstd", "configuration": {"level": 0, "checksum": false}}],
    "attributes": {}, "zarr_format": 3, "node_type": "array", "storage_transformers": []})");
  edit(doc);
  fs::create_directories(dir.file("a"));
  write_bytes(dir.file("a/zarr.json"), doc.dump(2));
  return dir.file("a");
}

// Chunks are opened by path: a store deleted under a reader read as the fill value everywhere,
// and one replaced (another prepare --overwrite) gave its rows beside the old store's labels.
TEST(Zarr, AnArrayRemovedOrReplacedWhileBeingReadIsAnError) {
  for (const char* compressor : {"zstd", "none"}) {
    SCOPED_TRACE(compressor);
    TempDir dir;
    const std::string path = dir.file("a");
    const ArrayMeta meta = make_meta(Format::V3, DType::UInt8, {4, 3}, {2, 3}, compressor);
    write_logical(Array::create(path, meta), make_values(DType::UInt8, 12, 5));
    const Array a = Array::open(path);
    std::vector<uint8_t> chunk(meta.chunk_bytes());
    EXPECT_TRUE(a.read_chunk({0, 0}, chunk.data()));
    fs::rename(path, dir.file("old"));
    write_logical(Array::create(path, meta), make_values(DType::UInt8, 12, 6));  // a new one
    std::string why = test::error_of<InputError>([&] { a.read_chunk({1, 0}, chunk.data()); });
    EXPECT_TRUE(test::contains(why, "chunk 'c/1/0': the array's directory was removed or replaced"))
        << why;
    if (std::string(compressor) == "none") {
      EXPECT_THROW(a.map_chunk({1, 0}), InputError);
    }
    fs::remove_all(path);
    fs::remove_all(dir.file("old"));
    why = test::error_of<InputError>([&] { a.read_chunk({1, 0}, chunk.data()); });
    EXPECT_TRUE(test::contains(why, "removed or replaced")) << why;
  }
}

// A FIFO in a chunk's or the metadata's place: open() blocked forever waiting for a writer.
TEST(Zarr, AFifoInAFilesPlaceIsRefusedNotWaitedOn) {
  for (const char* compressor : {"zstd", "none"}) {
    SCOPED_TRACE(compressor);
    TempDir dir;
    const ArrayMeta meta = make_meta(Format::V3, DType::UInt8, {4, 3}, {2, 3}, compressor);
    const Array a = Array::create(dir.file("a"), meta);
    write_logical(a, make_values(DType::UInt8, 12, 5));
    const std::string chunk_file = dir.file("a/c/1/0");
    fs::remove(chunk_file);
    ASSERT_EQ(::mkfifo(chunk_file.c_str(), 0600), 0);
    std::vector<uint8_t> chunk(meta.chunk_bytes());
    const Array b = Array::open(dir.file("a"));
    std::string why = test::error_of<InputError>([&] { b.read_chunk({1, 0}, chunk.data()); });
    EXPECT_TRUE(test::contains(why, "not a regular file")) << why;
    if (std::string(compressor) == "none") {
      why = test::error_of<InputError>([&] { b.map_chunk({1, 0}); });
      EXPECT_TRUE(test::contains(why, "not a regular file")) << why;
    }
    fs::remove(dir.file("a/zarr.json"));
    ASSERT_EQ(::mkfifo(dir.file("a/zarr.json").c_str(), 0600), 0);
    why = test::error_of<InputError>([&] { Array::open(dir.file("a")); });
    EXPECT_TRUE(test::contains(why, "not a regular file")) << why;
  }
}

TEST(Zarr, FillValueForms) {
  struct FillCase {
    bool v3;
    std::string dtype;
    json fill;
    double expected;  // NaN compares by isnan
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<FillCase> cases = {
      {false, "<f4", "NaN", nan},         {false, "<f8", "Infinity", inf},
      {false, "<f4", "-Infinity", -inf},  {false, "<f4", nullptr, 0.0},
      {false, "<i8", -5, -5.0},           {false, "|u1", 255, 255.0},
      {false, "<u8", nullptr, 0.0},       {true, "float32", "0x7fc00000", nan},
      {true, "float32", "0x3f800000", 1.0}, {true, "float64", "0x4000000000000000", 2.0},
      {true, "int64", -9007199254740992, -9007199254740992.0}, {true, "float32", 0.5, 0.5},
  };
  for (const FillCase& c : cases) {
    TempDir dir;
    const std::string path =
        c.v3 ? write_v3(dir, [&](json& d) { d["data_type"] = c.dtype; d["fill_value"] = c.fill; })
             : write_v2(dir, [&](json& d) { d["dtype"] = c.dtype; d["fill_value"] = c.fill; });
    const double got = Array::open(path).meta().fill_value;
    if (std::isnan(c.expected)) {
      EXPECT_TRUE(std::isnan(got)) << c.fill;
    } else {
      EXPECT_EQ(got, c.expected) << c.fill;
    }
  }
}

// ---- metadata compatibility: files as dask/zarr-python write them ----

// Attributes are written as zarr-python writes them, ASCII with \u escapes (zarr 2.13 decodes
// .zattrs as ASCII: a path with an accent made them unreadable there), and a string that is not
// UTF-8 (a path of Latin-1 bytes) has U+FFFD for its bad bytes instead of failing the write.
TEST(Zarr, AttributesAreWrittenAsAsciiWithBadUtf8Replaced) {
  for (const Format format : {Format::V2, Format::V3}) {
    TempDir dir;
    const std::string root = dir.file("group");
    Group::create(root, format, {{"source_dir", "/data/Donn\xc3\xa9" "es"},
                                 {"latin1", "/data/caf\xe9"}});
    const std::string text =
        read_bytes(root + (format == Format::V2 ? "/.zattrs" : "/zarr.json"));
    EXPECT_TRUE(std::all_of(text.begin(), text.end(),
                            [](char c) { return static_cast<unsigned char>(c) < 0x80; }))
        << text;
    EXPECT_NE(text.find("Donn\\u00e9es"), std::string::npos) << text;
    const json attributes = Group::open(root).second;
    EXPECT_EQ(attributes.value("source_dir", ""), "/data/Donn\xc3\xa9" "es");
    EXPECT_EQ(attributes.value("latin1", ""), "/data/caf\xef\xbf\xbd");
  }
}

TEST(Zarr, ReadsDaskStyleV2WithoutDimensionSeparator) {
  TempDir dir;
  const std::string path = write_v2(dir, [](json&) {});
  const Array a = Array::open(path);
  EXPECT_EQ(a.meta().separator, '.');
  EXPECT_EQ(a.meta().compressor.describe(), "blosc-lz4:5");
  // numcodecs' AUTOSHUFFLE (-1): bit shuffle for 1-byte types, byte shuffle otherwise.
  for (const auto& [dtype, described] : std::vector<std::pair<std::string, std::string>>{
           {"|u1", "blosc-lz4-bitshuffle:5"}, {"<f4", "blosc-lz4:5"}}) {
    TempDir other;
    const std::string auto_path = write_v2(other, [&, d = dtype](json& doc) {
      doc["dtype"] = d;
      doc["compressor"]["shuffle"] = -1;
    });
    EXPECT_EQ(Array::open(auto_path).meta().compressor.describe(), described);
  }
  EXPECT_EQ(a.chunk_key({2, 1}), "2.1");
  const std::vector<uint8_t> data = make_values(DType::Float32, 70, 1);
  write_logical(a, data);
  EXPECT_TRUE(read_logical(Array::open(path)) == data);
}

TEST(Zarr, ReadsZarrPythonStyleV3) {
  TempDir dir;
  // zarr-python 3 leaves out the bytes codec's configuration for 1-byte types.
  const std::string path = write_v3(dir, [](json& d) {
    d["data_type"] = "uint8";
    d["fill_value"] = 0;
    d["codecs"][0] = {{"name", "bytes"}};
    d["dimension_names"] = {"row", nullptr};
    d["an_extension"] = {{"must_understand", false}, {"x", 1}};
  });
  const Array a = Array::open(path);
  EXPECT_EQ(a.meta().compressor.describe(), "zstd:0");
  const std::vector<uint8_t> data = make_values(DType::UInt8, 70, 2);
  write_logical(a, data);
  EXPECT_TRUE(read_logical(Array::open(path)) == data);
  // "dimension_names": null, which zarr-python reads as no names.
  const std::string unnamed = write_v3(dir, [](json& d) { d["dimension_names"] = nullptr; });
  EXPECT_NO_THROW(Array::open(unnamed));
  // One byte has no order: big-endian uint8 is uint8, in v3 as in v2 (">u1").
  const std::string big_bytes = write_v3(dir, [](json& d) {
    d["data_type"] = "uint8";
    d["fill_value"] = 0;
    d["codecs"][0]["configuration"]["endian"] = "big";
  });
  EXPECT_EQ(Array::open(big_bytes).meta().dtype, DType::UInt8);
  const TempDir v2_dir;  // (write_v2 writes the same path as write_v3)
  const std::string big_v2 = write_v2(v2_dir, [](json& d) {
    d["dtype"] = ">u1";
    d["fill_value"] = 0;
  });
  EXPECT_EQ(Array::open(big_v2).meta().dtype, DType::UInt8);
}

// numcodecs writes levels Tandem does not (zlib's and gzip's default, -1; a zstd level above the
// maximum, which libzstd clamps), and zarr-python reads such stores back: a level is the writer's
// business, so they are read. Creating an array with one is still refused.
TEST(Zarr, LevelsOutsideTandemsRangeAreReadButNotWritten) {
  struct Case {
    Format format;
    json written, odd;  // the compressor (v2) or second codec (v3) written with, then claimed
    std::string refused;
  };
  const json blosc = {{"id", "blosc"}, {"cname", "zstd"}, {"clevel", 5}, {"shuffle", 1},
                      {"blocksize", 0}};
  json blosc42 = blosc;
  blosc42["clevel"] = 42;
  const std::vector<Case> cases = {
      {Format::V2, {{"id", "zlib"}, {"level", 1}}, {{"id", "zlib"}, {"level", -1}},
       "zlib level -1 is out of range 0 to 9"},
      {Format::V2, {{"id", "gzip"}, {"level", 1}}, {{"id", "gzip"}, {"level", -1}},
       "gzip level -1 is out of range 0 to 9"},
      {Format::V2, {{"id", "zstd"}, {"level", 3}}, {{"id", "zstd"}, {"level", 30}},
       "zstd level 30 is out of range"},
      {Format::V2, blosc, blosc42, "blosc clevel 42 is out of range 0 to 9"},
      {Format::V3, {{"name", "gzip"}, {"configuration", {{"level", 1}}}},
       {{"name", "gzip"}, {"configuration", {{"level", -1}}}}, "gzip level -1 is out of range"},
      {Format::V3, {{"name", "zstd"}, {"configuration", {{"level", 3}, {"checksum", false}}}},
       {{"name", "zstd"}, {"configuration", {{"level", 100}, {"checksum", false}}}},
       "zstd level 100 is out of range"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.odd.dump());
    TempDir dir;
    const auto with = [&](const json& compressor) {
      return [&](json& d) {
        if (c.format == Format::V2) d["compressor"] = compressor;
        else d["codecs"][1] = compressor;
      };
    };
    const auto write = [&](const json& compressor) {
      return c.format == Format::V2 ? write_v2(dir, with(compressor))
                                    : write_v3(dir, with(compressor));
    };
    const std::string path = write(c.written);
    const std::vector<uint8_t> data = make_values(DType::Float32, 70, 3);
    write_logical(Array::open(path), data);
    write(c.odd);  // the same chunks, their metadata now naming the odd level
    const Array odd = Array::open(path);
    EXPECT_TRUE(read_logical(odd) == data);
    // Writing into it is refused, naming the store, the chunk and the level.
    expect_input_error([&] { write_logical(odd, data); }, {path, "chunk ", c.refused});
    TempDir other;
    expect_input_error([&] { Array::create(other.file("b"), odd.meta()); },
                       {other.file("b"), c.refused});
  }
}

TEST(Zarr, ReadsZstdFramesWithChecksumsAndDetectsCorruption) {
  TempDir dir;
  const std::string path = write_v3(dir, [](json& d) {
    d["codecs"][1]["configuration"]["checksum"] = true;
  });
  const Array a = Array::open(path);
  std::vector<uint8_t> chunk = make_values(DType::Float32, 12, 3);
  ZSTD_CCtx* cctx = ZSTD_createCCtx();
  ZSTD_CCtx_setParameter(cctx, ZSTD_c_checksumFlag, 1);
  std::vector<uint8_t> frame(ZSTD_compressBound(chunk.size()));
  frame.resize(ZSTD_compress2(cctx, frame.data(), frame.size(), chunk.data(), chunk.size()));
  ZSTD_freeCCtx(cctx);
  fs::create_directories(path + "/c/0");
  write_bytes(path + "/c/0/0", as_string(frame));
  std::vector<uint8_t> back(chunk.size());
  EXPECT_TRUE(a.read_chunk({0, 0}, back.data()));
  EXPECT_EQ(back, chunk);
  frame[frame.size() - 1] ^= 0x55;  // the checksum is the frame's last 4 bytes
  write_bytes(path + "/c/0/0", as_string(frame));
  expect_input_error([&] { a.read_chunk({0, 0}, back.data()); }, {path, "chunk 'c/0/0'", "zstd"});
}

// Skippable frames (pzstd starts every file with one) hold no data, and a chunk may be several
// frames: what the frames declare is summed, and only a wrong sum is refused.
TEST(Zarr, ReadsZstdChunksOfSeveralFramesAndSkippableOnes) {
  TempDir dir;
  const std::string path = write_v3(dir, [](json&) {});
  const Array a = Array::open(path);
  const std::vector<uint8_t> chunk = make_values(DType::Float32, 12, 4);
  const auto frame_of = [&](size_t begin, size_t end) {
    std::vector<uint8_t> f(ZSTD_compressBound(end - begin));
    f.resize(ZSTD_compress(f.data(), f.size(), chunk.data() + begin, end - begin, 3));
    return as_string(f);
  };
  // Magic 0x184D2A50 and a 4-byte length, little-endian, then that many bytes of anything.
  const std::string skippable = std::string("\x50\x2a\x4d\x18\x05\x00\x00\x00", 8) + "hello";
  fs::create_directories(path + "/c/0");
  std::vector<uint8_t> back(chunk.size());
  for (const std::string& bytes :
       {skippable + frame_of(0, chunk.size()), frame_of(0, 20) + skippable + frame_of(20, 48),
        frame_of(0, chunk.size()) + skippable}) {
    write_bytes(path + "/c/0/0", bytes);
    std::fill(back.begin(), back.end(), 0);
    EXPECT_TRUE(a.read_chunk({0, 0}, back.data()));
    EXPECT_EQ(back, chunk);
  }
  write_bytes(path + "/c/0/0", skippable + frame_of(0, 20) + frame_of(20, 44));
  expect_input_error([&] { a.read_chunk({0, 0}, back.data()); },
                     {"chunk 'c/0/0'", "zstd frames declare 44 bytes; expected 48 bytes"});
  write_bytes(path + "/c/0/0", skippable);
  expect_input_error([&] { a.read_chunk({0, 0}, back.data()); },
                     {"chunk 'c/0/0'", "zstd frame declares 0 bytes; expected 48 bytes"});
}

// A v2 array or group with a stray zarr.json beside its metadata is refused as ambiguous: the
// zarr.json was taken, and the v2 array's chunks read as fill values without a word.
TEST(Zarr, AV2ArrayOrGroupWithAStrayZarrJsonIsRefused) {
  TempDir dir;
  const std::string path = dir.file("a");
  write_logical(Array::create(path, make_meta(Format::V2, DType::UInt8, {4, 3}, {2, 3}, "zstd")),
                make_values(DType::UInt8, 12, 5));
  Array::create(dir.file("v3"), make_meta(Format::V3, DType::UInt8, {4, 3}, {2, 3}, "zstd"));
  fs::copy_file(dir.file("v3/zarr.json"), path + "/zarr.json");
  expect_input_error([&] { Array::open(path); },
                     {path, "both zarr.json (Zarr v3) and .zarray (Zarr v2)"});
  const std::string group = dir.file("g");
  Group::create(group, Format::V2);
  Group::create(dir.file("g3"), Format::V3);
  fs::copy_file(dir.file("g3/zarr.json"), group + "/zarr.json");
  expect_input_error([&] { Group::open(group); },
                     {group, "both zarr.json (Zarr v3) and .zgroup (Zarr v2)"});
}

// ---- bad chunks ----

class BadChunk : public ::testing::TestWithParam<std::tuple<Format, std::string>> {};

TEST_P(BadChunk, IsAnInputErrorNamingStoreAndKey) {
  const auto& [format, compressor] = GetParam();
  TempDir dir;
  const ArrayMeta meta = make_meta(format, DType::Int64, {40, 8}, {20, 8}, compressor);
  const Array a = Array::create(dir.file("a"), meta);
  const std::vector<uint8_t> data = make_values(DType::Int64, 320, 9);
  write_logical(a, data);
  const std::string key = a.chunk_key({1, 0});
  const std::string file = dir.file("a/" + key);
  const std::string good = read_bytes(file);
  std::vector<uint8_t> out(meta.chunk_bytes());
  const auto expect_bad = [&](const std::string& bytes, const std::string& why) {
    SCOPED_TRACE(why);
    write_bytes(file, bytes);
    expect_input_error([&] { a.read_chunk({1, 0}, out.data()); },
                       {"zarr store '" + dir.file("a") + "'", "chunk '" + key + "'", "expected"});
  };
  expect_bad("", "empty file");
  expect_bad(good.substr(0, good.size() / 2), "truncated");
  expect_bad(good.substr(0, good.size() - 1), "one byte short");
  expect_bad(good + "x", "one byte extra");
  std::mt19937 gen(5);
  std::string garbage(good.size(), '\0');
  for (char& c : garbage) c = char(gen());
  // Uncompressed chunks have no structure: random bytes of the right size are valid data.
  if (meta.compressor.kind != Compressor::Kind::None) expect_bad(garbage, "random bytes");
  expect_bad(std::string(meta.chunk_bytes() * 2 + 1000, 'z'), "file larger than any chunk");
  // A valid stream of the wrong size: the first half of the chunk, compressed alone.
  const std::vector<uint8_t> half =
      compress(meta.compressor, data.data(), meta.chunk_bytes() / 2, 8);
  expect_bad(as_string(half), "decompresses to the wrong size");
  if (meta.compressor.kind != Compressor::Kind::None) {
    std::string bad_header = good;
    for (size_t i = 0; i < 8 && i < bad_header.size(); ++i) bad_header[i] = char(~bad_header[i]);
    expect_bad(bad_header, "corrupt header");
  }
  // The good chunk still reads back (the file was restored).
  write_bytes(file, good);
  EXPECT_TRUE(a.read_chunk({1, 0}, out.data()));
}

std::string bad_chunk_name(const ::testing::TestParamInfo<BadChunk::ParamType>& info) {
  std::string name = std::string(std::get<0>(info.param) == Format::V2 ? "v2_" : "v3_") +
                     std::get<1>(info.param);
  for (char& ch : name) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return name;
}

INSTANTIATE_TEST_SUITE_P(Compressors, BadChunk,
                         ::testing::Combine(::testing::Values(Format::V2, Format::V3),
                                            ::testing::Values("none", "zstd", "blosc-lz4",
                                                              "blosc-zstd", "gzip")),
                         bad_chunk_name);
INSTANTIATE_TEST_SUITE_P(V2Only, BadChunk,
                         ::testing::Combine(::testing::Values(Format::V2),
                                            ::testing::Values("zlib")),
                         bad_chunk_name);

// Large compressed chunk files are mapped instead of read (Array::kMapChunkFilesFrom): the same
// bytes, and the same errors for a bad file, as the read path above.
TEST(Zarr, LargeCompressedChunksAreMappedAndCheckedAsSmallOnes) {
  for (const std::string compressor : {"zstd", "blosc-lz4"}) {
    SCOPED_TRACE(compressor);
    TempDir dir;
    // Random bytes barely compress: every chunk file is over the mapping threshold.
    const ArrayMeta meta = make_meta(Format::V3, DType::UInt8, {40, 65536}, {20, 65536}, compressor);
    const Array a = Array::create(dir.file("a"), meta);
    std::mt19937 gen(11);
    std::vector<uint8_t> data(40 * 65536);
    for (auto& b : data) b = uint8_t(gen());
    a.write_chunk({1, 0}, data.data() + meta.chunk_bytes());
    const std::string key = a.chunk_key({1, 0});
    const std::string file = dir.file("a/" + key);
    const std::string good = read_bytes(file);
    ASSERT_GE(good.size() / 2, Array::kMapChunkFilesFrom);  // even the truncated one is mapped
    std::vector<uint8_t> out(meta.chunk_bytes());
    EXPECT_TRUE(a.read_chunk({1, 0}, out.data()));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + long(meta.chunk_bytes())));
    const auto expect_bad = [&](const std::string& bytes, const std::string& why) {
      SCOPED_TRACE(why);
      write_bytes(file, bytes);
      expect_input_error([&] { a.read_chunk({1, 0}, out.data()); },
                         {"zarr store '" + dir.file("a") + "'", "chunk '" + key + "'"});
    };
    expect_bad(good.substr(0, good.size() / 2), "truncated");
    expect_bad(good.substr(0, good.size() - 1), "one byte short");
    std::string bad_header = good;
    for (size_t i = 0; i < 8; ++i) bad_header[i] = char(~bad_header[i]);
    expect_bad(bad_header, "corrupt header");
    write_bytes(file, good);
    std::fill(out.begin(), out.end(), 0);
    EXPECT_TRUE(a.read_chunk({1, 0}, out.data()));
    EXPECT_TRUE(std::equal(out.begin(), out.end(), data.begin() + long(meta.chunk_bytes())));
  }
}

TEST(Zarr, BloscHeaderClaimingAnotherSizeIsRefused) {
  const std::vector<uint8_t> data = make_values(DType::Float32, 256, 4);
  const Compressor c = Compressor::parse("blosc-lz4");
  std::vector<uint8_t> stored = compress(c, data.data(), data.size(), 4);
  std::vector<uint8_t> out(data.size());
  // Bytes 4..7 of the blosc header hold the decompressed size.
  std::vector<uint8_t> bigger = stored;
  bigger[5] ^= 0x10;
  expect_input_error([&] { decompress(c, bigger.data(), bigger.size(), out.data(), out.size(), "W"); },
                     {"W: ", "decompressed bytes", "expected 1024 bytes"});
  // The right data but a caller expecting a different size.
  std::vector<uint8_t> small(512);
  expect_input_error([&] { decompress(c, stored.data(), stored.size(), small.data(), 512, "W"); },
                     {"W: ", "expected 512 bytes"});
  decompress(c, stored.data(), stored.size(), out.data(), out.size(), "W");
  EXPECT_EQ(out, data);
}

// ---- bad metadata ----

TEST(Zarr, BadV2MetadataIsAnInputErrorNamingTheFile) {
  const std::vector<std::pair<std::string, std::function<void(json&)>>> cases = {
      {"dimensions", [](json& d) { d["chunks"] = {3}; }},
      {"chunk length > 0", [](json& d) { d["chunks"] = {3, 0}; }},
      {"non-negative", [](json& d) { d["shape"] = {-7, 10}; }},
      {"dtype \"<c8\" is not supported", [](json& d) { d["dtype"] = "<c8"; }},
      {"dtype \"|b1\"", [](json& d) { d["dtype"] = "|b1"; }},
      {"big-endian", [](json& d) { d["dtype"] = ">i8"; }},
      {"order \"F\"", [](json& d) { d["order"] = "F"; }},
      {"filters", [](json& d) { d["filters"] = {{{"id", "delta"}, {"dtype", "<f4"}}}; }},
      {"compressor \"lzma\"", [](json& d) { d["compressor"] = {{"id", "lzma"}, {"preset", 1}}; }},
      {"missing \"level\" in the zlib compressor",
       [](json& d) { d["compressor"] = {{"id", "zlib"}}; }},
      {"blosc compressor 'nope'", [](json& d) { d["compressor"]["cname"] = "nope"; }},
      {"missing \"id\"", [](json& d) { d["compressor"].erase("id"); }},
      {"\"zarr_format\"", [](json& d) { d["zarr_format"] = 3; }},
      {"missing \"shape\"", [](json& d) { d.erase("shape"); }},
      {"missing \"fill_value\"", [](json& d) { d.erase("fill_value"); }},
      {"fill_value \"zero\"", [](json& d) { d["fill_value"] = "zero"; }},
      {"fill_value 1.5 is not an int64 value", [](json& d) { d["dtype"] = "<i8"; d["fill_value"] = 1.5; }},
      {"fill_value 256 is not a uint8 value", [](json& d) { d["dtype"] = "|u1"; d["fill_value"] = 256; }},
      {"not exactly representable",
       [](json& d) { d["dtype"] = "<u8"; d["fill_value"] = 18446744073709551615ull; }},
      {"dimension_separator", [](json& d) { d["dimension_separator"] = "-"; }},
      {"too large", [](json& d) { d["shape"] = {int64_t(1) << 40, int64_t(1) << 40}; }},
      // No rows, but a row's length overflows all the same (readers multiply it out).
      {"too large",
       [](json& d) {
         d["shape"] = {0, int64_t(1) << 40, int64_t(1) << 23};
         d["chunks"] = {1, 1, 1};
       }},
      {"bytes per chunk", [](json& d) { d["chunks"] = {int64_t(1) << 20, int64_t(1) << 20}; }},
      {"expected at most 32", [](json& d) { d["shape"] = std::vector<int>(40, 1); }},
      {"expected an integer", [](json& d) { d["compressor"]["clevel"] = "5"; }},
      {"blosc shuffle 7 is not 0, 1 or 2", [](json& d) { d["compressor"]["shuffle"] = 7; }},
      {"blosc blocksize -5 is negative", [](json& d) { d["compressor"]["blocksize"] = -5; }},
  };
  for (const auto& [expected, edit] : cases) {
    SCOPED_TRACE(expected);
    TempDir dir;
    const std::string path = write_v2(dir, edit);
    expect_input_error([&] { Array::open(path); },
                       {"zarr store '" + path + "'", "metadata '.zarray'", expected});
  }
}

// The test document's codecs as the inner chain of a sharding_indexed codec, inner chunks [3, 2]
// (of the shard's [3, 4]), the index as zarr-python writes it.
void shard_codecs(json& d) {
  json sharding = json::parse(R"({"name": "sharding_indexed", "configuration": {
      "chunk_shape": [3, 2],
      "index_codecs": [{"name": "bytes", "configuration": {"endian": "little"}},
                       {"name": "crc32c"}],
      "index_location": "end"}})");
  sharding["configuration"]["codecs"] = d["codecs"];
  d["codecs"] = json::array({sharding});
}

TEST(Zarr, BadV3MetadataIsAnInputErrorNamingTheFile) {
  const auto sharded = [](const std::function<void(json&)>& edit) {
    return [edit](json& d) {
      shard_codecs(d);
      edit(d["codecs"][0]["configuration"]);
    };
  };
  const std::vector<std::pair<std::string, std::function<void(json&)>>> cases = {
      {"dimensions", [](json& d) { d["chunk_grid"]["configuration"]["chunk_shape"] = {3}; }},
      {"chunk length > 0", [](json& d) { d["chunk_grid"]["configuration"]["chunk_shape"] = {0, 4}; }},
      {"data_type \"complex64\"", [](json& d) { d["data_type"] = "complex64"; }},
      {"expected a string", [](json& d) { d["data_type"] = {{"name", "float32"}}; }},
      {"codec \"transpose\"",
       [](json& d) { d["codecs"].insert(d["codecs"].begin(), json::object({{"name", "transpose"}})); }},
      {"missing \"chunk_shape\" in the sharding_indexed codec",
       [](json& d) { d["codecs"] = json::array({json::object({{"name", "sharding_indexed"}})}); }},
      {"inner chunks [2, 4]: expected inner chunk lengths > 0 that divide the shard's",
       sharded([](json& c) { c["chunk_shape"] = {2, 4}; })},
      {"inner chunks [3]: not the same number of dimensions",
       sharded([](json& c) { c["chunk_shape"] = {3}; })},
      {"shards [2200000, 1000] of float32 is more than 2147483631 bytes per shard; expected "
       "smaller shards (Tandem reads a shard whole)",
       [](json& d) {
         d["shape"] = {4400000, 1000};
         d["chunk_grid"]["configuration"]["chunk_shape"] = {2200000, 1000};
         shard_codecs(d);
         d["codecs"][0]["configuration"]["chunk_shape"] = {1000, 1000};
       }},
      {"chunks [2200000, 1000] of float32 is more than 2147483631 bytes per chunk; expected "
       "smaller chunks",
       [](json& d) {
         d["shape"] = {4400000, 1000};
         d["chunk_grid"]["configuration"]["chunk_shape"] = {2200000, 1000};
       }},
      {"codec \"sharding_indexed\" at position 0 is not supported",  // nested
       [](json& d) {
         shard_codecs(d);
         shard_codecs(d);
       }},
      {"codec \"crc32c\" after sharding_indexed is not supported",
       [](json& d) {
         shard_codecs(d);
         d["codecs"].push_back({{"name", "crc32c"}});
       }},
      {"index codec \"crc32c\" is not supported",
       sharded([](json& c) { c["index_codecs"].erase(0); })},
      {"index codec \"zstd\" is not supported",
       sharded([](json& c) { c["index_codecs"][1] = {{"name", "zstd"}}; })},
      {"big-endian",
       sharded([](json& c) { c["index_codecs"][0]["configuration"]["endian"] = "big"; })},
      {"index_location \"middle\"", sharded([](json& c) { c["index_location"] = "middle"; })},
      {"codec \"transpose\" at position 0",
       sharded([](json& c) { c["codecs"][0] = {{"name", "transpose"}}; })},
      // crc32c is read only last (a checksum of what the codecs before it wrote); one compressor.
      {"codec \"crc32c\" at position 1",
       [](json& d) {
         d["codecs"].insert(d["codecs"].begin() + 1, json::object({{"name", "crc32c"}}));
       }},
      {"codec \"gzip\" at position 2",
       [](json& d) { d["codecs"].push_back(json::object({{"name", "gzip"}})); }},
      {"missing \"level\" in the gzip codec",
       [](json& d) { d["codecs"][1] = json::object({{"name", "gzip"}}); }},
      {"codec \"zlib\" at position 1",
       [](json& d) {
         d["codecs"][1] = {{"name", "zlib"}, {"configuration", {{"level", 1}}}};
       }},
      {"codec \"zstd\" at position 0", [](json& d) { d["codecs"].erase(0); }},
      {"\"codecs\" is []", [](json& d) { d["codecs"] = json::array(); }},
      {"big-endian", [](json& d) { d["codecs"][0]["configuration"]["endian"] = "big"; }},
      {"no \"endian\"", [](json& d) { d["codecs"][0].erase("configuration"); }},
      {"chunk_grid \"rectangular\"", [](json& d) { d["chunk_grid"]["name"] = "rectangular"; }},
      {"chunk_key_encoding \"foo\"", [](json& d) { d["chunk_key_encoding"]["name"] = "foo"; }},
      {"separator \"-\"",
       [](json& d) { d["chunk_key_encoding"]["configuration"]["separator"] = "-"; }},
      {"unknown field \"foo\"", [](json& d) { d["foo"] = 1; }},
      {"unknown field \"ext\"", [](json& d) { d["ext"] = {{"must_understand", true}}; }},
      {"storage_transformers", [](json& d) { d["storage_transformers"] = json::array({json::object({{"name", "x"}})}); }},
      {"node_type is \"group\"", [](json& d) { d["node_type"] = "group"; }},
      {"\"dimension_names\"", [](json& d) { d["dimension_names"] = {"x"}; }},
      {"fill_value \"0x7fc0\"", [](json& d) { d["fill_value"] = "0x7fc0"; }},
      {"fill_value null", [](json& d) { d["fill_value"] = nullptr; }},
      {"\"zarr_format\"", [](json& d) { d["zarr_format"] = 2; }},
      {"blosc shuffle \"yes\"",
       [](json& d) {
         d["codecs"][1] = {{"name", "blosc"},
                           {"configuration", {{"cname", "lz4"}, {"clevel", 5}, {"shuffle", "yes"}}}};
       }},
      {"\"attributes\"", [](json& d) { d["attributes"] = {1, 2}; }},
  };
  for (const auto& [expected, edit] : cases) {
    SCOPED_TRACE(expected);
    TempDir dir;
    const std::string path = write_v3(dir, edit);
    expect_input_error([&] { Array::open(path); },
                       {"zarr store '" + path + "'", "metadata 'zarr.json'", expected});
  }
}

TEST(Zarr, UnparseableMetadataIsAnInputError) {
  const std::vector<std::pair<std::string, std::string>> texts = {
      {"{\"zarr_format\": 2, ", "not valid JSON"},
      {"", "not valid JSON"},
      {"[2]", "not a JSON object"},
      {"\"\xff\xfe\"", "not valid JSON"},
      {std::string(100, '[') + std::string(100, ']'), "nested more than 64"},
      {R"({"a": NaN, "b": })", "with NaN, Infinity and -Infinity read as quoted strings"},
  };
  for (const char* name : {".zarray", "zarr.json"}) {
    for (const auto& [text, expected] : texts) {
      TempDir dir;
      fs::create_directories(dir.file("a"));
      write_bytes(dir.file("a/") + name, text);
      expect_input_error([&] { Array::open(dir.file("a")); },
                         {dir.file("a"), std::string("metadata '") + name + "'", expected});
    }
  }
}

TEST(Zarr, OpeningWhatIsNotAnArrayIsAnInputError) {
  TempDir dir;
  expect_input_error([&] { Array::open(dir.file("nothing")); }, {dir.file("nothing"), "no Zarr array"});
  Group::create(dir.file("g2"), Format::V2);
  expect_input_error([&] { Array::open(dir.file("g2")); }, {dir.file("g2"), "group"});
  Group::create(dir.file("g3"), Format::V3);
  expect_input_error([&] { Array::open(dir.file("g3")); }, {dir.file("g3"), "node_type"});
  fs::create_directories(dir.file("d/.zarray"));
  expect_input_error([&] { Array::open(dir.file("d")); }, {dir.file("d"), "not a regular file"});
}

TEST(Zarr, CreateValidatesAndRefusesExistingArrays) {
  TempDir dir;
  const std::string path = dir.file("a");
  Array::create(path, make_meta(Format::V3, DType::UInt8, {4}, {2}));
  expect_input_error([&] { Array::create(path, make_meta(Format::V3, DType::UInt8, {4}, {2})); },
                     {path, "already holds"});
  expect_input_error([&] { Array::create(dir.file("z"), make_meta(Format::V2, DType::UInt8, {4}, {0})); },
                     {dir.file("z"), ".zarray", "chunk length > 0"});
  expect_input_error(
      [&] { Array::create(dir.file("f"), make_meta(Format::V3, DType::UInt8, {4}, {2}, "none", -1)); },
      {dir.file("f"), "zarr.json", "fill_value"});
  ArrayMeta bad_attributes = make_meta(Format::V3, DType::UInt8, {4}, {2});
  bad_attributes.attributes = json::array();
  expect_input_error([&] { Array::create(dir.file("b"), bad_attributes); }, {"attributes"});
}

// ---- attributes and groups ----

TEST(Zarr, AttributesRoundTrip) {
  for (const Format format : {Format::V2, Format::V3}) {
    TempDir dir;
    ArrayMeta meta = make_meta(format, DType::UInt8, {4}, {2});
    meta.attributes = {{"source", "test"}};
    Array a = Array::create(dir.file("a"), meta);
    EXPECT_EQ(Array::open(dir.file("a")).meta().attributes, meta.attributes);
    a.set_attributes({{"n", 3}, {"list", {1, 2}}});
    EXPECT_EQ(Array::open(dir.file("a")).meta().attributes, json({{"n", 3}, {"list", {1, 2}}}));
    expect_input_error([&] { a.set_attributes(json::array()); }, {dir.file("a"), "JSON object"});
  }
  // v3: rewriting attributes keeps fields Tandem does not model.
  TempDir dir;
  const std::string path = write_v3(dir, [](json& d) { d["dimension_names"] = {"r", "c"}; });
  Array a = Array::open(path);
  a.set_attributes({{"k", "v"}});
  const json doc = json::parse(read_bytes(path + "/zarr.json"));
  EXPECT_EQ(doc["dimension_names"], json({"r", "c"}));
  EXPECT_EQ(doc["attributes"], json({{"k", "v"}}));
}

// Python's json module, which zarr-python writes attributes with, writes a NaN or an infinity as
// a bare NaN, Infinity or -Infinity: not JSON, but zarr-python reads its own stores back, and so
// does Tandem (as Zarr's strings for them, "NaN" and so on).
TEST(Zarr, NonFiniteNumbersInAttributesAsPythonWritesThem) {
  EXPECT_EQ(detail::quote_nonfinite_numbers(
                R"({"a": NaN, "b": [Infinity,-Infinity, -1.5e3], "s": "NaN \"Infinity\" -I"})"),
            R"({"a": "NaN", "b": ["Infinity","-Infinity", -1.5e3], "s": "NaN \"Infinity\" -I"})");
  const std::string valid = R"({"n": -1, "e": 2E-3, "t": [true, false, null], "s": "\\"})";
  EXPECT_EQ(detail::quote_nonfinite_numbers(valid), valid);
  const std::string attributes = R"({"stat": NaN, "range": [-Infinity, Infinity]})";
  const json expected = {{"stat", "NaN"}, {"range", {"-Infinity", "Infinity"}}};
  {  // v2: an array's .zattrs and a group's
    TempDir dir;
    const std::string path = write_v2(dir, [](json&) {});
    write_bytes(path + "/.zattrs", attributes);
    EXPECT_EQ(Array::open(path).meta().attributes, expected);
    Group::create(dir.file("g"), Format::V2);
    write_bytes(dir.file("g/.zattrs"), attributes);
    EXPECT_EQ(Group::open(dir.file("g")).second, expected);
  }
  {  // v3: zarr.json's attributes, and rewriting them keeps the rest
    TempDir dir;
    const std::string path = write_v3(dir, [](json& d) { d["attributes"] = {{"x", "@"}}; });
    std::string text = read_bytes(path + "/zarr.json");
    const std::string placeholder = R"("x": "@")";
    const size_t at = text.find(placeholder);
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, placeholder.size(), R"("stat": NaN, "range": [-Infinity, Infinity])");
    write_bytes(path + "/zarr.json", text);
    Array a = Array::open(path);
    EXPECT_EQ(a.meta().attributes, expected);
    a.set_attributes({{"k", "v"}});
    EXPECT_EQ(Array::open(path).meta().attributes, json({{"k", "v"}}));
    Group::create(dir.file("g"), Format::V3);
    std::string group = read_bytes(dir.file("g/zarr.json"));
    const size_t open = group.find("\"attributes\"");
    ASSERT_NE(open, std::string::npos) << group;
    group.replace(group.find('{', open), group.find('}', open) - group.find('{', open) + 1,
                  attributes);
    write_bytes(dir.file("g/zarr.json"), group);
    EXPECT_TRUE(Group::exists(dir.file("g")));  // (what prepare --overwrite asks)
    EXPECT_EQ(Group::open(dir.file("g")).second, expected);
  }
}

TEST(Zarr, Groups) {
  for (const Format format : {Format::V2, Format::V3}) {
    TempDir dir;
    const std::string path = dir.file("g");
    EXPECT_FALSE(Group::exists(path));
    Group::create(path, format, {{"name", "fashion"}});
    EXPECT_TRUE(Group::exists(path));
    EXPECT_TRUE(fs::is_regular_file(path + (format == Format::V2 ? "/.zgroup" : "/zarr.json")));
    auto [f, attributes] = Group::open(path);
    EXPECT_EQ(f, format);
    EXPECT_EQ(attributes, json({{"name", "fashion"}}));
    // Re-creating rewrites the attributes.
    Group::create(path, format);
    EXPECT_EQ(Group::open(path).second, json::object());
    // Arrays inside a group, and a group is not an array nor the reverse.
    Array::create(path + "/images", make_meta(format, DType::UInt8, {4, 4}, {2, 4}));
    EXPECT_FALSE(Group::exists(path + "/images"));
    expect_input_error([&] { Group::open(path + "/images"); }, {path + "/images"});
    expect_input_error([&] { Group::create(path + "/images", format); }, {path + "/images", "array"});
    expect_input_error([&] { Group::open(dir.file("none")); }, {dir.file("none"), "no Zarr group"});
  }
  TempDir dir;
  fs::create_directories(dir.file("bad"));
  write_bytes(dir.file("bad/zarr.json"), "{nope");
  EXPECT_FALSE(Group::exists(dir.file("bad")));
  expect_input_error([&] { Group::open(dir.file("bad")); }, {dir.file("bad"), "zarr.json"});
}

// ---- compressor names ----

TEST(Zarr, CompressorParseAndDescribe) {
  const std::vector<std::pair<std::string, std::string>> good = {
      {"none", "none"},
      {"zstd", "zstd:3"},
      {"zstd:9", "zstd:9"},
      {"zstd:-5", "zstd:-5"},
      {"blosc-lz4", "blosc-lz4:5"},
      {"blosc-zstd:3", "blosc-zstd:3"},
      {"blosc-lz4-bitshuffle:1", "blosc-lz4-bitshuffle:1"},
      {"blosc-blosclz-noshuffle", "blosc-blosclz-noshuffle:5"},
      {"blosc-zlib-shuffle:9", "blosc-zlib:9"},
      {"gzip", "gzip:5"},
      {"gzip:0", "gzip:0"},
      {"zlib", "zlib:1"},
      {"zlib:9", "zlib:9"},
  };
  for (const auto& [text, described] : good) {
    const Compressor c = Compressor::parse(text);
    EXPECT_EQ(c.describe(), described);
    EXPECT_EQ(Compressor::parse(c.describe()).describe(), described);
  }
  for (const std::string bad : {"", "gz", "zstd:", "zstd:x", "zstd:3x", "zstd:99", "none:1",
                                "blosc", "blosc-", "blosc-foo", "blosc-lz4:10", "blosc-lz4-swap",
                                "gzip:10", "gzip:-1", "zlib:", "gzip-lz4"}) {
    expect_input_error([&] { Compressor::parse(bad); }, {"compressor '" + bad + "'", "expected"});
  }
  EXPECT_EQ(parse_dtype_name("float32"), DType::Float32);
  expect_input_error([] { parse_dtype_name("float16"); }, {"float16"});
}

// zarr-python 3's numcodecs (PyPI) has no snappy: a blosc-snappy store Tandem wrote could not be
// read there, so Tandem does not write one (its reading is in python/zarr_interop_test.sh, from a
// store Debian's zarr 2.13 writes).
TEST(Zarr, BloscSnappyIsNotWritten) {
  for (const std::string text : {"blosc-snappy", "blosc-snappy-noshuffle:3"}) {
    expect_input_error([&] { Compressor::parse(text); },
                       {"compressor '" + text + "'", "snappy", "zarr-python", "expected"});
  }
  ArrayMeta meta = make_meta(Format::V2, DType::UInt8, {10}, {5}, "blosc-lz4");
  meta.compressor.blosc_cname = "snappy";
  for (const Format format : {Format::V2, Format::V3}) {
    TempDir dir;
    meta.format = format;
    expect_input_error([&] { Array::create(dir.file("a"), meta); },
                       {dir.file("a"), "blosc-snappy", "zarr-python"});
    EXPECT_FALSE(fs::exists(dir.file("a")));  // refused before anything is written
  }
}

// ---- fuzz ----

// Random bytes and mutated valid chunks for each codec, and mutated metadata for Array::open: the
// only acceptable outcomes are success or a tandem::Error, within a bounded time and memory.
TEST(Zarr, FuzzDecompressAndOpen) {
  // A fixed seed keeps failures reproducible; ZARR_FUZZ_SEED explores other inputs.
  const char* env = std::getenv("ZARR_FUZZ_SEED");
  const uint32_t seed = env ? uint32_t(std::strtoul(env, nullptr, 10)) : 20240611u;
  std::printf("zarr fuzz seed %u (set ZARR_FUZZ_SEED to change it)\n", seed);
  std::mt19937 gen(seed);
  const auto start = std::chrono::steady_clock::now();
  const auto rnd = [&](size_t n) { return n == 0 ? size_t(0) : size_t(gen() % n); };
  size_t errors = 0, successes = 0;
  const auto attempt = [&](const std::function<void()>& f) {
    try {
      f();
      ++successes;
    } catch (const Error&) {
      ++errors;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a tandem::Error: " << e.what();
    }
  };
  const auto mutate = [&](std::string s) {
    const int edits = 1 + int(rnd(4));
    for (int e = 0; e < edits; ++e) {
      switch (rnd(5)) {
        case 0: if (!s.empty()) s[rnd(s.size())] = char(gen()); break;
        case 1: if (!s.empty()) s.erase(rnd(s.size()), 1 + rnd(8)); break;
        case 2: s.insert(rnd(s.size() + 1), std::string(1 + rnd(4), char(gen()))); break;
        case 3: s.resize(rnd(s.size() + 1)); break;
        default: if (!s.empty()) s[rnd(s.size())] ^= char(1 << rnd(8)); break;
      }
    }
    return s;
  };

  // Chunks: 1500 tries over the codecs.
  const std::vector<Compressor> codecs = {Compressor::parse("zstd"), Compressor::parse("blosc-lz4"),
                                          Compressor::parse("blosc-zstd-bitshuffle"),
                                          Compressor::parse("gzip"), Compressor::parse("zlib")};
  const std::vector<uint8_t> plain = make_values(DType::Float32, 512, 11);
  std::vector<std::string> valid;
  for (const Compressor& c : codecs) valid.push_back(as_string(compress(c, plain.data(), plain.size(), 4)));
  std::vector<uint8_t> out(plain.size());
  for (int i = 0; i < 1500; ++i) {
    const size_t which = rnd(codecs.size());
    std::string input;
    if (i % 3 == 0) {
      input.resize(rnd(600));
      for (char& c : input) c = char(gen());
    } else {
      input = mutate(valid[which]);
    }
    const size_t out_size = i % 5 == 0 ? rnd(out.size() + 1) : out.size();
    attempt([&] {
      decompress(codecs[which], reinterpret_cast<const uint8_t*>(input.data()), input.size(),
                 out.data(), out_size, "fuzz");
    });
  }

  // Metadata: 1500 tries, text-level mutations and field-level replacements with odd values. The
  // store holds real v2 and v3 chunks, so chunks are also decoded under mutated metadata.
  TempDir dir;
  const std::string path = dir.file("a");
  const std::vector<uint8_t> values = make_values(DType::Float32, 70, 12);
  write_logical(Array::create(path, make_meta(Format::V3, DType::Float32, {7, 10}, {3, 4}, "zstd")),
                values);
  const std::string v3_text = read_bytes(path + "/zarr.json");
  fs::remove(path + "/zarr.json");
  write_logical(
      Array::create(path, make_meta(Format::V2, DType::Float32, {7, 10}, {3, 4}, "blosc-lz4")),
      values);
  const std::string v2_text = read_bytes(path + "/.zarray");
  const std::vector<json> odd = {nullptr, true, 0, -1, 1, 3, 255, 1.5, 1e300, -1e300,
                                 int64_t(1) << 62, 18446744073709551615ull, "", "NaN", "x",
                                 "<f4", ">f4", "float32", json::array(), json::object(),
                                 {1, 2}, {0}, {-1, 4}, {1 << 30, 1 << 30}, {{"name", "bytes"}}};
  std::vector<uint8_t> chunk;
  for (int i = 0; i < 1500; ++i) {
    const bool v3 = i % 2 == 0;
    const std::string name = v3 ? "zarr.json" : ".zarray";
    std::string text = v3 ? v3_text : v2_text;
    if (i % 3 == 0) {
      text = mutate(text);
    } else {
      // Replace a random (possibly nested) field with an odd value.
      json doc = json::parse(text);
      json* node = &doc;
      while ((node->is_object() || node->is_array()) && !node->empty() && rnd(3) != 0) {
        auto it = node->begin();
        std::advance(it, rnd(node->size()));
        node = &*it;
      }
      *node = odd[rnd(odd.size())];
      text = doc.dump();
    }
    write_bytes(path + "/" + name, text);
    fs::remove(path + "/" + std::string(v3 ? ".zarray" : "zarr.json"));
    attempt([&] {
      const Array a = Array::open(path);
      EXPECT_LE(a.meta().chunk_bytes(), size_t(2147483647));
      // A chunk read under the mutated metadata: missing, or the wrong size, or fine.
      if (a.meta().chunk_bytes() <= (1u << 20) && !a.meta().grid().empty() &&
          a.meta().grid()[0] > 0) {
        chunk.resize(a.meta().chunk_bytes());
        std::vector<int64_t> index(a.meta().shape.size(), 0);
        a.read_chunk(index, chunk.data());
      }
    });
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("zarr fuzz: %zu errors, %zu successes in %.2f s\n", errors, successes, seconds);
  EXPECT_GT(errors, 1000u);
  EXPECT_LT(seconds, 30.0) << "fuzzing is far slower than expected (a hang?)";
}

}  // namespace
}  // namespace tandem::zarr
