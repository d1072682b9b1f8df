// A chunk's file: its bytes through the array's compressor, or a shard. A shard (Zarr v3's
// sharding_indexed codec, zarr-python's `shards=`) holds the chunk as inner chunks, each encoded
// with the compressor on its own, and an index at its end (or start): per inner chunk in C order,
// its offset and size in the file as two little-endian uint64, both 2^64-1 for an inner chunk not
// stored (the fill value), then the index's CRC-32C when the index codecs say so.
#include "zarr/zarr_stored_chunks.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "crc32c.h"
#include "tandem/error.h"
#include "zarr/zarr_metadata.h"

namespace tandem::zarr::detail {
namespace {

constexpr uint64_t kNotStored = ~uint64_t{0};
constexpr size_t kIndexEntryBytes = 16;

// Fills `elements` with the fill value converted to the element type, copying the first element
// forward in doubling blocks (chunks are large and `out` may be unaligned for T).
template <typename T>
void fill_typed(uint8_t* out, size_t elements, double value) {
  if (elements == 0) return;
  const T v = static_cast<T>(value);
  std::memcpy(out, &v, sizeof v);
  const size_t total = elements * sizeof v;
  for (size_t filled = sizeof v; filled < total;) {
    const size_t n = std::min(filled, total - filled);
    std::memcpy(out + filled, out, n);
    filled += n;
  }
}

uint64_t load_le64(const uint8_t* p) {
  uint64_t v = 0;
  for (int b = 7; b >= 0; --b) v = v << 8 | p[b];
  return v;
}

void store_le(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int b = 0; b < bytes; ++b) out.push_back(uint8_t(v >> (8 * b)));
}

// A shard's layout: inner chunks per dimension, their count and size, and the index's size.
struct ShardLayout {
  std::vector<int64_t> per_dim;
  size_t count = 1;
  size_t inner_bytes = 0;
  size_t index_bytes = 0;
  // Each inner chunk is a contiguous run of the shard (it spans every dimension but the first),
  // so it is decoded in place rather than through a scratch buffer.
  bool contiguous = true;

  explicit ShardLayout(const ArrayMeta& meta) {
    inner_bytes = dtype_size(meta.dtype);
    for (size_t d = 0; d < meta.chunks.size(); ++d) {
      per_dim.push_back(meta.chunks[d] / meta.inner_chunks[d]);
      count *= size_t(per_dim.back());
      inner_bytes *= size_t(meta.inner_chunks[d]);
      if (d > 0 && per_dim.back() != 1) contiguous = false;
    }
    index_bytes = count * kIndexEntryBytes + (meta.shard_index_crc32c ? 4 : 0);
  }

