#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>

#include "cuda_check.h"
#include "cuda_device.h"
#include "pinned_memory.h"

namespace tandem::kernels {

namespace {
constexpr size_t kPage = 4096;

void* page_aligned(size_t bytes) {
  void* p = std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

PinnedAllocation pinned_alloc(size_t bytes, int device) {
  if (bytes == 0) bytes = 1;
  if (device < 0 || cuda_device_count() == 0) return {page_aligned(bytes), false};
  if (device >= cuda_device_count())
    throw CudaError("page-locked memory for CUDA device " + std::to_string(device) +
                    ": this machine has " + std::to_string(cuda_device_count()) +
                    " CUDA device(s), numbered from 0");
  void* p = nullptr;
  cudaError_t status = cudaSetDevice(device);
  if (status == cudaSuccess) status = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
  if (status != cudaSuccess)
    throw CudaError(std::string("cudaHostAlloc(") + std::to_string(bytes) +
                             " bytes) for device " + std::to_string(device) + " failed: " +
                             cudaGetErrorString(status) + " (" __FILE__ ")");
  return {p, true};
}

void pinned_free(const PinnedAllocation& allocation) noexcept {
  if (allocation.data == nullptr) return;
  if (!allocation.page_locked) {
    std::free(allocation.data);
    return;
  }
  const cudaError_t status = cudaFreeHost(allocation.data);
  if (status != cudaSuccess)  // destructors log instead of throwing
    std::fprintf(stderr, "tandem: cudaFreeHost failed: %s\n", cudaGetErrorString(status));
}

}  // namespace tandem::kernels
