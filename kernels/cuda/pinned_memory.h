// Host buffers for data headed to the GPU: page-locked (cudaHostAlloc) when a CUDA device is
// present, so copies run asynchronously at full PCIe/NVLink speed; page-aligned ordinary memory
// otherwise (CPU training, machines without a GPU).
#pragma once

#include <cstddef>

namespace tandem::kernels {

struct PinnedAllocation {
  void* data = nullptr;
  bool page_locked = false;  // true when cudaHostAlloc provided it
};

// Page-locked for CUDA device `device` when one is present: allocated in that device's context,
// which becomes the calling thread's current device (the runtime creates a device's context the
// first time it is made current, so an allocation for GPU 2 must not go through GPU 0). With
// `device` < 0 (the data goes to the CPU) or no device present, page-aligned ordinary memory:
// page-locking it would only cost a CUDA context. Throws std::bad_alloc (plain memory), or
// CudaError (a tandem::Error) for a device this machine does not have or with the CUDA error's
// text.
PinnedAllocation pinned_alloc(size_t bytes, int device);
void pinned_free(const PinnedAllocation& allocation) noexcept;

}  // namespace tandem::kernels
