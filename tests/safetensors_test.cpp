#include "safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

#include "file_io.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;
using test::read_bytes;
using test::write_bytes;

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char(uint8_t(v >> (8 * i)));
  return s;
}

// A whole file from header text and data bytes; `pad` adds the spaces writers normally add.
std::string file_bytes(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

// Two F32 tensors, a = {1, 2} at bytes [0, 8) and b = {3, 4} at [8, 16), plus metadata.
SafeTensorsFile two_tensors() {
  SafeTensorsFile f;
  f.metadata["format"] = "pt";
  f.tensors.push_back({"a", "F32", {2}, bytes_of(std::vector<float>{1, 2})});
  f.tensors.push_back({"b", "F32", {2}, bytes_of(std::vector<float>{3, 4})});
  return f;
}

class SafeTensorsTest : public ::testing::Test {
 protected:
  std::string path(const std::string& name) const { return dir_.file(name); }

  // File names in the test directory, sorted.
  std::vector<std::string> listing() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(dir_.path()))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  // Writes two_tensors() to a fresh file, then lets the test edit its parsed header and its data
  // bytes and writes the result back (re-padded), returning the path.
  std::string corrupt(const std::function<void(ordered_json&)>& edit_header,
                      const std::function<void(std::string&)>& edit_data = nullptr) {
    const std::string p = path("corrupt" + std::to_string(counter_++) + ".safetensors");
    write_safetensors_atomic(p, two_tensors());
    const std::string bytes = read_bytes(p);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
    ordered_json header = ordered_json::parse(bytes.substr(8, n));
    std::string data = bytes.substr(8 + n);
    if (edit_header) edit_header(header);
    if (edit_data) edit_data(data);
    write_bytes(p, file_bytes(header.dump(), data));
    return p;
  }

  // Writes a good file and replaces its bytes with `bytes`, returning the path.
  std::string overwrite_with(const std::string& bytes) {
    const std::string p = corrupt(nullptr);
    write_bytes(p, bytes);
    return p;
  }

  test::TempDir dir_;
  int counter_ = 0;
};

// Reading `p` must fail with an InputError naming the file and the problem.
void expect_read_fails(const std::string& p, const std::string& phrase) {
  try {
    read_safetensors(p);
    ADD_FAILURE() << "read_safetensors accepted a bad file; expected \"" << phrase << "\"";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p), std::string::npos) << msg;
    EXPECT_NE(msg.find(phrase), std::string::npos) << "expected \"" << phrase << "\" in: " << msg;
  }
}

