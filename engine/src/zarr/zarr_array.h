// Zarr arrays and groups on a local filesystem, formats v2 and v3: the persisted chunk store.
// Compatible with what dask.array.to_zarr and zarr-python write (C order, little-endian), so data
// can be prepared in Dask and trained on in Tandem, and the other way round.
//
// Scope: C-order arrays of fixed-size little-endian numbers; compressors none, zstd, blosc, gzip
// and (v2 only) zlib (v2 `compressor`, v3 `codecs` = [bytes, zstd|blosc|gzip], or v3's
// sharding_indexed codec holding such a chain for its inner chunks); v2 chunk keys "i.j" or
// "i/j", v3 keys "c/i/j" (default chunk_key_encoding) or "i.j"/"i/j" (v2 encoding); missing
// chunks (and a shard's missing inner chunks) read as fill_value. Everything else (F order,
// big-endian, filters, nested sharding, transposes) is refused with an InputError naming the
// store, and the key where one is involved.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "file_io.h"

namespace tandem::zarr {

enum class Format { V2 = 2, V3 = 3 };

enum class DType { UInt8, Int8, UInt16, Int16, UInt32, Int32, UInt64, Int64, Float32, Float64 };
size_t dtype_size(DType type);
const char* dtype_name(DType type);  // "uint8", "float32", ... (v3 names)
DType parse_dtype_name(const std::string& name);  // v3 name; InputError otherwise

struct Compressor {
  // Gzip: deflate in gzip's wrapper (RFC 1952: numcodecs GZip in v2, the gzip codec in v3).
  // Zlib: deflate in zlib's wrapper (RFC 1950: numcodecs Zlib), a Zarr v2 compressor only.
  enum class Kind { None, Zstd, Blosc, Gzip, Zlib };
  Kind kind = Kind::None;
  int level = 3;                   // zstd level, blosc clevel, or gzip/zlib level (0 to 9)
  std::string blosc_cname = "lz4";  // blosc: lz4, lz4hc, zstd, blosclz, zlib
  int blosc_shuffle = 1;           // blosc: 0 none, 1 byte, 2 bit
  int blosc_blocksize = 0;         // blosc: 0 = automatic
  // Zarr v3's crc32c codec last in the chain: each chunk file ends with the CRC-32C of what
  // precedes it (4 bytes, little-endian), checked and stripped before decompressing. Read, not
  // written (zarr-python writes it when asked: compressors=[..., Crc32cCodec()]).
  bool crc32c = false;

  // "none", "zstd", "zstd:5", "blosc-lz4", "blosc-zstd:5", "gzip", "zlib:9", ... (what `tandem
  // prepare --compressor` takes); InputError naming the text otherwise.
  static Compressor parse(const std::string& text);
  std::string describe() const;
};

struct ArrayMeta {
  Format format = Format::V3;
  DType dtype = DType::UInt8;
  std::vector<int64_t> shape;
  std::vector<int64_t> chunks;
  Compressor compressor;
  double fill_value = 0.0;           // numbers only (NaN allowed for floats)
  char separator = '/';              // v2: '.' (zarr's default) or '/'; v3: '/' (c/i/j) or as v2 encoding
  bool v3_default_key_encoding = true;  // v3: "c/i/j" (default) or the "v2" encoding
  nlohmann::json attributes = nlohmann::json::object();
  // Zarr v3's sharding_indexed codec: each stored chunk (a shard, of `chunks`) holds inner chunks
  // of `inner_chunks`, each encoded with `compressor`, and an index of where each one lies.
  // Empty: not sharded. A shard is read and written whole, as any chunk.
  std::vector<int64_t> inner_chunks;
  bool shard_index_at_start = false;  // index_location "start"; zarr-python writes "end"
  bool shard_index_crc32c = true;     // the index ends with its CRC-32C (zarr-python's default)

