#include "wire_protocol.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "tandem/error.h"

namespace tandem::transport {
namespace {

// Header integers are written and read byte by byte, which is right on any host. Tensor frames
// are host memory sent as is, and all_finite reads them as host floats: the protocol says they
// are little-endian, so the host must be.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tensor frames carry host-order floats; the protocol needs a little-endian host");
#else
#error "cannot tell this compiler's byte order; the wire protocol needs a little-endian host"
#endif

constexpr uint16_t kLastType = static_cast<uint16_t>(MessageType::Idle);
// The smallest tensor entry: a 1-byte name, dtype, rank 0 and the byte length.
constexpr uint64_t kMinEntryBytes = 2 + 1 + 1 + 1 + 8;
constexpr uint64_t kExtraLengthBytes = 4;

// ---- Shared checks: the encoder and the decoder must agree on what is valid ----------------

bool valid_utf8(const uint8_t* p, size_t n) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1Fu, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0Fu, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07u, min = 0x10000;
    } else {
      return false;  // a continuation byte first, or 0xF8..0xFF
    }
    if (n - i < len) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3Fu);
    }
    // Overlong forms, UTF-16 surrogates and code points past Unicode are not UTF-8.
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

// Why a name is unacceptable, or nullptr when it is fine. Names are checked as UTF-8 so that
// they can go into logs, error texts and the stats JSON without further escaping.
const char* name_problem(const uint8_t* p, size_t n) {
  if (n == 0) return "is empty";
  if (n > kMaxNameBytes) return "is longer than 255 bytes";
  if (std::memchr(p, 0, n) != nullptr) return "holds a NUL byte";
  if (!valid_utf8(p, n)) return "is not valid UTF-8";
  return nullptr;
}

const char* name_problem(const std::string& name) {
  return name_problem(reinterpret_cast<const uint8_t*>(name.data()), name.size());
}

// A name for an error text: printable ASCII as is, every other byte as \xNN, in quotes.
std::string quoted(std::string_view name) {
  static const char* hex = "0123456789abcdef";
  std::string s = "'";
  for (const char ch : name) {
    const auto c = static_cast<uint8_t>(ch);
    if (c >= 0x20 && c < 0x7F && c != '\\') {
      s += ch;
    } else {
      s += "\\x";
      s += hex[c >> 4];
      s += hex[c & 15];
    }
  }
  return s + "'";
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

enum class ShapeCheck { Ok, NegativeDim, Overflow };

// product(shape) * element_size into *bytes. Any zero dimension makes the tensor empty, so the
// answer does not depend on the order of the dimensions; otherwise every partial product must
// fit in 64 bits (a hostile header can claim [2^62, 2^62]).
ShapeCheck shape_bytes(const std::vector<int64_t>& shape, size_t element_size, uint64_t* bytes) {
  for (const int64_t d : shape)
    if (d < 0) return ShapeCheck::NegativeDim;
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) {
    *bytes = 0;
    return ShapeCheck::Ok;
  }
  uint64_t n = element_size;
  for (const int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return ShapeCheck::Overflow;
  *bytes = n;
  return ShapeCheck::Ok;
}

// ---- Little-endian writing -------------------------------------------------------------------

template <typename T>
void put(std::vector<uint8_t>& out, T value) {
  using U = std::make_unsigned_t<T>;
  const auto u = static_cast<U>(value);
  for (size_t i = 0; i < sizeof(U); ++i) out.push_back(static_cast<uint8_t>(u >> (8 * i)));
}

// ---- Bounded little-endian reading ---------------------------------------------------------

// Reads fields from [data, data + size) of frame 0 and never past it; a read that does not fit
// returns false and consumes nothing. offset() is the position in frame 0, for error texts.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, size_t offset) : data_(data), end_(size), pos_(offset) {}

  size_t offset() const { return pos_; }
  size_t remaining() const { return end_ - pos_; }

  template <typename T>
  bool get(T* value) {
    using U = std::make_unsigned_t<T>;
    if (remaining() < sizeof(U)) return false;
    U u = 0;
    for (size_t i = 0; i < sizeof(U); ++i) u |= static_cast<U>(U{data_[pos_ + i]} << (8 * i));
    pos_ += sizeof(U);
    *value = static_cast<T>(u);  // two's complement for int64 (well defined since C++20, and
                                 // what every C++17 compiler does)
    return true;
  }

  // A pointer to the next n bytes, which are then consumed.
  bool bytes(size_t n, const uint8_t** out) {
    if (remaining() < n) return false;
    *out = data_ + pos_;
    pos_ += n;
    return true;
  }

 private:
  const uint8_t* data_;
  size_t end_;
  size_t pos_;
};

