// CPU twin of the column-statistics reduction (kernels/cuda/stats_cuda.h): per-column mean and
// population variance (ddof 0) of a row-major matrix in float64, two passes (mean, then squared
// deviations) so the variance keeps its precision when the mean is large.
#pragma once

#include <cstdint>

namespace tandem::kernels {

void column_stats_u8_cpu(const uint8_t* data, int64_t rows, int64_t cols, double* mean,
                         double* variance);
void column_stats_f32_cpu(const float* data, int64_t rows, int64_t cols, double* mean,
                          double* variance);

}  // namespace tandem::kernels
