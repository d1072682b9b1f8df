#include "idx_reader.h"

#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>

#include "tandem/error.h"

namespace tandem {

bool holds_idx_images(const std::string& dir) {
  std::error_code ec;
  const std::string raw = (std::filesystem::path(dir) / "train-images-idx3-ubyte").string();
  return std::filesystem::exists(raw, ec) || std::filesystem::exists(raw + ".gz", ec);
}

namespace {

constexpr int kMaxDims = 8;
// gzread/gzwrite take an unsigned length, so large transfers go in steps of this size.
constexpr size_t kChunk = size_t(1) << 20;
// Far beyond any real data set; bounds a hostile header's dims before their product can overflow.
constexpr int64_t kMaxDataBytes = int64_t(1) << 48;

struct GzClose {
  void operator()(gzFile_s* f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzClose>;

struct Header {
  IdxType type;
  std::vector<int64_t> dims;
  int64_t data_bytes;
};

std::string hex(unsigned v) {
  static const char digits[] = "0123456789abcdef";
  return std::string("0x") + digits[(v >> 4) & 15] + digits[v & 15];
}

bool is_known_type(uint8_t code) {
  switch (static_cast<IdxType>(code)) {
    case IdxType::UInt8: case IdxType::Int8: case IdxType::Int16:
    case IdxType::Int32: case IdxType::Float32: case IdxType::Float64:
      return true;
  }
  return false;
}

size_t type_size(IdxType type) {
  switch (type) {
    case IdxType::Int16: return 2;
    case IdxType::Int32: case IdxType::Float32: return 4;
    case IdxType::Float64: return 8;
    default: return 1;
  }
}

// "int16 with dims 3x4", for messages.
std::string describe(IdxType type, const std::vector<int64_t>& dims) {
  std::string s = std::string(idx_type_name(type)) + " with dims ";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "x" : "") + std::to_string(dims[i]);
  return s;
}

// The data size `dims` describe, refusing products that could overflow or are absurd.
int64_t checked_data_bytes(const std::string& path, IdxType type, const std::vector<int64_t>& dims) {
  int64_t bytes = static_cast<int64_t>(type_size(type));
  for (int64_t d : dims) {
    if (d != 0 && bytes > kMaxDataBytes / d)
      throw InputError(path + ": IDX header (" + describe(type, dims) +
                       ") describes more than 2^48 bytes of data; expected a plausible size");
    bytes *= d;
  }
  return bytes;
}

// IDX data is big-endian; swapping each element converts to host order and back alike.
void swap_big_endian(uint8_t* p, size_t n, size_t elem_size) {
  const uint16_t probe = 1;
  uint8_t first = 0;
  std::memcpy(&first, &probe, 1);
  if (elem_size == 1 || first == 0) return;  // bytes need no swap; a big-endian host neither
  for (size_t i = 0; i + elem_size <= n; i += elem_size) std::reverse(p + i, p + i + elem_size);
}

// zlib's message prefixed with the path it was given; strip that so messages name it once.
std::string zlib_message(gzFile f, const std::string& path, int* code) {
  std::string msg = gzerror(f, code);
  const std::string prefix = path + ": ";
  return msg.compare(0, prefix.size(), prefix) == 0 ? msg.substr(prefix.size()) : msg;
}

// Throws for a stream in an error state: a system failure as IoError, bad gzip data as InputError.
void check_stream(gzFile f, const std::string& path) {
  int code = Z_OK;
  const std::string msg = zlib_message(f, path, &code);
  if (code == Z_OK) return;
  if (code == Z_ERRNO) throw IoError(path + ": read failed: " + msg);
  // zlib reports a gzip stream cut short only here (Z_BUF_ERROR), never as a failed gzread.
  if (code == Z_BUF_ERROR) throw InputError(path + ": truncated gzip stream (" + msg + ")");
  throw InputError(path + ": corrupt gzip stream (" + msg + "); expected valid gzip data");
}

// Reads up to n bytes; fewer only at the end of the stream.
size_t read_some(gzFile f, const std::string& path, uint8_t* dst, size_t n) {
  size_t total = 0;
  while (total < n) {
    const int got = gzread(f, dst + total, static_cast<unsigned>(std::min(n - total, kChunk)));
    if (got <= 0) break;
    total += static_cast<size_t>(got);
  }
  if (total < n) check_stream(f, path);
  return total;
}

uint32_t load_be32(const uint8_t* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

void store_be32(uint32_t v, std::vector<uint8_t>& out) {
  for (int shift = 24; shift >= 0; shift -= 8) out.push_back(uint8_t(v >> shift));
}

Header read_header(gzFile f, const std::string& path) {
  uint8_t magic[4];
  const size_t got = read_some(f, path, magic, 4);
  if (got < 4)
    throw InputError(path + ": truncated IDX header: file has " + std::to_string(got) +
                     " bytes, expected at least the 4 magic bytes");
  if (magic[0] != 0 || magic[1] != 0)
    throw InputError(path + ": bad IDX magic: first two bytes are " + hex(magic[0]) + " " +
                     hex(magic[1]) + ", expected 0x00 0x00");
  if (!is_known_type(magic[2]))
    throw InputError(path + ": unknown IDX type code " + hex(magic[2]) +
                     ", expected one of 0x08 (uint8), 0x09 (int8), 0x0b (int16), 0x0c (int32), "
                     "0x0d (float32), 0x0e (float64)");
  const int ndims = magic[3];
  if (ndims < 1 || ndims > kMaxDims)
    throw InputError(path + ": IDX header has " + std::to_string(ndims) +
                     " dimensions, expected 1 to " + std::to_string(kMaxDims));
  uint8_t raw[4 * kMaxDims];
  const size_t want = 4 * size_t(ndims);
  const size_t have = read_some(f, path, raw, want);
  if (have < want)
    throw InputError(path + ": truncated IDX header: " + std::to_string(ndims) +
                     " dimensions need " + std::to_string(want) + " bytes after the magic, file has " +
                     std::to_string(have));
  Header h{static_cast<IdxType>(magic[2]), {}, 0};
  for (int i = 0; i < ndims; ++i) h.dims.push_back(load_be32(raw + 4 * i));
  h.data_bytes = checked_data_bytes(path, h.type, h.dims);
  return h;
}

std::vector<uint8_t> read_data(gzFile f, const std::string& path, const Header& h) {
  const size_t expected = static_cast<size_t>(h.data_bytes);
  std::vector<uint8_t> data;
  // Grow as bytes arrive instead of trusting the header, so a corrupt one cannot make us
  // allocate far more than the file holds; doubling keeps the copies few.
  while (data.size() < expected) {
    const size_t old = data.size();
    const size_t step = std::min(expected - old, std::max(kChunk, old));
    data.resize(old + step);
    const size_t got = read_some(f, path, data.data() + old, step);
    if (got < step)
      throw InputError(path + ": truncated IDX data: header (" + describe(h.type, h.dims) +
                       ") needs " + std::to_string(expected) + " bytes of data, file has " +
                       std::to_string(old + got));
  }
  return data;
}

void reject_trailing_bytes(gzFile f, const std::string& path, const Header& h) {
  std::vector<uint8_t> scratch(64 * 1024);
  uint64_t extra = 0;
  for (size_t got = scratch.size(); got == scratch.size();) {
    got = read_some(f, path, scratch.data(), scratch.size());
    extra += got;
  }
  if (extra > 0)
    throw InputError(path + ": " + std::to_string(extra) + " trailing bytes after the " +
                     std::to_string(h.data_bytes) + " bytes of data the header (" +
                     describe(h.type, h.dims) + ") describes");
}

void validate_for_write(const std::string& path, const IdxArray& a) {
  const std::string where = path + ": cannot write IDX: ";
  if (!is_known_type(static_cast<uint8_t>(a.type)))
    throw InputError(where + "unknown type code " + hex(static_cast<uint8_t>(a.type)));
  if (a.dims.empty() || a.dims.size() > size_t(kMaxDims))
    throw InputError(where + std::to_string(a.dims.size()) + " dimensions, expected 1 to " +
                     std::to_string(kMaxDims));
  for (int64_t d : a.dims)
    if (d < 0 || d > int64_t(UINT32_MAX))
      throw InputError(where + "dimension " + std::to_string(d) + " is outside [0, 2^32)");
  const int64_t bytes = checked_data_bytes(path, a.type, a.dims);
  if (uint64_t(bytes) != a.data.size())
    throw InputError(where + "data has " + std::to_string(a.data.size()) + " bytes, " +
                     describe(a.type, a.dims) + " needs " + std::to_string(bytes));
}

}  // namespace

size_t IdxArray::element_size() const { return type_size(type); }

int64_t IdxArray::element_count() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

const char* idx_type_name(IdxType type) {
  switch (type) {
    case IdxType::UInt8: return "uint8";
    case IdxType::Int8: return "int8";
    case IdxType::Int16: return "int16";
    case IdxType::Int32: return "int32";
    case IdxType::Float32: return "float32";
    case IdxType::Float64: return "float64";
  }
  return "unknown";
}

IdxArray read_idx(const std::string& path) {
  // zlib recognises gzip by its 1f 8b magic and passes any other file through unchanged.
  GzFile f(gzopen(path.c_str(), "rb"));
  if (!f) {
    const int err = errno;
    if (err == ENOENT) throw InputError(path + ": no such file; expected an IDX file");
    throw IoError(path + ": cannot open for reading: " + std::strerror(err));
  }
  gzbuffer(f.get(), 256 * 1024);
  const Header h = read_header(f.get(), path);
  IdxArray a;
  a.type = h.type;
  a.dims = h.dims;
  a.data = read_data(f.get(), path, h);
  reject_trailing_bytes(f.get(), path, h);
  swap_big_endian(a.data.data(), a.data.size(), a.element_size());
  return a;
}

IdxArray read_idx_labels(const std::string& path) {
  IdxArray a = read_idx(path);
  if (a.type != IdxType::UInt8 || a.dims.size() != 1)
    throw InputError(path + ": labels are " + idx_type_name(a.type) + " with " +
                     std::to_string(a.dims.size()) + " dimensions, expected uint8 with 1 dimension");
  return a;
}

void check_label_classes(const std::string& path, const IdxArray& labels, int num_classes) {
  for (size_t i = 0; i < labels.data.size(); ++i)
    if (labels.data[i] >= num_classes)
      throw InputError(path + ": label at index " + std::to_string(i) + " is " +
                       std::to_string(labels.data[i]) + ", expected a class below " +
                       std::to_string(num_classes));
}

void check_label_count(const std::string& images_path, int64_t image_count,
                       const std::string& labels_path, const IdxArray& labels) {
  if (labels.dims[0] != image_count)
    throw InputError("image/label count mismatch: " + images_path + " has " +
                     std::to_string(image_count) + " images but " + labels_path + " has " +
                     std::to_string(labels.dims[0]) + " labels");
}

void write_idx(const std::string& path, const IdxArray& a, bool gzip) {
  validate_for_write(path, a);
  std::vector<uint8_t> bytes = {0, 0, static_cast<uint8_t>(a.type), uint8_t(a.dims.size())};
  for (int64_t d : a.dims) store_be32(uint32_t(d), bytes);
  const size_t header = bytes.size();
  bytes.insert(bytes.end(), a.data.begin(), a.data.end());
  swap_big_endian(bytes.data() + header, a.data.size(), a.element_size());

  // Mode "T" makes zlib write plainly, so raw and gzip output share one code path.
  GzFile f(gzopen(path.c_str(), gzip ? "wb" : "wbT"));
  if (!f) throw IoError(path + ": cannot open for writing: " + std::strerror(errno));
  for (size_t off = 0; off < bytes.size();) {
    const unsigned n = static_cast<unsigned>(std::min(bytes.size() - off, kChunk));
    if (gzwrite(f.get(), bytes.data() + off, n) != int(n)) {
      int code = Z_OK;
      throw IoError(path + ": write failed: " + zlib_message(f.get(), path, &code));
    }
    off += n;
  }
  // gzclose flushes the last block, so its result is part of the write's result.
  if (gzclose(f.release()) != Z_OK)
    throw IoError(path + ": write failed when closing: " + std::strerror(errno));
}

}  // namespace tandem
