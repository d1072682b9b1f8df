// Zarr array metadata: v2 .zarray and v3 zarr.json to and from ArrayMeta, data types, fill
// values, and the consistency checks shared by Array::open and Array::create. Every field is
// type-checked before it is read, so corrupt or hostile metadata ends in an InputError naming the
// store and the file, never in a JSON library exception or an absurd size.
#include "zarr/zarr_metadata.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "json_fields.h"
#include "tandem/error.h"

namespace tandem::zarr {
namespace {

using detail::dims_text;
using detail::kMaxChunkBytes;

using json = nlohmann::json;
using ordered_json = nlohmann::ordered_json;

struct DTypeInfo {
  DType type;
  const char* v3_name;
  const char* v2_name;  // little-endian NumPy type string; 1-byte types have no byte order
  size_t size;
  bool is_float;
  double lowest;     // integers: the range as doubles, [lowest, past_max)
  double past_max;
};

constexpr double kTwo63 = 9223372036854775808.0;
constexpr double kTwo64 = 18446744073709551616.0;

constexpr DTypeInfo kDTypes[] = {
    {DType::UInt8, "uint8", "|u1", 1, false, 0.0, 256.0},
    {DType::Int8, "int8", "|i1", 1, false, -128.0, 128.0},
    {DType::UInt16, "uint16", "<u2", 2, false, 0.0, 65536.0},
    {DType::Int16, "int16", "<i2", 2, false, -32768.0, 32768.0},
    {DType::UInt32, "uint32", "<u4", 4, false, 0.0, 4294967296.0},
    {DType::Int32, "int32", "<i4", 4, false, -2147483648.0, 2147483648.0},
    {DType::UInt64, "uint64", "<u8", 8, false, 0.0, kTwo64},
    {DType::Int64, "int64", "<i8", 8, false, -kTwo63, kTwo63},
    {DType::Float32, "float32", "<f4", 4, true, 0.0, 0.0},
    {DType::Float64, "float64", "<f8", 8, true, 0.0, 0.0},
};

const DTypeInfo& info(DType type) {
  for (const DTypeInfo& d : kDTypes) {
    if (d.type == type) return d;
  }
  throw Error("zarr: invalid DType value " + std::to_string(int(type)));
}

const char* kV2DTypeList = "|u1, |i1, <u2, <i2, <u4, <i4, <u8, <i8, <f4 or <f8";
const char* kV3DTypeList = "uint8, int8, uint16, int16, uint32, int32, uint64, int64, float32 or "
                           "float64";

// A JSON value for an error message, cut short: metadata values can be arbitrarily long.
std::string brief(const json& j) {
  std::string s = j.dump();
  return s.size() <= 80 ? s : s.substr(0, 77) + "...";
}

// A fill value for a message: integers without ".0", NaN and infinities by name.
std::string number_text(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  if (v == std::floor(v) && std::fabs(v) < 1e18) return std::to_string(int64_t(v));
  return json(v).dump();
}

// Reads metadata fields with their context, so each problem names the store, the file and the
// field (and the value found).
class Reader {
 public:
  Reader(const std::string& store, const std::string& file) : store_(store), file_(file) {}

  [[noreturn]] void fail(const std::string& problem) const {
    detail::metadata_error(store_, file_, problem);
  }

  const json& need(const json& obj, const std::string& key, const std::string& where = "") const {
    const auto it = obj.find(key);
    if (it == obj.end()) fail("missing \"" + key + "\"" + where);
    return *it;
  }

  const json* find(const json& obj, const std::string& key) const {
    const auto it = obj.find(key);
    return it == obj.end() ? nullptr : &*it;
  }

  const std::string& string(const json& j, const std::string& name) const {
    if (!j.is_string()) fail("\"" + name + "\" is " + brief(j) + "; expected a string");
    return j.get_ref<const std::string&>();
  }

  const json& object(const json& j, const std::string& name) const {
    if (!j.is_object()) fail("\"" + name + "\" is " + brief(j) + "; expected a JSON object");
    return j;
  }

  int integer(const json& j, const std::string& name) const {
    if (!j.is_number_integer() || j.get<int64_t>() < std::numeric_limits<int>::min() ||
        j.get<int64_t>() > std::numeric_limits<int>::max() ||
        (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(std::numeric_limits<int>::max()))) {
      fail("\"" + name + "\" is " + brief(j) + "; expected an integer");
    }
    return j.get<int>();
  }

  bool boolean(const json& j, const std::string& name) const {
    if (!j.is_boolean()) fail("\"" + name + "\" is " + brief(j) + "; expected true or false");
    return j.get<bool>();
  }

