// CUDA twins of kernels/cpu/convert_cpu.h: the first layer's input path. Data sets stay uint8 on
// the device (and cross PCIe as uint8, a quarter of the bytes of float32); this gathers a batch's
// rows and scales them to float in [0,1] in one pass, labels alongside.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels {

// dst[i, :] = src[rows[i], :] * kPixelScale and labels_out[i] = labels[rows[i]] for i in [0, n);
// `rows` null means rows 0..n-1; `labels`/`labels_out` may be null.
void gather_rows_u8_cuda(const uint8_t* src, int64_t features, const int32_t* rows, int64_t n,
                         float* dst, const uint8_t* labels, uint8_t* labels_out,
                         cudaStream_t stream);
// The same for float32 pixels (copied, not scaled).
void gather_rows_f32_cuda(const float* src, int64_t features, const int32_t* rows, int64_t n,
                          float* dst, const uint8_t* labels, uint8_t* labels_out,
                          cudaStream_t stream);

}  // namespace tandem::kernels