// ---- Encoding helpers ------------------------------------------------------------------------

[[noreturn]] void encode_error(const Message& m, const std::string& what) {
  throw InputError(std::string("wire protocol: cannot encode a ") + to_string(m.header.type) +
                   " message (request " + std::to_string(m.header.request_id) + "): " + what);
}

std::string tensor_label(size_t index, const std::string& name) {
  return "tensor " + std::to_string(index) + " (" + quoted(name) + ")";
}

// ---- Decoding --------------------------------------------------------------------------------

// Builds the failed result: the code, the text, and the header if it was read. Whatever else
// was decoded is dropped so that a failed result never carries half a message.
DecodeResult failure(DecodeResult&& r, DecodeError code, std::string text) {
  r.code = code;
  r.error = "wire protocol: " + std::move(text);
  r.message.tensors.clear();
  r.message.extra.clear();
  r.tensor_data.clear();
  return std::move(r);
}

std::string at(size_t offset) { return "header frame byte " + std::to_string(offset) + ": "; }

}  // namespace

const char* to_string(MessageType type) {
  switch (type) {
    case MessageType::Init:
      return "Init";
    case MessageType::Pull:
      return "Pull";
    case MessageType::Push:
      return "Push";
    case MessageType::PushPull:
      return "PushPull";
    case MessageType::Stats:
      return "Stats";
    case MessageType::Checkpoint:
      return "Checkpoint";
    case MessageType::Shutdown:
      return "Shutdown";
    case MessageType::Reply:
      return "Reply";
    case MessageType::Error:
      return "Error";
    case MessageType::Idle:
      return "Idle";
  }
  return "unknown";
}

const char* to_string(DecodeError code) {
  switch (code) {
    case DecodeError::Ok:
      return "Ok";
    case DecodeError::Truncated:
      return "Truncated";
    case DecodeError::BadMagic:
      return "BadMagic";
    case DecodeError::BadVersion:
      return "BadVersion";
    case DecodeError::UnknownType:
      return "UnknownType";
    case DecodeError::TooManyTensors:
      return "TooManyTensors";
    case DecodeError::TooLarge:
      return "TooLarge";
    case DecodeError::BadName:
      return "BadName";
    case DecodeError::DuplicateName:
      return "DuplicateName";
    case DecodeError::BadDType:
      return "BadDType";
    case DecodeError::BadShape:
      return "BadShape";
    case DecodeError::LengthMismatch:
      return "LengthMismatch";
    case DecodeError::FrameCountMismatch:
      return "FrameCountMismatch";
    case DecodeError::TrailingBytes:
      return "TrailingBytes";
  }
  return "unknown";
}

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::Float32:
      return 4;
  }
  return 0;
}

bool operator==(const TensorInfo& a, const TensorInfo& b) {
  return a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.bytes == b.bytes;
}

bool operator==(const Header& a, const Header& b) {
  return a.type == b.type && a.request_id == b.request_id &&
         a.parameter_version == b.parameter_version;
}

bool operator==(const Message& a, const Message& b) {
  return a.header == b.header && a.tensors == b.tensors && a.extra == b.extra;
}

// ---- Encoding ----------------------------------------------------------------------------------

TensorInfo float32_tensor(std::string name, std::vector<int64_t> shape) {
  if (const char* why = name_problem(name))
    throw InputError("wire protocol: tensor name " + quoted(name) + " " + why);
  if (shape.size() > kMaxRank)
    throw InputError("wire protocol: tensor " + quoted(name) + " has rank " +
                     std::to_string(shape.size()) + "; at most 4 is supported");
  uint64_t bytes = 0;
  switch (shape_bytes(shape, dtype_size(DType::Float32), &bytes)) {
    case ShapeCheck::Ok:
      break;
    case ShapeCheck::NegativeDim:
      throw InputError("wire protocol: tensor " + quoted(name) + " has a negative dimension in " +
                       shape_text(shape));
    case ShapeCheck::Overflow:
      throw InputError("wire protocol: tensor " + quoted(name) + " of shape " + shape_text(shape) +
                       " has more than 2^64 bytes");
  }
  return {std::move(name), DType::Float32, std::move(shape), bytes};
}

