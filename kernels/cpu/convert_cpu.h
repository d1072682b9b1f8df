// CPU twin of the input-conversion kernel: gathers rows of a data set into a contiguous float
// block, scaling uint8 pixels to [0,1] on the way (so data stays uint8 until it is used).
#pragma once

#include <cstdint>

namespace tandem::kernels {

// The scale TensorFlow's MNIST reader applies: x * float32(1/255).
constexpr float kPixelScale = 1.0f / 255.0f;

// dst[i, :] = src[rows[i], :] * kPixelScale for i in [0, n). `rows` null means rows 0..n-1.
void gather_rows_u8_cpu(const uint8_t* src, int64_t features, const int32_t* rows, int64_t n,
                        float* dst);
// dst[i, :] = src[rows[i], :] for float32 data.
void gather_rows_f32_cpu(const float* src, int64_t features, const int32_t* rows, int64_t n,
                         float* dst);
// dst[i] = src[rows[i]] (labels).
void gather_labels_cpu(const uint8_t* src, const int32_t* rows, int64_t n, uint8_t* dst);

}  // namespace tandem::kernels