TEST(SafeTensorsDtype, Sizes) {
  EXPECT_EQ(safetensors_dtype_size("F64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("I64"), 8u);
  EXPECT_EQ(safetensors_dtype_size("F32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("I32"), 4u);
  EXPECT_EQ(safetensors_dtype_size("BF16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("F16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("I16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U16"), 2u);
  EXPECT_EQ(safetensors_dtype_size("U8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("I8"), 1u);
  EXPECT_EQ(safetensors_dtype_size("BOOL"), 1u);
  EXPECT_THROW(safetensors_dtype_size("f32"), InputError);
  EXPECT_THROW(safetensors_dtype_size(""), InputError);
}

TEST_F(SafeTensorsTest, RoundTripsEveryDtypeScalarsEmptyTensorsAndMetadata) {
  SafeTensorsFile f;
  f.metadata = {{"format", "pt"}, {"note", "ünïcode ok"}, {"empty", ""}};
  f.tensors.push_back(
      {"weights.f32", "F32", {2, 3}, bytes_of(std::vector<float>{1, -2, 3.5f, 4, 5, 6})});
  f.tensors.push_back({"f64", "F64", {2}, bytes_of(std::vector<double>{1e300, -0.25})});
  f.tensors.push_back({"i64", "I64", {1}, bytes_of(std::vector<int64_t>{-(int64_t(1) << 40)})});
  f.tensors.push_back({"scalar", "I32", {}, bytes_of(std::vector<int32_t>{-7})});
  f.tensors.push_back({"u8", "U8", {3}, {0, 128, 255}});
  f.tensors.push_back({"i8", "I8", {1, 1, 1}, {0x80}});
  f.tensors.push_back({"i16", "I16", {2}, bytes_of(std::vector<int16_t>{-1, 300})});
  f.tensors.push_back({"u16", "U16", {1}, bytes_of(std::vector<uint16_t>{65535})});
  f.tensors.push_back({"bf16", "BF16", {2}, {0x80, 0x3f, 0x00, 0xc0}});
  f.tensors.push_back({"f16", "F16", {1}, {0x00, 0x3c}});
  f.tensors.push_back({"bool", "BOOL", {4}, {1, 0, 0, 1}});
  f.tensors.push_back({"empty", "F32", {0, 5}, {}});
  const std::string p = path("model.safetensors");
  write_safetensors_atomic(p, f);

  const SafeTensorsFile back = read_safetensors(p);
  EXPECT_EQ(back.metadata, f.metadata);
  ASSERT_EQ(back.tensors.size(), f.tensors.size());
  for (size_t i = 0; i < f.tensors.size(); ++i) {
    SCOPED_TRACE(f.tensors[i].name);
    EXPECT_EQ(back.tensors[i].name, f.tensors[i].name);  // file order is write order
    EXPECT_EQ(back.tensors[i].dtype, f.tensors[i].dtype);
    EXPECT_EQ(back.tensors[i].shape, f.tensors[i].shape);
    EXPECT_EQ(back.tensors[i].data, f.tensors[i].data);
  }
  ASSERT_NE(back.find("scalar"), nullptr);
  EXPECT_TRUE(back.find("scalar")->shape.empty());
  EXPECT_EQ(back.find("missing"), nullptr);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafeTensorsTest, RoundTripsAnEmptyFile) {
  const std::string p = path("empty.safetensors");
  write_safetensors_atomic(p, SafeTensorsFile{});
  const SafeTensorsFile back = read_safetensors(p);
  EXPECT_TRUE(back.metadata.empty());
  EXPECT_TRUE(back.tensors.empty());
}

TEST_F(SafeTensorsTest, HeaderIsPaddedToEightBytes) {
  SafeTensorsFile f;
  f.tensors.push_back({"odd_name_x", "U8", {3}, {1, 2, 3}});  // chosen so the JSON needs padding
  const std::string p = path("aligned.safetensors");
  write_safetensors_atomic(p, f);
  const std::string bytes = read_bytes(p);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(bytes[size_t(i)]);
  EXPECT_EQ((8 + n) % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 3);
  const std::string header = bytes.substr(8, n);
  const std::string json_text = header.substr(0, header.find_last_not_of(' ') + 1);
  EXPECT_LT(json_text.size(), header.size()) << "this case was meant to need padding";
  EXPECT_EQ(json_text, R"({"odd_name_x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})");
  EXPECT_EQ(bytes.substr(8 + n), std::string("\x01\x02\x03"));
}

TEST_F(SafeTensorsTest, ReadsAHandBuiltFile) {
  // Unpadded header, keys out of data order, metadata last: all legal.
  const std::string header =
      R"({"z":{"dtype":"I32","shape":[2],"data_offsets":[0,8]},)"
      R"("a":{"data_offsets":[8,10],"shape":[],"dtype":"I16","extra":"ignored"},)"
      R"("__metadata__":{"k":"v"}})";
  const std::string data =
      std::string("\x01\x00\x00\x00\xff\xff\xff\xff", 8) + std::string("\x34\x12", 2);
  const std::string p = path("hand.safetensors");
  write_bytes(p, file_bytes(header, data, /*pad=*/false));

  const SafeTensorsFile f = read_safetensors(p);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  ASSERT_EQ(f.tensors.size(), 2u);
  EXPECT_EQ(f.tensors[0].name, "z");  // in data order, not key order
  EXPECT_EQ(f.tensors[0].dtype, "I32");
  EXPECT_EQ(f.tensors[0].shape, std::vector<int64_t>{2});
  std::vector<int32_t> z(2);
  std::memcpy(z.data(), f.tensors[0].data.data(), 8);
  EXPECT_EQ(z, (std::vector<int32_t>{1, -1}));
  EXPECT_EQ(f.tensors[1].name, "a");
  EXPECT_TRUE(f.tensors[1].shape.empty());
  int16_t a = 0;
  std::memcpy(&a, f.tensors[1].data.data(), 2);
  EXPECT_EQ(a, 0x1234);
}

TEST_F(SafeTensorsTest, MissingFileIsAnIoError) {
  const std::string p = path("nope.safetensors");
  try {
    read_safetensors(p);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(std::strerror(ENOENT)), std::string::npos) << e.what();
  }
}

TEST_F(SafeTensorsTest, RejectsFilesShorterThanTheLengthField) {
  expect_read_fails(overwrite_with(""), "shorter than 8 bytes");
  expect_read_fails(overwrite_with(std::string(7, '\0')), "shorter than 8 bytes");
}

TEST_F(SafeTensorsTest, RejectsBadHeaderLengths) {
  const std::string good = read_bytes(corrupt(nullptr));
  expect_read_fails(overwrite_with(le64(good.size() - 7) + good.substr(8)), "larger than the file");
  expect_read_fails(overwrite_with(le64(200'000'000) + good.substr(8)), "absurd");
  expect_read_fails(overwrite_with(le64(~uint64_t(0)) + good.substr(8)), "absurd");
  // The files users give by mistake say what they are (an IDX file's length field once read as
  // "header length 6834787397512235807 is absurd", and no more).
  const std::string gzip = std::string("\x1f\x8b\x08\x08\x00\x00\x00\x00", 8) + good;
  expect_read_fails(overwrite_with(gzip), "not a safetensors file (it looks like a gzip file)");
  const std::string idx = std::string("\x00\x00\x08\x03\x00\x00\xea\x60", 8) + good;
  expect_read_fails(overwrite_with(idx), "not a safetensors file (it looks like an IDX file)");
  // gzip -n (no name, no time): its first 8 bytes read as a plausible length of 559,903.
  const std::string gzip_n = std::string("\x1f\x8b\x08\x00\x00\x00\x00\x00", 8) +
                             std::string(600'000, 'x');
  expect_read_fails(overwrite_with(gzip_n), "not a safetensors file (it looks like a gzip file)");
  expect_read_fails(overwrite_with("{\"zarr_format\": 3}\n" + std::string(64, ' ')),
                    "not a safetensors file (it looks like JSON text)");
}

TEST_F(SafeTensorsTest, RejectsHeadersThatAreNotJsonObjects) {
  expect_read_fails(overwrite_with(file_bytes("{\"a\": ", "")), "not valid JSON");
  expect_read_fails(overwrite_with(file_bytes("", "")), "does not start with '{'");
  expect_read_fails(overwrite_with(file_bytes("{\"\xff\": 1}", "")),
                    "not valid JSON");  // bad UTF-8
  // A number beyond double's range: nlohmann reports it as out_of_range, not as a parse_error
  // (found by tests/fuzz/safetensors_fuzz.cpp; it crashed the reader before).
  expect_read_fails(overwrite_with(file_bytes("{\"a\": 2E84434840}", "")), "not valid JSON");
  expect_read_fails(overwrite_with(file_bytes("[1, 2]", "")), "does not start with '{'");
  // A shape nested 100,000 deep: its error showed the value with dump(), which recursed once
  // per level and overflowed the stack.
  expect_read_fails(overwrite_with(file_bytes("{\"t\":{\"dtype\":\"F32\",\"data_offsets\":[0,0],"
                                              "\"shape\":[" + std::string(100'000, '[') +
                                              std::string(100'000, ']') + "]}}", "")),
                    "nested more than 64 levels deep");
  expect_read_fails(overwrite_with(file_bytes("\"text\"", "")), "does not start with '{'");
  // As the Python package refuses them: a byte-order mark or a space before the object, and
  // anything after a NUL (nlohmann's parser took a NUL for the end of the text and read a
  // valid object followed by garbage).
  expect_read_fails(overwrite_with(file_bytes("\xef\xbb\xbf{}", "")), "does not start with '{'");
  expect_read_fails(overwrite_with(file_bytes(" {}", "")), "does not start with '{'");
  expect_read_fails(overwrite_with(file_bytes(std::string("{}\0garbage {{{", 14), "")),
                    "a NUL byte at offset 2");
}

TEST_F(SafeTensorsTest, RejectsEntriesWithMissingFields) {
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    SCOPED_TRACE(key);
    const std::string p = corrupt([&](ordered_json& h) { h["b"].erase(key); });
    expect_read_fails(p, std::string("tensor 'b': missing \"") + key + "\"");
  }
}

TEST_F(SafeTensorsTest, RejectsEntriesWithWrongJsonTypes) {
  expect_read_fails(corrupt([](ordered_json& h) { h["b"] = 3; }),
                    "tensor 'b': entry is not a JSON object");
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["dtype"] = 4; }),
                    "\"dtype\" is not a string");
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["shape"] = "2"; }),
                    "\"shape\" is not an array");
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["shape"] = {2.0}; }), "not a dimension");
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["shape"] = {"2"}; }), "not a dimension");
  for (const ordered_json& bad : {ordered_json{8}, ordered_json{8, 16, 24}, ordered_json{8.0, 16.0},
                                  ordered_json{-8, 16}, ordered_json("8,16")}) {
    SCOPED_TRACE(bad.dump());
    expect_read_fails(corrupt([&](ordered_json& h) { h["b"]["data_offsets"] = bad; }),
                      "\"data_offsets\" is not an array of two non-negative integers");
  }
}

