// The parameter server's wire protocol: round trips of every message type, the byte layout
// against a hand-written frame, one crafted frame set per decode error, every truncation and
// every flipped byte of a valid header frame, a bounded fuzz loop, the limits, and all_finite.
#include "wire_protocol.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tandem/error.h"
#include "test_support.h"

namespace tandem::transport {
namespace {

using Frames = std::vector<std::vector<uint8_t>>;

// Little-endian bytes written by hand, independent of the encoder, for crafting frames.
class Bytes {
 public:
  Bytes& u8(uint64_t v) { return le(v, 1); }
  Bytes& u16(uint64_t v) { return le(v, 2); }
  Bytes& u32(uint64_t v) { return le(v, 4); }
  Bytes& u64(uint64_t v) { return le(v, 8); }
  Bytes& i64(int64_t v) { return le(static_cast<uint64_t>(v), 8); }
  Bytes& str(const std::string& s) {
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  // One tensor-table entry; `bytes` defaults to what a float32 of that shape needs.
  Bytes& entry(const std::string& name, const std::vector<int64_t>& shape,
               std::optional<uint64_t> bytes = std::nullopt, uint8_t dtype = 1) {
    uint64_t n = 4;
    for (const int64_t d : shape) n *= static_cast<uint64_t>(d);
    u16(name.size()).str(name).u8(dtype).u8(shape.size());
    for (const int64_t d : shape) i64(d);
    return u64(bytes.value_or(n));
  }
  std::vector<uint8_t> b;

 private:
  Bytes& le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return *this;
  }
};

// The fixed header's raw fields, each free to be wrong; body_bytes defaults to the body's size.
struct RawHeader {
  uint32_t magic = kMagic;
  uint16_t version = kProtocolVersion;
  uint16_t type = static_cast<uint16_t>(MessageType::PushPull);
  uint64_t request_id = 7;
  uint64_t parameter_version = 3;
  uint32_t tensor_count = 0;
  std::optional<uint32_t> body_bytes;
};

std::vector<uint8_t> raw_frame(const RawHeader& h, const Bytes& body) {
  Bytes f;
  f.u32(h.magic).u16(h.version).u16(h.type).u64(h.request_id).u64(h.parameter_version);
  f.u32(h.tensor_count).u32(h.body_bytes.value_or(static_cast<uint32_t>(body.b.size())));
  f.b.insert(f.b.end(), body.b.begin(), body.b.end());
  return f.b;
}

std::vector<ByteSpan> spans(const Frames& frames) {
  std::vector<ByteSpan> out;
  for (const auto& f : frames) out.push_back(span_of(f));
  return out;
}

std::vector<uint8_t> float_bytes(const std::vector<float>& values) {
  std::vector<uint8_t> out(values.size() * sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), values.data(), out.size());
  return out;
}

// A message with its tensor bytes: frame 0 encoded by encode_header_frame, frames 1..N the data.
struct Sample {
  Message message;
  Frames frames;
};

Sample make_sample(MessageType type, std::vector<TensorInfo> tensors, std::string extra,
                   uint32_t seed = 1) {
  Sample s;
  s.message = make_message(type, 0x0123456789abcdefULL, 42, std::move(tensors), std::move(extra));
  s.frames.push_back(encode_header_frame(s.message));
  for (const TensorInfo& t : s.message.tensors)
    s.frames.push_back(float_bytes(test::random_floats(t.bytes / 4, seed++)));
  return s;
}

// The tensor sets every message type is tried with: none, one, and several including a scalar
// (rank 0, one element), an empty tensor (a zero dimension, a zero-length frame), rank 4, a
// 255-byte name and multi-byte UTF-8 names.
std::vector<std::vector<TensorInfo>> tensor_sets() {
  return {
      {},
      {float32_tensor("fc1.weight", {3, 5})},
      {float32_tensor("fc1.weight", {3, 5}), float32_tensor("fc1.bias", {5}),
       float32_tensor("loss_scale", {}), float32_tensor("empty", {4, 0}),
       float32_tensor("conv", {2, 1, 3, 2}), float32_tensor(std::string(255, 'n'), {1}),
       float32_tensor("\xc3\xbc\xe5\xb1\x82.\xf0\x9f\x99\x82", {2})},
  };
}

std::vector<MessageType> all_types() {
  return {MessageType::Init,     MessageType::Pull,  MessageType::Push,
          MessageType::PushPull, MessageType::Stats, MessageType::Checkpoint,
          MessageType::Shutdown, MessageType::Reply, MessageType::Error};
}

// What must hold for any decode of any frames: a failure has a code, a text and no half message;
// a success points at the frames (no copy), and its header frame is exactly what the encoder
// makes of the decoded Message (the encoding is canonical), which decodes to the same Message.
::testing::AssertionResult decodes_consistently(const std::vector<ByteSpan>& frames,
                                                const DecodeLimits& limits,
                                                DecodeError* code_out = nullptr) {
  const DecodeResult r = decode(frames, limits);
  if (code_out) *code_out = r.code;
  if (!r.ok()) {
    if (r.error.empty())
      return ::testing::AssertionFailure() << to_string(r.code) << " without text";
    if (!r.message.tensors.empty() || !r.message.extra.empty() || !r.tensor_data.empty())
      return ::testing::AssertionFailure() << "a failed decode carries part of a message";
    return ::testing::AssertionSuccess();
  }
  if (!r.error.empty()) return ::testing::AssertionFailure() << "ok but error text: " << r.error;
  if (!r.header_ok) return ::testing::AssertionFailure() << "ok but header_ok is false";
  if (r.tensor_data.size() != r.message.tensors.size() || frames.size() != 1 + r.tensor_data.size())
    return ::testing::AssertionFailure() << "tensor_data does not match the frames";
  for (size_t i = 0; i < r.tensor_data.size(); ++i) {
    if (r.tensor_data[i].data != frames[i + 1].data || r.tensor_data[i].size != frames[i + 1].size)
      return ::testing::AssertionFailure() << "tensor " << i << " is not its frame";
  }
  std::vector<uint8_t> again;
  try {
    again = encode_header_frame(r.message);
  } catch (const std::exception& e) {
    return ::testing::AssertionFailure() << "accepted message does not re-encode: " << e.what();
  }
  if (again != std::vector<uint8_t>(frames[0].data, frames[0].data + frames[0].size))
    return ::testing::AssertionFailure() << "re-encoded header frame differs from the received one";
  std::vector<ByteSpan> frames2 = frames;
  frames2[0] = span_of(again);
  const DecodeResult r2 = decode(frames2, limits);
  if (!r2.ok() || r2.message != r.message)
    return ::testing::AssertionFailure() << "re-encoded message decodes differently: " << r2.error;
  return ::testing::AssertionSuccess();
}

// ---- Layout and round trips --------------------------------------------------------------------

TEST(WireProtocol, HeaderFrameMatchesTheDocumentedLayout) {
  const Message m = make_message(MessageType::Push, 0x1122334455667788ULL, 9,
                                 {float32_tensor("w", {2, 3}), float32_tensor("s", {})}, "hi");
  Bytes body;
  body.entry("w", {2, 3}).entry("s", {}).u32(2).str("hi");
  Bytes expect;
  expect.str("TDPS").u16(1).u16(3).u64(0x1122334455667788ULL).u64(9).u32(2).u32(body.b.size());
  expect.b.insert(expect.b.end(), body.b.begin(), body.b.end());
  EXPECT_EQ(encode_header_frame(m), expect.b);
  EXPECT_EQ(expect.b.size(), 32u + (2 + 1 + 2 + 16 + 8) + (2 + 1 + 2 + 8) + 4 + 2);
}

TEST(WireProtocol, EveryTypeRoundTripsWithNoneOneAndSeveralTensors) {
  for (const MessageType type : all_types()) {
    for (const auto& tensors : tensor_sets()) {
      for (const std::string& extra : {std::string(), std::string("{\"step\": 3}\0\xff", 14)}) {
        SCOPED_TRACE(std::string(to_string(type)) + ", " + std::to_string(tensors.size()) +
                     " tensors, extra of " + std::to_string(extra.size()) + " bytes");
        const Sample s = make_sample(type, tensors, extra);
        const std::vector<ByteSpan> frames = spans(s.frames);
        const DecodeResult r = decode(frames);
        ASSERT_TRUE(r.ok()) << r.error;
        EXPECT_TRUE(r.header_ok);
        EXPECT_EQ(r.message, s.message);
        EXPECT_EQ(r.message.header.type, type);
        EXPECT_EQ(r.message.header.request_id, 0x0123456789abcdefULL);
        EXPECT_EQ(r.message.header.parameter_version, 42u);
        EXPECT_EQ(r.message.extra, extra);
        ASSERT_EQ(r.tensor_data.size(), tensors.size());
        for (size_t i = 0; i < tensors.size(); ++i) {
          EXPECT_EQ(r.tensor_data[i].data, frames[i + 1].data) << "tensor " << i << " was copied";
          EXPECT_EQ(r.tensor_data[i].size, tensors[i].bytes);
        }
        EXPECT_TRUE(decodes_consistently(frames, {}));
      }
    }
  }
}

TEST(WireProtocol, ScalarAndEmptyTensorsHaveTheRightSizes) {
  EXPECT_EQ(float32_tensor("s", {}).bytes, 4u);
  EXPECT_EQ(float32_tensor("e", {4, 0}).bytes, 0u);
  EXPECT_EQ(float32_tensor("e", {0}).bytes, 0u);
  EXPECT_EQ(float32_tensor("m", {2, 3, 4, 5}).bytes, 480u);
}

TEST(WireProtocol, FloatMessageSendsTheCallersMemory) {
  const std::vector<float> w = test::random_floats(15, 3), b = test::random_floats(5, 4);
  const float scale = 0.5f;
  const OutgoingMessage out =
      encode_float_message(MessageType::Push, 11, 12,
                           {{"w", {3, 5}, w.data()}, {"b", {5}, b.data()}, {"s", {}, &scale}});
  ASSERT_EQ(out.tensor_frames.size(), 3u);
  EXPECT_EQ(out.tensor_frames[0].data, reinterpret_cast<const uint8_t*>(w.data()));
  EXPECT_EQ(out.tensor_frames[2].data, reinterpret_cast<const uint8_t*>(&scale));

  const DecodeResult r = decode(out.frames());
  ASSERT_TRUE(r.ok()) << r.error;
  ASSERT_EQ(r.message.tensors.size(), 3u);
  EXPECT_EQ(r.message.tensors[0], float32_tensor("w", {3, 5}));
  std::vector<float> got(15);
  std::memcpy(got.data(), r.tensor_data[0].data, r.tensor_data[0].size);
  EXPECT_TRUE(test::all_close(got, w, 0.0, 0.0));
}

TEST(WireProtocol, EncoderRejectsMessagesItCannotSend) {
  auto expect_throws = [](const Message& m, const std::string& phrase) {
    try {
      encode_header_frame(m);
      ADD_FAILURE() << "encoded a bad message; expected \"" << phrase << "\"";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos)
          << "expected \"" << phrase << "\" in: " << e.what();
    }
  };
  auto with = [](TensorInfo t) { return make_message(MessageType::Push, 1, 0, {std::move(t)}); };
  expect_throws(with({"", DType::Float32, {1}, 4}), "the name is empty");
  expect_throws(with({std::string(256, 'x'), DType::Float32, {1}, 4}), "longer than 255");
  expect_throws(with({std::string("a\0b", 3), DType::Float32, {1}, 4}), "NUL");
  expect_throws(with({"\xc0\xaf", DType::Float32, {1}, 4}), "not valid UTF-8");
  expect_throws(with({"w", static_cast<DType>(7), {1}, 4}), "unknown dtype 7");
  expect_throws(with({"w", DType::Float32, {1, 1, 1, 1, 1}, 4}), "rank 5");
  expect_throws(with({"w", DType::Float32, {2, -1}, 0}), "negative dimension");
  expect_throws(with({"w", DType::Float32, {int64_t{1} << 62, int64_t{1} << 62}, 0}),
                "more than 2^64 bytes");
  expect_throws(with({"w", DType::Float32, {2}, 12}), "byte length 12 but shape [2] needs 8");
  expect_throws(
      make_message(MessageType::Push, 1, 0, {float32_tensor("w", {1}), float32_tensor("w", {2})}),
      "tensor 1 ('w'): the name is used by an earlier tensor");
  expect_throws(make_message(static_cast<MessageType>(0), 1, 0), "message type 0");
  expect_throws(make_message(static_cast<MessageType>(11), 1, 0), "message type 11");

