#include "cuda_device.h"

#include <cuda_runtime.h>

#include <sstream>

#include "cuda_check.h"
#include "cuda_required.h"

#ifndef TANDEM_CUDA_ARCHITECTURES
#define TANDEM_CUDA_ARCHITECTURES "?"
#endif

namespace tandem::kernels {
namespace {

__global__ void probe_kernel() {}  // has an image for the device exactly when every kernel has

}  // namespace

int cuda_device_count() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error so later calls start clean
    no_cuda_device(std::string("cudaGetDeviceCount failed with CUDA error ") +
                   std::to_string(static_cast<int>(status)) + " (" + cudaGetErrorString(status) +
                   ")");
    return 0;
  }
  if (count == 0) no_cuda_device("the CUDA runtime sees none (CUDA_VISIBLE_DEVICES?)");
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

std::string cuda_kernels_unusable_on(int index) {
  TANDEM_CUDA_CHECK(cudaSetDevice(index));  // busy, exclusive, out of memory: said as it is
  cudaFuncAttributes attributes{};
  const cudaError_t status = cudaFuncGetAttributes(&attributes, probe_kernel);
  if (status == cudaSuccess) return "";
  cudaGetLastError();  // not sticky; cleared so later calls start clean
  // Only a missing image means "rebuild"; any other failure is the device's, reported as such.
  if (status != cudaErrorNoKernelImageForDevice && status != cudaErrorInvalidDeviceFunction)
    TANDEM_CUDA_CHECK(status);
  cudaDeviceProp prop{};
  const std::string arch = cudaGetDeviceProperties(&prop, index) == cudaSuccess
                               ? std::to_string(prop.major) + std::to_string(prop.minor)
                               : "N";
  return "CUDA device " + std::to_string(index) + " (" + cuda_device_description(index) +
         ") cannot run this build's kernels (" + cudaGetErrorString(status) +
         "): they were compiled for CUDA architectures " TANDEM_CUDA_ARCHITECTURES
         "; rebuild with -DCMAKE_CUDA_ARCHITECTURES=" + arch + " (or native)";
}

}  // namespace tandem::kernels
