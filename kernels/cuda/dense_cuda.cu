#include "cuda/dense_cuda.h"

#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "cuda/cublas_check.h"
#include "cuda/device_buffer.h"
#include "cuda/launch_config.h"

namespace tandem::kernels {

namespace {

// cuBLASLt may pick split-K algorithms that need scratch space; 32 MiB covers every shape of
// the models here (the library asks for far less at these sizes).
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

cublasComputeType_t compute_type(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::Fp32: return CUBLAS_COMPUTE_32F;  // no TF32: plain float32 FMA
    case MatmulPrecision::Tf32: return CUBLAS_COMPUTE_32F_FAST_TF32;
    case MatmulPrecision::Bf16: return CUBLAS_COMPUTE_32F_FAST_16BF;
  }
  return CUBLAS_COMPUTE_32F;
}

// The largest power of two (up to 256) dividing the address: what the algorithm may assume.
uint32_t alignment_of(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 256;
  while (alignment > 4 && address % alignment != 0) alignment /= 2;
  return alignment;
}

// Column-major product D = alpha op(A) op(B) + beta C (C and D the same buffer), in cuBLASLt's
// terms. The row-major layer maths map onto it by reading each row-major matrix as its
// column-major transpose.
struct Gemm {
  cublasOperation_t trans_a = CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  const float* bias = nullptr;
  float beta = 0.0f;
  // Plain float32 whatever the layer's precision: the bias gradient's sum over rows costs the
  // same either way, and rounding dy to TF32 or bfloat16 first would only lose bits.
  bool full_fp32 = false;
};

__global__ void fill_kernel(float* out, int64_t n, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    out[i] = value;
}

__global__ void bias_relu_kernel(float* y, const float* b, int64_t rows, int64_t out, bool relu) {
  const int64_t n = rows * out;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x) {
    const float v = b != nullptr ? y[i] + b[i % out] : y[i];
    // std::max(v, 0.0f), the CPU twin's, keeps a NaN (fmaxf would make it 0 and hide a diverged
    // run's NaN from the loss and from the parameter server's finite check).
    y[i] = relu && v < 0.0f ? 0.0f : v;
  }
}

// The bias gradient without cuBLASLt: one thread per column, rows summed in order. Only used if
// the library offers no algorithm for the matrix-vector form (slow, but deterministic).
__global__ void column_sums_kernel(const float* dy, float* db, int64_t rows, int64_t out, float beta) {
  for (int64_t j = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; j < out;
       j += int64_t{gridDim.x} * blockDim.x) {
    float sum = 0.0f;
    for (int64_t r = 0; r < rows; ++r) sum += dy[r * out + j];
    db[j] = beta != 0.0f ? db[j] + sum : sum;
  }
}

__global__ void relu_mask_kernel(float* dx, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    if (!(x[i] > 0.0f)) dx[i] = 0.0f;
}

}  // namespace

struct DenseCuda::Impl {
  // A matmul's descriptors and chosen algorithm, made once per shape: the heuristic query costs
  // far more host time than the product at these sizes.
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  using Key = std::tuple<int, int, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int,
                         uint32_t, uint32_t, uint32_t, uint32_t, int>;

  cudaStream_t stream;
  MatmulPrecision precision;
  // cuBLASLt's functions, the library loaded by the first of these (cublaslt_api.h).
  const CublasLtApi& lt = cublaslt();
  cublasLtHandle_t handle = nullptr;
  DeviceBuffer<unsigned char> workspace{kWorkspaceBytes};
  DeviceBuffer<float> ones;  // the bias gradient is dy^T times a vector of ones
  std::map<Key, Plan> plans;
  // The forms (shape, epilogue, alignments) for which cuBLASLt offered no algorithm on this
  // device and library: each falls back to Tandem's own kernel for good, without asking again.
  // Per form, so one shape without a fused epilogue does not take it from every other shape.
  std::set<Key> unavailable;
  int64_t fused_forwards = 0;

