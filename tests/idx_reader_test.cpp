// Tests for IDX reading/writing and the MNIST-format loader. Files are written into a fresh
// temporary directory per test, so tests neither depend on nor disturb each other.
#include "idx_reader.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <array>
#include <cstring>
#include <filesystem>
#include <functional>

#include "tandem/dataset.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

using test::TempDir;
using test::write_bytes;
using Bytes = std::vector<uint8_t>;

template <typename T>
IdxArray make_array(IdxType type, std::vector<int64_t> dims, const std::vector<T>& values) {
  IdxArray a;
  a.type = type;
  a.dims = std::move(dims);
  a.data.resize(values.size() * sizeof(T));
  std::memcpy(a.data.data(), values.data(), a.data.size());
  return a;
}

template <typename T>
std::vector<T> values_of(const IdxArray& a) {
  std::vector<T> v(a.data.size() / sizeof(T));
  std::memcpy(v.data(), a.data.data(), v.size() * sizeof(T));
  return v;
}

std::vector<uint8_t> gzip_bytes(const TempDir& dir, const std::vector<uint8_t>& bytes) {
  const std::string tmp = dir.file("gzip_scratch");
  gzFile f = gzopen(tmp.c_str(), "wb");
  gzwrite(f, bytes.data(), unsigned(bytes.size()));
  gzclose(f);
  return test::read_bytes<Bytes>(tmp);
}

// Runs `fn`, expecting an InputError whose message names `path` and contains `phrase`.
void expect_input_error(const std::function<void()>& fn, const std::string& path,
                        const std::string& phrase) {
  try {
    fn();
    ADD_FAILURE() << "expected an InputError mentioning '" << phrase << "'";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message lacks the path: " << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << "message lacks '" << phrase << "': " << msg;
  }
}

// A 2x3 int16 array: header 00 00 0b 02, dims 2 and 3, then 12 data bytes.
std::vector<uint8_t> small_int16_file() {
  return {0, 0, 0x0B, 2, 0, 0, 0, 2, 0, 0, 0, 3, 0, 1, 0, 2, 0, 3, 0, 4, 0, 5, 0xFF, 0xFA};
}

template <typename T>
void check_round_trip(const TempDir& dir, IdxType type, const std::vector<T>& values) {
  const std::vector<int64_t> dims = {2, 3, 2};
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(std::string(idx_type_name(type)) + (gzip ? " gzip" : " raw"));
    const std::string path = dir.file(std::string(idx_type_name(type)) + (gzip ? ".gz" : ".idx"));
    write_idx(path, make_array(type, dims, values), gzip);
    const std::vector<uint8_t> on_disk = test::read_bytes<Bytes>(path);
    ASSERT_GE(on_disk.size(), 2u);
    EXPECT_EQ(gzip, on_disk[0] == 0x1f && on_disk[1] == 0x8b);
    const IdxArray back = read_idx(path);
    EXPECT_EQ(back.type, type);
    EXPECT_EQ(back.dims, dims);
    EXPECT_EQ(back.element_count(), 12);
    EXPECT_EQ(back.element_size(), sizeof(T));
    EXPECT_EQ(values_of<T>(back), values);
  }
}

TEST(IdxReaderTest, RoundTripsEveryTypeRawAndGzip) {
  TempDir dir;
  check_round_trip<uint8_t>(dir, IdxType::UInt8, {0, 1, 2, 127, 128, 200, 255, 3, 4, 5, 6, 7});
  check_round_trip<int8_t>(dir, IdxType::Int8, {-128, -1, 0, 1, 127, -50, 50, 2, -2, 3, -3, 4});
  check_round_trip<int16_t>(dir, IdxType::Int16,
                            {-32768, -1, 0, 1, 32767, -300, 300, 258, -258, 1000, -1000, 7});
  check_round_trip<int32_t>(dir, IdxType::Int32,
                            {INT32_MIN, -1, 0, 1, INT32_MAX, -70000, 70000, 16909060, -16909060,
                             123456789, -987654321, 42});
  check_round_trip<float>(dir, IdxType::Float32,
                          {-1.5f, 0.0f, 3.14159f, -2.75e-8f, 1e30f, 0.1f, -0.1f, 255.5f, -0.0f,
                           7.25f, 1.0f / 3.0f, -123.456f});
  check_round_trip<double>(dir, IdxType::Float64,
                           {-1.5, 0.0, 3.141592653589793, -2.75e-300, 1e300, 0.1, -0.1, 255.5,
                            -0.0, 7.25, 1.0 / 3.0, -123.456});
}

