#include "dense_cpu.h"

#include <cblas.h>

#include <algorithm>

namespace tandem::kernels {

void dense_forward_cpu(const float* x, const float* w, const float* b, float* y, int64_t rows,
                       int64_t in, int64_t out, bool relu) {
  if (rows == 0) return;
  // Seeding y with the bias and letting sgemm add x*w (beta = 1) touches y once instead of a
  // separate bias pass; y is small (rows x out) and stays in cache for the ReLU that follows.
  for (int64_t r = 0; r < rows; ++r) std::copy(b, b + out, y + r * out);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows),
              static_cast<int>(out), static_cast<int>(in), 1.0f, x, static_cast<int>(in), w,
              static_cast<int>(out), 1.0f, y, static_cast<int>(out));
  if (relu) {
    const int64_t n = rows * out;
    for (int64_t i = 0; i < n; ++i) y[i] = std::max(y[i], 0.0f);
  }
}

void dense_backward_params_cpu(const float* x, const float* dy, float* dw, float* db,
                               int64_t rows, int64_t in, int64_t out, bool accumulate) {
  if (!accumulate) {
    std::fill(dw, dw + in * out, 0.0f);
    std::fill(db, db + out, 0.0f);
  }
  if (rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, static_cast<int>(in),
              static_cast<int>(out), static_cast<int>(rows), 1.0f, x, static_cast<int>(in), dy,
              static_cast<int>(out), 1.0f, dw, static_cast<int>(out));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = dy + r * out;
    for (int64_t j = 0; j < out; ++j) db[j] += row[j];
  }
}

void dense_backward_input_relu_cpu(const float* dy, const float* w, const float* x, float* dx,
                                   int64_t rows, int64_t in, int64_t out) {
  if (rows == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
              static_cast<int>(in), static_cast<int>(out), 1.0f, dy, static_cast<int>(out), w,
              static_cast<int>(out), 0.0f, dx, static_cast<int>(in));
  const int64_t n = rows * in;
  for (int64_t i = 0; i < n; ++i) dx[i] = x[i] > 0.0f ? dx[i] : 0.0f;
}

}  // namespace tandem::kernels
