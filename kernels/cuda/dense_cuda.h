// CUDA twins of kernels/cpu/dense_cpu.h: the dense layer's forward (bias and ReLU fused into the
// matrix product's epilogue) and its backward pieces, on cuBLASLt. Row-major, weights [in, out]
// (y = x W + b), exactly as the CPU twins; every call is asynchronous on the stream given at
// construction and may be captured into a CUDA Graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace tandem::kernels {

// How the matrix products compute. Fp32 is plain float32 (no TF32); Tf32 and Bf16 let the
// tensor cores round the operands to TF32 / bfloat16 while inputs, outputs and accumulation stay
// float32 (so parameters and Adam's state stay float32 too).
enum class MatmulPrecision { Fp32, Tf32, Bf16 };

// Forward: the bias in cuBLASLt's epilogue and ReLU in Tandem's own kernel after it (cuBLASLt's
// RELU epilogue is reported to make a NaN 0; the CPU twin keeps it), or a plain product followed
// by Tandem's own bias+ReLU kernel (kept so the benchmark can compare the two; also taken for a
// bias that is not 16-byte aligned).
enum class DenseEpilogue { Fused, Separate };

class DenseCuda {
 public:
  DenseCuda(cudaStream_t stream, MatmulPrecision precision);
  ~DenseCuda();
  DenseCuda(const DenseCuda&) = delete;
  DenseCuda& operator=(const DenseCuda&) = delete;

  void set_stream(cudaStream_t stream);
  MatmulPrecision precision() const;

  // y[rows, out] = x[rows, in] w[in, out] + b, then max(y, 0) when `relu`.
  void forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
               int64_t in, int64_t out, bool relu, DenseEpilogue epilogue = DenseEpilogue::Fused);

  // dw[in, out] (+)= x^T dy and db[out] (+)= column sums of dy; `accumulate` false overwrites.
  void backward_params(const float* x, const float* dy, float* dw, float* db, int64_t rows,
                       int64_t in, int64_t out, bool accumulate);

  // dx[rows, in] = (dy w^T) * (x > 0), `x` being the ReLU output that fed the layer.
  void backward_input_relu(const float* dy, const float* w, const float* x, float* dx,
                           int64_t rows, int64_t in, int64_t out);

  // Allocates what a batch of `rows` rows needs (the ones vector of the bias gradient) now, so
  // that no call allocates later (and graph capture sees no allocation).
  void reserve_rows(int64_t rows);

  // How many product forms (shape, epilogue, alignments) fell back to Tandem's own kernels
  // because cuBLASLt offered no algorithm for them: tests report it, so that a fused path that
  // never ran is seen.
  size_t fallback_forms() const;
  // How many forward calls ran the bias in cuBLASLt's epilogue (the fused path): tests check that
  // a bias it must not take (misaligned) was not given to it.
  int64_t fused_forwards() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// y[rows, out] += b (per column; none when b is null), then max(y, 0) when `relu`, a NaN kept:
// the separate epilogue.
void bias_relu_cuda(float* y, const float* b, int64_t rows, int64_t out, bool relu,
                    cudaStream_t stream);
// dx *= (x > 0), elementwise over n values.
void relu_mask_cuda(float* dx, const float* x, int64_t n, cudaStream_t stream);

}  // namespace tandem::kernels
