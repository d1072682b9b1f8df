// The CPU-only build: page-aligned ordinary memory.
#include <cstdlib>
#include <new>

#include "pinned_memory.h"

namespace tandem::kernels {

PinnedAllocation pinned_alloc(size_t bytes, int) {
  constexpr size_t kPage = 4096;
  void* p = std::aligned_alloc(kPage, (bytes + kPage) / kPage * kPage);
  if (p == nullptr) throw std::bad_alloc();
  return {p, false};
}

void pinned_free(const PinnedAllocation& allocation) noexcept { std::free(allocation.data); }

}  // namespace tandem::kernels
