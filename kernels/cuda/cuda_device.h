// How many CUDA devices this process can use. Any error (no driver, no device, a driver older
// than the runtime) counts as none, so `--backend auto` falls back to the CPU and GPU tests skip.
#pragma once

#include <string>

namespace tandem::kernels {

int cuda_device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for device `index`, or the CUDA error's text.
std::string cuda_device_description(int index);

}  // namespace tandem::kernels
