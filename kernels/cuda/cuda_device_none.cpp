// The CPU-only build (-DTANDEM_CUDA=OFF): no CUDA runtime is linked, so there are no devices.
#include "cuda_device.h"
#include "cuda_required.h"

namespace tandem::kernels {

int cuda_device_count() {
  no_cuda_device("this build of tandem has no CUDA (built with -DTANDEM_CUDA=OFF)");
  return 0;
}
std::string cuda_device_description(int) { return "built without CUDA"; }
std::string cuda_kernels_unusable_on(int) { return "this build of tandem has no CUDA"; }

}  // namespace tandem::kernels