Message make_message(MessageType type, uint64_t request_id, uint64_t parameter_version,
                     std::vector<TensorInfo> tensors, std::string extra) {
  Message m;
  m.header = {type, request_id, parameter_version};
  m.tensors = std::move(tensors);
  m.extra = std::move(extra);
  return m;
}

std::string encode_error_reason(const std::string& kind, const std::string& text) {
  if (kind.find('\n') != std::string::npos)
    throw InputError("wire protocol: an error kind holds a newline: " + quoted(kind));
  return kind + '\n' + text;
}

ErrorReason decode_error_reason(const std::string& extra) {
  const size_t newline = extra.find('\n');
  if (newline == std::string::npos) return {std::string(), extra};
  return {extra.substr(0, newline), extra.substr(newline + 1)};
}

std::vector<uint8_t> encode_header_frame(const Message& m) {
  const auto type = static_cast<uint16_t>(m.header.type);
  if (type < 1 || type > kLastType)
    encode_error(m, "message type " + std::to_string(type) + " is not one of 1.." +
                        std::to_string(kLastType));
  if (m.tensors.size() > std::numeric_limits<uint32_t>::max())
    encode_error(m, std::to_string(m.tensors.size()) + " tensors do not fit a uint32 count");

  // Validate every entry and size the body before writing a byte. Names are at most 255 bytes
  // and ranks at most 4, so one entry is small and the 64-bit sum cannot overflow.
  uint64_t body = 0;
  std::unordered_set<std::string_view> names;
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const TensorInfo& t = m.tensors[i];
    if (const char* why = name_problem(t.name))
      encode_error(m, tensor_label(i, t.name) + ": the name " + why);
    if (!names.insert(t.name).second)
      encode_error(m, tensor_label(i, t.name) + ": the name is used by an earlier tensor");
    const size_t element = dtype_size(t.dtype);
    if (element == 0)
      encode_error(m, tensor_label(i, t.name) + ": unknown dtype " +
                          std::to_string(static_cast<unsigned>(t.dtype)));
    if (t.shape.size() > kMaxRank)
      encode_error(
          m, tensor_label(i, t.name) + ": rank " + std::to_string(t.shape.size()) + " is above 4");
    uint64_t bytes = 0;
    switch (shape_bytes(t.shape, element, &bytes)) {
      case ShapeCheck::Ok:
        break;
      case ShapeCheck::NegativeDim:
        encode_error(m, tensor_label(i, t.name) + ": negative dimension in " + shape_text(t.shape));
      case ShapeCheck::Overflow:
        encode_error(m, tensor_label(i, t.name) + ": shape " + shape_text(t.shape) +
                            " has more than 2^64 bytes");
    }
    if (bytes != t.bytes)
      encode_error(m, tensor_label(i, t.name) + ": byte length " + std::to_string(t.bytes) +
                          " but shape " + shape_text(t.shape) + " needs " + std::to_string(bytes));
    body += 2 + t.name.size() + 1 + 1 + 8 * t.shape.size() + 8;
  }
  if (m.extra.size() > std::numeric_limits<uint32_t>::max())
    encode_error(m, "the extra blob's " + std::to_string(m.extra.size()) +
                        " bytes do not fit a uint32 length");
  body += kExtraLengthBytes + m.extra.size();
  if (body > std::numeric_limits<uint32_t>::max())
    encode_error(m, "the header frame's body of " + std::to_string(body) +
                        " bytes does not fit a uint32 length");

  std::vector<uint8_t> out;
  out.reserve(kFixedHeaderBytes + body);
  put(out, kMagic);
  put(out, kProtocolVersion);
  put(out, type);
  put(out, m.header.request_id);
  put(out, m.header.parameter_version);
  put(out, static_cast<uint32_t>(m.tensors.size()));
  put(out, static_cast<uint32_t>(body));
  for (const TensorInfo& t : m.tensors) {
    put(out, static_cast<uint16_t>(t.name.size()));
    out.insert(out.end(), t.name.begin(), t.name.end());
    put(out, static_cast<uint8_t>(t.dtype));
    put(out, static_cast<uint8_t>(t.shape.size()));
    for (const int64_t d : t.shape) put(out, d);
    put(out, t.bytes);
  }
  put(out, static_cast<uint32_t>(m.extra.size()));
  out.insert(out.end(), m.extra.begin(), m.extra.end());
  return out;
}