  // A list of dimension lengths: non-negative integers that fit int64.
  std::vector<int64_t> dims(const json& j, const std::string& name) const {
    if (!j.is_array()) fail("\"" + name + "\" is " + brief(j) + "; expected an array of integers");
    if (j.size() > detail::kMaxDimensions) {
      fail("\"" + name + "\" has " + std::to_string(j.size()) + " dimensions; expected at most " +
           std::to_string(detail::kMaxDimensions));
    }
    std::vector<int64_t> out;
    for (const json& d : j) {
      const bool ok = d.is_number_unsigned() ? d.get<uint64_t>() <= uint64_t(INT64_MAX)
                                             : d.is_number_integer() && d.get<int64_t>() >= 0;
      if (!ok) {
        fail("\"" + name + "\" has " + brief(d) + "; expected non-negative integers, got " +
             brief(j));
      }
      out.push_back(d.get<int64_t>());
    }
    return out;
  }

  void zarr_format(const json& doc, int expected) const {
    const json& f = need(doc, "zarr_format");
    if (!f.is_number_integer() || f.get<int64_t>() != expected) {
      fail("\"zarr_format\" is " + brief(f) + "; expected " + std::to_string(expected));
    }
  }

 private:
  std::string store_;
  std::string file_;
};

// ---- data types and fill values ----

DType parse_v2_dtype(const Reader& r, const json& j) {
  const std::string& text = r.string(j, "dtype");
  for (const DTypeInfo& d : kDTypes) {
    // A 1-byte type has no byte order; NumPy writes "|" but "<" and ">" mean the same.
    if (text == d.v2_name || (d.size == 1 && (text == std::string("<") + (d.v2_name + 1) ||
                                              text == std::string(">") + (d.v2_name + 1)))) {
      return d.type;
    }
  }
  if (!text.empty() && text[0] == '>') {
    r.fail("big-endian dtype \"" + text + "\" is not supported; expected a little-endian one (" +
           kV2DTypeList + ")");
  }
  r.fail("dtype \"" + text + "\" is not supported; expected one of " + kV2DTypeList);
}

DType parse_v3_dtype(const Reader& r, const json& j) {
  const std::string& text = r.string(j, "data_type");
  for (const DTypeInfo& d : kDTypes) {
    if (text == d.v3_name) return d.type;
  }
  r.fail("data_type \"" + text + "\" is not supported; expected one of " + kV3DTypeList);
}

// True if `v` is exactly a double: fill values are kept as doubles (ArrayMeta::fill_value), so a
// 64-bit integer fill beyond 2^53 that would silently change is refused instead.
bool exact_as_double(uint64_t v) {
  const double d = double(v);
  return d < kTwo64 && uint64_t(d) == v;
}

// v3 writes a float's bit pattern as "0x7fc00000" (float32) or 16 hex digits (float64).
bool parse_hex_float(const std::string& text, DType type, double& value) {
  const size_t digits = 2 * info(type).size;
  if (text.size() != 2 + digits || text.compare(0, 2, "0x") != 0) return false;
  uint64_t bits = 0;
  for (size_t i = 2; i < text.size(); ++i) {
    const char c = text[i];
    const int v = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                         : -1;
    if (v < 0) return false;
    bits = bits << 4 | uint64_t(v);
  }
  if (type == DType::Float32) {
    const uint32_t b32 = uint32_t(bits);
    float f;
    std::memcpy(&f, &b32, sizeof f);
    value = f;
  } else {
    std::memcpy(&value, &bits, sizeof value);
  }
  return true;
}

double parse_fill_value(const Reader& r, const json& j, DType type, Format format) {
  const std::string what = "fill_value " + brief(j) + " for " + dtype_name(type);
  // zarr v2 allows null ("no fill value": missing chunks are undefined); zeros are a valid choice.
  if (j.is_null() && format == Format::V2) return 0.0;
  if (info(type).is_float && j.is_string()) {
    const std::string& s = j.get_ref<const std::string&>();
    if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
    if (s == "Infinity") return std::numeric_limits<double>::infinity();
    if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
    double value = 0.0;
    if (format == Format::V3 && parse_hex_float(s, type, value)) return value;
    r.fail(what + " is not a number; expected a number, \"NaN\", \"Infinity\" or \"-Infinity\"");
  }
  if (j.is_number_unsigned()) {
    if (!exact_as_double(j.get<uint64_t>())) r.fail(what + " is not exactly representable");
    return double(j.get<uint64_t>());
  }
  if (j.is_number_integer()) {
    const int64_t v = j.get<int64_t>();
    if (!exact_as_double(v < 0 ? uint64_t(0) - uint64_t(v) : uint64_t(v))) {
      r.fail(what + " is not exactly representable");
    }
    return double(v);
  }
  if (j.is_number_float()) return j.get<double>();  // range and integrality checked later
  r.fail(what + " is not a number; expected a number");
}

// The fill value as metadata writes it: zarr's strings for NaN and infinities, integers as
// integers (zarr-python refuses 0.0 for an integer array).
json fill_value_json(const ArrayMeta& meta) {
  const double v = meta.fill_value;
  if (info(meta.dtype).is_float) {
    if (std::isnan(v)) return "NaN";
    if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
    return v;
  }
  if (v < 0) return int64_t(v);
  return uint64_t(v);
}

// ---- compressors ----

// numcodecs' AUTOSHUFFLE (-1): bit shuffle for 1-byte items, byte shuffle otherwise.
int resolve_shuffle(int shuffle, size_t type_size) {
  if (shuffle != -1) return shuffle;
  return type_size == 1 ? 2 : 1;
}

Compressor parse_v2_compressor(const Reader& r, const json& j, DType type) {
  Compressor c;
  if (j.is_null()) return c;
  r.object(j, "compressor");
  const std::string& id = r.string(r.need(j, "id", " in \"compressor\""), "compressor.id");
  if (id == "zstd") {
    c.kind = Compressor::Kind::Zstd;
    c.level = r.integer(r.need(j, "level", " in the zstd compressor"), "compressor.level");
    // "checksum" only changes what the frames carry; zstd verifies it while decompressing.
    if (const json* checksum = r.find(j, "checksum")) r.boolean(*checksum, "compressor.checksum");
  } else if (id == "blosc") {
    c.kind = Compressor::Kind::Blosc;
    c.blosc_cname = r.string(r.need(j, "cname", " in the blosc compressor"), "compressor.cname");
    c.level = r.integer(r.need(j, "clevel", " in the blosc compressor"), "compressor.clevel");
    const int shuffle =
        r.integer(r.need(j, "shuffle", " in the blosc compressor"), "compressor.shuffle");
    c.blosc_shuffle = resolve_shuffle(shuffle, dtype_size(type));
    if (const json* b = r.find(j, "blocksize")) c.blosc_blocksize = r.integer(*b, "blocksize");
  } else if (id == "gzip" || id == "zlib") {
    // The level only matters to the writer; numcodecs always records it.
    c.kind = id == "gzip" ? Compressor::Kind::Gzip : Compressor::Kind::Zlib;
    c.level = r.integer(r.need(j, "level", " in the " + id + " compressor"), "compressor.level");
  } else {
    r.fail("compressor \"" + id + "\" is not supported; expected null, zstd, blosc, gzip or "
           "zlib");
  }
  return c;
}

int parse_v3_shuffle(const Reader& r, const json& j) {
  const std::string& s = r.string(j, "blosc shuffle");
  if (s == "noshuffle") return 0;
  if (s == "shuffle") return 1;
  if (s == "bitshuffle") return 2;
  r.fail("blosc shuffle \"" + s + "\" is not noshuffle, shuffle or bitshuffle");
}

const char* v3_shuffle_name(int shuffle) {
  return shuffle == 0 ? "noshuffle" : shuffle == 2 ? "bitshuffle" : "shuffle";
}

// A v3 codec entry as (name, configuration); the spec also allows a bare name string.
std::pair<std::string, json> codec_parts(const Reader& r, const json& codec) {
  if (codec.is_string()) return {codec.get<std::string>(), json::object()};
  r.object(codec, "codecs entry");
  const std::string& name = r.string(r.need(codec, "name", " in a codecs entry"), "codec name");
  const json* config = r.find(codec, "configuration");
  if (config == nullptr) return {name, json::object()};
  return {name, r.object(*config, name + " configuration")};
}

void parse_v3_bytes_codec(const Reader& r, const json& config, DType type) {
  const json* endian = r.find(config, "endian");
  if (endian == nullptr) {
    if (dtype_size(type) > 1) {
      r.fail(std::string("the bytes codec has no \"endian\" for ") + dtype_name(type) +
             "; expected \"endian\": \"little\"");
    }
    return;
  }
  const std::string& e = r.string(*endian, "endian");
  // One byte has no order: "big" means the same bytes as "little" (zarr-python reads it).
  if (e == "big" && dtype_size(type) > 1)
    r.fail("big-endian data (bytes codec endian \"big\") is not supported; expected "
           "\"little\"");
  if (e != "little" && e != "big")
    r.fail("bytes codec endian \"" + e + "\" is not \"little\" or \"big\"");
}

Compressor parse_v3_compressor(const Reader& r, const std::string& name, const json& config) {
  Compressor c;
  if (name == "zstd") {
    c.kind = Compressor::Kind::Zstd;
    c.level = r.integer(r.need(config, "level", " in the zstd codec"), "zstd level");
    if (const json* checksum = r.find(config, "checksum")) r.boolean(*checksum, "zstd checksum");
  } else if (name == "gzip") {
    c.kind = Compressor::Kind::Gzip;
    c.level = r.integer(r.need(config, "level", " in the gzip codec"), "gzip level");
  } else {
    c.kind = Compressor::Kind::Blosc;
    c.blosc_cname = r.string(r.need(config, "cname", " in the blosc codec"), "blosc cname");
    c.level = r.integer(r.need(config, "clevel", " in the blosc codec"), "blosc clevel");
    c.blosc_shuffle = parse_v3_shuffle(r, r.need(config, "shuffle", " in the blosc codec"));
    if (const json* b = r.find(config, "blocksize")) c.blosc_blocksize = r.integer(*b, "blocksize");
    if (const json* t = r.find(config, "typesize")) r.integer(*t, "blosc typesize");
  }
  return c;
}

// codecs = [bytes] or [bytes, zstd|blosc|gzip], either followed by crc32c: anything else
// (transpose, sharding) is refused rather than misread.
Compressor parse_v3_codecs(const Reader& r, const json& codecs, DType type) {
  const char* expected = "; expected [bytes] or [bytes, zstd|blosc|gzip], optionally followed by "
                         "crc32c";
  if (!codecs.is_array() || codecs.empty()) {
    r.fail("\"codecs\" is " + brief(codecs) + expected);
  }
  Compressor c;
  for (size_t i = 0; i < codecs.size(); ++i) {
    const auto [name, config] = codec_parts(r, codecs[i]);
    if (i == 0 && name == "bytes") {
      parse_v3_bytes_codec(r, config, type);
    } else if (i == 1 && (name == "zstd" || name == "blosc" || name == "gzip")) {
      c = parse_v3_compressor(r, name, config);
    } else if (i >= 1 && i + 1 == codecs.size() && name == "crc32c") {
      c.crc32c = true;  // after the compressor: its config is empty in the spec
    } else {
      r.fail("codec \"" + name + "\" at position " + std::to_string(i) + " is not supported" +
             expected);
    }
  }
  return c;
}

// The array's codecs: a chain as above, or a sharding_indexed codec holding one for its inner
// chunks (zarr-python's `shards=`). Nested sharding, and codecs after the sharding codec, are
// refused.
void parse_v3_array_codecs(const Reader& r, const json& codecs, ArrayMeta& meta) {
  if (!codecs.is_array() || codecs.empty() ||
      codec_parts(r, codecs[0]).first != "sharding_indexed") {
    meta.compressor = parse_v3_codecs(r, codecs, meta.dtype);  // (which names what is wrong)
    return;
  }
  if (codecs.size() != 1) {
    r.fail("codec \"" + codec_parts(r, codecs[1]).first + "\" after sharding_indexed is not "
           "supported; expected sharding_indexed alone");
  }
  const auto [name, config] = codec_parts(r, codecs[0]);
  meta.inner_chunks =
      r.dims(r.need(config, "chunk_shape", " in the sharding_indexed codec"), "chunk_shape");
  if (meta.inner_chunks.empty()) r.fail("sharding a 0-d array is not supported");
  meta.compressor =
      parse_v3_codecs(r, r.need(config, "codecs", " in the sharding_indexed codec"), meta.dtype);
  // The index is (offset, size) pairs of uint64: [bytes] or [bytes, crc32c], little-endian.
  const json& index = r.need(config, "index_codecs", " in the sharding_indexed codec");
  const char* index_expected = "; expected [bytes] or [bytes, crc32c] (little-endian)";
  if (!index.is_array() || index.empty() || index.size() > 2) {
    r.fail("index_codecs " + brief(index) + index_expected);
  }
  const auto [first, first_config] = codec_parts(r, index[0]);
  if (first != "bytes") r.fail("index codec \"" + first + "\" is not supported" + index_expected);
  parse_v3_bytes_codec(r, first_config, DType::UInt64);
  meta.shard_index_crc32c = index.size() == 2;
  if (meta.shard_index_crc32c) {
    const std::string second = codec_parts(r, index[1]).first;
    if (second != "crc32c") {
      r.fail("index codec \"" + second + "\" is not supported" + index_expected);
    }
  }
  meta.shard_index_at_start = false;  // the spec's default
  if (const json* location = r.find(config, "index_location")) {
    const std::string& l = r.string(*location, "index_location");
    if (l != "start" && l != "end") r.fail("index_location \"" + l + "\" is not start or end");
    meta.shard_index_at_start = l == "start";
  }
}

// Inner chunks that tile each shard exactly (the spec requires it), and an index of a bounded
// size. Checked on open and on create.
void check_sharding(const Reader& r, const ArrayMeta& meta) {
  if (meta.format != Format::V3) r.fail("sharding is a Zarr v3 codec; expected format 3");
  const std::vector<int64_t>& inner = meta.inner_chunks;
  const std::string shapes =
      "shard shape (chunks) " + dims_text(meta.chunks) + ", inner chunks " + dims_text(inner);
  if (inner.size() != meta.chunks.size()) {
    r.fail(shapes + ": not the same number of dimensions");
  }
  uint64_t count = 1;
  for (size_t i = 0; i < inner.size(); ++i) {
    if (inner[i] <= 0 || meta.chunks[i] % inner[i] != 0) {
      r.fail(shapes + ": expected inner chunk lengths > 0 that divide the shard's");
    }
    count *= uint64_t(meta.chunks[i] / inner[i]);  // at most the shard's elements: no overflow
  }
  if (count > kMaxChunkBytes / 16) {
    r.fail(shapes + ": " + std::to_string(count) + " inner chunks per shard; expected at most " +
           std::to_string(kMaxChunkBytes / 16));
  }
}

// ---- v3 document structure ----

// Fields a v3 array document may have. Others are extensions: the spec lets a reader ignore one
// only when it says "must_understand": false.
void check_v3_fields(const Reader& r, const json& doc) {
  static const std::set<std::string> known = {
      "zarr_format", "node_type",  "shape",      "data_type",       "chunk_grid",
      "chunk_key_encoding", "fill_value", "codecs", "attributes", "dimension_names",
      "storage_transformers"};
  for (const auto& [key, value] : doc.items()) {
    if (known.count(key)) continue;
    const bool optional = value.is_object() && value.contains("must_understand") &&
                          value["must_understand"] == false;
    if (!optional) r.fail("unknown field \"" + key + "\" (an extension this reader does not "
                          "support)");
  }
}

std::vector<int64_t> parse_v3_chunk_grid(const Reader& r, const json& grid) {
  r.object(grid, "chunk_grid");
  const std::string& name = r.string(r.need(grid, "name", " in \"chunk_grid\""), "chunk_grid.name");
  if (name != "regular") {
    r.fail("chunk_grid \"" + name + "\" is not supported; expected \"regular\"");
  }
  const json& config =
      r.object(r.need(grid, "configuration", " in \"chunk_grid\""), "chunk_grid.configuration");
  return r.dims(r.need(config, "chunk_shape", " in the chunk_grid configuration"), "chunk_shape");
}

void parse_v3_key_encoding(const Reader& r, const json& enc, ArrayMeta& meta) {
  r.object(enc, "chunk_key_encoding");
  const std::string& name =
      r.string(r.need(enc, "name", " in \"chunk_key_encoding\""), "chunk_key_encoding.name");
  if (name != "default" && name != "v2") {
    r.fail("chunk_key_encoding \"" + name + "\" is not supported; expected \"default\" or \"v2\"");
  }
  meta.v3_default_key_encoding = name == "default";
  meta.separator = meta.v3_default_key_encoding ? '/' : '.';  // the spec's defaults
  const json* config = r.find(enc, "configuration");
  if (config == nullptr) return;
  r.object(*config, "chunk_key_encoding.configuration");
  if (const json* sep = r.find(*config, "separator")) {
    const std::string& s = r.string(*sep, "separator");
    if (s != "/" && s != ".") r.fail("separator \"" + s + "\" is not \"/\" or \".\"");
    meta.separator = s[0];
  }
}

void check_dimension_names(const Reader& r, const json& names, size_t ndim) {
  if (!names.is_array() || names.size() != ndim) {
    r.fail("\"dimension_names\" is " + brief(names) + "; expected " + std::to_string(ndim) +
           " names (strings or null), one per dimension");
  }
  for (const json& n : names) {
    if (!n.is_string() && !n.is_null()) {
      r.fail("\"dimension_names\" has " + brief(n) + "; expected strings or null");
    }
  }
}

}  // namespace

std::string detail::dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

// ---- public helpers declared in zarr_array.h ----

size_t dtype_size(DType type) { return info(type).size; }
const char* dtype_name(DType type) { return info(type).v3_name; }

DType parse_dtype_name(const std::string& name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.v3_name) return d.type;
  }
  throw InputError("unknown Zarr data type '" + name + "'; expected " + kV3DTypeList);
}

