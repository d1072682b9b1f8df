// Which server holds which tensor (whole-tensor placement; row splitting of large tensors comes
// later and will refine this, not replace its interface).
#pragma once

#include <cstdint>
#include <vector>

namespace tandem {

// Greedy by size: tensors from largest to smallest (ties: earlier first), each onto the server
// with the fewest elements so far (ties: lowest index). Deterministic, so every client that
// sees the same tensors computes the same placement. Returns the server index of each tensor.
std::vector<int> place_tensors(const std::vector<int64_t>& sizes, int servers);

}  // namespace tandem
