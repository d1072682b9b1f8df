#include "cuda/stats_cuda.h"

#include <thrust/execution_policy.h>
#include <thrust/functional.h>
#include <thrust/inner_product.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda/cuda_check.h"

namespace tandem::kernels {

namespace {

// A block covers 32 columns (one warp-width of consecutive columns: coalesced reads of a row)
// with 8 lanes of rows, over one chunk of rows.
constexpr int kColumnsPerBlock = 32;
constexpr int kRowLanes = 8;
constexpr int64_t kMinRowsPerChunk = 1024;
constexpr int64_t kMaxChunks = 65535;  // the grid's y limit

int64_t rows_per_chunk(int64_t rows) {
  return std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
}

int64_t chunks_for(int64_t rows) {
  const int64_t per = rows_per_chunk(rows);
  return std::max<int64_t>(1, (rows + per - 1) / per);
}

// Each chunk's column means and sums of squared deviations, in two passes over the chunk (its
// rows are in L2 for the second), summed over the row lanes in a fixed order.
template <typename T>
__global__ void column_partials_kernel(const T* data, int64_t rows, int64_t cols,
                                       int64_t chunk_rows, double* part_mean, double* part_m2) {
  __shared__ double lanes[kRowLanes][kColumnsPerBlock + 1];
  __shared__ double chunk_mean[kColumnsPerBlock];
  const int tx = threadIdx.x % kColumnsPerBlock;
  const int lane = threadIdx.x / kColumnsPerBlock;
  const int64_t col = blockIdx.x * int64_t{kColumnsPerBlock} + tx;
  const int64_t r0 = blockIdx.y * chunk_rows;
  const int64_t r1 = min(rows, r0 + chunk_rows);
  const double count = static_cast<double>(r1 - r0);

  double sum = 0.0;
  if (col < cols)
    for (int64_t r = r0 + lane; r < r1; r += kRowLanes) sum += static_cast<double>(data[r * cols + col]);
  lanes[lane][tx] = sum;
  __syncthreads();
  if (lane == 0) {
    double total = 0.0;
    for (int k = 0; k < kRowLanes; ++k) total += lanes[k][tx];
    chunk_mean[tx] = total / count;
  }
  __syncthreads();
  const double mean = chunk_mean[tx];
  double m2 = 0.0;
  if (col < cols)
    for (int64_t r = r0 + lane; r < r1; r += kRowLanes) {
      const double d = static_cast<double>(data[r * cols + col]) - mean;
      m2 += d * d;
    }
  __syncthreads();  // every lane has read chunk_mean; `lanes` may be reused
  lanes[lane][tx] = m2;
  __syncthreads();
  if (lane == 0 && col < cols) {
    double total = 0.0;
    for (int k = 0; k < kRowLanes; ++k) total += lanes[k][tx];
    part_mean[blockIdx.y * cols + col] = mean;
    part_m2[blockIdx.y * cols + col] = total;
  }
}

// Chan, Golub and LeVeque's pairwise update, chunk after chunk in row order.
__global__ void merge_partials_kernel(const double* part_mean, const double* part_m2,
                                      int64_t rows, int64_t cols, int64_t chunk_rows,
                                      int64_t chunks, double* mean_out, double* var_out) {
  for (int64_t col = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; col < cols;
       col += int64_t{gridDim.x} * blockDim.x) {
    double n = 0.0, mean = 0.0, m2 = 0.0;
    for (int64_t c = 0; c < chunks; ++c) {
      const double nb = static_cast<double>(min(rows, (c + 1) * chunk_rows) - c * chunk_rows);
      const double delta = part_mean[c * cols + col] - mean;
      const double total = n + nb;
      mean += delta * (nb / total);
      m2 += part_m2[c * cols + col] + delta * delta * (n * nb / total);
      n = total;
    }
    mean_out[col] = mean;
    var_out[col] = m2 / n;
  }
}

__global__ void fill_nan_kernel(double* a, double* b, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    a[i] = b[i] = NAN;
}

template <typename T>
void column_stats(const T* data, int64_t rows, int64_t cols, double* mean, double* variance,
                  double* scratch, cudaStream_t stream) {
  if (cols == 0) return;
  const unsigned col_blocks = static_cast<unsigned>((cols + 255) / 256);
  if (rows == 0) {
    fill_nan_kernel<<<col_blocks, 256, 0, stream>>>(mean, variance, cols);
    TANDEM_CUDA_CHECK_LAUNCH();
    return;
  }
  const int64_t chunk_rows = rows_per_chunk(rows);
  const int64_t chunks = chunks_for(rows);
  double* part_mean = scratch;
  double* part_m2 = scratch + chunks * cols;
  const dim3 grid(static_cast<unsigned>((cols + kColumnsPerBlock - 1) / kColumnsPerBlock),
                  static_cast<unsigned>(chunks));
  column_partials_kernel<T><<<grid, kColumnsPerBlock * kRowLanes, 0, stream>>>(
      data, rows, cols, chunk_rows, part_mean, part_m2);
  TANDEM_CUDA_CHECK_LAUNCH();
  merge_partials_kernel<<<col_blocks, 256, 0, stream>>>(part_mean, part_m2, rows, cols,
                                                         chunk_rows, chunks, mean, variance);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace

int64_t count_correct_cuda(const uint8_t* predictions, const uint8_t* labels, int64_t n,
                           cudaStream_t stream) {
  if (n == 0) return 0;
  try {
    return thrust::inner_product(thrust::cuda::par.on(stream), predictions, predictions + n,
                                 labels, int64_t{0}, thrust::plus<int64_t>(),
                                 thrust::equal_to<uint8_t>());
  } catch (const std::exception& e) {  // thrust::system_error: name the call like the macros do
    throw CudaError(std::string("thrust::inner_product (count_correct_cuda) failed: ") + e.what());
  }
}

int64_t column_stats_scratch_doubles(int64_t rows, int64_t cols) {
  return 2 * chunks_for(rows) * cols;
}

void column_stats_u8_cuda(const uint8_t* data, int64_t rows, int64_t cols, double* mean,
                          double* variance, double* scratch, cudaStream_t stream) {
  column_stats(data, rows, cols, mean, variance, scratch, stream);
}

void column_stats_f32_cuda(const float* data, int64_t rows, int64_t cols, double* mean,
                           double* variance, double* scratch, cudaStream_t stream) {
  column_stats(data, rows, cols, mean, variance, scratch, stream);
}

}  // namespace tandem::kernels
