// Where each parameter tensor lives inside one flat float arena. One arena (rather than one
// buffer per tensor) lets the optimizer sweep every parameter in one pass and lets gradients,
// Adam's moments and the parameters share one set of offsets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/config.h"

namespace tandem {

struct ParameterLayout {
  struct Entry {
    std::string name;
    std::vector<int64_t> shape;
    int64_t offset = 0;  // in floats, a multiple of kAlignFloats
    int64_t size = 0;
  };
  // Tensors start on 64-byte boundaries so vector loads never split a cache line.
  static constexpr int64_t kAlignFloats = 16;

  std::vector<Entry> entries;  // weight, bias of layer 0, then of layer 1, ...
  int64_t total = 0;           // arena size in floats, padding included

  static ParameterLayout for_model(const ModelConfig& config);
  const Entry& weight(size_t layer) const { return entries[2 * layer]; }
  const Entry& bias(size_t layer) const { return entries[2 * layer + 1]; }
};

}  // namespace tandem