  Impl(cudaStream_t s, MatmulPrecision p) : stream(s), precision(p) {
    TANDEM_CUBLAS_CHECK(lt.Create(&handle));
  }
  ~Impl() {
    for (auto& [key, plan] : plans) destroy(plan);
    if (handle) lt.Destroy(handle);
  }

  void destroy(Plan& plan) const noexcept {
    if (plan.a) lt.MatrixLayoutDestroy(plan.a);
    if (plan.b) lt.MatrixLayoutDestroy(plan.b);
    if (plan.c) lt.MatrixLayoutDestroy(plan.c);
    if (plan.desc) lt.MatmulDescDestroy(plan.desc);
    plan = Plan{};
  }

  cublasComputeType_t compute_of(const Gemm& g) const {
    return g.full_fp32 ? CUBLAS_COMPUTE_32F : compute_type(precision);
  }

  // The plan for a product's form, made and cached on first use; null when cuBLASLt has no
  // algorithm for it (remembered in `unavailable`). Any other failure throws, and destroys what
  // was made so far, or each failing form would leave its descriptors behind.
  Plan* plan_or_null(const Gemm& g) {
    const Key key{g.trans_a, g.trans_b, g.m, g.n, g.k, g.lda, g.ldb, g.ldc, g.epilogue,
                  alignment_of(g.a), alignment_of(g.b), alignment_of(g.c),
                  g.bias ? alignment_of(g.bias) : 256u, static_cast<int>(compute_of(g))};
    auto found = plans.find(key);
    if (found != plans.end()) return &found->second;
    if (unavailable.count(key) != 0) return nullptr;
    Plan plan;
    bool has_algorithm = false;
    try {
      has_algorithm = make_plan(g, key, plan);
    } catch (...) {
      destroy(plan);
      throw;
    }
    if (!has_algorithm) {
      destroy(plan);
      unavailable.insert(key);
      std::fprintf(stderr, "tandem: cuBLASLt has no algorithm for a %lldx%lldx%lld product with "
                   "epilogue %d on this device; Tandem's own kernel does that part for this "
                   "shape\n", static_cast<long long>(g.m), static_cast<long long>(g.n),
                   static_cast<long long>(g.k), static_cast<int>(g.epilogue));
      return nullptr;
    }
    return &plans.emplace(key, plan).first->second;
  }