  size_t chunk_elements() const;  // product of chunks
  size_t chunk_bytes() const;     // chunk_elements() * dtype size
  std::vector<int64_t> grid() const;  // chunks per dimension, ceil(shape / chunks)
  bool sharded() const { return !inner_chunks.empty(); }
  // A chunk's file is the chunk's bytes as they are: no compressor, checksum or sharding.
  bool stored_plain() const {
    return compressor.kind == Compressor::Kind::None && !compressor.crc32c && !sharded();
  }
};

class Array {
 public:
  // Reads the metadata at `path` (v2 .zarray + .zattrs, or v3 zarr.json) and checks it is
  // self-consistent and supported. InputError naming the path otherwise.
  static Array open(const std::string& path);
  // Creates the directory and writes the metadata (refuses an existing array at `path`).
  static Array create(const std::string& path, const ArrayMeta& meta);

  const ArrayMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }

  // The chunk's key relative to the array ("0.3", "0/3", "c/0/3").
  std::string chunk_key(const std::vector<int64_t>& index) const;
  // Decompresses chunk `index` into `out` (chunk_bytes(), C order, the full chunk even at the
  // edge). A missing chunk is filled with fill_value and false returned. InputError naming the
  // store and key for a corrupt chunk or one of the wrong decompressed size. Thread-safe.
  // A compressed chunk's file of at least kMapChunkFilesFrom bytes is mapped (mmap) and
  // decompressed from the page cache, not read into a buffer first; smaller ones are read.
  bool read_chunk(const std::vector<int64_t>& index, uint8_t* out) const;
  static constexpr uint64_t kMapChunkFilesFrom = uint64_t{256} << 10;
  // Uncompressed arrays only: the chunk's file mapped read-only (chunk_bytes(), C order), so a
  // reader copies straight out of the page cache; an empty mapping when the chunk is missing
  // (read_chunk gives its fill value). InputError naming the store and key for a file of the
  // wrong size, or when the array is compressed.
  MappedFile map_chunk(const std::vector<int64_t>& index) const;
  // Compresses and writes a full chunk (chunk_bytes(); edge chunks padded by the caller) through a
  // temporary file and rename. Safe for different chunks from different threads.
  void write_chunk(const std::vector<int64_t>& index, const uint8_t* data) const;
  // Updates the attributes (v2 .zattrs, v3 zarr.json).
  void set_attributes(const nlohmann::json& attributes);

 private:
  bool read_chunk_file(const std::string& key, uint8_t* out) const;
  MappedFile map_chunk_file(const std::string& key) const;
  // Chunks are opened by path, so a store removed or replaced under a reader gave the fill value
  // for every chunk (all gone) or another store's rows, beside labels read from this one.
  // InputError naming `what` unless path_ is still the directory open() found (a created
  // array is not checked: its directory may be renamed into place while it is written). The
  // check is by device and inode number: a store deleted and made again at once may get the
  // same inode, which it cannot tell apart.
  void check_still_there(const std::string& what) const;

  std::string path_;
  ArrayMeta meta_;
  uint64_t directory_device_ = 0, directory_inode_ = 0;  // 0: not checked
};

// A group: a directory with .zgroup (+ .zattrs) in v2, or zarr.json with node_type "group" in v3.
struct Group {
  static void create(const std::string& path, Format format,
                     const nlohmann::json& attributes = nlohmann::json::object());
  // The group's format and attributes; InputError if `path` is not a group.
  static std::pair<Format, nlohmann::json> open(const std::string& path);
  static bool exists(const std::string& path);  // a v2 or v3 group is at path
};

// Raw codec entry points (also used by benchmarks): decompress `in` into exactly `out_size`
// bytes, throwing InputError with `what` in the message when the data is corrupt or not exactly
// that size.
std::vector<uint8_t> compress(const Compressor& c, const uint8_t* data, size_t size,
                              size_t type_size);
void decompress(const Compressor& c, const uint8_t* in, size_t in_size, uint8_t* out,
                size_t out_size, const std::string& what);

}  // namespace tandem::zarr
