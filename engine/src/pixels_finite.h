// Pixels that are NaN or infinite (a float32 store's or array's): refused wherever data meets a
// model, naming the row, since every output they touch is NaN.
#pragma once

#include <cstdint>
#include <string>

#include "tandem/dataset.h"

namespace tandem {

// A row with a pixel that is NaN or infinite (a float32 store's or array's) has no predicted
// class: its logits are NaN (class 0 and NaN probabilities were written), or, on a device whose
// fused ReLU takes NaN to 0, finite and meaningless. InputError naming the first such row of
// `view` (counted from first_row, in `what`): "WHAT: row N holds a pixel that is not finite
// (NaN or infinity); CONSEQUENCE". tandem eval and Model.evaluate name it too when the loss is
// not finite, rather than blame the model; a store's stream refuses it as it reads
// (ChunkManager::check_band_finite).
void check_pixels_finite(const DatasetView& view, int64_t first_row, const std::string& what,
                         const char* consequence = "it has no predicted class");
// check_pixels_finite's consequence for an evaluation (tandem eval, Model.evaluate).
inline constexpr const char* kNoLossScored = "no loss can be scored on it";
// ... for training data, and for a store's stream, which both may read.
inline constexpr const char* kNaNParameters = "training on it would make every parameter NaN";
inline constexpr const char* kNaNOutputs = "a model trained or scored on it gives NaN";

}  // namespace tandem
