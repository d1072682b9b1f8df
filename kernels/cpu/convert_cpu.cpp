#include "convert_cpu.h"

#include <cstring>

namespace tandem::kernels {

void gather_rows_u8_cpu(const uint8_t* src, int64_t features, const int32_t* rows, int64_t n,
                        float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    const uint8_t* in = src + (rows ? rows[i] : i) * features;
    float* out = dst + i * features;
#pragma omp simd
    for (int64_t j = 0; j < features; ++j) out[j] = static_cast<float>(in[j]) * kPixelScale;
  }
}

void gather_rows_f32_cpu(const float* src, int64_t features, const int32_t* rows, int64_t n,
                         float* dst) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * features, src + (rows ? rows[i] : i) * features,
                sizeof(float) * static_cast<size_t>(features));
}

void gather_labels_cpu(const uint8_t* src, const int32_t* rows, int64_t n, uint8_t* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = src[rows ? rows[i] : i];
}

}  // namespace tandem::kernels