  EXPECT_THROW(float32_tensor("", {1}), InputError);
  EXPECT_THROW(float32_tensor("w", {-1}), InputError);
  EXPECT_THROW(float32_tensor("w", {1, 2, 3, 4, 5}), InputError);
  EXPECT_THROW(float32_tensor("w", {int64_t{1} << 62, 4}), InputError);

  const Message two = make_message(MessageType::Push, 1, 0, {float32_tensor("w", {2})});
  const std::vector<float> v(3);
  EXPECT_THROW(encode_message(two, {}), InputError);
  EXPECT_THROW(encode_message(two, {span_of(v.data(), 3)}), InputError);
  EXPECT_THROW(encode_message(two, {ByteSpan{nullptr, 8}}), InputError);
  EXPECT_NO_THROW(encode_message(two, {span_of(v.data(), 2)}));
}

// ---- Each decode error from a crafted frame set ------------------------------------------------

struct BadCase {
  std::string what;
  Frames frames;
  DecodeError code;
  std::string phrase;  // must appear in the error text
  DecodeLimits limits = {};
};

std::vector<BadCase> bad_cases() {
  const std::vector<uint8_t> eight(8, 0x11);
  auto one = [](const std::string& name, std::vector<int64_t> shape,
                std::optional<uint64_t> bytes = std::nullopt, uint8_t dtype = 1) {
    Bytes body;
    body.entry(name, shape, bytes, dtype).u32(0);
    RawHeader h;
    h.tensor_count = 1;
    return raw_frame(h, body);
  };
  const std::vector<uint8_t> good = one("w", {2});
  auto header_with = [](auto edit, Bytes body = Bytes().u32(0)) {
    RawHeader h;
    edit(h);
    return raw_frame(h, body);
  };
  Bytes two_w;
  two_w.entry("w", {2}).entry("w", {2}).u32(0);
  DecodeLimits small;
  small.max_tensors = 2;
  small.max_message_bytes = 100;
  small.max_extra_bytes = 4;
  DecodeLimits huge;
  huge.max_message_bytes = std::numeric_limits<size_t>::max();
  Bytes two_halves;  // two tensors of 2^63 bytes each: the sum overflows 64 bits
  two_halves.entry("a", {int64_t{1} << 61}).entry("b", {int64_t{1} << 61}).u32(0);

  using E = DecodeError;
  return {
      {"no frames", {}, E::FrameCountMismatch, "no frames"},
      {"31-byte header",
       {std::vector<uint8_t>(good.begin(), good.begin() + 31), eight},
       E::Truncated,
       "header frame of 31 bytes; the fixed header alone needs 32"},
      {"body shorter than announced",
       {std::vector<uint8_t>(good.begin(), good.end() - 1), eight},
       E::Truncated,
       "its header says"},
      {"3 entries in 5 bytes",
       {header_with([](RawHeader& h) { h.tensor_count = 3; }, Bytes().u8(0).u32(0)), eight, eight,
        eight},
       E::Truncated,
       "cannot hold 3 tensor entries"},
      {"name runs past the body",
       {header_with([](RawHeader& h) { h.tensor_count = 1; },
                    Bytes().u16(40).str(std::string(15, 'x'))),
        eight},
       E::Truncated,
       "inside the name"},
      {"extra longer than the body",
       {header_with([](RawHeader&) {}, Bytes().u32(100).str("abc"))},
       E::Truncated,
       "only 3 remain"},
      {"bad magic",
       {header_with([](RawHeader& h) { h.magic = 0x12345678; })},
       E::BadMagic,
       "magic 0x12345678 is not 0x53504454"},
      {"protocol version 2",
       {header_with([](RawHeader& h) { h.version = 2; })},
       E::BadVersion,
       "the sender speaks protocol version 2, this build speaks version 1"},
      {"type 0",
       {header_with([](RawHeader& h) { h.type = 0; })},
       E::UnknownType,
       "unknown message type 0"},
      {"type 11",
       {header_with([](RawHeader& h) { h.type = 11; })},
       E::UnknownType,
       "unknown message type 11"},
      {"3 tensors over a limit of 2",
       {header_with([](RawHeader& h) { h.tensor_count = 3; })},
       E::TooManyTensors,
       "3 tensors; the limit is 2",
       small},
      {"header frame over the message limit",
       {header_with([](RawHeader&) {}, Bytes().u32(80).str(std::string(80, 'x')))},
       E::TooLarge,
       "a header frame of 116 bytes; the message limit is 100",
       small},
      {"tensor over the message limit",
       {one("w", {100}), std::vector<uint8_t>(400)},
       E::TooLarge,
       "takes the message past its limit of 100 bytes",
       small},
      {"dims 2^62 x 2^62",
       {one("w", {int64_t{1} << 62, int64_t{1} << 62}, 0), {}},
       E::TooLarge,
       "would hold more than 2^64 bytes"},
      {"dims 2^62 x 4 (x 4 bytes)",
       {one("w", {int64_t{1} << 62, 4}, 0), {}},
       E::TooLarge,
       "more than 2^64 bytes"},
      {"dim INT64_MAX",
       {one("w", {std::numeric_limits<int64_t>::max()}, 0), {}},
       E::TooLarge,
       "more than 2^64 bytes"},
      {"two tensors of 2^63 bytes",
       {header_with([](RawHeader& h) { h.tensor_count = 2; }, two_halves), {}, {}},
       E::TooLarge,
       "past its limit",
       huge},
      {"extra over its limit",
       {header_with([](RawHeader&) {}, Bytes().u32(5).str("12345"))},
       E::TooLarge,
       "an extra blob of 5 bytes; the limit is 4",
       small},
      {"name length 0", {one("", {2}), eight}, E::BadName, "name length 0 (must be 1..255)"},
      {"name length 256", {one(std::string(256, 'x'), {2}), eight}, E::BadName, "name length 256"},
      {"NUL in a name",
       {one(std::string("a\0b", 3), {2}), eight},
       E::BadName,
       "'a\\x00b' holds a NUL byte"},
      {"overlong UTF-8", {one("\xc0\xaf", {2}), eight}, E::BadName, "not valid UTF-8"},
      {"UTF-16 surrogate", {one("\xed\xa0\x80", {2}), eight}, E::BadName, "not valid UTF-8"},
      {"lone continuation byte", {one("a\x80", {2}), eight}, E::BadName, "not valid UTF-8"},
      {"cut UTF-8 sequence", {one("a\xe2\x82", {2}), eight}, E::BadName, "not valid UTF-8"},
      {"past U+10FFFF", {one("\xf4\x90\x80\x80", {2}), eight}, E::BadName, "not valid UTF-8"},
      {"two tensors named w",
       {header_with([](RawHeader& h) { h.tensor_count = 2; }, two_w), eight, eight},
       E::DuplicateName,
       "tensor 1: the name 'w' is used by an earlier tensor"},
      {"dtype 0", {one("w", {2}, 8, 0), eight}, E::BadDType, "unknown dtype 0"},
      {"dtype 2", {one("w", {2}, 8, 2), eight}, E::BadDType, "unknown dtype 2"},
      {"rank 5", {one("w", {1, 1, 1, 1, 2}), eight}, E::BadShape, "rank 5"},
      {"negative dimension",
       {one("w", {2, -4}, 0), {}},
       E::BadShape,
       "negative dimension in [2, -4]"},
      {"byte length disagrees with the shape",
       {one("w", {2}, 12), eight},
       E::LengthMismatch,
       "declares 12 bytes but shape [2] needs 8"},
      {"frame shorter than its entry",
       {good, std::vector<uint8_t>(7)},
       E::LengthMismatch,
       "frame 1 holds 7 bytes; tensor 0 ('w', shape [2]) needs 8"},
      {"a tensor frame missing", {good}, E::FrameCountMismatch, "1 frames"},
      {"one frame too many", {good, eight, eight}, E::FrameCountMismatch, "3 frames"},
      {"header frame longer than announced",
       {[&] {
          auto f = good;
          f.push_back(0);
          return f;
        }(),
        eight},
       E::TrailingBytes,
       "its header says"},
      {"bytes after the extra blob",
       {header_with([](RawHeader&) {}, Bytes().u32(1).str("ab"))},
       E::TrailingBytes,
       "1 bytes after the extra blob"},
  };
}

