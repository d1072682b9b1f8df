#include "column_stats_cpu.h"

#include <cstddef>
#include <limits>
#include <vector>

namespace tandem::kernels {

namespace {

template <typename T>
void column_stats(const T* data, int64_t rows, int64_t cols, double* mean, double* variance) {
  if (rows == 0) {
    for (int64_t j = 0; j < cols; ++j)
      mean[j] = variance[j] = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  std::vector<double> sum(static_cast<std::size_t>(cols), 0.0), m2(static_cast<std::size_t>(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) sum[j] += static_cast<double>(data[r * cols + j]);
  for (int64_t j = 0; j < cols; ++j) mean[j] = sum[j] / static_cast<double>(rows);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) {
      const double d = static_cast<double>(data[r * cols + j]) - mean[j];
      m2[j] += d * d;
    }
  for (int64_t j = 0; j < cols; ++j) variance[j] = m2[j] / static_cast<double>(rows);
}

}  // namespace

void column_stats_u8_cpu(const uint8_t* data, int64_t rows, int64_t cols, double* mean,
                         double* variance) {
  column_stats(data, rows, cols, mean, variance);
}

void column_stats_f32_cpu(const float* data, int64_t rows, int64_t cols, double* mean,
                          double* variance) {
  column_stats(data, rows, cols, mean, variance);
}

}  // namespace tandem::kernels