  // Inner chunk k's position in the shard's grid of inner chunks (C order).
  std::vector<int64_t> position(size_t k) const {
    std::vector<int64_t> p(per_dim.size());
    for (size_t d = per_dim.size(); d-- > 0;) {
      p[d] = int64_t(k % size_t(per_dim[d]));
      k /= size_t(per_dim[d]);
    }
    return p;
  }
};

// Calls fn(shard_offset, inner_offset, bytes) for each innermost row of inner chunk `position`:
// where the row lies in the shard's C-order bytes and in the inner chunk's own.
template <typename Fn>
void for_each_inner_row(const ArrayMeta& meta, const std::vector<int64_t>& position, Fn fn) {
  const size_t dims = meta.chunks.size(), item = dtype_size(meta.dtype);
  const std::vector<int64_t>& in_shape = meta.inner_chunks;
  const size_t row = size_t(in_shape[dims - 1]) * item;
  std::vector<int64_t> at(dims, 0);  // within the inner chunk; the last stays 0
  for (size_t inner_offset = 0;; inner_offset += row) {
    size_t shard_offset = 0;
    for (size_t d = 0; d < dims; ++d)
      shard_offset = shard_offset * size_t(meta.chunks[d]) +
                     size_t(position[d] * in_shape[d] + at[d]);
    fn(shard_offset * item, inner_offset, row);
    // The next row: count up the dimensions before the last, the last-but-one fastest.
    size_t d = dims - 1;
    while (d-- > 0) {
      if (++at[d] < in_shape[d]) break;
      at[d] = 0;
    }
    if (d == size_t(-1)) return;  // every dimension wrapped: all rows done
  }
}

void decode_shard(const ArrayMeta& meta, const uint8_t* in, size_t in_size, uint8_t* out,
                  const std::string& what) {
  const ShardLayout layout(meta);
  if (in_size < layout.index_bytes) {
    throw InputError(what + ": shard is " + std::to_string(in_size) + " bytes, shorter than its " +
                     std::to_string(layout.index_bytes) + "-byte index of " +
                     std::to_string(layout.count) + " inner chunks; expected a whole shard");
  }
  const uint8_t* index = meta.shard_index_at_start ? in : in + in_size - layout.index_bytes;
  const uint64_t data_begin = meta.shard_index_at_start ? layout.index_bytes : 0;
  const uint64_t data_end = meta.shard_index_at_start ? in_size : in_size - layout.index_bytes;
  const size_t entries_bytes = layout.count * kIndexEntryBytes;
  if (meta.shard_index_crc32c) {
    const uint8_t* sum = index + entries_bytes;
    const uint32_t stored = uint32_t(sum[0]) | uint32_t(sum[1]) << 8 | uint32_t(sum[2]) << 16 |
                            uint32_t(sum[3]) << 24;
    const uint32_t computed = crc32c(index, entries_bytes);
    if (stored != computed) {
      char text[128];
      std::snprintf(text, sizeof text, "shard index crc32c checksum is %08x, the index's is %08x",
                    stored, computed);
      throw InputError(what + ": " + text + " (the shard is corrupt)");
    }
  }
  // Every entry is checked before anything is decoded; a missing inner chunk is the fill value.
  // The inner chunks may not take more than the data in all: entries that overlap would have
  // the same bytes decoded again and again (every entry the whole data: quadratic time).
  bool any_missing = false;
  uint64_t taken = 0;
  for (size_t k = 0; k < layout.count; ++k) {
    const uint64_t offset = load_le64(index + k * kIndexEntryBytes);
    const uint64_t size = load_le64(index + k * kIndexEntryBytes + 8);
    if (offset == kNotStored && size == kNotStored) {
      any_missing = true;
    } else if (offset < data_begin || offset > data_end || size > data_end - offset) {
      throw InputError(what + ": the shard index places inner chunk " +
                       dims_text(layout.position(k)) + " at bytes " + std::to_string(offset) +
                       " to " + std::to_string(offset) + "+" + std::to_string(size) +
                       "; expected it within the shard's data, bytes " +
                       std::to_string(data_begin) + " to " + std::to_string(data_end));
    } else if (size > data_end - data_begin - taken) {
      throw InputError(what + ": the shard index gives its inner chunks more bytes in all than "
                       "the shard's data holds (" + std::to_string(data_end - data_begin) +
                       ", passed at inner chunk " + dims_text(layout.position(k)) +
                       "); expected inner chunks that do not overlap");
    } else {
      taken += size;
    }
  }
  if (any_missing) fill_chunk(meta, out);
  std::vector<uint8_t> scratch(layout.contiguous ? 0 : layout.inner_bytes);
  for (size_t k = 0; k < layout.count; ++k) {
    const uint64_t offset = load_le64(index + k * kIndexEntryBytes);
    const uint64_t size = load_le64(index + k * kIndexEntryBytes + 8);
    if (offset == kNotStored && size == kNotStored) continue;
    uint8_t* target = layout.contiguous ? out + k * layout.inner_bytes : scratch.data();
    // The inner chunk is named only when one is at fault: a shard may hold many thousands.
    // decompress's messages begin "<what>: "; the name goes after `what`.
    const auto named = [&](const char* message) {
      std::string text = message;
      const std::string prefix = what + ": ";
      const std::string name = ", inner chunk " + dims_text(layout.position(k));
      if (text.rfind(prefix, 0) == 0) return text.insert(what.size(), name);
      return what + name + ": " + text;
    };
    try {
      decompress(meta.compressor, in + offset, size_t(size), target, layout.inner_bytes, what);
    } catch (const InputError& e) {
      throw InputError(named(e.what()));
    } catch (const Error& e) {  // (zlib out of memory, say)
      throw Error(named(e.what()));
    }
    if (!layout.contiguous) {
      for_each_inner_row(meta, layout.position(k), [&](size_t to, size_t from, size_t bytes) {
        std::memcpy(out + to, scratch.data() + from, bytes);
      });
    }
  }
}

std::vector<uint8_t> encode_shard(const ArrayMeta& meta, const uint8_t* data) {
  const ShardLayout layout(meta);
  std::vector<uint8_t> body, entries;
  std::vector<uint8_t> scratch(layout.contiguous ? 0 : layout.inner_bytes);
  const uint64_t base = meta.shard_index_at_start ? layout.index_bytes : 0;
  for (size_t k = 0; k < layout.count; ++k) {
    const uint8_t* inner = data + k * layout.inner_bytes;
    if (!layout.contiguous) {
      for_each_inner_row(meta, layout.position(k), [&](size_t from, size_t to, size_t bytes) {
        std::memcpy(scratch.data() + to, data + from, bytes);
      });
      inner = scratch.data();
    }
    const std::vector<uint8_t> stored =
        compress(meta.compressor, inner, layout.inner_bytes, dtype_size(meta.dtype));
    store_le(entries, base + body.size(), 8);
    store_le(entries, stored.size(), 8);
    body.insert(body.end(), stored.begin(), stored.end());
  }
  if (meta.shard_index_crc32c) store_le(entries, crc32c(entries.data(), entries.size()), 4);
  if (meta.shard_index_at_start) {
    entries.insert(entries.end(), body.begin(), body.end());
    return entries;
  }
  body.insert(body.end(), entries.begin(), entries.end());
  return body;
}

}  // namespace