size_t ArrayMeta::chunk_elements() const {
  size_t n = 1;
  for (const int64_t c : chunks) n *= size_t(c);
  return n;
}

size_t ArrayMeta::chunk_bytes() const { return chunk_elements() * dtype_size(dtype); }

std::vector<int64_t> ArrayMeta::grid() const {
  std::vector<int64_t> g;
  for (size_t i = 0; i < shape.size() && i < chunks.size(); ++i) {
    // Not (shape + chunk - 1) / chunk, which overflows for shapes near INT64_MAX.
    g.push_back(chunks[i] <= 0 ? 0 : shape[i] / chunks[i] + (shape[i] % chunks[i] != 0));
  }
  return g;
}

namespace detail {

void metadata_error(const std::string& store, const std::string& file, const std::string& problem) {
  throw InputError("zarr store '" + store + "', metadata '" + file + "': " + problem);
}

std::string quote_nonfinite_numbers(const std::string& text) {
  static const std::string kTokens[] = {"NaN", "Infinity", "-Infinity"};
  std::string out;
  out.reserve(text.size());
  JsonStringTracker strings;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (strings.outside(c) && (c == 'N' || c == 'I' || c == '-')) {
      // None of these starts a valid JSON token but these three (a '-' starts a number): a
      // match is a non-finite number, never part of valid JSON.
      bool quoted = false;
      for (const std::string& token : kTokens) {
        if (text.compare(i, token.size(), token) != 0) continue;
        out += '"' + token + '"';
        i += token.size() - 1;
        quoted = true;
        break;
      }
      if (quoted) continue;
    }
    out += c;
  }
  return out;
}

