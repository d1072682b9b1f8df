#include "softmax_xent_cpu.h"

#include <cmath>

namespace tandem::kernels {

namespace {

int64_t first_argmax(const float* z, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (z[j] > z[best]) best = j;
  return best;
}

}  // namespace

void softmax_xent_cpu(const float* logits, const uint8_t* labels, float* dlogits, int64_t rows,
                      int64_t classes, SoftmaxXentStats& stats) {
  const float log_clip = std::log(kProbabilityClip);
  double loss = 0.0;
  int64_t correct = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    const int64_t label = labels[r];
    const int64_t top = first_argmax(z, classes);
    const float zmax = z[top];
    float sum = 0.0f;
    for (int64_t j = 0; j < classes; ++j) sum += std::exp(z[j] - zmax);
    const float log_sum = std::log(sum);
    const float log_p_label = z[label] - zmax - log_sum;
    const bool clipped = log_p_label < log_clip;
    loss -= clipped ? log_clip : log_p_label;
    correct += top == label;
    if (dlogits == nullptr) continue;
    float* dz = dlogits + r * classes;
    if (clipped) {
      for (int64_t j = 0; j < classes; ++j) dz[j] = 0.0f;
      continue;
    }
    const float inv_sum = 1.0f / sum;
    for (int64_t j = 0; j < classes; ++j) dz[j] = std::exp(z[j] - zmax) * inv_sum;
    dz[label] -= 1.0f;
  }
  stats.loss_sum += loss;
  stats.correct += correct;
}

void argmax_rows_cpu(const float* logits, uint8_t* out, int64_t rows, int64_t classes) {
  for (int64_t r = 0; r < rows; ++r)
    out[r] = static_cast<uint8_t>(first_argmax(logits + r * classes, classes));
}

}  // namespace tandem::kernels
