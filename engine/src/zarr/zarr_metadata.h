// Internal to the Zarr module: metadata documents (v2 .zarray, v3 zarr.json) to and from
// ArrayMeta, and the checks every array passes whether it is opened or created. Kept apart from
// zarr_array.cpp so the file I/O there stays short; not part of the engine's interface.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zarr/zarr_array.h"

namespace tandem::zarr::detail {

// Metadata files larger than this are corruption, not metadata (attributes included).
constexpr size_t kMaxMetadataBytes = 16u << 20;
// NumPy's historical dimension limit; more dimensions than this is a corrupt shape.
constexpr size_t kMaxDimensions = 32;
// One chunk must fit blosc's buffer limit (INT_MAX - 16), whatever its compressor, so any array
// can be recompressed with any compressor and no chunk asks for an absurd allocation.
constexpr size_t kMaxChunkBytes = 2147483647u - 16u;

// "[1, 2, 3]": shapes, chunk shapes and chunk indices in messages.
std::string dims_text(const std::vector<int64_t>& dims);

// Throws InputError("zarr store '<store>', metadata '<file>': <problem>").
[[noreturn]] void metadata_error(const std::string& store, const std::string& file,
                                 const std::string& problem);

// `text` with the bare NaN, Infinity and -Infinity that Python's json module writes for
// non-finite floats (zarr-python writes user attributes with it) turned into the strings "NaN",
// "Infinity" and "-Infinity", Zarr's own spelling of them in fill_value. Valid JSON is returned
// as it is.
std::string quote_nonfinite_numbers(const std::string& text);

// Parses metadata text (as quote_nonfinite_numbers leaves it when it is not JSON as it is): bad
// JSON, too deep or not an object is an InputError naming the file.
nlohmann::json parse_metadata_text(const std::string& store, const std::string& file,
                                   const std::string& text);

// The array described by a v2 .zarray document (attributes come from .zattrs separately) or a v3
// zarr.json document (node_type "array"), checked with check_array_meta.
ArrayMeta parse_v2_array(const std::string& store, const nlohmann::json& zarray);
ArrayMeta parse_v3_array(const std::string& store, const nlohmann::json& zarr_json);

// Shape, chunks, dtype, fill value, compressor and key encoding are supported and consistent,
// and no size overflows; InputError naming the store and `file` otherwise. What only writing
// uses is checked only for an array being created (`Purpose::Create`): a compression level
// outside the range Tandem writes (numcodecs' Zlib(level=-1), zlib's default, or a zstd level
// above the maximum, which libzstd clamps) does not stop a store from being read.
enum class Purpose { Create, Read };
void check_array_meta(const std::string& store, const std::string& file, const ArrayMeta& meta,
                      Purpose purpose);

// The metadata documents written for `meta` (v2: .zarray without attributes; v3: zarr.json).
nlohmann::ordered_json v2_array_json(const ArrayMeta& meta);
nlohmann::ordered_json v3_array_json(const ArrayMeta& meta);

// Describes a Compressor's problem (unsupported name, level out of range), or "" if it is fine.
std::string compressor_problem(const Compressor& c);
// What of compressor_problem holds for reading: a blosc compressor this libblosc has, and a
// shuffle and block size that mean something. Levels are the writer's.
std::string compressor_read_problem(const Compressor& c);

// Why Tandem reads stores compressed with `c` but does not write them, or "": blosc-snappy, which
// the numcodecs that zarr-python 3 installs from PyPI is built without (Debian's zarr 2.13 writes
// and reads it), so a store Tandem wrote could not be read there.
std::string unwritable_compressor_problem(const Compressor& c);

// The largest stored chunk `c` can produce from `chunk_bytes` bytes: a larger chunk file is
// corrupt, and refusing it before reading keeps memory bounded by the chunk size.
size_t max_stored_size(const Compressor& c, size_t chunk_bytes);
// The same for `parts` chunks of `part_bytes` stored in one file (a shard's inner chunks).
size_t max_stored_size_of_parts(const Compressor& c, size_t parts, size_t part_bytes);

}  // namespace tandem::zarr::detail