json parse_metadata_text(const std::string& store, const std::string& file,
                         const std::string& text) {
  std::string problem;
  json doc = parse_json_file_text(text, problem);
  const std::string quoted_text = problem.empty() ? text : quote_nonfinite_numbers(text);
  if (quoted_text != text) {  // not JSON, but it may be Python's (a NaN attribute)
    doc = parse_json_file_text(quoted_text, problem);
    // The parser's position is in the quoted text: two characters on per token before it.
    if (!problem.empty()) problem += " (with NaN, Infinity and -Infinity read as quoted strings)";
  }
  if (!problem.empty()) metadata_error(store, file, problem + "; expected Zarr metadata");
  if (!doc.is_object()) metadata_error(store, file, "not a JSON object; expected Zarr metadata");
  return doc;
}

void check_array_meta(const std::string& store, const std::string& file, const ArrayMeta& meta,
                      Purpose purpose) {
  const Reader r(store, file);
  if (meta.format != Format::V2 && meta.format != Format::V3) r.fail("unknown Zarr format");
  const DTypeInfo& type = info(meta.dtype);
  if (meta.shape.size() != meta.chunks.size()) {
    r.fail("shape " + dims_text(meta.shape) + " has " + std::to_string(meta.shape.size()) +
           " dimensions but chunks " + dims_text(meta.chunks) + " has " +
           std::to_string(meta.chunks.size()) + "; expected the same number");
  }
  if (meta.shape.size() > kMaxDimensions) {
    r.fail(std::to_string(meta.shape.size()) + " dimensions; expected at most " +
           std::to_string(kMaxDimensions));
  }
  // Element and byte counts must fit int64: readers compute offsets and sizes from them. A zero
  // length counts as one here: readers still multiply the other lengths (a row's features in an
  // array of no rows), so [0, 2^40, 2^23] is as much too large as [1, 2^40, 2^23].
  uint64_t elements = type.size, chunk_bytes = type.size;
  for (size_t i = 0; i < meta.shape.size(); ++i) {
    if (meta.shape[i] < 0) r.fail("shape " + dims_text(meta.shape) + " has a negative length");
    if (meta.chunks[i] <= 0) {
      r.fail("chunks " + dims_text(meta.chunks) + " has a zero or negative length; expected "
             "every chunk length > 0");
    }
    const uint64_t length = uint64_t(std::max<int64_t>(meta.shape[i], 1));
    if (__builtin_mul_overflow(elements, length, &elements) ||
        elements > uint64_t(INT64_MAX)) {
      r.fail("shape " + dims_text(meta.shape) + " is too large (its byte size overflows)");
    }
    if (__builtin_mul_overflow(chunk_bytes, uint64_t(meta.chunks[i]), &chunk_bytes) ||
        chunk_bytes > kMaxChunkBytes) {
      // A sharded array's chunk grid is its shards' (meta.chunks), and a shard is read whole.
      const char* unit = meta.sharded() ? "shard" : "chunk";
      r.fail((meta.sharded() ? "shards " : "chunks ") + dims_text(meta.chunks) + " of " +
             type.v3_name + " is more than " + std::to_string(kMaxChunkBytes) + " bytes per " +
             unit + "; expected smaller " + unit + "s" +
             (meta.sharded() ? " (Tandem reads a shard whole)" : ""));
    }
  }
  const double v = meta.fill_value;
  if (type.is_float) {
    if (meta.dtype == DType::Float32 && std::isfinite(v) && std::fabs(v) > FLT_MAX) {
      r.fail("fill_value " + number_text(v) + " is outside the float32 range");
    }
  } else if (!(v >= type.lowest && v < type.past_max && v == std::floor(v))) {
    const std::string article = type.v3_name[0] == 'i' ? "an " : "a ";
    r.fail("fill_value " + number_text(v) + " is not " + article + type.v3_name + " value");
  }
  const std::string problem = purpose == Purpose::Create ? compressor_problem(meta.compressor)
                                                         : compressor_read_problem(meta.compressor);
  if (!problem.empty()) r.fail(problem);
  if (meta.sharded()) check_sharding(r, meta);
  // Only made, never read: a v3 document has no zlib codec.
  if (meta.format == Format::V3 && meta.compressor.kind == Compressor::Kind::Zlib) {
    r.fail("zlib is a Zarr v2 compressor (numcodecs Zlib); Zarr v3 has gzip, the same deflate "
           "data in gzip's wrapper");
  }
  if (meta.separator != '.' && meta.separator != '/') {
    r.fail(std::string("chunk key separator '") + meta.separator + "' is not '.' or '/'");
  }
  if (!meta.attributes.is_object()) r.fail("attributes are not a JSON object");
}

