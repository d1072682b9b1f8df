// The parameter server's wire protocol: how one message becomes a list of frames and back. Pure
// encoding and decoding, with no ZeroMQ in it; the sockets hand this code byte spans.
//
// A message is 1 + N frames. Frame 0, the header frame, is a fixed 32-byte header and a body;
// frames 1..N hold the N tensors' raw bytes, one frame each, so a sender can give ZeroMQ the
// tensor memory itself (zero-copy) and a receiver can read a tensor in place.
//
// Every integer is little-endian. Byte offsets in the header frame:
//
//   0  uint32 magic              0x53504454, the bytes "TDPS"
//   4  uint16 version            kProtocolVersion
//   6  uint16 type               MessageType
//   8  uint64 request_id         chosen by the requester, echoed by the reply
//  16  uint64 parameter_version  the server's global step (its parameters' version)
//  24  uint32 tensor_count       N
//  28  uint32 body_bytes         the header frame holds exactly 32 + body_bytes bytes
//  32  body: N tensor entries, then the extra blob
//
//   tensor entry: uint16 name length (1..255), the name (UTF-8, no NUL), uint8 dtype (DType),
//                 uint8 rank (0..4), rank x int64 dims (each >= 0), uint64 byte length (exactly
//                 product(dims) * dtype size, and exactly the size of that tensor's frame)
//   extra blob:   uint32 length, then that many bytes (always present, often empty): small
//                 typed fields such as an error text, a stats JSON or options
//
// The encoding is canonical: every field is checked and nothing is left over, so a header frame
// the decoder accepts re-encodes to exactly the same bytes. The tensor bytes themselves are the
// sender's memory as is: float32 values in the host's order, which must be little-endian.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::transport {

constexpr uint32_t kMagic = 0x53504454;  // "TDPS" read as a little-endian uint32
constexpr uint16_t kProtocolVersion = 1;
constexpr size_t kFixedHeaderBytes = 32;
constexpr size_t kMaxNameBytes = 255;  // the length field is a uint16, leaving room to grow
constexpr size_t kMaxRank = 4;

enum class MessageType : uint16_t {
  Init = 1,    // worker -> server: register, get the parameters' names and shapes
  Pull,        // worker -> server: ask for parameters
  Push,        // worker -> server: gradients, one-way (no reply; bad ones are dropped, counted)
  PushPull,    // worker -> server: gradients, then the updated parameters in the reply
  Stats,       // anyone -> server: counters, as JSON in the extra blob of the reply
  Checkpoint,  // -> server: write a checkpoint
  Shutdown,    // -> server: stop
  Reply,       // server -> requester: success, echoing request_id
  Error,       // server -> requester: failure, its kind and text in the extra blob
  Idle,        // worker -> server: one-way: it has no batch to train for now (ps_server.h)
};

// The name of a type ("PushPull"), or "unknown" for a value outside the enum.
const char* to_string(MessageType type);

enum class DType : uint8_t {
  Float32 = 1,
};

// Bytes per element; 0 for a value outside the enum.
size_t dtype_size(DType dtype);

// A read-only view of bytes owned by someone else: a received frame or a tensor to send.
struct ByteSpan {
  const uint8_t* data = nullptr;
  size_t size = 0;
};

inline ByteSpan span_of(const std::vector<uint8_t>& bytes) { return {bytes.data(), bytes.size()}; }
inline ByteSpan span_of(const float* values, size_t count) {
  return {reinterpret_cast<const uint8_t*>(values), count * sizeof(float)};
}

// One entry of the tensor table: what the matching frame holds.
struct TensorInfo {
  std::string name;
  DType dtype = DType::Float32;
  std::vector<int64_t> shape;  // empty: a scalar with one element
  uint64_t bytes = 0;          // product(shape) * dtype_size(dtype)
};

// The fixed header's fields that vary. Magic and version are constants on the way out and
// checked on the way in; tensor_count and body_bytes follow from the Message.
struct Header {
  MessageType type = MessageType::Reply;
  uint64_t request_id = 0;
  uint64_t parameter_version = 0;
};

// Everything frame 0 carries. The tensors' bytes travel beside it (ByteSpans, not copied).
struct Message {
  Header header;
  std::vector<TensorInfo> tensors;  // in frame order: tensors[i] describes frame i + 1
  std::string extra;                // free-form bytes; may be empty
};

bool operator==(const TensorInfo& a, const TensorInfo& b);
bool operator==(const Header& a, const Header& b);
bool operator==(const Message& a, const Message& b);
inline bool operator!=(const Message& a, const Message& b) { return !(a == b); }

// ---- Encoding (our own messages: a bad one is a bug, so these throw InputError) -------------

// A float32 table entry with its byte length computed; InputError for a bad name or shape.
TensorInfo float32_tensor(std::string name, std::vector<int64_t> shape);

Message make_message(MessageType type, uint64_t request_id, uint64_t parameter_version,
                     std::vector<TensorInfo> tensors = {}, std::string extra = {});