TEST(IdxReaderTest, WritesBigEndianHeaderAndData) {
  TempDir dir;
  const std::string path = dir.file("be.idx");
  write_idx(path, make_array<int16_t>(IdxType::Int16, {2, 3}, {1, 2, 3, 4, 5, -6}), false);
  EXPECT_EQ(test::read_bytes<Bytes>(path), small_int16_file());
}

TEST(IdxReaderTest, ReadsHandWrittenFileAndOneDimension) {
  TempDir dir;
  const std::string path = dir.file("hand.idx");
  write_bytes(path, small_int16_file());
  EXPECT_EQ(values_of<int16_t>(read_idx(path)), (std::vector<int16_t>{1, 2, 3, 4, 5, -6}));
  write_bytes(path, Bytes{0, 0, 0x08, 1, 0, 0, 0, 3, 9, 8, 7});
  const IdxArray a = read_idx(path);
  EXPECT_EQ(a.dims, std::vector<int64_t>{3});
  EXPECT_EQ(a.data, (std::vector<uint8_t>{9, 8, 7}));
}

TEST(IdxReaderTest, TypeNames) {
  EXPECT_STREQ(idx_type_name(IdxType::UInt8), "uint8");
  EXPECT_STREQ(idx_type_name(IdxType::Float64), "float64");
  EXPECT_STREQ(idx_type_name(static_cast<IdxType>(0x42)), "unknown");
}

TEST(IdxReaderTest, MissingFile) {
  TempDir dir;
  const std::string path = dir.file("absent.idx");
  expect_input_error([&] { read_idx(path); }, path, "no such file");
}

TEST(IdxReaderTest, BadMagic) {
  TempDir dir;
  const std::string path = dir.file("bad.idx");
  std::vector<uint8_t> bytes = small_int16_file();
  bytes[1] = 0x12;
  write_bytes(path, bytes);
  expect_input_error([&] { read_idx(path); }, path, "bad IDX magic: first two bytes are 0x00 0x12");

  bytes = small_int16_file();
  bytes[2] = 0x0A;
  write_bytes(path, bytes);
  expect_input_error([&] { read_idx(path); }, path, "unknown IDX type code 0x0a");

  for (uint8_t ndims : {0, 9}) {
    bytes = small_int16_file();
    bytes[3] = ndims;
    write_bytes(path, bytes);
    expect_input_error([&] { read_idx(path); }, path,
                       std::to_string(ndims) + " dimensions, expected 1 to 8");
  }
}

TEST(IdxReaderTest, TrailingBytes) {
  TempDir dir;
  const std::string path = dir.file("long.idx");
  std::vector<uint8_t> bytes = small_int16_file();
  bytes.insert(bytes.end(), {1, 2, 3});
  write_bytes(path, bytes);
  expect_input_error([&] { read_idx(path); }, path, "3 trailing bytes");
  const std::string gz = dir.file("long.idx.gz");
  write_bytes(gz, gzip_bytes(dir, bytes));
  expect_input_error([&] { read_idx(gz); }, gz, "3 trailing bytes");
}

TEST(IdxReaderTest, TruncatedDataAndHeader) {
  TempDir dir;
  const std::string path = dir.file("short.idx");
  std::vector<uint8_t> bytes = small_int16_file();
  bytes.pop_back();
  write_bytes(path, bytes);
  expect_input_error([&] { read_idx(path); }, path, "needs 12 bytes of data, file has 11");

  write_bytes(path, Bytes{0, 0, 0x0B});
  expect_input_error([&] { read_idx(path); }, path, "truncated IDX header: file has 3 bytes");
  write_bytes(path, Bytes{0, 0, 0x0B, 2, 0, 0, 0, 2, 0, 0});
  expect_input_error([&] { read_idx(path); }, path, "need 8 bytes after the magic, file has 6");
  write_bytes(path, Bytes{});
  expect_input_error([&] { read_idx(path); }, path, "truncated IDX header: file has 0 bytes");
}

TEST(IdxReaderTest, AbsurdDimensionsAreRejectedBeforeAllocating) {
  TempDir dir;
  const std::string path = dir.file("huge.idx");
  write_bytes(path, Bytes{0, 0, 0x0E, 4, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF,
                          0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 1, 2, 3});
  expect_input_error([&] { read_idx(path); }, path, "more than 2^48 bytes");
  // Plausible in size but far beyond the file: must report truncation, not try to allocate it all.
  write_bytes(path, Bytes{0, 0, 0x08, 2, 0x00, 0x10, 0, 0, 0, 0x10, 0, 0, 1, 2, 3});
  expect_input_error([&] { read_idx(path); }, path, "file has 3");
}