TEST_F(SafeTensorsTest, RejectsUnknownDtypes) {
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["dtype"] = "F8"; }),
                    "tensor 'b': unknown dtype \"F8\"");
}

TEST_F(SafeTensorsTest, RejectsNegativeAndOverflowingDimensions) {
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["shape"] = {-2}; }),
                    "negative dimension -2");
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["b"]["shape"] = {int64_t(1) << 40, int64_t(1) << 40};
                    }),
                    "is too large");
}

TEST_F(SafeTensorsTest, RejectsBadDataOffsets) {
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["b"]["data_offsets"] = {16, 8};
                    }),
                    "tensor 'b': data_offsets [16, 8] has begin > end");
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["b"]["data_offsets"] = {12, 20};
                    }),
                    "tensor 'b': data_offsets end 20 is out of range");
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["b"]["data_offsets"] = {4, 12};
                    }),
                    "tensor 'b': data_offsets overlap tensor 'a'");
  // Same range twice: both tensors would alias the same bytes.
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["b"]["data_offsets"] = {0, 8};
                    }),
                    "overlap tensor");
  expect_read_fails(corrupt(
                        [](ordered_json& h) {
                          h["b"]["data_offsets"] = {12, 20};
                        },
                        [](std::string& d) { d.append(4, '\0'); }),
                    "tensor 'b': gap in the data section");
  // Trailing bytes that belong to no tensor.
  expect_read_fails(corrupt(nullptr, [](std::string& d) { d.append(8, '\0'); }),
                    "do not cover the data section exactly: the last, tensor 'b', ends at byte 16 "
                    "but the data section is 24 bytes");
  expect_read_fails(corrupt([](ordered_json& h) {
                      h.erase("a");
                      h.erase("b");
                    }),
                    "do not cover the data section exactly: there are no tensors but the data "
                    "section is 16 bytes");
}

