#include "array_stats.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>

#include "dataset_store.h"
#include "tandem/error.h"
#include "thread_pool.h"

namespace tandem {
namespace {

// Partial results are kept per block of row chunks; the blocks together stay below this many
// bytes, however many chunks the array has.
constexpr int64_t kPartialBudgetBytes = int64_t(64) << 20;

// Runs job(j, member) for j in [0, jobs) on `threads` members (chunk_read_threads), each job
// once, in any order.
template <typename Job>
void parallel_jobs(int64_t jobs, int threads, Job&& job) {
  if (jobs <= 0) return;
  ThreadPool pool(std::max(1, threads));
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  pool.run([&](int member) {
    try {
      for (int64_t j; !failed.load(std::memory_order_relaxed) && (j = next.fetch_add(1)) < jobs;)
        job(j, member);
    } catch (...) {
      failed.store(true);
      throw;
    }
  });
}

// Count, mean and M2 (sum of squared deviations) per column: one partial result. The mean is
// held as shift + mean, the shift a value of the column (a float32 chunk's first row): the
// means of two chunks are then compared to the precision of the column's spread, not of its
// magnitude. (Without it, values of 1e4 +- 1e-3 gave a variance 7e-10 off, relative.)
struct Moments {
  int64_t count = 0;
  std::vector<double> shift, mean, m2;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();

