#include "cuda_device.h"

#include <cuda_runtime.h>

#include <sstream>

namespace tandem::kernels {

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return 0;
  }
  return count;
}

std::string cuda_device_description(int index) {
  cudaDeviceProp prop{};
  const cudaError_t status = cudaGetDeviceProperties(&prop, index);
  if (status != cudaSuccess) return cudaGetErrorString(status);
  std::ostringstream text;
  text << prop.name << " (sm_" << prop.major << prop.minor << ", "
       << (prop.totalGlobalMem >> 30) << " GiB)";
  return text.str();
}

}  // namespace tandem::kernels
