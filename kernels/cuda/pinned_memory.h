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

// Throws std::bad_alloc (plain memory) or std::runtime_error with the CUDA error's text.
PinnedAllocation pinned_alloc(size_t bytes);
void pinned_free(const PinnedAllocation& allocation) noexcept;

}  // namespace tandem::kernels