std::vector<ByteSpan> OutgoingMessage::frames() const {
  std::vector<ByteSpan> all;
  all.reserve(1 + tensor_frames.size());
  all.push_back(span_of(header_frame));
  all.insert(all.end(), tensor_frames.begin(), tensor_frames.end());
  return all;
}

OutgoingMessage encode_message(const Message& message, std::vector<ByteSpan> tensor_data) {
  OutgoingMessage out;
  out.header_frame = encode_header_frame(message);
  if (tensor_data.size() != message.tensors.size())
    encode_error(message, std::to_string(message.tensors.size()) + " tensors but " +
                              std::to_string(tensor_data.size()) + " data spans");
  for (size_t i = 0; i < tensor_data.size(); ++i) {
    const TensorInfo& t = message.tensors[i];
    if (tensor_data[i].size != t.bytes)
      encode_error(message, tensor_label(i, t.name) + ": data holds " +
                                std::to_string(tensor_data[i].size) + " bytes, shape " +
                                shape_text(t.shape) + " needs " + std::to_string(t.bytes));
    if (tensor_data[i].data == nullptr && t.bytes != 0)
      encode_error(message, tensor_label(i, t.name) + ": data is null");
  }
  out.tensor_frames = std::move(tensor_data);
  return out;
}

OutgoingMessage encode_float_message(MessageType type, uint64_t request_id,
                                     uint64_t parameter_version,
                                     const std::vector<FloatTensorRef>& tensors,
                                     std::string extra) {
  std::vector<TensorInfo> infos;
  std::vector<ByteSpan> data;
  infos.reserve(tensors.size());
  data.reserve(tensors.size());
  for (const FloatTensorRef& t : tensors) {
    infos.push_back(float32_tensor(t.name, t.shape));
    data.push_back({reinterpret_cast<const uint8_t*>(t.data), infos.back().bytes});
  }
  return encode_message(
      make_message(type, request_id, parameter_version, std::move(infos), std::move(extra)),
      std::move(data));
}

// ---- Decoding ----------------------------------------------------------------------------------

