#include "cuda/softmax_xent_cuda.h"

#include <cmath>
#include <cstdint>

#include "cpu/softmax_xent_cpu.h"
#include "cuda/cuda_check.h"
#include "cuda/launch_config.h"

namespace tandem::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = kThreadsPerBlock / kWarp;
constexpr unsigned kFullMask = 0xffffffffu;

// The first maximum, as the CPU twin's `if (z[j] > z[best])` scan finds it: larger value wins,
// equal values go to the lower index.
__device__ inline void keep_first_max(float& value, int& index, float other_value, int other_index) {
  if (other_value > value || (other_value == value && other_index < index)) {
    value = other_value;
    index = other_index;
  }
}

__device__ inline void warp_first_max(float& value, int& index) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float v = __shfl_xor_sync(kFullMask, value, offset);
    const int i = __shfl_xor_sync(kFullMask, index, offset);
    keep_first_max(value, index, v, i);
  }
}

__device__ inline float warp_sum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(kFullMask, value, offset);
  return value;
}

// One warp per row: the row's logits are read once from memory (re-reads hit L1), each lane
// owning classes lane, lane+32, ... Loss and correct count go to one partial per block, summed
// by lane 0 of each warp in row order and then over the block's warps in warp order.
__global__ void softmax_xent_kernel(const float* logits, const uint8_t* labels, float* dlogits,
                                    uint8_t* predictions, int64_t rows, int classes,
                                    float log_clip, SoftmaxXentPartial* partials) {
  __shared__ double warp_loss[kWarpsPerBlock];
  __shared__ long long warp_correct[kWarpsPerBlock];
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  double loss = 0.0;
  long long correct = 0;
  for (int64_t r = blockIdx.x * int64_t{kWarpsPerBlock} + warp; r < rows;
       r += int64_t{gridDim.x} * kWarpsPerBlock) {
    const float* z = logits + r * classes;
    // Every lane starts below everything and folds its classes in, so a NaN is never taken (no
    // comparison with it holds), as in the CPU's scan; started from its first class, a lane
    // whose first class was NaN kept it and passed over its larger classes after it.
    float best = -INFINITY;
    int best_index = INT32_MAX;
    for (int j = lane; j < classes; j += kWarp) keep_first_max(best, best_index, z[j], j);
    warp_first_max(best, best_index);
    // ... except at class 0, where the CPU's scan starts: a NaN there is never replaced.
    if (isnan(z[0])) best_index = 0;
    const float zmax = best;
    float sum = 0.0f;
    for (int j = lane; j < classes; j += kWarp) sum += expf(z[j] - zmax);
    sum = warp_sum(sum);
    const int label = labels[r];
    const float log_p_label = label < classes ? z[label] - zmax - logf(sum) : NAN;
    const bool clipped = log_p_label < log_clip;
    if (lane == 0) {
      loss -= clipped ? log_clip : log_p_label;
      correct += best_index == label;
      if (predictions) predictions[r] = static_cast<uint8_t>(best_index);
    }
    if (dlogits) {
      float* dz = dlogits + r * classes;
      const float inv_sum = 1.0f / sum;
      for (int j = lane; j < classes; j += kWarp) {
        float g = expf(z[j] - zmax) * inv_sum;
        if (j == label) g -= 1.0f;
        dz[j] = clipped ? 0.0f : g;
      }
    }
  }
  if (lane == 0) {
    warp_loss[warp] = loss;
    warp_correct[warp] = correct;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    SoftmaxXentPartial p{0.0, 0};
    for (int w = 0; w < kWarpsPerBlock; ++w) {
      p.loss_sum += warp_loss[w];
      p.correct += warp_correct[w];
    }
    partials[blockIdx.x] = p;
  }
}

// One block adds the partials in a fixed order (strided per thread, then a tree), so the total
// does not depend on which block finished first.
__global__ void sum_partials_kernel(const SoftmaxXentPartial* partials, int64_t count,
                                    DeviceStats* totals) {
  __shared__ double loss[kThreadsPerBlock];
  __shared__ long long correct[kThreadsPerBlock];
  double l = 0.0;
  long long c = 0;
  for (int64_t i = threadIdx.x; i < count; i += kThreadsPerBlock) {
    l += partials[i].loss_sum;
    c += partials[i].correct;
  }
  loss[threadIdx.x] = l;
  correct[threadIdx.x] = c;
  __syncthreads();
  for (int stride = kThreadsPerBlock / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) {
      loss[threadIdx.x] += loss[threadIdx.x + stride];
      correct[threadIdx.x] += correct[threadIdx.x + stride];
    }
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    totals->loss_sum += loss[0];
    totals->correct += correct[0];
  }
}

__global__ void argmax_rows_kernel(const float* logits, uint8_t* out, int64_t rows, int classes) {
  for (int64_t r = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; r < rows;
       r += int64_t{gridDim.x} * blockDim.x) {
    const float* z = logits + r * classes;
    int best = 0;
    for (int j = 1; j < classes; ++j)
      if (z[j] > z[best]) best = j;
    out[r] = static_cast<uint8_t>(best);
  }
}

}  // namespace

int64_t softmax_xent_partials_needed(int64_t rows) {
  return grid_for(rows, kWarpsPerBlock);
}

void softmax_xent_cuda(const float* logits, const uint8_t* labels, float* dlogits,
                       uint8_t* predictions, int64_t rows, int64_t classes,
                       SoftmaxXentPartial* partials, DeviceStats* totals, cudaStream_t stream) {
  if (rows == 0) return;
  if (classes < 1 || classes > 256)
    throw CudaError("softmax_xent_cuda: classes must be in [1, 256], got " +
                    std::to_string(classes));
  // The same float the CPU twin compares against, computed by the same host log.
  const float log_clip = std::log(kProbabilityClip);
  const unsigned blocks = grid_for(rows, kWarpsPerBlock);
  softmax_xent_kernel<<<blocks, kThreadsPerBlock, 0, stream>>>(
      logits, labels, dlogits, predictions, rows, static_cast<int>(classes), log_clip, partials);
  TANDEM_CUDA_CHECK_LAUNCH();
  sum_partials_kernel<<<1, kThreadsPerBlock, 0, stream>>>(partials, blocks, totals);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void argmax_rows_cuda(const float* logits, uint8_t* out, int64_t rows, int64_t classes,
                      cudaStream_t stream) {
  if (rows == 0) return;
  if (classes < 1 || classes > 256)  // a class index is a byte
    throw CudaError("argmax_rows_cuda: classes must be in [1, 256], got " +
                    std::to_string(classes));
  argmax_rows_kernel<<<grid_for(rows), kThreadsPerBlock, 0, stream>>>(logits, out, rows,
                                                                      static_cast<int>(classes));
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::kernels