TEST(IdxReaderTest, CorruptAndTruncatedGzip) {
  TempDir dir;
  const std::string path = dir.file("bad.idx.gz");
  std::vector<uint8_t> good = gzip_bytes(dir, small_int16_file());
  std::vector<uint8_t> bad = good;
  for (size_t i = 10; i < bad.size(); ++i) bad[i] ^= 0x5A;  // keep the gzip header, spoil the rest
  write_bytes(path, bad);
  expect_input_error([&] { read_idx(path); }, path, "corrupt gzip stream");

  bad = good;
  bad[bad.size() - 6] ^= 0xFF;  // a wrong CRC-32 in the trailer
  write_bytes(path, bad);
  expect_input_error([&] { read_idx(path); }, path, "corrupt gzip stream");

  bad = good;
  bad.resize(bad.size() - 4);
  write_bytes(path, bad);
  expect_input_error([&] { read_idx(path); }, path, "truncated gzip stream");
}

TEST(IdxReaderTest, WriteRejectsInconsistentArray) {
  TempDir dir;
  const std::string path = dir.file("out.idx");
  IdxArray a = make_array<int32_t>(IdxType::Int32, {2, 2}, {1, 2, 3});
  expect_input_error([&] { write_idx(path, a, false); }, path, "data has 12 bytes");
  a.dims.clear();
  expect_input_error([&] { write_idx(path, a, false); }, path, "0 dimensions");
}

TEST(DatasetTest, ViewAndSlice) {
  Dataset d(PixelType::Float32, 5, 3, 4);
  EXPECT_EQ(d.view().rows, 5);
  const DatasetView s = d.view().slice(2, 4);
  EXPECT_EQ(s.rows, 2);
  EXPECT_EQ(s.features, 3);
  EXPECT_EQ(s.num_classes, 4);
  EXPECT_EQ(s.pixels, d.pixel_data() + 2 * 3 * 4);
  EXPECT_EQ(s.labels, d.label_data() + 2);
  EXPECT_EQ(d.view().slice(5, 5).rows, 0);
  EXPECT_THROW(d.view().slice(3, 6), InputError);
  EXPECT_THROW(d.view().slice(-1, 2), InputError);
  EXPECT_THROW(d.view().slice(3, 2), InputError);
}

// A small MNIST-format set: 30 training and 11 test images of 4x3 pixels. Pixel i of training
// row r is r * 5 + i, so every row is recognisable; label r % 10 (test: (r * 3) % 10).
class MnistLoaderTest : public ::testing::Test {
 protected:
  static constexpr int64_t kTrain = 30, kTest = 11, kFeatures = 12;

  void SetUp() override {
    write_images("train-images-idx3-ubyte", kTrain, 0, false);
    write_labels("train-labels-idx1-ubyte", kTrain, 1, true);
    write_images("t10k-images-idx3-ubyte", kTest, 100, true);
    write_labels("t10k-labels-idx1-ubyte", kTest, 3, false);
  }

  void write_images(const std::string& name, int64_t rows, int base, bool gzip) {
    std::vector<uint8_t> px;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t i = 0; i < kFeatures; ++i) px.push_back(uint8_t(base + r * 5 + i));
    write_idx(dir_.file(name) + (gzip ? ".gz" : ""), make_array(IdxType::UInt8, {rows, 4, 3}, px),
              gzip);
  }

  void write_labels(const std::string& name, int64_t rows, int step, bool gzip) {
    std::vector<uint8_t> labels;
    for (int64_t r = 0; r < rows; ++r) labels.push_back(uint8_t((r * step) % 10));
    write_idx(dir_.file(name) + (gzip ? ".gz" : ""), make_array(IdxType::UInt8, {rows}, labels),
              gzip);
  }

  static std::vector<uint8_t> row(const Dataset& d, int64_t r) {
    const uint8_t* p = static_cast<const uint8_t*>(d.view().pixels) + r * d.features();
    return std::vector<uint8_t>(p, p + d.features());
  }

  static std::vector<uint8_t> expected_row(int base, int64_t r) {
    std::vector<uint8_t> v;
    for (int64_t i = 0; i < kFeatures; ++i) v.push_back(uint8_t(base + r * 5 + i));
    return v;
  }

  TempDir dir_;
};

