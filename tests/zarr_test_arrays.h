// Walking a Zarr array's chunks and the logical (C-order) array they hold, and typed element
// access, for the Zarr tests (zarr_test.cpp) and the interop helper (zarr_tool.cpp).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "zarr/zarr_array.h"

namespace tandem::zarr::test_arrays {

// Calls fn for every chunk index of the grid, in C order (one empty index for a 0-d array).
inline void for_each_chunk(const ArrayMeta& m,
                           const std::function<void(const std::vector<int64_t>&)>& fn) {
  const std::vector<int64_t> grid = m.grid();
  for (const int64_t g : grid) {
    if (g == 0) return;
  }
  std::vector<int64_t> index(grid.size(), 0);
  while (true) {
    fn(index);
    int d = int(grid.size()) - 1;
    for (; d >= 0; --d) {
      if (++index[size_t(d)] < grid[size_t(d)]) break;
      index[size_t(d)] = 0;
    }
    if (d < 0) return;
  }
}

// Calls fn(array_offset, chunk_offset, count), in elements, for each run along the last
// dimension where chunk `index` overlaps the array: edge chunks are only partly inside it.
inline void for_each_run(const ArrayMeta& m, const std::vector<int64_t>& index,
                         const std::function<void(size_t, size_t, size_t)>& fn) {
  const size_t nd = m.shape.size();
  if (nd == 0) return fn(0, 0, 1);
  std::vector<int64_t> start(nd), extent(nd), pos(nd, 0);
  for (size_t d = 0; d < nd; ++d) {
    start[d] = index[d] * m.chunks[d];
    extent[d] = std::min(m.chunks[d], m.shape[d] - start[d]);
  }
  while (true) {
    size_t a = 0, c = 0;
    for (size_t d = 0; d < nd; ++d) {
      a = a * size_t(m.shape[d]) + size_t(start[d] + pos[d]);
      c = c * size_t(m.chunks[d]) + size_t(pos[d]);
    }
    fn(a, c, size_t(extent[nd - 1]));
    int d = int(nd) - 2;
    for (; d >= 0; --d) {
      if (++pos[size_t(d)] < extent[size_t(d)]) break;
      pos[size_t(d)] = 0;
    }
    if (d < 0) return;
  }
}

// Elements in the whole array (1 for a 0-d array).
inline size_t element_count(const ArrayMeta& m) {
  size_t n = 1;
  for (const int64_t s : m.shape) n *= size_t(s);
  return n;
}

// The whole array in C order, read chunk by chunk. With `missing`, counts the chunks that were
// absent (read as the fill value).
inline std::vector<uint8_t> read_logical(const Array& a, int* missing = nullptr) {
  const ArrayMeta& m = a.meta();
  const size_t es = dtype_size(m.dtype);
  std::vector<uint8_t> data(element_count(m) * es);
  std::vector<uint8_t> chunk(m.chunk_bytes());
  for_each_chunk(m, [&](const std::vector<int64_t>& index) {
    if (!a.read_chunk(index, chunk.data()) && missing) ++*missing;
    for_each_run(m, index, [&](size_t ao, size_t co, size_t n) {
      std::memcpy(data.data() + ao * es, chunk.data() + co * es, n * es);
    });
  });
  return data;
}

template <typename T>
void put(uint8_t* p, double v) {
  const T t = static_cast<T>(v);
  std::memcpy(p, &t, sizeof t);
}

template <typename T>
double get(const uint8_t* p) {
  T t;
  std::memcpy(&t, p, sizeof t);
  return double(t);
}

// Stores v, converted to `type`, at p (which may be unaligned).
inline void put_element(DType type, uint8_t* p, double v) {
  switch (type) {
    case DType::UInt8: return put<uint8_t>(p, v);
    case DType::Int8: return put<int8_t>(p, v);
    case DType::UInt16: return put<uint16_t>(p, v);
    case DType::Int16: return put<int16_t>(p, v);
    case DType::UInt32: return put<uint32_t>(p, v);
    case DType::Int32: return put<int32_t>(p, v);
    case DType::UInt64: return put<uint64_t>(p, v);
    case DType::Int64: return put<int64_t>(p, v);
    case DType::Float32: return put<float>(p, v);
    case DType::Float64: return put<double>(p, v);
  }
}

// The element of `type` at p (which may be unaligned), as a double.
inline double get_element(DType type, const uint8_t* p) {
  switch (type) {
    case DType::UInt8: return get<uint8_t>(p);
    case DType::Int8: return get<int8_t>(p);
    case DType::UInt16: return get<uint16_t>(p);
    case DType::Int16: return get<int16_t>(p);
    case DType::UInt32: return get<uint32_t>(p);
    case DType::Int32: return get<int32_t>(p);
    case DType::UInt64: return get<uint64_t>(p);
    case DType::Int64: return get<int64_t>(p);
    case DType::Float32: return get<float>(p);
    case DType::Float64: return get<double>(p);
  }
  return 0.0;
}

}  // namespace tandem::zarr::test_arrays