ArrayMeta parse_v2_array(const std::string& store, const json& doc) {
  const Reader r(store, ".zarray");
  r.zarr_format(doc, 2);
  ArrayMeta meta;
  meta.format = Format::V2;
  meta.shape = r.dims(r.need(doc, "shape"), "shape");
  meta.chunks = r.dims(r.need(doc, "chunks"), "chunks");
  meta.dtype = parse_v2_dtype(r, r.need(doc, "dtype"));
  meta.compressor = parse_v2_compressor(r, r.need(doc, "compressor"), meta.dtype);
  meta.fill_value = parse_fill_value(r, r.need(doc, "fill_value"), meta.dtype, Format::V2);
  const json& order = r.need(doc, "order");
  if (order != "C") {
    r.fail("order " + brief(order) + " is not supported (only row-major arrays); expected \"C\"");
  }
  const json& filters = r.need(doc, "filters");
  if (!filters.is_null() && !(filters.is_array() && filters.empty())) {
    r.fail("filters " + brief(filters) + " are not supported; expected null");
  }
  meta.separator = '.';  // zarr v2's default when the field is absent
  if (const json* sep = r.find(doc, "dimension_separator")) {
    const std::string& s = r.string(*sep, "dimension_separator");
    if (s != "." && s != "/") r.fail("dimension_separator \"" + s + "\" is not \".\" or \"/\"");
    meta.separator = s[0];
  }
  meta.v3_default_key_encoding = false;
  check_array_meta(store, ".zarray", meta, Purpose::Read);
  return meta;
}