  // false when the heuristic offers no algorithm (or says the form is not supported); any other
  // failure throws.
  bool make_plan(const Gemm& g, const Key& key, Plan& plan) {
    TANDEM_CUBLAS_CHECK(lt.MatmulDescCreate(&plan.desc, compute_of(g), CUDA_R_32F));
    TANDEM_CUBLAS_CHECK(lt.MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                  &g.trans_a, sizeof(g.trans_a)));
    TANDEM_CUBLAS_CHECK(lt.MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                  &g.trans_b, sizeof(g.trans_b)));
    TANDEM_CUBLAS_CHECK(lt.MatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &g.epilogue, sizeof(g.epilogue)));
    if (g.bias)
      TANDEM_CUBLAS_CHECK(lt.MatmulDescSetAttribute(
          plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    const bool a_n = g.trans_a == CUBLAS_OP_N, b_n = g.trans_b == CUBLAS_OP_N;
    TANDEM_CUBLAS_CHECK(lt.MatrixLayoutCreate(&plan.a, CUDA_R_32F, a_n ? g.m : g.k,
                                              a_n ? g.k : g.m, g.lda));
    TANDEM_CUBLAS_CHECK(lt.MatrixLayoutCreate(&plan.b, CUDA_R_32F, b_n ? g.k : g.n,
                                              b_n ? g.n : g.k, g.ldb));
    TANDEM_CUBLAS_CHECK(lt.MatrixLayoutCreate(&plan.c, CUDA_R_32F, g.m, g.n, g.ldc));

    cublasLtMatmulPreference_t preference = nullptr;
    TANDEM_CUBLAS_CHECK(lt.MatmulPreferenceCreate(&preference));
    const size_t workspace_bytes = workspace.bytes();
    const uint32_t align_a = std::get<9>(key), align_b = std::get<10>(key),
                   align_c = std::get<11>(key);
    cublasLtMatmulHeuristicResult_t result{};
    int returned = 0;
    const cublasStatus_t status = [&] {
      cublasStatus_t s = lt.MatmulPreferenceSetAttribute(
          preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
          sizeof(workspace_bytes));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.MatmulPreferenceSetAttribute(
            preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
      if (s == CUBLAS_STATUS_SUCCESS)
        s = lt.MatmulAlgoGetHeuristic(handle, plan.desc, plan.a, plan.b, plan.c, plan.c,
                                      preference, 1, &result, &returned);
      return s;
    }();
    lt.MatmulPreferenceDestroy(preference);
    if (status == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    TANDEM_CUBLAS_CHECK(status);
    if (returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) return false;
    plan.algo = result.algo;
    return true;
  }

  // A product that must run: no algorithm for it is an error.
  void run(const Gemm& g) {
    if (!try_run(g))
      throw CudaError("cuBLASLt found no algorithm for a " + std::to_string(g.m) + "x" +
                      std::to_string(g.n) + "x" + std::to_string(g.k) + " product");
  }

  // Queues the product; false, with nothing queued, when its form has no algorithm (the caller
  // falls back). Errors from the library or the launch throw: they are not a missing algorithm,
  // and a fallback would hide them.
  bool try_run(const Gemm& g) {
    Plan* found = plan_or_null(g);
    if (found == nullptr) return false;
    Plan& plan = *found;
    // The bias pointer is part of the call, not of the shape: set it every time.
    if (g.bias)
      TANDEM_CUBLAS_CHECK(lt.MatmulDescSetAttribute(
          plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g.bias, sizeof(g.bias)));
    const float alpha = 1.0f;
    TANDEM_CUBLAS_CHECK(lt.Matmul(handle, plan.desc, &alpha, g.a, plan.a, g.b, plan.b,
                                  &g.beta, g.c, plan.c, g.c, plan.c, &plan.algo,
                                  workspace.data(), workspace.bytes(), stream));
    return true;
  }

  void reserve_rows(int64_t rows) {
    if (static_cast<size_t>(rows) <= ones.size()) return;
    ones = DeviceBuffer<float>(static_cast<size_t>(rows));
    fill_kernel<<<grid_for(rows), kThreadsPerBlock, 0, stream>>>(ones.data(), rows, 1.0f);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
};

DenseCuda::DenseCuda(cudaStream_t stream, MatmulPrecision precision)
    : impl_(std::make_unique<Impl>(stream, precision)) {}
DenseCuda::~DenseCuda() = default;

void DenseCuda::set_stream(cudaStream_t stream) { impl_->stream = stream; }
MatmulPrecision DenseCuda::precision() const { return impl_->precision; }
void DenseCuda::reserve_rows(int64_t rows) { impl_->reserve_rows(rows); }
size_t DenseCuda::fallback_forms() const { return impl_->unavailable.size(); }
int64_t DenseCuda::fused_forwards() const { return impl_->fused_forwards; }

void DenseCuda::forward(const float* x, const float* w, const float* b, float* y, int64_t rows,
                        int64_t in, int64_t out, bool relu, DenseEpilogue epilogue) {
  if (rows == 0) return;
  // y^T[out, rows] = W^T[out, in] x^T[in, rows] in column-major terms: no transposes at all.
  Gemm g;
  g.m = out, g.n = rows, g.k = in;
  g.a = w, g.lda = out;
  g.b = x, g.ldb = in;
  g.c = y, g.ldc = out;
  // The bias in cuBLASLt's epilogue only where its pointer is 16-byte aligned: the heuristic is
  // told the alignment of A, B, C and D, not the bias's, and may pick vector loads that fault on
  // a misaligned one (a fault that ends the CUDA context). ReLU by Tandem's own kernel after it:
  // cuBLASLt's RELU epilogue is reported to make a NaN 0 (max semantics; NVIDIA developer forum
  // thread 329783), which would hide a diverged run's NaN from the loss and from the parameter
  // server's finite check, as fmaxf would; the CPU twin keeps it.
  if (epilogue == DenseEpilogue::Fused && alignment_of(b) >= 16) {
    Gemm fused = g;
    fused.epilogue = CUBLASLT_EPILOGUE_BIAS;
    fused.bias = b;
    // Without an algorithm for this epilogue (found out on a shape's first, eager call, so never
    // inside a graph capture): the plain product and our own bias/ReLU kernel instead.
    if (impl_->try_run(fused)) {
      ++impl_->fused_forwards;
      if (relu) bias_relu_cuda(y, nullptr, rows, out, true, impl_->stream);
      return;
    }
  }
  impl_->run(g);
  bias_relu_cuda(y, b, rows, out, relu, impl_->stream);
}

void DenseCuda::backward_params(const float* x, const float* dy, float* dw, float* db,
                                int64_t rows, int64_t in, int64_t out, bool accumulate) {
  const float beta = accumulate ? 1.0f : 0.0f;
  if (rows == 0) {
    if (!accumulate) {
      TANDEM_CUDA_CHECK(cudaMemsetAsync(dw, 0, sizeof(float) * in * out, impl_->stream));
      TANDEM_CUDA_CHECK(cudaMemsetAsync(db, 0, sizeof(float) * out, impl_->stream));
    }
    return;
  }
  // dW^T[out, in] = dy^T[out, rows] x[rows, in]: x is stored as x^T, so B is transposed.
  Gemm g;
  g.m = out, g.n = in, g.k = rows;
  g.a = dy, g.lda = out;
  g.b = x, g.ldb = in, g.trans_b = CUBLAS_OP_T;
  g.c = dw, g.ldc = out;
  g.beta = beta;
  impl_->run(g);
  // db[out] = dy^T[out, rows] 1[rows]: a matrix-vector product, deterministic (no atomics).
  impl_->reserve_rows(rows);
  Gemm v;
  v.m = out, v.n = 1, v.k = rows;
  v.a = dy, v.lda = out;
  v.b = impl_->ones.data(), v.ldb = rows;
  v.c = db, v.ldc = out;
  v.beta = beta;
  v.full_fp32 = true;
  if (impl_->try_run(v)) return;
  // No algorithm for the matrix-vector form: a plain kernel, slower but as deterministic.
  column_sums_kernel<<<grid_for(out), kThreadsPerBlock, 0, impl_->stream>>>(dy, db, rows, out, beta);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void DenseCuda::backward_input_relu(const float* dy, const float* w, const float* x, float* dx,
                                    int64_t rows, int64_t in, int64_t out) {
  if (rows == 0) return;
  // dx^T[in, rows] = W[in, out] dy^T[out, rows]; W is stored as W^T, so A is transposed.
  Gemm g;
  g.m = in, g.n = rows, g.k = out;
  g.a = w, g.lda = out, g.trans_a = CUBLAS_OP_T;
  g.b = dy, g.ldb = out;
  g.c = dx, g.ldc = in;
  impl_->run(g);
  relu_mask_cuda(dx, x, rows * in, impl_->stream);
}

void bias_relu_cuda(float* y, const float* b, int64_t rows, int64_t out, bool relu,
                    cudaStream_t stream) {
  if (rows * out == 0) return;
  bias_relu_kernel<<<grid_for(rows * out), kThreadsPerBlock, 0, stream>>>(y, b, rows, out, relu);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void relu_mask_cuda(float* dx, const float* x, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  relu_mask_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(dx, x, n);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::kernels
