#include "safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "file_io.h"
#include "json_fields.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// Tensor bytes go between memory and disk unswapped, and safetensors data is little-endian.
#if defined(__BYTE_ORDER__) && defined(__ORDER_LITTLE_ENDIAN__)
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "safetensors I/O needs a little-endian host");
#else
#error "cannot tell this compiler's byte order; safetensors I/O needs a little-endian host"
#endif

using json = nlohmann::json;

// The Python package's limit too: a larger header is corruption or an attack, not a model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

[[noreturn]] void input_error(const std::string& path, const std::string& what) {
  throw InputError("safetensors file '" + path + "': " + what);
}

// 0 for an unknown dtype, so callers can word the error with their own context.
size_t lookup_dtype(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"F32", 4}, {"I64", 8}, {"F64", 8}};
  const auto it = sizes.find(dtype);
  return it == sizes.end() ? 0 : it->second;
}

// product(shape) * element size, or nullopt on overflow: a hostile header can claim any shape.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, size_t element_size) {
  if (std::find(shape.begin(), shape.end(), 0) != shape.end()) return 0;  // order-independent
  uint64_t n = element_size;
  for (const int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Checks one tensor's dtype, shape and size; shared by the writer and the reader.
uint64_t checked_byte_size(const std::string& path, const SafeTensor& t) {
  const std::string where = "tensor '" + t.name + "': ";
  const size_t element_size = lookup_dtype(t.dtype);
  if (element_size == 0) input_error(path, where + "unknown dtype \"" + t.dtype + "\"");
  for (const int64_t d : t.shape) {
    if (d < 0) input_error(path, where + "negative dimension " + std::to_string(d) + " in shape");
  }
  const auto size = byte_size(t.shape, element_size);
  if (!size) input_error(path, where + "shape " + shape_text(t.shape) + " is too large");
  return *size;
}

// ---- reading ----

// A tensor from the header plus where its bytes lie in the data section.
struct HeaderEntry {
  SafeTensor tensor;
  uint64_t begin = 0;
  uint64_t end = 0;
};

const json& require(const std::string& path, const std::string& where, const json& entry,
                    const char* key) {
  const auto it = entry.find(key);
  if (it == entry.end()) input_error(path, where + "missing \"" + key + "\"");
  return *it;
}

std::vector<int64_t> parse_shape(const std::string& path, const std::string& where, const json& j) {
  if (!j.is_array()) input_error(path, where + "\"shape\" is not an array");
  std::vector<int64_t> shape;
  for (const json& d : j) {
    if (d.is_number_unsigned() &&
        d.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max())) {
      shape.push_back(d.get<int64_t>());
    } else if (d.is_number_integer() && d.get<int64_t>() < 0) {
      input_error(path, where + "negative dimension " + d.dump() + " in shape");
    } else {
      input_error(path, where + "\"shape\" has " + d.dump() + ", not a dimension (an integer)");
    }
  }
  return shape;
}

HeaderEntry parse_entry(const std::string& path, const std::string& name, const json& entry) {
  const std::string where = "tensor '" + name + "': ";
  if (!entry.is_object()) input_error(path, where + "entry is not a JSON object");
  const json& dtype = require(path, where, entry, "dtype");
  const json& shape = require(path, where, entry, "shape");
  const json& offsets = require(path, where, entry, "data_offsets");
  if (!dtype.is_string()) input_error(path, where + "\"dtype\" is not a string");
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned()) {
    input_error(path, where + "\"data_offsets\" is not an array of two non-negative integers");
  }
  HeaderEntry e{{name, dtype.get<std::string>(), parse_shape(path, where, shape), {}},
                offsets[0].get<uint64_t>(),
                offsets[1].get<uint64_t>()};
  const std::string range =
      "data_offsets [" + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
  if (e.begin > e.end) input_error(path, where + range + " has begin > end");
  const uint64_t needed = checked_byte_size(path, e.tensor);
  if (e.end - e.begin != needed) {
    input_error(path, where + range + " span " + std::to_string(e.end - e.begin) +
                          " bytes but shape " + shape_text(e.tensor.shape) + " of " +
                          e.tensor.dtype + " needs " + std::to_string(needed) + " bytes");
  }
  return e;
}

std::map<std::string, std::string> parse_metadata(const std::string& path, const json& j) {
  if (!j.is_object()) input_error(path, "\"__metadata__\" is not a JSON object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_string())
      input_error(path, "metadata value for key '" + key + "' is not a string");
    metadata[key] = value.get<std::string>();
  }
  return metadata;
}