ArrayMeta parse_v3_array(const std::string& store, const json& doc) {
  const Reader r(store, "zarr.json");
  r.zarr_format(doc, 3);
  const json& node_type = r.need(doc, "node_type");
  if (node_type != "array") {
    r.fail("node_type is " + brief(node_type) + "; expected \"array\"");
  }
  check_v3_fields(r, doc);
  ArrayMeta meta;
  meta.format = Format::V3;
  meta.shape = r.dims(r.need(doc, "shape"), "shape");
  meta.dtype = parse_v3_dtype(r, r.need(doc, "data_type"));
  meta.chunks = parse_v3_chunk_grid(r, r.need(doc, "chunk_grid"));
  parse_v3_key_encoding(r, r.need(doc, "chunk_key_encoding"), meta);
  meta.fill_value = parse_fill_value(r, r.need(doc, "fill_value"), meta.dtype, Format::V3);
  parse_v3_array_codecs(r, r.need(doc, "codecs"), meta);
  if (const json* attributes = r.find(doc, "attributes")) {
    meta.attributes = r.object(*attributes, "attributes");
  }
  // null: no names, as zarr-python reads it (the key left out means the same).
  if (const json* names = r.find(doc, "dimension_names"); names != nullptr && !names->is_null()) {
    check_dimension_names(r, *names, meta.shape.size());
  }
  if (const json* st = r.find(doc, "storage_transformers")) {
    if (!st->is_array() || !st->empty()) {
      r.fail("storage_transformers " + brief(*st) + " are not supported; expected []");
    }
  }
  check_array_meta(store, "zarr.json", meta, Purpose::Read);
  return meta;
}