// An Error reply's extra blob: the reason's kind, a newline, then the text for people. The kind
// is a short fixed phrase a requester may act on, one of those below; the text may change between
// versions, so nobody should match it. A blob with no newline is all text, of no kind (an older
// server's).
inline constexpr char kNotInitialised[] = "not initialised";  // no parameters yet: retry later
inline constexpr char kUnknownName[] = "unknown name";        // a tensor the server does not hold
inline constexpr char kWrongDtype[] = "wrong dtype";          // a gradient that is not float32
inline constexpr char kWrongShape[] = "wrong shape";          // not the parameter's shape
inline constexpr char kNonFinite[] = "non-finite";            // a NaN or infinite gradient
inline constexpr char kMissingGradient[] = "missing gradient";  // a push lacks a parameter's
inline constexpr char kBadInitialTensor[] = "bad initial tensor";  // an Init the shard refuses
inline constexpr char kTensorsInPull[] = "tensors in a Pull";      // a Pull carries none
inline constexpr char kUnsupported[] = "unsupported";  // an unknown request, or no checkpoints
inline constexpr char kCheckpointFailed[] = "checkpoint failed";  // the file could not be written
inline constexpr char kShardFailed[] = "shard failed";  // its GPU failed: restart the server
// A message that does not decode: this, then its DecodeError's name ("malformed: Truncated").
inline constexpr char kMalformed[] = "malformed: ";

struct ErrorReason {
  std::string kind;  // empty: none given
  std::string text;
};

// The extra blob for an Error reply; InputError for a kind that holds a newline.
std::string encode_error_reason(const std::string& kind, const std::string& text);
ErrorReason decode_error_reason(const std::string& extra);

// Frame 0 of `message`. InputError (naming the tensor and the problem) for an unknown type or
// dtype, a bad or repeated name, a bad shape, a byte length that does not match the shape, or
// counts and sizes that do not fit the header's fields.
std::vector<uint8_t> encode_header_frame(const Message& message);

// A message ready for the socket: the header frame (owned) and the tensor frames (borrowed).
struct OutgoingMessage {
  std::vector<uint8_t> header_frame;
  std::vector<ByteSpan> tensor_frames;

  std::vector<ByteSpan> frames() const;  // header frame first, then the tensors
};

// encode_header_frame plus a check that tensor_data has one span per tensor, each exactly as
// long as its table entry says (InputError otherwise). The spans must outlive the send.
OutgoingMessage encode_message(const Message& message, std::vector<ByteSpan> tensor_data);

// One float32 tensor to send; `data` holds product(shape) values and must outlive the send.
struct FloatTensorRef {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// The usual way to send tensors: a message over named float32 tensors, zero-copy.
OutgoingMessage encode_float_message(MessageType type, uint64_t request_id,
                                     uint64_t parameter_version,
                                     const std::vector<FloatTensorRef>& tensors,
                                     std::string extra = {});

// ---- Decoding (anyone's bytes: never throws on bad input, never reads out of bounds) --------

enum class DecodeError : uint8_t {
  Ok = 0,
  Truncated,           // a frame or field ends before the data it announces
  BadMagic,            // the first 4 bytes are not "TDPS"
  BadVersion,          // another protocol version
  UnknownType,         // a message type outside MessageType
  TooManyTensors,      // tensor_count above DecodeLimits::max_tensors
  TooLarge,            // over a size limit, or a shape whose byte count overflows 64 bits
  BadName,             // empty, longer than 255 bytes, holding a NUL, or not UTF-8
  DuplicateName,       // two tensors with one name
  BadDType,            // a dtype outside DType
  BadShape,            // rank above 4 or a negative dimension
  LengthMismatch,      // a byte length that disagrees with the shape, or a frame with its entry
  FrameCountMismatch,  // not 1 + tensor_count frames
  TrailingBytes,       // bytes after the extra blob or after the header frame's announced end
};

const char* to_string(DecodeError code);  // "Truncated", ...

// Limits on what one message may claim, so a hostile peer cannot make the decoder allocate or
// read without bound. Sizes count the header frame plus every tensor frame. They act once ZeroMQ
// has received the message whole: the socket's ZMQ_MAXMSGSIZE (max_message_bytes) bounds each
// frame (ZeroMQ closes the connection of a peer that sends a longer one: no reply, and nothing
// the server could count, since it never sees the message), but nothing in ZeroMQ bounds a
// message's count of frames, so a peer that can connect can still make the server's ZeroMQ
// buffer a huge message before it is refused here. Against
// peers that are not trusted, CURVE with an allowed-clients list keeps them from connecting.
struct DecodeLimits {
  size_t max_tensors = 4096;
  size_t max_message_bytes = size_t{1} << 30;  // 1 GiB
  size_t max_extra_bytes = size_t{1} << 20;    // 1 MiB
};

struct DecodeResult {
  DecodeError code = DecodeError::Ok;
  std::string error;  // what was wrong and where (byte offset of frame 0, tensor index)

  // Set once the fixed header's magic, version and type passed, whether or not the rest did:
  // then message.header is filled in, so the server can address an error reply to request_id
  // (or, for a one-way Push, drop and count it).
  bool header_ok = false;

  Message message;                    // complete only when ok()
  std::vector<ByteSpan> tensor_data;  // when ok(): frames 1..N, parallel to message.tensors

  bool ok() const { return code == DecodeError::Ok; }
};

// Decodes the frames of one message. The ByteSpans in the result point into `frames`' memory,
// which must outlive them. Never throws on bad input (only std::bad_alloc could escape, and the
// limits bound what is allocated).
DecodeResult decode(const std::vector<ByteSpan>& frames, const DecodeLimits& limits = {});

// ---- Checking values ----------------------------------------------------------------------

// True when every float32 in `float32_data` is finite (no NaN, +Inf or -Inf). The span may be
// unaligned. A size that is not a multiple of 4 is not a float32 array: false.
bool all_finite(ByteSpan float32_data);

// The index of the first non-finite float32, or SIZE_MAX when there is none: for the error
// text once all_finite has said no.
size_t first_non_finite(ByteSpan float32_data);

}  // namespace tandem::transport