// An Error reply's kind travels apart from its text, through a whole message, so a requester
// acts on the kind; a blob without a newline (an older server's) is all text, of no kind.
TEST(WireProtocol, ErrorReasonKeepsKindAndTextApart) {
  const std::string text = "not initialised yet\nsecond line: a kind's words in the text";
  const Message sent = make_message(MessageType::Error, 7, 3, {},
                                    encode_error_reason(kNotInitialised, text));
  const OutgoingMessage out = encode_message(sent, {});
  const DecodeResult r = decode(out.frames());
  ASSERT_TRUE(r.ok()) << r.error;
  const ErrorReason reason = decode_error_reason(r.message.extra);
  EXPECT_EQ(reason.kind, kNotInitialised);
  EXPECT_EQ(reason.text, text);

  const ErrorReason bare = decode_error_reason("not initialised yet");
  EXPECT_EQ(bare.kind, "");
  EXPECT_EQ(bare.text, "not initialised yet");
  const ErrorReason empty_kind = decode_error_reason(encode_error_reason("", "why"));
  EXPECT_EQ(empty_kind.kind, "");
  EXPECT_EQ(empty_kind.text, "why");
  EXPECT_THROW(encode_error_reason("two\nlines", "why"), InputError);
}

TEST(WireProtocolDecode, EachErrorFromACraftedFrameSet) {
  std::set<DecodeError> seen;
  for (const BadCase& c : bad_cases()) {
    SCOPED_TRACE(c.what);
    const std::vector<ByteSpan> frames = spans(c.frames);
    const DecodeResult r = decode(frames, c.limits);
    EXPECT_STREQ(to_string(r.code), to_string(c.code)) << r.error;
    EXPECT_NE(r.error.find(c.phrase), std::string::npos)
        << "expected \"" << c.phrase << "\" in: " << r.error;
    EXPECT_TRUE(decodes_consistently(frames, c.limits));
    seen.insert(r.code);
  }
  // Every code but Ok has a case above.
  for (int code = 1; code <= static_cast<int>(DecodeError::TrailingBytes); ++code)
    EXPECT_TRUE(seen.count(static_cast<DecodeError>(code)))
        << "no case for " << to_string(static_cast<DecodeError>(code));
}

