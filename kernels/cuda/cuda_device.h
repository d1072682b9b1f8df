// How many CUDA devices this process can use. Any error (no driver, no device, a driver older
// than the runtime) counts as none, so `--backend auto` falls back to the CPU and GPU tests skip;
// with TANDEM_REQUIRE_CUDA=1 in the environment it throws instead, saying why (cuda_required.h).
#pragma once

#include <string>

namespace tandem::kernels {

int cuda_device_count();
// "NVIDIA H200 (sm_90, 139 GiB)" for device `index`, or the CUDA error's text.
std::string cuda_device_description(int index);
// Empty when this build's kernels run on device `index`; else why not, in a sentence that says
// what to rebuild with. The kernels are compiled for CMAKE_CUDA_ARCHITECTURES only (sm_90 and
// its PTX by default): an older GPU has no image to run, and its first launch would fail deep
// inside a training step. Makes `index` the calling thread's current device. CudaError for
// any other failure (the device busy or out of memory): that is not a build problem.
std::string cuda_kernels_unusable_on(int index);

}  // namespace tandem::kernels
