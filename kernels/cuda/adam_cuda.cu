#include "cuda/adam_cuda.h"

#include <cstdint>

#include "cuda/cuda_check.h"
#include "cuda/launch_config.h"

namespace tandem::kernels {

namespace {

// The per-step constants, as the CPU twin computes them (1 - beta in float).
struct AdamConstants {
  float b1, b2, one_b1, one_b2, eps;
};

AdamConstants constants_of(const AdamHyper& h) {
  return {h.beta1, h.beta2, 1.0f - h.beta1, 1.0f - h.beta2, h.epsilon};
}

__global__ void adam_advance_step_kernel(AdamDeviceStep* state, double lr, double b1, double b2) {
  const long long step = state->step + 1;
  const double t = static_cast<double>(step);
  const double correction1 = 1.0 - pow(b1, t);
  const double correction2 = 1.0 - pow(b2, t);
  state->step = step;
  state->lr_t = static_cast<float>(lr * sqrt(correction2) / correction1);
}

__device__ inline void adam_one(float& w, float& m, float& v, float g, float lr_t,
                                const AdamConstants& c) {
  m = c.b1 * m + c.one_b1 * g;
  v = c.b2 * v + c.one_b2 * g * g;
  w -= lr_t * m / (sqrtf(v) + c.eps);
}

// 16-byte loads and stores: the update is pure bandwidth (7 floats moved per parameter), and
// wide accesses keep more bytes in flight per thread.
__global__ void adam_vector_kernel(float4* w, float4* m, float4* v, const float4* g, int64_t n4,
                                   const AdamDeviceStep* state, AdamConstants c) {
  const float lr_t = state->lr_t;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n4;
       i += int64_t{gridDim.x} * blockDim.x) {
    float4 wi = w[i], mi = m[i], vi = v[i];
    const float4 gi = g[i];
    adam_one(wi.x, mi.x, vi.x, gi.x, lr_t, c);
    adam_one(wi.y, mi.y, vi.y, gi.y, lr_t, c);
    adam_one(wi.z, mi.z, vi.z, gi.z, lr_t, c);
    adam_one(wi.w, mi.w, vi.w, gi.w, lr_t, c);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

__global__ void adam_scalar_kernel(float* w, float* m, float* v, const float* g, int64_t n,
                                   const AdamDeviceStep* state, AdamConstants c) {
  const float lr_t = state->lr_t;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    adam_one(w[i], m[i], v[i], g[i], lr_t, c);
}

__global__ void sgd_kernel(float* w, const float* g, int64_t n, float learning_rate) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += int64_t{gridDim.x} * blockDim.x)
    w[i] -= learning_rate * g[i];
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace

void adam_advance_step_cuda(AdamDeviceStep* state, const AdamHyper& hyper, cudaStream_t stream) {
  adam_advance_step_kernel<<<1, 1, 0, stream>>>(state, hyper.learning_rate, hyper.beta1,
                                                hyper.beta2);
  TANDEM_CUDA_CHECK_LAUNCH();
}

void adam_update_cuda(float* w, float* m, float* v, const float* g, int64_t n,
                      const AdamDeviceStep* state, const AdamHyper& hyper, cudaStream_t stream) {
  if (n == 0) return;
  const AdamConstants c = constants_of(hyper);
  int64_t done = 0;
  if (aligned16(w) && aligned16(m) && aligned16(v) && aligned16(g)) {
    const int64_t n4 = n / 4;
    if (n4 > 0) {
      adam_vector_kernel<<<grid_for(n4), kThreadsPerBlock, 0, stream>>>(
          reinterpret_cast<float4*>(w), reinterpret_cast<float4*>(m),
          reinterpret_cast<float4*>(v), reinterpret_cast<const float4*>(g), n4, state, c);
      TANDEM_CUDA_CHECK_LAUNCH();
    }
    done = n4 * 4;
  }
  if (done < n) {  // the tail, or everything when a pointer is not 16-byte aligned
    adam_scalar_kernel<<<grid_for(n - done), kThreadsPerBlock, 0, stream>>>(
        w + done, m + done, v + done, g + done, n - done, state, c);
    TANDEM_CUDA_CHECK_LAUNCH();
  }
}

void sgd_update_cuda(float* w, const float* g, int64_t n, float learning_rate,
                     cudaStream_t stream) {
  if (n == 0) return;
  sgd_kernel<<<grid_for(n), kThreadsPerBlock, 0, stream>>>(w, g, n, learning_rate);
  TANDEM_CUDA_CHECK_LAUNCH();
}

}  // namespace tandem::kernels
