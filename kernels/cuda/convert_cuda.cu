#include "cuda/convert_cuda.h"

#include <cstdint>

#include "cpu/convert_cpu.h"
#include "cuda/cuda_check.h"
#include "cuda/launch_config.h"

namespace tandem::kernels {

namespace {

constexpr int kGatherThreads = 128;
// Rows per launch before the grid-stride loop takes over: plenty of blocks in flight.
constexpr int64_t kGatherMaxBlocks = 65536;

unsigned gather_grid(int64_t n) {
  return static_cast<unsigned>(n < kGatherMaxBlocks ? n : kGatherMaxBlocks);
}

// One block per row: the source row is one contiguous run, read as 4-byte words and written as
// 16-byte float4 stores when the row length and the pointers allow it.
template <bool kVector>
__global__ void gather_u8_kernel(const uint8_t* src, int64_t features, const int32_t* rows,
                                 int64_t n, float* dst, const uint8_t* labels,
                                 uint8_t* labels_out, float scale) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t row = rows ? rows[i] : i;
    const uint8_t* in = src + row * features;
    float* out = dst + i * features;
    if (kVector) {
      const uchar4* in4 = reinterpret_cast<const uchar4*>(in);
      float4* out4 = reinterpret_cast<float4*>(out);
      for (int64_t j = threadIdx.x; j < features / 4; j += blockDim.x) {
        const uchar4 p = in4[j];
        out4[j] = make_float4(static_cast<float>(p.x) * scale, static_cast<float>(p.y) * scale,
                              static_cast<float>(p.z) * scale, static_cast<float>(p.w) * scale);
      }
    } else {
      for (int64_t j = threadIdx.x; j < features; j += blockDim.x)
        out[j] = static_cast<float>(in[j]) * scale;
    }
    if (labels_out && threadIdx.x == 0) labels_out[i] = labels[row];
  }
}

template <bool kVector>
__global__ void gather_f32_kernel(const float* src, int64_t features, const int32_t* rows,
                                  int64_t n, float* dst, const uint8_t* labels,
                                  uint8_t* labels_out) {
  for (int64_t i = blockIdx.x; i < n; i += gridDim.x) {
    const int64_t row = rows ? rows[i] : i;
    const float* in = src + row * features;
    float* out = dst + i * features;
    if (kVector) {
      const float4* in4 = reinterpret_cast<const float4*>(in);
      float4* out4 = reinterpret_cast<float4*>(out);
      for (int64_t j = threadIdx.x; j < features / 4; j += blockDim.x) out4[j] = in4[j];
    } else {
      for (int64_t j = threadIdx.x; j < features; j += blockDim.x) out[j] = in[j];
    }
    if (labels_out && threadIdx.x == 0) labels_out[i] = labels[row];
  }
}

bool aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

}  // namespace

void gather_rows_u8_cuda(const uint8_t* src, int64_t features, const int32_t* rows, int64_t n,
                         float* dst, const uint8_t* labels, uint8_t* labels_out,
                         cudaStream_t stream) {
  if (n == 0 || features == 0) return;
  if (labels_out != nullptr && labels == nullptr)
    throw CudaError("gather_rows_u8_cuda: labels_out given without labels");
  const bool vector = features % 4 == 0 && aligned(src, 4) && aligned(dst, 16);
  if (vector)
    gather_u8_kernel<true><<<gather_grid(n), kGatherThreads, 0, stream>>>(
        src, features, rows, n, dst, labels, labels_out, kPixelScale);
  else
    gather_u8_kernel<false><<<gather_grid(n), kGatherThreads, 0, stream>>>(
        src, features, rows, n, dst, labels, labels_out, kPixelScale);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void gather_rows_f32_cuda(const float* src, int64_t features, const int32_t* rows, int64_t n,
                          float* dst, const uint8_t* labels, uint8_t* labels_out,
                          cudaStream_t stream) {
  if (n == 0 || features == 0) return;
  if (labels_out != nullptr && labels == nullptr)
    throw CudaError("gather_rows_f32_cuda: labels_out given without labels");
  const bool vector = features % 4 == 0 && aligned(src, 16) && aligned(dst, 16);
  if (vector)
    gather_f32_kernel<true><<<gather_grid(n), kGatherThreads, 0, stream>>>(
        src, features, rows, n, dst, labels, labels_out);
  else
    gather_f32_kernel<false><<<gather_grid(n), kGatherThreads, 0, stream>>>(
        src, features, rows, n, dst, labels, labels_out);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::kernels
