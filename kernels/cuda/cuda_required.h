// TANDEM_REQUIRE_CUDA=1 (bench/gpu_check.sh sets it on the lent GPU machine): a process that
// finds no usable CUDA device throws, saying why, where it would count none. Without it the GPU
// tests skip and `--backend auto` takes the CPU, which on a GPU machine with a broken driver
// hides the cause and spends the machine's time on nothing.
#pragma once

#include <cstdlib>
#include <cstring>
#include <string>

#include "tandem/error.h"

namespace tandem::kernels {

inline bool cuda_required() {
  const char* value = std::getenv("TANDEM_REQUIRE_CUDA");
  return value != nullptr && *value != '\0' && std::strcmp(value, "0") != 0;
}

// Throws when CUDA is required and `why` says there is no device.
inline void no_cuda_device(const std::string& why) {
  if (cuda_required())
    throw Error("TANDEM_REQUIRE_CUDA is set, and no CUDA device is usable: " + why);
}

}  // namespace tandem::kernels