TEST(WireProtocolDecode, HeaderIsKeptForTheErrorReplyOnceItChecksOut) {
  Bytes body;
  body.entry("w", {2}, 12).u32(0);
  RawHeader h;
  h.tensor_count = 1;
  h.request_id = 99;
  const std::vector<uint8_t> bad_entry = raw_frame(h, body), eight(8);
  DecodeResult r = decode(spans({bad_entry, eight}));
  EXPECT_EQ(r.code, DecodeError::LengthMismatch);
  EXPECT_TRUE(r.header_ok);
  EXPECT_EQ(r.message.header.request_id, 99u);
  EXPECT_EQ(r.message.header.type, MessageType::PushPull);

  h.version = 3;
  const std::vector<uint8_t> bad_version = raw_frame(h, body);
  r = decode(spans({bad_version, eight}));
  EXPECT_EQ(r.code, DecodeError::BadVersion);
  EXPECT_FALSE(r.header_ok);
}

TEST(WireProtocolDecode, ZeroDimensionMakesAnyShapeEmpty) {
  // product(dims) is 0 whatever the other dimensions are, in any order, on both sides.
  for (const std::vector<int64_t>& shape :
       {std::vector<int64_t>{int64_t{1} << 62, int64_t{1} << 62, 0},
        std::vector<int64_t>{0, int64_t{1} << 62, int64_t{1} << 62}}) {
    const Sample s = make_sample(MessageType::Push, {float32_tensor("z", shape)}, "");
    const DecodeResult r = decode(spans(s.frames));
    ASSERT_TRUE(r.ok()) << r.error;
    EXPECT_EQ(r.message.tensors[0].bytes, 0u);
  }
}

