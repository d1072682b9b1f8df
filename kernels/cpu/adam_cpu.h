// CPU twins of the optimizer kernels: Adam in TensorFlow's form, and plain SGD.
// Both work on one flat range of parameters (all tensors of a model live in one arena, so one
// call covers every tensor: the CPU form of a multi-tensor launch) and sum the gradients of
// several partial buffers on the fly (one per thread that computed part of the batch).
#pragma once

#include <cstdint>

namespace tandem::kernels {

struct AdamHyper {
  float learning_rate = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;
};

// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t) for step t >= 1, computed once per step.
float adam_step_size(const AdamHyper& h, int64_t step);

// For i in [begin, end): g = sum_k grads[k][i]; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
// w -= lr_t * m / (sqrt(v) + epsilon).
void adam_update_cpu(float* w, float* m, float* v, const float* const* grads, int num_grads,
                     int64_t begin, int64_t end, float lr_t, const AdamHyper& h);

// For i in [begin, end): w -= lr * sum_k grads[k][i].
void sgd_update_cpu(float* w, const float* const* grads, int num_grads, int64_t begin,
                    int64_t end, float learning_rate);

}  // namespace tandem::kernels
