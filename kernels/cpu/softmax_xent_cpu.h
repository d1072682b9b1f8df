// CPU twin of the fused softmax + clipped cross-entropy kernel.
#pragma once

#include <cstdint>

namespace tandem::kernels {

// TensorFlow's seed model computes loss = -sum(y * log(clip(softmax(z), 1e-10, 1))).
// Computed stably as log-softmax; where the clip bites (p < 1e-10) the loss of that row is
// -log(1e-10) and, as clip_by_value's gradient is zero there, so is the row's gradient.
constexpr float kProbabilityClip = 1e-10f;

struct SoftmaxXentStats {
  double loss_sum = 0.0;  // summed over the rows
  int64_t correct = 0;    // rows whose arg-max (first maximum) equals the label
};

// logits [rows, classes], labels [rows]. Writes dlogits [rows, classes] = p - onehot (or 0 where
// clipped) when `dlogits` is not null. Adds to `stats`.
void softmax_xent_cpu(const float* logits, const uint8_t* labels, float* dlogits, int64_t rows,
                      int64_t classes, SoftmaxXentStats& stats);

// Arg-max of each row (the first maximum), the model's prediction.
void argmax_rows_cpu(const float* logits, uint8_t* out, int64_t rows, int64_t classes);

}  // namespace tandem::kernels