  void reset(size_t columns) {
    count = 0;
    shift.assign(columns, 0.0);
    mean.assign(columns, 0.0);
    m2.assign(columns, 0.0);
    min = std::numeric_limits<double>::infinity();
    max = -std::numeric_limits<double>::infinity();
  }
  // Chan, Golub and LeVeque's pairwise update: this = this (+) other.
  void merge(const Moments& other) {
    if (other.count == 0) return;
    min = std::min(min, other.min);
    max = std::max(max, other.max);
    if (count == 0) {
      count = other.count;
      shift = other.shift;
      mean = other.mean;
      m2 = other.m2;
      return;
    }
    const double na = double(count), nb = double(other.count), n = na + nb;
    const double wb = nb / n, w = na * nb / n;
    const double wa = na / n;
    for (size_t j = 0; j < mean.size(); ++j) {
      // (Shifts are finite float32 values: their difference is exact, or as good as needed.)
      const double delta = (other.shift[j] - shift[j]) + (other.mean[j] - mean[j]);
      if (std::isfinite(delta)) {
        mean[j] += delta * wb;
        m2[j] += other.m2[j] + delta * delta * w;
      } else {
        // A column holding an infinity: inf - inf would make an infinite mean NaN where NumPy's
        // is inf (and NaN only for +inf with -inf, as the weighted sum gives); the variance is
        // NaN either way, as NumPy's.
        const double a = shift[j] + mean[j], b = other.shift[j] + other.mean[j];
        mean[j] = (a * wa + b * wb) - shift[j];
        m2[j] = std::nan("");
      }
    }
    count += other.count;
  }
};

// Moments of the valid part of one uint8 chunk, exactly: integer sums of x and x^2 per column.
void chunk_moments_u8(const uint8_t* chunk, const ChunkLayout& layout, Moments& out,
                      std::vector<uint64_t>& sum, std::vector<uint64_t>& sum_sq) {
  const size_t columns = size_t(layout.columns());
  sum.assign(columns, 0);
  sum_sq.assign(columns, 0);
  unsigned lo = 255, hi = 0;
  for (int64_t r = 0; r < layout.rows; ++r) {
    const uint8_t* row = chunk + r * layout.chunk_row_elements;
    size_t k = 0;
    for (const auto& run : layout.runs) {
      const uint8_t* src = row + run.chunk_offset;
      uint64_t* s = sum.data() + k;
      uint64_t* q = sum_sq.data() + k;
      unsigned run_lo = 255, run_hi = 0;
      for (int64_t i = 0; i < run.length; ++i) {
        const unsigned x = src[i];
        s[i] += x;
        q[i] += x * x;
        run_lo = std::min(run_lo, x);
        run_hi = std::max(run_hi, x);
      }
      lo = std::min(lo, run_lo);
      hi = std::max(hi, run_hi);
      k += size_t(run.length);
    }
  }
  const uint64_t n = uint64_t(layout.rows);
  out.count = layout.rows;
  out.shift.assign(columns, 0.0);  // exact integer sums need none
  out.mean.resize(columns);
  out.m2.resize(columns);
  for (size_t j = 0; j < columns; ++j) {
    out.mean[j] = double(sum[j]) / double(n);
    // n * sum(x^2) - sum(x)^2 >= 0 exactly; 128 bits cannot overflow for any chunk size.
    const unsigned __int128 numerator =
        (unsigned __int128)n * sum_sq[j] - (unsigned __int128)sum[j] * sum[j];
    out.m2[j] = double(numerator) / double(n);
  }
  out.min = lo;
  out.max = hi;
}

// Moments of the valid part of one float32 chunk: the corrected two-pass algorithm in float64.
void chunk_moments_f32(const float* chunk, const ChunkLayout& layout, Moments& out,
                       std::vector<double>& s1) {
  const size_t columns = size_t(layout.columns());
  out.count = layout.rows;
  out.shift.assign(columns, 0.0);
  out.mean.assign(columns, 0.0);
  out.m2.assign(columns, 0.0);
  if (layout.rows > 0) {  // the first row's values, where finite, are the shifts
    size_t k = 0;
    for (const auto& run : layout.runs)
      for (int64_t i = 0; i < run.length; ++i, ++k)
        if (std::isfinite(chunk[run.chunk_offset + i])) out.shift[k] = chunk[run.chunk_offset + i];
  }
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (int64_t r = 0; r < layout.rows; ++r) {
    const float* row = chunk + r * layout.chunk_row_elements;
    size_t k = 0;
    for (const auto& run : layout.runs) {
      const float* src = row + run.chunk_offset;
      double* m = out.mean.data() + k;
      const double* shift = out.shift.data() + k;
      for (int64_t i = 0; i < run.length; ++i) {
        const double x = src[i];
        m[i] += x - shift[i];
        lo = std::min(lo, x);  // NaN-free minimum: min(lo, NaN) keeps lo
        hi = std::max(hi, x);
      }
      k += size_t(run.length);
    }
  }
  const double n = double(layout.rows);
  for (auto& m : out.mean) m /= n;
  s1.assign(columns, 0.0);
  for (int64_t r = 0; r < layout.rows; ++r) {
    const float* row = chunk + r * layout.chunk_row_elements;
    size_t k = 0;
    for (const auto& run : layout.runs) {
      const float* src = row + run.chunk_offset;
      const double* m = out.mean.data() + k;
      const double* shift = out.shift.data() + k;
      double* a = s1.data() + k;
      double* b = out.m2.data() + k;
      for (int64_t i = 0; i < run.length; ++i) {
        const double d = (double(src[i]) - shift[i]) - m[i];
        a[i] += d;
        b[i] += d * d;
      }
      k += size_t(run.length);
    }
  }
  for (size_t j = 0; j < columns; ++j) out.m2[j] -= s1[j] * s1[j] / n;
  out.min = lo;
  out.max = hi;
}

template <typename T>
void count_values(const T* data, size_t n, std::map<int64_t, int64_t>& counts,
                  std::vector<int64_t>& small, const std::string& path) {
  for (size_t i = 0; i < n; ++i) {
    // The histogram counts in int64: a uint64 past its range would show as a negative value.
    if constexpr (std::is_same_v<T, uint64_t>)
      if (data[i] > uint64_t(INT64_MAX))
        throw InputError(path + ": value " + std::to_string(data[i]) +
                         " is above 2^63 - 1, the largest a histogram of values counts");
    const auto v = static_cast<int64_t>(data[i]);
    if (v >= 0 && v < int64_t(small.size())) ++small[size_t(v)];
    else ++counts[v];
  }
}

}  // namespace

int64_t matrix_features(const zarr::ArrayMeta& meta) {
  int64_t features = 1;
  for (size_t d = 1; d < meta.shape.size(); ++d) features *= meta.shape[d];
  return features;
}

int64_t ChunkLayout::columns() const {
  int64_t n = 0;
  for (const auto& run : runs) n += run.length;
  return n;
}

int chunk_read_threads(int threads, int64_t jobs, size_t chunk_bytes, int buffers_per_thread) {
  if (threads < 0) throw InputError("threads is " + std::to_string(threads) + ", expected >= 0");
  const int wanted = threads == 0 ? ThreadPool::available_cores() : threads;
  const size_t per_thread = std::max<size_t>(1, chunk_bytes * size_t(buffers_per_thread));
  const int64_t affordable = int64_t(std::max<size_t>(1, kChunkReadBudget / per_thread));
  return static_cast<int>(
      std::max<int64_t>(1, std::min<int64_t>({int64_t(wanted), jobs, affordable})));
}

int64_t chunk_count(const std::vector<int64_t>& grid) {
  int64_t n = 1;
  for (int64_t g : grid) n *= g;
  return n;
}

std::vector<int64_t> chunk_index_of(const std::vector<int64_t>& grid, int64_t linear) {
  std::vector<int64_t> index(grid.size(), 0);
  for (size_t d = grid.size(); d-- > 0;) {
    index[d] = linear % grid[d];
    linear /= grid[d];
  }
  return index;
}

ChunkLayout chunk_layout(const zarr::ArrayMeta& meta, const std::vector<int64_t>& chunk_index) {
  const size_t ndim = meta.shape.size();
  ChunkLayout layout;
  if (ndim == 0) {  // a scalar: one row of one element
    layout.rows = 1;
    layout.runs.push_back({0, 0, 1});
    return layout;
  }
  std::vector<int64_t> origin(ndim), extent(ndim);
  for (size_t d = 0; d < ndim; ++d) {
    origin[d] = chunk_index[d] * meta.chunks[d];
    extent[d] = std::max<int64_t>(0, std::min(meta.chunks[d], meta.shape[d] - origin[d]));
  }
  layout.row_begin = origin[0];
  layout.rows = extent[0];
  layout.chunk_row_elements = 1;
  for (size_t d = 1; d < ndim; ++d) layout.chunk_row_elements *= meta.chunks[d];
  if (ndim == 1) {
    layout.runs.push_back({0, 0, 1});
    return layout;
  }
  // Strides of dims 1..ndim-1 in a chunk row and in a matrix row.
  std::vector<int64_t> chunk_stride(ndim, 1), shape_stride(ndim, 1);
  for (size_t d = ndim - 1; d > 1; --d) {
    chunk_stride[d - 1] = chunk_stride[d] * meta.chunks[d];
    shape_stride[d - 1] = shape_stride[d] * meta.shape[d];
  }
  // One run per position in dims 1..ndim-2 (none for a 2-D array: a single run).
  std::vector<int64_t> m(ndim, 0);
  for (size_t d = 1; d + 1 < ndim; ++d)
    if (extent[d] == 0) return layout;
  for (;;) {
    ChunkLayout::Run run{0, 0, extent[ndim - 1]};
    for (size_t d = 1; d < ndim; ++d) {
      run.chunk_offset += m[d] * chunk_stride[d];
      run.feature += (origin[d] + m[d]) * shape_stride[d];
    }
    if (run.length > 0) layout.runs.push_back(run);
    size_t d = ndim - 1;
    while (d-- > 1) {
      if (++m[d] < extent[d]) break;
      m[d] = 0;
    }
    if (d == 0) break;
  }
  return layout;
}

void place_chunk_rows(const ChunkLayout& layout, const uint8_t* chunk, size_t element_bytes,
                      int64_t features, uint8_t* rows) {
  for (int64_t r = 0; r < layout.rows; ++r) {
    const uint8_t* src = chunk + size_t(r * layout.chunk_row_elements) * element_bytes;
    uint8_t* dst = rows + size_t(r * features) * element_bytes;
    for (const auto& run : layout.runs)
      std::memcpy(dst + size_t(run.feature) * element_bytes,
                  src + size_t(run.chunk_offset) * element_bytes,
                  size_t(run.length) * element_bytes);
  }
}

PixelType image_pixel_type(const zarr::ArrayMeta& images, const std::string& what) {
  switch (images.dtype) {
    case zarr::DType::UInt8: return PixelType::UInt8;
    case zarr::DType::Float32:
    case zarr::DType::Float64: return PixelType::Float32;
    default:
      throw InputError(what + ": images are " + zarr::dtype_name(images.dtype) +
                       ", expected uint8, float32 or float64");
  }
}

size_t pixels_in_place(const zarr::ArrayMeta& images, uint8_t* chunk) {
  if (images.dtype != zarr::DType::Float64) return zarr::dtype_size(images.dtype);
  // Element i's 4 bytes land at 4i, below element i+1's 8 at 8i + 8: read before overwritten.
  for (size_t i = 0, n = images.chunk_elements(); i < n; ++i) {
    double wide;
    std::memcpy(&wide, chunk + i * sizeof wide, sizeof wide);
    const float narrow = static_cast<float>(wide);
    std::memcpy(chunk + i * sizeof narrow, &narrow, sizeof narrow);
  }
  return sizeof(float);
}

namespace {

// A chunk read, or its fill value where it is missing; with `every_chunk_written` (a store tandem
// prepare wrote, DatasetStore::Split::every_chunk_written) a missing one is an InputError.
void read_chunk_of_store(const zarr::Array& array, const std::vector<int64_t>& index,
                         uint8_t* out, bool every_chunk_written) {
  if (!array.read_chunk(index, out) && every_chunk_written)
    throw InputError(missing_chunk_message(array, "chunk " + array.chunk_key(index)));
}

}  // namespace

bool read_row_band(const zarr::Array& array, int64_t band, int64_t features, uint8_t* out,
                   std::vector<uint8_t>& scratch, bool as_pixels) {
  bool whole = true;
  const zarr::ArrayMeta& meta = array.meta();
  const std::vector<int64_t> grid = meta.grid();
  const std::vector<int64_t> inner(grid.begin() + 1, grid.end());
  scratch.resize(meta.chunk_bytes());
  for (int64_t t = 0, n = chunk_count(inner); t < n; ++t) {
    std::vector<int64_t> index = chunk_index_of(inner, t);
    index.insert(index.begin(), band);
    whole = array.read_chunk(index, scratch.data()) && whole;
    const size_t element =
        as_pixels ? pixels_in_place(meta, scratch.data()) : zarr::dtype_size(meta.dtype);
    place_chunk_rows(chunk_layout(meta, index), scratch.data(), element, features, out);
  }
  return whole;
}

void read_images_band(const zarr::Array& images, int64_t band, int64_t features, uint8_t* out,
                      std::vector<uint8_t>& scratch, bool every_chunk_written) {
  if (!read_row_band(images, band, features, out, scratch, true) && every_chunk_written)
    throw InputError(missing_chunk_message(images, "a chunk of row band " + std::to_string(band)));
}

ColumnStats column_stats(const zarr::Array& array, int threads, bool every_chunk_written) {
  const zarr::ArrayMeta& meta = array.meta();
  image_pixel_type(meta, array.path() + ": column statistics");  // the dtypes images may have
  if (meta.shape.size() < 2)
    throw InputError(array.path() + ": column statistics need an array of at least 2 "
                     "dimensions, got " + std::to_string(meta.shape.size()));
  ColumnStats result;
  result.rows = meta.shape[0];
  result.features = matrix_features(meta);
  result.mean.assign(size_t(result.features), 0.0);
  result.variance.assign(size_t(result.features), 0.0);
  const std::vector<int64_t> grid = meta.grid();
  const int64_t row_chunks = grid[0];
  const int64_t column_tuples = row_chunks == 0 ? 0 : chunk_count(grid) / row_chunks;
  if (result.rows == 0 || result.features == 0 || column_tuples == 0) {
    result.min = result.max = result.overall_mean = std::nan("");
    if (result.rows == 0) {
      std::fill(result.mean.begin(), result.mean.end(), std::nan(""));
      std::fill(result.variance.begin(), result.variance.end(), std::nan(""));
    }
    return result;
  }
  // Blocks of consecutive row chunks: fixed by the shape, so the merge order is too.
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(row_chunks, kPartialBudgetBytes / (16 * result.features)));
  std::vector<Moments> partial(size_t(blocks * column_tuples));
  struct Scratch {
    std::vector<uint8_t> chunk;
    Moments moments;
    std::vector<uint64_t> sum, sum_sq;
    std::vector<double> s1;
  };
  const int size = chunk_read_threads(threads, blocks * column_tuples, meta.chunk_bytes(), 1);
  std::vector<Scratch> scratch(static_cast<size_t>(size));
  parallel_jobs(blocks * column_tuples, size, [&](int64_t job, int member) {
    Scratch& s = scratch[size_t(member)];
    s.chunk.resize(meta.chunk_bytes());
    const int64_t tuple = job / blocks, block = job % blocks;
    std::vector<int64_t> index = chunk_index_of(grid, tuple);  // row index 0 (tuple < columns)
    Moments& acc = partial[size_t(job)];
    bool first = true;
    for (int64_t rc = split_begin(row_chunks, int(blocks), int(block));
         rc < split_begin(row_chunks, int(blocks), int(block) + 1); ++rc) {
      index[0] = rc;
      const ChunkLayout layout = chunk_layout(meta, index);
      if (first) acc.reset(size_t(layout.columns()));
      first = false;
      read_chunk_of_store(array, index, s.chunk.data(), every_chunk_written);
      pixels_in_place(meta, s.chunk.data());
      if (meta.dtype == zarr::DType::UInt8)
        chunk_moments_u8(s.chunk.data(), layout, s.moments, s.sum, s.sum_sq);
      else
        chunk_moments_f32(reinterpret_cast<const float*>(s.chunk.data()), layout, s.moments, s.s1);
      acc.merge(s.moments);
    }
  });
  // Merge the blocks of each column tuple in block order.
  result.min = std::numeric_limits<double>::infinity();
  result.max = -std::numeric_limits<double>::infinity();
  for (int64_t tuple = 0; tuple < column_tuples; ++tuple) {
    Moments total = partial[size_t(tuple * blocks)];
    for (int64_t b = 1; b < blocks; ++b) total.merge(partial[size_t(tuple * blocks + b)]);
    result.min = std::min(result.min, total.min);
    result.max = std::max(result.max, total.max);
    const ChunkLayout layout = chunk_layout(meta, chunk_index_of(grid, tuple));
    size_t k = 0;
    for (const auto& run : layout.runs)
      for (int64_t i = 0; i < run.length; ++i, ++k) {
        result.mean[size_t(run.feature + i)] = total.shift[k] + total.mean[k];
        result.variance[size_t(run.feature + i)] = total.m2[k] / double(total.count);
      }
  }
  double sum = 0.0;
  for (double m : result.mean) sum += m;
  result.overall_mean = sum / double(result.features);
  if (result.min > result.max) result.min = result.max = std::nan("");  // every value NaN
  return result;
}

