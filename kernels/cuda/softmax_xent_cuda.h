// CUDA twin of kernels/cpu/softmax_xent_cpu.h: softmax, the seed's clipped cross-entropy, its
// gradient and the correct-prediction count in one pass over the logits (one warp per row).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::kernels {

// Device-side running totals: kernels add to them, the host reads them when it wants the loss.
struct DeviceStats {
  double loss_sum;
  long long correct;
};

// Partial sums per block live in `partials` (softmax_xent_partials_needed(rows) of them) and are
// added to `totals` in a fixed order by a second launch, so the same inputs give the same bits.
// A partial holds what a total holds.
using SoftmaxXentPartial = DeviceStats;
int64_t softmax_xent_partials_needed(int64_t rows);

// logits [rows, classes] (classes <= 256), labels [rows]. Writes dlogits = p - onehot (0 for a
// clipped row) when `dlogits` is not null, the arg-max class into `predictions` when not null,
// and adds the summed loss and correct count to `totals`.
void softmax_xent_cuda(const float* logits, const uint8_t* labels, float* dlogits,
                       uint8_t* predictions, int64_t rows, int64_t classes,
                       SoftmaxXentPartial* partials, DeviceStats* totals, cudaStream_t stream);

// Arg-max class (first maximum) of each row, for unlabelled data.
void argmax_rows_cuda(const float* logits, uint8_t* out, int64_t rows, int64_t classes,
                      cudaStream_t stream);

}  // namespace tandem::kernels