DecodeResult decode(const std::vector<ByteSpan>& frames, const DecodeLimits& limits) {
  DecodeResult r;
  using E = DecodeError;
  if (frames.empty())
    return failure(std::move(r), E::FrameCountMismatch, "a message with no frames");
  const ByteSpan head = frames[0];
  if (head.size < kFixedHeaderBytes)
    return failure(
        std::move(r), E::Truncated,
        "header frame of " + std::to_string(head.size) + " bytes; the fixed header alone needs 32");

  // The fixed header. Every read below fits: the frame holds at least 32 bytes.
  Reader fixed(head.data, kFixedHeaderBytes, 0);
  uint32_t magic = 0, tensor_count = 0, body_bytes = 0;
  uint16_t version = 0, type = 0;
  Header h;
  fixed.get(&magic);
  fixed.get(&version);
  fixed.get(&type);
  fixed.get(&h.request_id);
  fixed.get(&h.parameter_version);
  fixed.get(&tensor_count);
  fixed.get(&body_bytes);
  if (magic != kMagic) {
    char hex[11];
    std::snprintf(hex, sizeof hex, "0x%08x", magic);
    return failure(std::move(r), E::BadMagic,
                   at(0) + "magic " + hex + " is not 0x53504454 ('TDPS'): not a Tandem message");
  }
  if (version != kProtocolVersion)
    return failure(std::move(r), E::BadVersion,
                   at(4) + "the sender speaks protocol version " + std::to_string(version) +
                       ", this build speaks version " + std::to_string(kProtocolVersion));
  if (type < 1 || type > kLastType)
    return failure(std::move(r), E::UnknownType,
                   at(6) + "unknown message type " + std::to_string(type) + " (known: 1.." +
                       std::to_string(kLastType) + ")");
  h.type = static_cast<MessageType>(type);
  r.header_ok = true;
  r.message.header = h;

  // Counts and sizes against the limits and against the header frame actually received. The
  // whole header frame is checked before the tensor frames are matched against it.
  if (tensor_count > limits.max_tensors)
    return failure(std::move(r), E::TooManyTensors,
                   at(24) + std::to_string(tensor_count) + " tensors; the limit is " +
                       std::to_string(limits.max_tensors));
  const uint64_t head_bytes = kFixedHeaderBytes + uint64_t{body_bytes};
  if (head_bytes > limits.max_message_bytes)
    return failure(std::move(r), E::TooLarge,
                   at(28) + "a header frame of " + std::to_string(head_bytes) +
                       " bytes; the message limit is " + std::to_string(limits.max_message_bytes));
  if (head.size < head_bytes)
    return failure(std::move(r), E::Truncated,
                   "header frame of " + std::to_string(head.size) + " bytes; its header says " +
                       std::to_string(head_bytes));
  if (head.size > head_bytes)
    return failure(std::move(r), E::TrailingBytes,
                   "header frame of " + std::to_string(head.size) + " bytes; its header says " +
                       std::to_string(head_bytes));
  // Rejects a tiny body that claims thousands of tensors before anything is reserved for them.
  if (tensor_count * kMinEntryBytes + kExtraLengthBytes > body_bytes)
    return failure(std::move(r), E::Truncated,
                   at(28) + "a body of " + std::to_string(body_bytes) + " bytes cannot hold " +
                       std::to_string(tensor_count) + " tensor entries and the extra length");

  // The tensor table. The reader's end is the frame's end, which is the body's end.
  Reader in(head.data, head.size, kFixedHeaderBytes);
  r.message.tensors.reserve(tensor_count);
  r.tensor_data.reserve(tensor_count);
  std::unordered_set<std::string_view> names;  // views into frame 0, which outlives this call
  uint64_t total = head_bytes;
  for (uint32_t i = 0; i < tensor_count; ++i) {
    const size_t entry_offset = in.offset();
    // Built only for an error text, so a good message costs no string work here.
    const auto where = [&] { return at(entry_offset) + "tensor " + std::to_string(i) + ": "; };
    auto truncated = [&](const char* field) {
      return failure(std::move(r), E::Truncated,
                     where() + "the body ends inside the " + field + " (at byte " +
                         std::to_string(in.offset()) + " of " + std::to_string(head.size) + ")");
    };
    uint16_t name_length = 0;
    if (!in.get(&name_length)) return truncated("name length");
    if (name_length == 0 || name_length > kMaxNameBytes)
      return failure(std::move(r), E::BadName,
                     where() + "name length " + std::to_string(name_length) + " (must be 1..255)");
    const uint8_t* name_bytes = nullptr;
    if (!in.bytes(name_length, &name_bytes)) return truncated("name");
    const std::string_view name(reinterpret_cast<const char*>(name_bytes), name_length);
    if (const char* why = name_problem(name_bytes, name_length))
      return failure(std::move(r), E::BadName, where() + "the name " + quoted(name) + " " + why);
    if (!names.insert(name).second)
      return failure(std::move(r), E::DuplicateName,
                     where() + "the name " + quoted(name) + " is used by an earlier tensor");

    TensorInfo t;
    t.name.assign(name);
    uint8_t dtype = 0, rank = 0;
    if (!in.get(&dtype)) return truncated("dtype");
    t.dtype = static_cast<DType>(dtype);
    const size_t element = dtype_size(t.dtype);
    if (element == 0)
      return failure(std::move(r), E::BadDType,
                     where() + quoted(name) + " has unknown dtype " + std::to_string(dtype));
    if (!in.get(&rank)) return truncated("rank");
    if (rank > kMaxRank)
      return failure(std::move(r), E::BadShape,
                     where() + quoted(name) + " has rank " + std::to_string(rank) +
                         "; at most 4 is supported");
    t.shape.resize(rank);
    for (uint8_t d = 0; d < rank; ++d)
      if (!in.get(&t.shape[d])) return truncated("dimensions");
    if (!in.get(&t.bytes)) return truncated("byte length");

    uint64_t expected = 0;
    switch (shape_bytes(t.shape, element, &expected)) {
      case ShapeCheck::Ok:
        break;
      case ShapeCheck::NegativeDim:
        return failure(
            std::move(r), E::BadShape,
            where() + quoted(name) + " has a negative dimension in " + shape_text(t.shape));
      case ShapeCheck::Overflow:
        return failure(std::move(r), E::TooLarge,
                       where() + quoted(name) + " of shape " + shape_text(t.shape) +
                           " would hold more than 2^64 bytes");
    }
    if (t.bytes != expected)
      return failure(std::move(r), E::LengthMismatch,
                     where() + quoted(name) + " declares " + std::to_string(t.bytes) +
                         " bytes but shape " + shape_text(t.shape) + " needs " +
                         std::to_string(expected));
    if (__builtin_add_overflow(total, t.bytes, &total) || total > limits.max_message_bytes)
      return failure(std::move(r), E::TooLarge,
                     where() + quoted(name) + " of shape " + shape_text(t.shape) +
                         " takes the message past its limit of " +
                         std::to_string(limits.max_message_bytes) + " bytes");
    r.message.tensors.push_back(std::move(t));
  }

  // The extra blob, then nothing.
  uint32_t extra_length = 0;
  const size_t extra_offset = in.offset();
  if (!in.get(&extra_length))
    return failure(std::move(r), E::Truncated,
                   at(extra_offset) + "the body ends inside the extra length");
  if (extra_length > limits.max_extra_bytes)
    return failure(std::move(r), E::TooLarge,
                   at(extra_offset) + "an extra blob of " + std::to_string(extra_length) +
                       " bytes; the limit is " + std::to_string(limits.max_extra_bytes));
  const uint8_t* extra = nullptr;
  if (!in.bytes(extra_length, &extra))
    return failure(std::move(r), E::Truncated,
                   at(extra_offset) + "an extra blob of " + std::to_string(extra_length) +
                       " bytes, but only " + std::to_string(in.remaining()) + " remain");
  if (in.remaining() != 0)
    return failure(
        std::move(r), E::TrailingBytes,
        at(in.offset()) + std::to_string(in.remaining()) + " bytes after the extra blob");
  r.message.extra.assign(reinterpret_cast<const char*>(extra), extra_length);

  // Frame 0 checks out; now the tensor frames must match it, one each, byte for byte.
  if (frames.size() != 1 + uint64_t{tensor_count})
    return failure(std::move(r), E::FrameCountMismatch,
                   std::to_string(frames.size()) + " frames; the header announces " +
                       std::to_string(tensor_count) + " tensors, so 1 + " +
                       std::to_string(tensor_count) + " frames");
  for (size_t i = 0; i < r.message.tensors.size(); ++i) {
    const TensorInfo& t = r.message.tensors[i];
    const ByteSpan frame = frames[1 + i];
    if (frame.size != t.bytes)
      return failure(std::move(r), E::LengthMismatch,
                     "frame " + std::to_string(i + 1) + " holds " + std::to_string(frame.size) +
                         " bytes; tensor " + std::to_string(i) + " (" + quoted(t.name) +
                         ", shape " + shape_text(t.shape) + ") needs " + std::to_string(t.bytes));
    r.tensor_data.push_back(frame);
  }
  return r;
}

