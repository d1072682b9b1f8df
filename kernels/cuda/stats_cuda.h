// Reductions for evaluation and data statistics on the device (CUB and Thrust underneath).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels {

// Rows whose prediction equals the label (Thrust; synchronises `stream` to return the count).
int64_t count_correct_cuda(const uint8_t* predictions, const uint8_t* labels, int64_t n,
                           cudaStream_t stream);

// Per-column mean and population variance (ddof 0) of a [rows, cols] matrix, in float64:
// per-block partials (count, mean, M2) merged with Chan et al.'s formula in a fixed order.
// `scratch` holds column_stats_scratch_doubles(rows, cols) doubles.
int64_t column_stats_scratch_doubles(int64_t rows, int64_t cols);
void column_stats_u8_cuda(const uint8_t* data, int64_t rows, int64_t cols, double* mean,
                          double* variance, double* scratch, cudaStream_t stream);
void column_stats_f32_cuda(const float* data, int64_t rows, int64_t cols, double* mean,
                           double* variance, double* scratch, cudaStream_t stream);

}  // namespace tandem::kernels