std::vector<HeaderEntry> parse_header(const std::string& path, const std::string& text,
                                      std::map<std::string, std::string>& metadata) {
  std::string problem;
  // As the reference implementation: the header is a JSON object from its first byte (no
  // byte-order mark or space before it; spaces pad it at the end only).
  if (text.empty() || text.front() != '{')
    input_error(path, "header does not start with '{'; expected a safetensors header");
  const json header = parse_json_file_text(text, problem);
  if (!problem.empty())
    input_error(path, "header is " + problem + "; expected a safetensors header");
  if (!header.is_object()) input_error(path, "header is not a JSON object");
  std::vector<HeaderEntry> entries;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      metadata = parse_metadata(path, entry);
    } else {
      entries.push_back(parse_entry(path, name, entry));
    }
  }
  return entries;
}

// Sorts entries into file order and checks that they tile the data section exactly, as the
// Python package does: no overlaps (which would alias tensors), no gaps, nothing past the end.
void check_layout(const std::string& path, std::vector<HeaderEntry>& entries, uint64_t data_size) {
  std::sort(entries.begin(), entries.end(), [](const HeaderEntry& a, const HeaderEntry& b) {
    return std::make_pair(a.begin, a.end) < std::make_pair(b.begin, b.end);
  });
  uint64_t pos = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const HeaderEntry& e = entries[i];
    const std::string where = "tensor '" + e.tensor.name + "': ";
    if (e.end > data_size) {
      input_error(path, where + "data_offsets end " + std::to_string(e.end) +
                            " is out of range (the data section is " + std::to_string(data_size) +
                            " bytes)");
    }
    if (e.begin < pos) {
      input_error(path, where + "data_offsets overlap tensor '" + entries[i - 1].tensor.name + "'");
    }
    if (e.begin > pos) {
      input_error(path, where + "gap in the data section before it (bytes " + std::to_string(pos) +
                            " to " + std::to_string(e.begin) + " belong to no tensor)");
    }
    pos = e.end;
  }
  if (pos != data_size) {
    const std::string last = entries.empty() ? "there are no tensors"
                                             : "the last, tensor '" + entries.back().tensor.name +
                                                   "', ends at byte " + std::to_string(pos);
    input_error(path, "tensors do not cover the data section exactly: " + last +
                          " but the data section is " + std::to_string(data_size) + " bytes");
  }
}

// ---- writing ----

void validate_for_write(const std::string& path, const SafeTensorsFile& file) {
  std::set<std::string> names;
  for (const SafeTensor& t : file.tensors) {
    if (t.name == "__metadata__") input_error(path, "tensor name \"__metadata__\" is reserved");
    if (!names.insert(t.name).second) input_error(path, "duplicate tensor name '" + t.name + "'");
    const uint64_t needed = checked_byte_size(path, t);
    if (t.data.size() != needed) {
      input_error(path, "tensor '" + t.name + "': data is " + std::to_string(t.data.size()) +
                            " bytes but shape " + shape_text(t.shape) + " of " + t.dtype +
                            " needs " + std::to_string(needed) + " bytes");
    }
  }
}

// The JSON header, space-padded so the data section starts 8-aligned (readers may mmap it).
std::string build_header(const std::string& path, const SafeTensorsFile& file) {
  // ordered_json keeps the header in data order and puts "__metadata__" first, as Python does.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const SafeTensor& t : file.tensors) {
    nlohmann::ordered_json& entry = header[t.name];
    entry["dtype"] = t.dtype;
    entry["shape"] = t.shape;
    entry["data_offsets"] = {offset, offset + t.data.size()};
    offset += t.data.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::type_error& e) {
    input_error(path, std::string("a tensor name or metadata string is not valid UTF-8 (") +
                          e.what() + ")");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  return text;
}

// What comes before the data section, checked: the header's length (8 bytes, little-endian),
// then the header. Writing a file and encoding bytes both start with it.
std::string file_prefix(const std::string& path, const SafeTensorsFile& file) {
  validate_for_write(path, file);
  const std::string header = build_header(path, file);
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[size_t(i)] = char(uint8_t(uint64_t(header.size()) >> (8 * i)));
  return prefix + header;
}

// ---- the length field (a file, or bytes in memory) ----

// What a file that is not safetensors is, from its first 8 bytes, when they say (the files
// users give by mistake: the data set's IDX files, gzipped or not, a PNG, a JSON document).
std::string what_it_looks_like(const uint8_t* b) {
  if (b[0] == 0x1f && b[1] == 0x8b) return "a gzip file";
  if (b[0] == 0 && b[1] == 0 && b[2] == 0x08 && (b[3] == 1 || b[3] == 3)) return "an IDX file";
  if (b[0] == 0x89 && b[1] == 'P' && b[2] == 'N' && b[3] == 'G') return "a PNG image";
  // A length field is binary (its high bytes zero); text is printable throughout.
  const bool text = std::all_of(b, b + 8, [](uint8_t c) {
    return (c >= 0x20 && c < 0x7f) || c == '\n' || c == '\r' || c == '\t';
  });
  if (text && (b[0] == '{' || b[0] == '[')) return "JSON text";
  return "";
}