// ---- Limits
// --------------------------------------------------------------------------------------

TEST(WireProtocolDecode, LimitsAreInclusive) {
  const Sample s = make_sample(MessageType::PushPull,
                               {float32_tensor("a", {3, 5}), float32_tensor("b", {7})}, "xyz");
  const std::vector<ByteSpan> frames = spans(s.frames);
  const size_t total = s.frames[0].size() + 15 * 4 + 7 * 4;

  DecodeLimits at;
  at.max_tensors = 2;
  at.max_message_bytes = total;
  at.max_extra_bytes = 3;
  EXPECT_TRUE(decode(frames, at).ok()) << decode(frames, at).error;

  DecodeLimits fewer = at;
  fewer.max_tensors = 1;
  EXPECT_EQ(decode(frames, fewer).code, DecodeError::TooManyTensors);
  DecodeLimits smaller = at;
  smaller.max_message_bytes = total - 1;
  EXPECT_EQ(decode(frames, smaller).code, DecodeError::TooLarge);
  DecodeLimits less_extra = at;
  less_extra.max_extra_bytes = 2;
  EXPECT_EQ(decode(frames, less_extra).code, DecodeError::TooLarge);

  // The defaults: 4096 tensors pass, 4097 do not.
  for (const size_t count : {size_t{4096}, size_t{4097}}) {
    std::vector<TensorInfo> many;
    for (size_t i = 0; i < count; ++i) many.push_back(float32_tensor("t" + std::to_string(i), {0}));
    const Sample big = make_sample(MessageType::Push, many, "");
    const DecodeResult r = decode(spans(big.frames));
    EXPECT_EQ(r.code, count <= 4096 ? DecodeError::Ok : DecodeError::TooManyTensors) << r.error;
  }
}

