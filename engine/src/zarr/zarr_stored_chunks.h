// Internal to the Zarr module: a chunk's bytes to and from what its file holds (compressed,
// checksummed, or a shard: inner chunks and their index, Zarr v3's sharding_indexed codec), and
// the fill value that stands for what is not stored. zarr_array.cpp does the files; this does the
// bytes in them. Not part of the engine's interface.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "zarr/zarr_array.h"

namespace tandem::zarr::detail {

// Fills a whole chunk (chunk_bytes()) with the array's fill value.
void fill_chunk(const ArrayMeta& meta, uint8_t* out);

// The largest file a chunk of `meta` can have: a larger one is corrupt, and refusing it before
// reading keeps memory bounded by the chunk size.
size_t max_stored_chunk_size(const ArrayMeta& meta);

// Decodes a chunk file's bytes into the chunk (chunk_bytes() at `out`). InputError naming `what`,
// and the inner chunk where one is at fault, when the bytes are corrupt or of the wrong size.
void decode_stored_chunk(const ArrayMeta& meta, const uint8_t* in, size_t in_size, uint8_t* out,
                         const std::string& what);

// What a chunk's file holds for the chunk's bytes `data` (chunk_bytes()).
std::vector<uint8_t> encode_stored_chunk(const ArrayMeta& meta, const uint8_t* data);

}  // namespace tandem::zarr::detail