// ---- Checking values --------------------------------------------------------------------------

namespace {

// A float32 is NaN or infinite exactly when its 8 exponent bits are all ones.
constexpr uint32_t kExponentBits = 0x7F800000u;

inline uint32_t float_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);  // unaligned-safe; compiles to a plain load
  return bits;
}

// The largest exponent field among the n floats at p: all ones (kExponentBits) exactly when one
// of them is NaN or infinite. A max has no branch and no early exit, so it vectorises whole.
inline uint32_t largest_exponent(const uint8_t* p, size_t n) {
  uint32_t top = 0;
  for (size_t i = 0; i < n; ++i) top = std::max(top, float_bits(p + 4 * i) & kExponentBits);
  return top;
}

}  // namespace

// Every push's gradients pass through here: built for AVX-512, AVX2 and baseline x86-64 and
// picked at load time, as the optimizer kernel is (kernels/cpu/adam_cpu.cpp).
// tandem_ps_shard_bench times it (stage_gradients).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
bool all_finite(ByteSpan s) {
  if (s.size % 4 != 0) return false;
  const size_t n = s.size / 4;
  // Whole blocks, with an early exit between them (a bad push is refused sooner), then the rest.
  constexpr size_t kBlock = 4096;
  size_t start = 0;
  for (; start + kBlock <= n; start += kBlock)
    if (largest_exponent(s.data + 4 * start, kBlock) == kExponentBits) return false;
  return largest_exponent(s.data + 4 * start, n - start) != kExponentBits;
}

size_t first_non_finite(ByteSpan s) {
  const size_t n = s.size / 4;
  for (size_t i = 0; i < n; ++i)
    if ((float_bits(s.data + 4 * i) & kExponentBits) == kExponentBits) return i;
  return std::numeric_limits<size_t>::max();
}

}  // namespace tandem::transport