// ---- Truncations, flipped bytes, fuzz
// ------------------------------------------------------------

Sample several_tensors_sample() {
  return make_sample(MessageType::PushPull, tensor_sets()[2], "{\"lr\": 0.01}", 5);
}

TEST(WireProtocolDecode, EveryTruncationOfAHeaderFrameFailsCleanly) {
  const Sample s = several_tensors_sample();
  const std::vector<uint8_t>& full = s.frames[0];
  for (size_t n = 0; n < full.size(); ++n) {
    SCOPED_TRACE("prefix of " + std::to_string(n) + " bytes");
    Frames cut = s.frames;
    cut[0].assign(full.begin(), full.begin() + n);
    const DecodeResult r = decode(spans(cut));
    EXPECT_STREQ(to_string(r.code), "Truncated") << r.error;

    // Also with body_bytes rewritten to fit the prefix, so the table parser meets the cut.
    if (n >= kFixedHeaderBytes) {
      const uint32_t body = static_cast<uint32_t>(n - kFixedHeaderBytes);
      for (int i = 0; i < 4; ++i) cut[0][28 + i] = static_cast<uint8_t>(body >> (8 * i));
      const DecodeResult r2 = decode(spans(cut));
      EXPECT_STREQ(to_string(r2.code), "Truncated") << r2.error;
    }
  }
}

TEST(WireProtocolDecode, EveryFlippedByteOfAHeaderFrameIsHandled) {
  const Sample s = several_tensors_sample();
  size_t accepted = 0;
  for (size_t pos = 0; pos < s.frames[0].size(); ++pos) {
    for (const uint8_t mask : {0x01, 0x10, 0x80, 0xFF}) {
      Frames f = s.frames;
      f[0][pos] ^= mask;
      DecodeError code;
      ASSERT_TRUE(decodes_consistently(spans(f), {}, &code))
          << "byte " << pos << " xor " << int(mask);
      accepted += code == DecodeError::Ok;
    }
  }
  // request_id and parameter_version are free-form: their 16 bytes x 4 masks must pass.
  EXPECT_GE(accepted, 64u);
}

// mt19937's output is fixed by the standard (its distributions are not), so the fuzz cases are
// the same everywhere.
struct Fuzzer {
  explicit Fuzzer(uint32_t seed) : gen(seed) {}
  uint32_t below(uint32_t n) { return gen() % n; }
  uint8_t byte() { return static_cast<uint8_t>(gen()); }

  std::vector<uint8_t> random_bytes(size_t n) {
    std::vector<uint8_t> b(n);
    for (auto& x : b) x = byte();
    return b;
  }