TEST_F(MnistLoaderTest, SplitsRawAndGzipFiles) {
  const DataSplits s = load_mnist_splits(dir_.path(), 7);
  EXPECT_EQ(s.source, dir_.path().string());
  EXPECT_EQ(s.train.rows(), 23);
  EXPECT_EQ(s.validation.rows(), 7);
  EXPECT_EQ(s.test.rows(), 11);
  for (const Dataset* d : {&s.train, &s.validation, &s.test}) {
    EXPECT_EQ(d->features(), kFeatures);
    EXPECT_EQ(d->num_classes(), 10);
    EXPECT_EQ(d->pixel_type(), PixelType::UInt8);
  }
  EXPECT_EQ(row(s.train, 0), expected_row(0, 0));
  EXPECT_EQ(row(s.train, 22), expected_row(0, 22));
  EXPECT_EQ(row(s.validation, 0), expected_row(0, 23));  // validation starts at training row 23
  EXPECT_EQ(row(s.validation, 6), expected_row(0, 29));
  EXPECT_EQ(row(s.test, 10), expected_row(100, 10));
  EXPECT_EQ(s.train.view().labels[22], 2);
  EXPECT_EQ(s.validation.view().labels[0], 3);
  EXPECT_EQ(s.test.view().labels[4], 2);  // (4 * 3) % 10

  const DataSplits none = load_mnist_splits(dir_.path(), 0);
  EXPECT_EQ(none.train.rows(), 30);
  EXPECT_EQ(none.validation.rows(), 0);
}

TEST_F(MnistLoaderTest, BadValidationRows) {
  const std::string images = dir_.file("train-images-idx3-ubyte");
  expect_input_error([&] { load_mnist_splits(dir_.path(), 30); }, images,
                     "validation rows 30 to split off");
  expect_input_error([&] { load_mnist_splits(dir_.path(), -1); }, images,
                     "validation rows -1 to split off");
}

TEST_F(MnistLoaderTest, CountMismatchNamesBothFiles) {
  std::filesystem::remove(dir_.file("t10k-labels-idx1-ubyte"));
  write_labels("t10k-labels-idx1-ubyte", kTest - 2, 3, true);
  const std::string images = dir_.file("t10k-images-idx3-ubyte.gz");
  const std::string labels = dir_.file("t10k-labels-idx1-ubyte.gz");
  expect_input_error([&] { load_mnist_splits(dir_.path(), 7); }, images,
                     "has 11 images but " + labels + " has 9 labels");
}

TEST_F(MnistLoaderTest, MissingFileNamesBothCandidates) {
  const std::string raw = dir_.file("train-labels-idx1-ubyte");
  std::filesystem::remove(raw + ".gz");
  expect_input_error([&] { load_mnist_splits(dir_.path(), 7); }, raw, "neither " + raw + " nor " + raw + ".gz");
}

TEST_F(MnistLoaderTest, LabelOutOfRange) {
  std::vector<uint8_t> labels(kTest, 1);
  labels[4] = 10;
  const std::string path = dir_.file("t10k-labels-idx1-ubyte");
  write_idx(path, make_array(IdxType::UInt8, {kTest}, labels), false);
  expect_input_error([&] { load_mnist_splits(dir_.path(), 7); }, path,
                     "label at index 4 is 10, expected a class below 10");
}

TEST_F(MnistLoaderTest, WrongImageTypeOrShape) {
  const std::string path = dir_.file("train-images-idx3-ubyte");
  write_idx(path, make_array<int16_t>(IdxType::Int16, {kTrain, 2}, std::vector<int16_t>(60, 1)),
            false);
  expect_input_error([&] { load_mnist_splits(dir_.path(), 7); }, path,
                     "images are int16 with 2 dimensions, expected uint8 with 3");
}

TEST(FashionMnistTest, LoadsInstalledDataSet) {
  const std::string dir = default_data_dir();
  if (!std::filesystem::is_directory(dir))
    GTEST_SKIP() << "Fashion-MNIST is not installed at " << dir
                 << " (Debian package dataset-fashion-mnist)";
  const DataSplits s = load_mnist_splits(dir);
  EXPECT_EQ(s.train.rows(), 55000);
  EXPECT_EQ(s.validation.rows(), 5000);
  EXPECT_EQ(s.test.rows(), 10000);
  EXPECT_EQ(s.train.features(), 784);
  EXPECT_EQ(s.test.features(), 784);
  EXPECT_EQ(s.train.num_classes(), 10);
  std::array<int64_t, 10> counts{};
  for (const Dataset* d : {&s.train, &s.validation})
    for (int64_t r = 0; r < d->rows(); ++r) ++counts[d->view().labels[r]];
  for (int c = 0; c < 10; ++c) EXPECT_EQ(counts[size_t(c)], 6000) << "class " << c;
}

}  // namespace
}  // namespace tandem
