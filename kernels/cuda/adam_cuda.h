// CUDA twins of kernels/cpu/adam_cpu.h. All parameters live in one arena, so one launch updates
// every tensor (the multi-tensor form); the step counter and the bias-corrected step size live on
// the device and are advanced by a one-thread launch per step, so a captured CUDA Graph replays
// correct steps without the host touching anything.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cpu/adam_cpu.h"

namespace tandem::kernels {

struct AdamDeviceStep {
  long long step;  // optimizer steps taken
  float lr_t;      // adam_step_size(hyper, step), computed once per step
};

// step += 1; lr_t = lr * sqrt(1 - beta2^step) / (1 - beta1^step) in double, as the CPU twin.
void adam_advance_step_cuda(AdamDeviceStep* state, const AdamHyper& hyper, cudaStream_t stream);

// For i in [0, n): m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g; w -= lr_t*m/(sqrt(v)+eps), with
// lr_t read from `state`. 16-byte accesses when the pointers allow.
void adam_update_cuda(float* w, float* m, float* v, const float* g, int64_t n,
                      const AdamDeviceStep* state, const AdamHyper& hyper, cudaStream_t stream);

// w -= learning_rate * g.
void sgd_update_cuda(float* w, const float* g, int64_t n, float learning_rate,
                     cudaStream_t stream);

}  // namespace tandem::kernels