TEST_F(SafeTensorsTest, RejectsTruncatedData) {
  const std::string good = read_bytes(corrupt(nullptr));
  expect_read_fails(overwrite_with(good.substr(0, good.size() - 4)),
                    "tensor 'b': data_offsets end 16 is out of range");
  expect_read_fails(overwrite_with(good.substr(0, good.size() - 16)), "out of range");
}

TEST_F(SafeTensorsTest, RejectsRangesThatDoNotMatchTheShape) {
  const std::string p = corrupt([](ordered_json& h) { h["b"]["shape"] = {3}; });
  expect_read_fails(p, "tensor 'b'");
  expect_read_fails(p, "span 8 bytes but shape [3] of F32 needs 12 bytes");
  expect_read_fails(corrupt([](ordered_json& h) { h["b"]["dtype"] = "F64"; }), "needs 16 bytes");
}

TEST_F(SafeTensorsTest, RejectsNonStringMetadata) {
  expect_read_fails(corrupt([](ordered_json& h) { h["__metadata__"]["epoch"] = 3; }),
                    "metadata value for key 'epoch' is not a string");
  expect_read_fails(corrupt([](ordered_json& h) {
                      h["__metadata__"] = {1, 2};
                    }),
                    "\"__metadata__\" is not a JSON object");
}