  // A valid message: up to 5 tensors of rank 0..4 with dims 0..3, distinct short names (some
  // non-ASCII, many one letter of a..d so that a mutated letter often repeats a name), a random
  // extra blob.
  Sample random_sample() {
    static const std::vector<std::string> pieces = {
        "a", "b", "c", "d", ".", "\xc3\xa9", "\xe6\xb7\xb1", "\xf0\x9f\x98\x80"};
    std::vector<TensorInfo> tensors;
    std::set<std::string> names;
    const uint32_t count = below(6);
    for (uint32_t i = 0; i < count; ++i) {
      std::string name;
      while (name.empty() || !names.insert(name).second) {
        name.clear();
        if (below(4) != 0) {
          name = pieces[below(4)];
        } else {
          for (uint32_t k = 1 + below(2); k > 0; --k)
            name += pieces[below(uint32_t(pieces.size()))];
        }
      }
      std::vector<int64_t> shape(below(5));
      for (auto& d : shape) d = below(4);
      tensors.push_back(float32_tensor(name, shape));
    }
    const std::vector<uint8_t> extra = random_bytes(below(3) == 0 ? below(40) : 0);
    Sample s = make_sample(static_cast<MessageType>(1 + below(9)), tensors,
                           std::string(extra.begin(), extra.end()), gen());
    s.message.header.request_id = uint64_t{gen()} << 32 | gen();
    s.frames[0] = encode_header_frame(s.message);
    return s;
  }

  // One to three edits of the kind a broken or hostile peer makes, to the frames of `m`.
  void mutate(Frames& f, const Message& m) {
    std::vector<size_t> name_bytes;  // where m's names are in its header frame
    size_t at = kFixedHeaderBytes;
    for (const TensorInfo& t : m.tensors) {
      for (size_t k = 0; k < t.name.size(); ++k) name_bytes.push_back(at + 2 + k);
      at += 2 + t.name.size() + 2 + 8 * t.shape.size() + 8;
    }
    static const uint64_t interesting[] = {0,
                                           1,
                                           255,
                                           256,
                                           0xFFFF,
                                           0x7FFFFFFF,
                                           0xFFFFFFFF,
                                           uint64_t{1} << 62,
                                           ~uint64_t{0},
                                           uint64_t{1} << 63};
    for (uint32_t edits = 1 + below(3); edits > 0; --edits) {
      std::vector<uint8_t>& head = f[0];
      switch (below(9)) {
        case 0:  // flip a byte
          if (!head.empty())
            head[below(uint32_t(head.size()))] ^= static_cast<uint8_t>(1 + below(255));
          break;
        case 1:  // overwrite 1, 2, 4 or 8 bytes with a boundary value
          if (!head.empty()) {
            const size_t width = size_t{1} << below(4);
            const size_t pos = below(uint32_t(head.size()));
            const uint64_t v = interesting[below(10)];
            for (size_t i = 0; i < width && pos + i < head.size(); ++i)
              head[pos + i] = static_cast<uint8_t>(v >> (8 * i));
          }
          break;
        case 2:  // cut the header frame
          head.resize(below(uint32_t(head.size()) + 1));
          break;
        case 3:  // insert or append random bytes
          head.insert(head.begin() + below(uint32_t(head.size()) + 1), 1 + below(8), byte());
          break;
        case 4:  // drop a frame or add one
          if (f.size() > 1 && below(2)) {
            f.erase(f.begin() + 1 + below(uint32_t(f.size() - 1)));
          } else {
            f.push_back(random_bytes(below(3) * 4));
          }
          break;
        case 5:  // resize a tensor frame
          if (f.size() > 1) f[1 + below(uint32_t(f.size() - 1))].resize(below(20));
          break;
        case 6:  // tensor_count +-1
          if (head.size() >= 28) head[24] = static_cast<uint8_t>(head[24] + (below(2) ? 1 : -1));
          break;
        case 7:  // remove a byte
          if (!head.empty()) head.erase(head.begin() + below(uint32_t(head.size())));
          break;
        case 8:  // a letter a..d in a name (if the frame still has it there): may repeat a name
          if (!name_bytes.empty()) {
            const size_t pos = name_bytes[below(uint32_t(name_bytes.size()))];
            if (pos < head.size()) head[pos] = static_cast<uint8_t>('a' + below(4));
          }
          break;
      }
      // Usually make body_bytes agree with the frame again, so the table parser is reached.
      // (f[0] afresh: adding a frame above may have moved it.)
      std::vector<uint8_t>& fixed = f[0];
      if (fixed.size() >= kFixedHeaderBytes && below(4) != 0) {
        const uint32_t body = static_cast<uint32_t>(fixed.size() - kFixedHeaderBytes);
        for (int i = 0; i < 4; ++i) fixed[28 + i] = static_cast<uint8_t>(body >> (8 * i));
      }
    }
  }

  std::mt19937 gen;
};