IntegerHistogram integer_histogram(const zarr::Array& array, int threads,
                                   bool every_chunk_written) {
  const zarr::ArrayMeta& meta = array.meta();
  if (meta.dtype == zarr::DType::Float32 || meta.dtype == zarr::DType::Float64)
    throw InputError(array.path() + ": a histogram of values needs an integer array, got " +
                     zarr::dtype_name(meta.dtype));
  const std::vector<int64_t> grid = meta.grid();
  const int64_t chunks = meta.shape.empty() ? 1 : chunk_count(grid);
  const int size = chunk_read_threads(threads, chunks, meta.chunk_bytes(), 2);
  struct Part {
    std::vector<uint8_t> chunk;
    std::vector<uint8_t> valid;
    std::map<int64_t, int64_t> counts;
    std::vector<int64_t> small = std::vector<int64_t>(256, 0);
  };
  std::vector<Part> parts(static_cast<size_t>(size));
  const size_t esize = zarr::dtype_size(meta.dtype);
  parallel_jobs(chunks, size, [&](int64_t job, int member) {
    Part& p = parts[size_t(member)];
    p.chunk.resize(meta.chunk_bytes());
    const std::vector<int64_t> index =
        meta.shape.empty() ? std::vector<int64_t>{} : chunk_index_of(grid, job);
    read_chunk_of_store(array, index, p.chunk.data(), every_chunk_written);
    // Gather the valid elements of the chunk, then count them.
    const ChunkLayout layout = chunk_layout(meta, index);
    p.valid.resize(size_t(layout.rows * layout.columns()) * esize);
    uint8_t* dst = p.valid.data();
    for (int64_t r = 0; r < layout.rows; ++r)
      for (const auto& run : layout.runs) {
        std::memcpy(dst, p.chunk.data() + (r * layout.chunk_row_elements + run.chunk_offset) * esize,
                    size_t(run.length) * esize);
        dst += size_t(run.length) * esize;
      }
    const size_t n = size_t(layout.rows * layout.columns());
    const void* v = p.valid.data();
    auto count = [&](auto* typed) { count_values(typed, n, p.counts, p.small, array.path()); };
    switch (meta.dtype) {
      case zarr::DType::UInt8: count(static_cast<const uint8_t*>(v)); break;
      case zarr::DType::Int8: count(static_cast<const int8_t*>(v)); break;
      case zarr::DType::UInt16: count(static_cast<const uint16_t*>(v)); break;
      case zarr::DType::Int16: count(static_cast<const int16_t*>(v)); break;
      case zarr::DType::UInt32: count(static_cast<const uint32_t*>(v)); break;
      case zarr::DType::Int32: count(static_cast<const int32_t*>(v)); break;
      case zarr::DType::UInt64: count(static_cast<const uint64_t*>(v)); break;
      case zarr::DType::Int64: count(static_cast<const int64_t*>(v)); break;
      default: break;
    }
  });
  IntegerHistogram h;
  for (const Part& p : parts) {
    for (const auto& [value, count] : p.counts) h.counts[value] += count;
    for (size_t v = 0; v < p.small.size(); ++v)
      if (p.small[v] != 0) h.counts[int64_t(v)] += p.small[v];
  }
  for (const auto& [value, count] : h.counts) h.count += count;
  if (!h.counts.empty()) {
    h.min = h.counts.begin()->first;
    h.max = h.counts.rbegin()->first;
  }
  return h;
}