ordered_json v2_array_json(const ArrayMeta& meta) {
  // Keys sorted, as zarr-python 2 writes them.
  ordered_json doc;
  doc["chunks"] = meta.chunks;
  const Compressor& c = meta.compressor;
  if (c.kind == Compressor::Kind::Zstd) {
    // No "checksum": numcodecs before 0.12 (Debian's zarr 2.13) rejects the unknown argument.
    doc["compressor"] = {{"id", "zstd"}, {"level", c.level}};
  } else if (c.kind == Compressor::Kind::Blosc) {
    doc["compressor"] = {{"blocksize", c.blosc_blocksize},
                         {"clevel", c.level},
                         {"cname", c.blosc_cname},
                         {"id", "blosc"},
                         {"shuffle", c.blosc_shuffle}};
  } else if (c.kind == Compressor::Kind::Gzip || c.kind == Compressor::Kind::Zlib) {
    doc["compressor"] = {{"id", c.kind == Compressor::Kind::Gzip ? "gzip" : "zlib"},
                         {"level", c.level}};
  } else {
    doc["compressor"] = nullptr;
  }
  doc["dimension_separator"] = std::string(1, meta.separator);
  doc["dtype"] = info(meta.dtype).v2_name;
  doc["fill_value"] = fill_value_json(meta);
  doc["filters"] = nullptr;
  doc["order"] = "C";
  doc["shape"] = meta.shape;
  doc["zarr_format"] = 2;
  return doc;
}