TEST(WireProtocolDecode, BoundedFuzz) {
  const uint32_t seed = 20240611;
  Fuzzer fz(seed);
  DecodeLimits limits;
  limits.max_tensors = 64;
  limits.max_message_bytes = 1 << 16;
  limits.max_extra_bytes = 256;
  std::map<DecodeError, int> codes;
  auto check = [&](const Frames& f, const char* kind, int i) {
    DecodeError code;
    ::testing::AssertionResult ok = decodes_consistently(spans(f), limits, &code);
    codes[code]++;
    if (!ok) ok << " (" << kind << " case " << i << ", seed " << seed << ")";
    return ok;
  };

  // Random frame sets: pure noise, then noise behind a plausible fixed header.
  for (int i = 0; i < 20000; ++i) {
    Frames f(1 + fz.below(5));
    for (auto& frame : f) frame = fz.random_bytes(fz.below(300));
    if (i % 2 == 1 && f[0].size() >= kFixedHeaderBytes) {
      RawHeader h;
      h.type = static_cast<uint16_t>(1 + fz.below(9));
      h.tensor_count = static_cast<uint32_t>(f.size() - 1);
      const std::vector<uint8_t> fixed = raw_frame(h, Bytes());
      std::copy(fixed.begin(), fixed.begin() + 28, f[0].begin());
      const uint32_t body = static_cast<uint32_t>(f[0].size() - kFixedHeaderBytes);
      for (int k = 0; k < 4; ++k) f[0][28 + k] = static_cast<uint8_t>(body >> (8 * k));
    }
    ASSERT_TRUE(check(f, "random", i));
  }

  // Valid messages, round-tripped, then mutated.
  for (int i = 0; i < 20000; ++i) {
    Sample s = fz.random_sample();
    DecodeError code;
    ASSERT_TRUE(decodes_consistently(spans(s.frames), limits, &code)) << "valid case " << i;
    ASSERT_EQ(code, DecodeError::Ok) << "valid case " << i;
    fz.mutate(s.frames, s.message);
    ASSERT_TRUE(check(s.frames, "mutated", i));
  }

  // The fuzz reached every check, and some mutations survived (and re-encoded identically).
  std::string histogram;
  for (const auto& [code, n] : codes)
    histogram += std::string(to_string(code)) + "=" + std::to_string(n) + " ";
  RecordProperty("codes", histogram);
  for (int code = 0; code <= static_cast<int>(DecodeError::TrailingBytes); ++code)
    EXPECT_GT(codes[static_cast<DecodeError>(code)], 0)
        << to_string(static_cast<DecodeError>(code)) << " never reached: " << histogram;
}

// ---- all_finite ---------------------------------------------------------------------------------

uint32_t bits_of(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

TEST(AllFinite, FindsNaNAndInfinityAtEveryPositionAndAlignment) {
  const size_t n = 37;  // not a multiple of any vector width
  std::vector<float> values = test::random_floats(n, 21, -1e30f, 1e30f);
  // Finite edge cases must pass.
  values[0] = std::numeric_limits<float>::max();
  values[1] = std::numeric_limits<float>::lowest();
  values[2] = std::numeric_limits<float>::denorm_min();
  values[3] = -0.0f;
  const uint32_t specials[] = {bits_of(NAN),           bits_of(INFINITY),
                               bits_of(-INFINITY),     0x7F800001u /* signalling NaN */,
                               0xFFC00000u /* -NaN */, 0x7FFFFFFFu};
  std::vector<uint8_t> buffer(n * 4 + 8);
  for (size_t offset = 0; offset < 4; ++offset) {
    uint8_t* base = buffer.data() + offset;
    std::memcpy(base, values.data(), n * 4);
    const ByteSpan span{base, n * 4};
    ASSERT_TRUE(all_finite(span)) << "offset " << offset;
    EXPECT_EQ(first_non_finite(span), std::numeric_limits<size_t>::max());
    for (size_t pos = 0; pos < n; ++pos) {
      for (const uint32_t bad : specials) {
        std::memcpy(base + 4 * pos, &bad, 4);
        EXPECT_FALSE(all_finite(span))
            << "offset " << offset << ", position " << pos << ", bits 0x" << std::hex << bad;
        EXPECT_EQ(first_non_finite(span), pos);
      }
      std::memcpy(base + 4 * pos, &values[pos], 4);
    }
  }
}

TEST(AllFinite, AcrossBlockBoundariesAndOddSizes) {
  const size_t n = 2500;
  std::vector<float> values = test::random_floats(n, 22);
  EXPECT_TRUE(all_finite(span_of(values.data(), n)));
  for (const size_t pos :
       {size_t{0}, size_t{1023}, size_t{1024}, size_t{2047}, size_t{2048}, n - 1}) {
    const float keep = values[pos];
    values[pos] = NAN;
    EXPECT_FALSE(all_finite(span_of(values.data(), n))) << pos;
    EXPECT_EQ(first_non_finite(span_of(values.data(), n)), pos);
    values[pos] = keep;
  }
  EXPECT_TRUE(all_finite(ByteSpan{}));  // no values: nothing to reject
  const std::vector<uint8_t> ragged(4 * 3 + 1);
  EXPECT_FALSE(all_finite(span_of(ragged)));  // not a float32 array
}

}  // namespace
}  // namespace tandem::transport