TEST_F(SafeTensorsTest, WriterRefusesInvalidTensorsAndCreatesNothing) {
  const std::string p = path("out.safetensors");
  auto expect_refused = [&](const SafeTensorsFile& f, const std::string& phrase) {
    try {
      write_safetensors_atomic(p, f);
      ADD_FAILURE() << "writer accepted a bad file; expected \"" << phrase << "\"";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
    EXPECT_TRUE(listing().empty());
  };
  SafeTensorsFile f = two_tensors();
  f.tensors[1].data.pop_back();
  expect_refused(f, "tensor 'b': data is 7 bytes but shape [2] of F32 needs 8 bytes");
  f = two_tensors();
  f.tensors[1].name = "a";
  expect_refused(f, "duplicate tensor name 'a'");
  f = two_tensors();
  f.tensors[0].name = "__metadata__";
  expect_refused(f, "\"__metadata__\" is reserved");
  f = two_tensors();
  f.tensors[0].dtype = "F8";
  expect_refused(f, "unknown dtype \"F8\"");
  f = two_tensors();
  f.tensors[0].shape = {-1, -2};
  expect_refused(f, "negative dimension -1");
  f = two_tensors();
  f.metadata["bad"] = "\xff";
  expect_refused(f, "not valid UTF-8");
}

TEST_F(SafeTensorsTest, WritingOverAnExistingFileReplacesIt) {
  const std::string p = path("model.safetensors");
  write_safetensors_atomic(p, two_tensors());
  SafeTensorsFile next;
  next.tensors.push_back({"only", "U8", {1}, {42}});
  write_safetensors_atomic(p, next);
  const SafeTensorsFile back = read_safetensors(p);
  ASSERT_EQ(back.tensors.size(), 1u);
  EXPECT_EQ(back.tensors[0].name, "only");
  EXPECT_TRUE(back.metadata.empty());
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

// The temporary file's name is predictable (PATH.tmp-PID): a link planted under it, in a shared
// directory, is removed and never written through (its target once got the file's bytes).
TEST_F(SafeTensorsTest, ALinkPlantedAtTheTemporaryNameIsNotFollowed) {
  const std::string p = path("model.safetensors");
  const std::string victim = path("victim");
  write_text_atomic(victim, "keep me\n");
  const std::string tmp = temp_path(p);
  ASSERT_EQ(::symlink(victim.c_str(), tmp.c_str()), 0) << std::strerror(errno);
  write_safetensors_atomic(p, two_tensors());
  EXPECT_EQ(read_bytes(victim), "keep me\n");
  EXPECT_EQ(read_safetensors(p).tensors.size(), 2u);
  EXPECT_EQ(listing(), (std::vector<std::string>{"model.safetensors", "victim"}));
}

TEST_F(SafeTensorsTest, InvalidWriteLeavesTheOldFileUntouched) {
  const std::string p = path("model.safetensors");
  write_safetensors_atomic(p, two_tensors());
  const std::string before = read_bytes(p);
  SafeTensorsFile bad = two_tensors();
  bad.tensors[0].shape = {3};  // 8 bytes of data for 12 bytes of shape
  EXPECT_THROW(write_safetensors_atomic(p, bad), InputError);
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafeTensorsTest, WriteIntoAMissingDirectoryIsAnIoError) {
  const std::string p = path("no_such_dir/model.safetensors");
  try {
    write_safetensors_atomic(p, two_tensors());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    // Said of the file asked for, not of its temporary name (which meant nothing to the user).
    EXPECT_EQ(std::string(e.what()), "cannot write '" + p + "': its directory '" +
                                         path("no_such_dir") + "' does not exist");
  }
  EXPECT_TRUE(listing().empty());
}

TEST_F(SafeTensorsTest, ADirectoryInThePlaceIsRefusedBeforeAnythingIsWritten) {
  const std::string p = path("model.safetensors");
  ASSERT_EQ(::mkdir(p.c_str(), 0755), 0) << std::strerror(errno);
  write_bytes(p + "/keep", "old");
  EXPECT_THROW(write_safetensors_atomic(p, two_tensors()), IoError);
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(read_bytes(p + "/keep"), "old");
}

TEST_F(SafeTensorsTest, FailedRenameRemovesTheTemporaryFile) {
  // A non-empty directory made where the file goes once the temporary file exists: the rename
  // fails, which exercises the clean-up after the temporary file was written.
  const std::string p = path("model.safetensors");
  {
    AtomicFile out(p);
    out.write("data", 4);
    ASSERT_EQ(::mkdir(p.c_str(), 0755), 0) << std::strerror(errno);
    write_bytes(p + "/keep", "old");
    EXPECT_THROW(out.commit(), IoError);
  }
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(read_bytes(p + "/keep"), "old");
}

// A write killed before its commit leaves NAME.tmp-PID-TID (NAME.tmp-PID from older versions),
// as big as the file: the next check of the same output removes it once its process has ended
// and nobody has written to it for a minute, and leaves everything else.
TEST_F(SafeTensorsTest, TheNextWriteRemovesWhatAKilledWriteLeft) {
  const std::string model = path("model.safetensors");
  const std::string dead = std::to_string(test::ended_process_id());
  const std::string killed = model + ".tmp-" + dead + "-7", killed_older = model + ".tmp-" + dead;
  const std::string alive = model + ".tmp-" + std::to_string(::getpid()) + "-1";
  const std::string recent = model + ".tmp-" + dead + "-8";
  const std::string other = path("other.safetensors.tmp-" + dead + "-1");
  const std::string not_a_temp = model + ".tmp-" + dead + "x";
  const std::string a_dir = model + ".tmp-" + dead + "-9", a_link = model + ".tmp-" + dead + "-10";
  for (const std::string& f : {killed, killed_older, alive, recent, other, not_a_temp})
    write_bytes(f, "partial");
  ASSERT_EQ(::mkdir(a_dir.c_str(), 0755), 0);
  ASSERT_EQ(::symlink(other.c_str(), a_link.c_str()), 0);
  for (const std::string& f : {killed, killed_older, alive, other, not_a_temp, a_dir, a_link})
    test::make_older(f, 2);
  check_replaceable(model);
  EXPECT_FALSE(fs::exists(killed));
  EXPECT_FALSE(fs::exists(killed_older));
  for (const std::string& f : {alive, recent, other, not_a_temp, a_dir})
    EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(fs::is_symlink(a_link));
}

// A link's file is replaced and the link stays a link (replacing the link would leave the file
// it names stale); a link to nothing is refused.
TEST_F(SafeTensorsTest, WritingThroughALinkReplacesTheFileItNames) {
  const std::string real = path("real.safetensors"), link = path("link.safetensors");
  write_text_atomic(real, "old\n");
  ASSERT_EQ(::symlink(real.c_str(), link.c_str()), 0) << std::strerror(errno);
  write_safetensors_atomic(link, two_tensors());
  EXPECT_TRUE(std::filesystem::is_symlink(link));
  EXPECT_EQ(read_safetensors(real).tensors.size(), 2u);
  EXPECT_EQ(listing(), (std::vector<std::string>{"link.safetensors", "real.safetensors"}));

  const std::string dangling = path("dangling.safetensors");
  ASSERT_EQ(::symlink(path("nowhere").c_str(), dangling.c_str()), 0) << std::strerror(errno);
  EXPECT_THROW(write_safetensors_atomic(dangling, two_tensors()), IoError);
  EXPECT_TRUE(std::filesystem::is_symlink(dangling));
  EXPECT_FALSE(std::filesystem::exists(path("nowhere")));
}

// `--checkpoint /dev/null` once replaced the system's /dev/null with a model file: a device, a
// FIFO or a socket is never replaced, and check_replaceable says so before any work.
TEST_F(SafeTensorsTest, DevicesAndFifosAreNeverReplaced) {
  const std::string fifo = path("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  for (const std::string& p : {std::string("/dev/null"), fifo}) {
    try {
      check_replaceable(p);
      FAIL() << "expected IoError for " << p;
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(write_safetensors_atomic(fifo, two_tensors()), IoError);
  struct stat st {};
  ASSERT_EQ(::lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  ASSERT_EQ(::stat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_EQ(listing(), std::vector<std::string>{"model.safetensors"});
}

TEST_F(SafeTensorsTest, TheReplacedFileKeepsItsPermissions) {
  const std::string p = path("model.safetensors");
  write_safetensors_atomic(p, two_tensors());
  // (0640: what neither umask 022 nor 077 gives a new file)
  ASSERT_EQ(::chmod(p.c_str(), 0640), 0);
  write_safetensors_atomic(p, two_tensors());
  struct stat st {};
  ASSERT_EQ(::stat(p.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
}

// A FIFO given as a file to read is refused at once, not waited on for a writer.
TEST_F(SafeTensorsTest, AFifoToReadIsRefusedWithoutWaiting) {
  const std::string fifo = path("model.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0) << std::strerror(errno);
  try {
    read_safetensors(fifo);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
