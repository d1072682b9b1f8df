#include "adam_cpu.h"

#include <cmath>

#include "vector_clones.h"

namespace tandem::kernels {

float adam_step_size(const AdamHyper& h, int64_t step) {
  const double t = static_cast<double>(step);
  const double correction1 = 1.0 - std::pow(static_cast<double>(h.beta1), t);
  const double correction2 = 1.0 - std::pow(static_cast<double>(h.beta2), t);
  return static_cast<float>(h.learning_rate * std::sqrt(correction2) / correction1);
}

namespace {

// Sums the partial gradients of element i. One and two buffers are the common cases (one and
// two threads) and get loops the compiler can vectorise without the inner loop.
inline float summed_gradient(const float* const* grads, int num_grads, int64_t i) {
  float g = grads[0][i];
  for (int k = 1; k < num_grads; ++k) g += grads[k][i];
  return g;
}

}  // namespace

TANDEM_VECTOR_CLONES
void adam_update_cpu(float* w, float* m, float* v, const float* const* grads, int num_grads,
                     int64_t begin, int64_t end, float lr_t, const AdamHyper& h) {
  const float b1 = h.beta1, b2 = h.beta2, one_b1 = 1.0f - h.beta1, one_b2 = 1.0f - h.beta2;
  const float eps = h.epsilon;
  if (num_grads == 1) {
    const float* g0 = grads[0];
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float g = g0[i];
      m[i] = b1 * m[i] + one_b1 * g;
      v[i] = b2 * v[i] + one_b2 * g * g;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
    return;
  }
  if (num_grads == 2) {
    const float* g0 = grads[0];
    const float* g1 = grads[1];
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) {
      const float g = g0[i] + g1[i];
      m[i] = b1 * m[i] + one_b1 * g;
      v[i] = b2 * v[i] + one_b2 * g * g;
      w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
    return;
  }
  for (int64_t i = begin; i < end; ++i) {
    const float g = summed_gradient(grads, num_grads, i);
    m[i] = b1 * m[i] + one_b1 * g;
    v[i] = b2 * v[i] + one_b2 * g * g;
    w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
  }
}

TANDEM_VECTOR_CLONES
void sgd_update_cpu(float* w, const float* const* grads, int num_grads, int64_t begin,
                    int64_t end, float learning_rate) {
  // One buffer (a parameter server's push, a one-thread backend) gets a loop the compiler
  // vectorises; summed_gradient's inner loop keeps the general one scalar (about 1.5x Adam's
  // time per push in tandem_ps_shard_bench before this path).
  if (num_grads == 1) {
    const float* g0 = grads[0];
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) w[i] -= learning_rate * g0[i];
    return;
  }
  for (int64_t i = begin; i < end; ++i) w[i] -= learning_rate * summed_gradient(grads, num_grads, i);
}

}  // namespace tandem::kernels