ordered_json v3_array_json(const ArrayMeta& meta) {
  ordered_json doc;
  doc["zarr_format"] = 3;
  doc["node_type"] = "array";
  doc["shape"] = meta.shape;
  doc["data_type"] = dtype_name(meta.dtype);
  doc["chunk_grid"] = {{"name", "regular"}, {"configuration", {{"chunk_shape", meta.chunks}}}};
  doc["chunk_key_encoding"] = {
      {"name", meta.v3_default_key_encoding ? "default" : "v2"},
      {"configuration", {{"separator", std::string(1, meta.separator)}}}};
  doc["fill_value"] = fill_value_json(meta);
  ordered_json codecs = ordered_json::array();
  // zarr-python leaves out "endian" for 1-byte types, where it means nothing.
  if (dtype_size(meta.dtype) == 1) {
    codecs.push_back({{"name", "bytes"}});
  } else {
    codecs.push_back({{"name", "bytes"}, {"configuration", {{"endian", "little"}}}});
  }
  const Compressor& c = meta.compressor;
  if (c.kind == Compressor::Kind::Zstd) {
    codecs.push_back(
        {{"name", "zstd"}, {"configuration", {{"level", c.level}, {"checksum", false}}}});
  } else if (c.kind == Compressor::Kind::Blosc) {
    codecs.push_back({{"name", "blosc"},
                      {"configuration",
                       {{"typesize", dtype_size(meta.dtype)},
                        {"cname", c.blosc_cname},
                        {"clevel", c.level},
                        {"shuffle", v3_shuffle_name(c.blosc_shuffle)},
                        {"blocksize", c.blosc_blocksize}}}});
  } else if (c.kind == Compressor::Kind::Gzip) {
    codecs.push_back({{"name", "gzip"}, {"configuration", {{"level", c.level}}}});
  }
  if (c.crc32c) {  // last, as read: set_attributes rewrites an opened array's document
    codecs.push_back({{"name", "crc32c"}});
  }
  if (meta.sharded()) {
    ordered_json index_codecs = ordered_json::array();
    index_codecs.push_back({{"name", "bytes"}, {"configuration", {{"endian", "little"}}}});
    if (meta.shard_index_crc32c) index_codecs.push_back({{"name", "crc32c"}});
    ordered_json sharding = {{"name", "sharding_indexed"},
                             {"configuration",
                              {{"chunk_shape", meta.inner_chunks},
                               {"codecs", codecs},
                               {"index_codecs", index_codecs},
                               {"index_location", meta.shard_index_at_start ? "start" : "end"}}}};
    codecs = ordered_json::array({sharding});
  }
  doc["codecs"] = codecs;
  doc["attributes"] = meta.attributes;
  return doc;
}

}  // namespace detail
}  // namespace tandem::zarr