void fill_chunk(const ArrayMeta& meta, uint8_t* out) {
  const size_t n = meta.chunk_elements();
  switch (meta.dtype) {
    case DType::UInt8: return fill_typed<uint8_t>(out, n, meta.fill_value);
    case DType::Int8: return fill_typed<int8_t>(out, n, meta.fill_value);
    case DType::UInt16: return fill_typed<uint16_t>(out, n, meta.fill_value);
    case DType::Int16: return fill_typed<int16_t>(out, n, meta.fill_value);
    case DType::UInt32: return fill_typed<uint32_t>(out, n, meta.fill_value);
    case DType::Int32: return fill_typed<int32_t>(out, n, meta.fill_value);
    case DType::UInt64: return fill_typed<uint64_t>(out, n, meta.fill_value);
    case DType::Int64: return fill_typed<int64_t>(out, n, meta.fill_value);
    case DType::Float32: return fill_typed<float>(out, n, meta.fill_value);
    case DType::Float64: return fill_typed<double>(out, n, meta.fill_value);
  }
}

size_t max_stored_chunk_size(const ArrayMeta& meta) {
  if (!meta.sharded()) return max_stored_size(meta.compressor, meta.chunk_bytes());
  const ShardLayout layout(meta);
  return max_stored_size_of_parts(meta.compressor, layout.count, layout.inner_bytes) +
         layout.index_bytes;
}

void decode_stored_chunk(const ArrayMeta& meta, const uint8_t* in, size_t in_size, uint8_t* out,
                         const std::string& what) {
  if (meta.sharded()) return decode_shard(meta, in, in_size, out, what);
  decompress(meta.compressor, in, in_size, out, meta.chunk_bytes(), what);
}

std::vector<uint8_t> encode_stored_chunk(const ArrayMeta& meta, const uint8_t* data) {
  if (meta.sharded()) return encode_shard(meta, data);
  return compress(meta.compressor, data, meta.chunk_bytes(), dtype_size(meta.dtype));
}

}  // namespace tandem::zarr::detail
