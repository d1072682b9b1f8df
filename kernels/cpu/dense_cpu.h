// CPU twins of the dense-layer kernels: forward with bias (+ ReLU), and the backward pieces.
// Row-major throughout; weights are [in, out] as TensorFlow stores them (y = x W + b).
// These are the reference the CUDA kernels are checked against, and the CPU backend's hot path.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// y[rows, out] = x[rows, in] * w[in, out] + b, then max(y, 0) when `relu` is set.
void dense_forward_cpu(const float* x, const float* w, const float* b, float* y, int64_t rows,
                       int64_t in, int64_t out, bool relu);

// Accumulates the weight and bias gradients of one block of rows:
// dw[in, out] += x^T dy, db[out] += column sums of dy. `accumulate` false overwrites instead.
void dense_backward_params_cpu(const float* x, const float* dy, float* dw, float* db,
                               int64_t rows, int64_t in, int64_t out, bool accumulate);

// Gradient with respect to a hidden layer's input, through that layer's ReLU:
// dx[rows, in] = (dy w^T) * (x > 0). `x` is the ReLU output that fed the layer.
void dense_backward_input_relu_cpu(const float* dy, const float* w, const float* x, float* dx,
                                   int64_t rows, int64_t in, int64_t out);

}  // namespace tandem::kernels