std::vector<double> read_matrix_row(const zarr::Array& array, int64_t row,
                                    bool every_chunk_written) {
  const zarr::ArrayMeta& meta = array.meta();
  if (meta.shape.empty() || row < 0 || row >= meta.shape[0])
    throw InputError(array.path() + ": row " + std::to_string(row) + " is out of range; the array "
                     "has " + std::to_string(meta.shape.empty() ? 0 : meta.shape[0]) + " rows");
  const std::vector<int64_t> grid = meta.grid();
  const int64_t row_chunks = grid[0];
  const int64_t column_tuples = chunk_count(grid) / row_chunks;
  std::vector<double> out(size_t(matrix_features(meta)), 0.0);
  std::vector<uint8_t> chunk(meta.chunk_bytes());
  const size_t esize = zarr::dtype_size(meta.dtype);
  for (int64_t tuple = 0; tuple < column_tuples; ++tuple) {
    std::vector<int64_t> index = chunk_index_of(grid, tuple);
    index[0] = row / meta.chunks[0];
    read_chunk_of_store(array, index, chunk.data(), every_chunk_written);
    const ChunkLayout layout = chunk_layout(meta, index);
    const uint8_t* src = chunk.data() + size_t(row - layout.row_begin) *
                                            size_t(layout.chunk_row_elements) * esize;
    for (const auto& run : layout.runs)
      for (int64_t i = 0; i < run.length; ++i) {
        const uint8_t* p = src + size_t(run.chunk_offset + i) * esize;
        double v = 0.0;
        switch (meta.dtype) {
          case zarr::DType::UInt8: v = *p; break;
          case zarr::DType::Int8: v = static_cast<int8_t>(*p); break;
#define TANDEM_LOAD(D, T) \
  case zarr::DType::D: { T x; std::memcpy(&x, p, sizeof(T)); v = double(x); break; }
          TANDEM_LOAD(UInt16, uint16_t)
          TANDEM_LOAD(Int16, int16_t)
          TANDEM_LOAD(UInt32, uint32_t)
          TANDEM_LOAD(Int32, int32_t)
          TANDEM_LOAD(UInt64, uint64_t)
          TANDEM_LOAD(Int64, int64_t)
          TANDEM_LOAD(Float32, float)
          TANDEM_LOAD(Float64, double)
#undef TANDEM_LOAD
        }
        out[size_t(run.feature + i)] = v;
      }
  }
  return out;
}

}  // namespace tandem