// The header length from the first 8 bytes, checked against the limit and against the
// `available` bytes that follow them.
uint64_t header_length(const std::string& path, const uint8_t* length_bytes, uint64_t available) {
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) header_size = (header_size << 8) | length_bytes[i];
  // Before the length is judged: a gzip file written without a name or time (gzip -n) reads as
  // a plausible length.
  const std::string looks_like = what_it_looks_like(length_bytes);
  if (!looks_like.empty())
    input_error(path, "not a safetensors file (it looks like " + looks_like + ")");
  if (header_size > kMaxHeaderBytes) {
    input_error(path, "not a safetensors file: its first 8 bytes give a header length of " +
                          std::to_string(header_size) + ", which is absurd (limit " +
                          std::to_string(kMaxHeaderBytes) + " bytes)");
  }
  if (header_size > available) {
    input_error(path, "header length " + std::to_string(header_size) +
                          " is larger than the file (" + std::to_string(available) +
                          " bytes follow the length field)");
  }
  return header_size;
}

void check_at_least_length_field(const std::string& path, uint64_t size) {
  if (size < 8) {
    input_error(path, "file is " + std::to_string(size) +
                          " bytes, shorter than 8 bytes (the header length)");
  }
}

}  // namespace

const SafeTensor* SafeTensorsFile::find(const std::string& name) const {
  for (const SafeTensor& t : tensors) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

size_t safetensors_dtype_size(const std::string& dtype) {
  const size_t size = lookup_dtype(dtype);
  if (size == 0) throw InputError("unknown safetensors dtype \"" + dtype + "\"");
  return size;
}

SafeTensorsFile read_safetensors(const std::string& path) {
  // What a read that meets the end of the file early throws.
  const std::string truncated =
      "safetensors file '" + path + "': file ended early (was it truncated while being read?)";
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO: refused below
  if (fd.get() < 0) io_error("open", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) input_error(path, "not a regular file");
  const uint64_t file_size = uint64_t(st.st_size);
  check_at_least_length_field(path, file_size);

  uint8_t length_bytes[8];
  read_exact(fd.get(), length_bytes, 8, path, truncated);
  const uint64_t header_size = header_length(path, length_bytes, file_size - 8);
  std::string header(header_size, '\0');
  read_exact(fd.get(), header.data(), header.size(), path, truncated);

  SafeTensorsFile file;
  std::vector<HeaderEntry> entries = parse_header(path, header, file.metadata);
  check_layout(path, entries, file_size - 8 - header_size);
  // The layout check proved the entries tile the data section in this order, so reading them
  // one after another reads the rest of the file exactly.
  for (HeaderEntry& e : entries) {
    e.tensor.data.resize(e.end - e.begin);
    read_exact(fd.get(), e.tensor.data.data(), e.tensor.data.size(), path, truncated);
    file.tensors.push_back(std::move(e.tensor));
  }
  return file;
}

std::vector<uint8_t> encode_safetensors(const SafeTensorsFile& file, const std::string& name) {
  const std::string prefix = file_prefix(name, file);
  size_t size = prefix.size();
  for (const SafeTensor& t : file.tensors) size += t.data.size();
  std::vector<uint8_t> out;
  out.reserve(size);
  out.insert(out.end(), prefix.begin(), prefix.end());
  for (const SafeTensor& t : file.tensors) out.insert(out.end(), t.data.begin(), t.data.end());
  return out;
}

SafeTensorsFile decode_safetensors(const uint8_t* data, size_t size, const std::string& name) {
  check_at_least_length_field(name, size);
  const uint64_t header_size = header_length(name, data, size - 8);
  SafeTensorsFile file;
  std::vector<HeaderEntry> entries = parse_header(
      name, std::string(reinterpret_cast<const char*>(data) + 8, header_size), file.metadata);
  const uint8_t* section = data + 8 + header_size;
  check_layout(name, entries, size - 8 - header_size);
  for (HeaderEntry& e : entries) {
    e.tensor.data.assign(section + e.begin, section + e.end);
    file.tensors.push_back(std::move(e.tensor));
  }
  return file;
}

void write_safetensors_atomic(const std::string& path, const SafeTensorsFile& file) {
  const std::string prefix = file_prefix(path, file);
  AtomicFile out(path);
  out.write(prefix.data(), prefix.size());
  for (const SafeTensor& t : file.tensors) out.write(t.data.data(), t.data.size());
  out.commit();
  fsync_parent_directory(out.target(), "replacing");
}

}  // namespace tandem
