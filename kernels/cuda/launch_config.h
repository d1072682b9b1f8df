// Grid sizes for the element-wise and row-wise kernels: grid-stride loops over at most a few
// waves of blocks, so huge inputs do not launch millions of blocks and small ones launch few.
#pragma once

#include <algorithm>
#include <cstdint>

namespace tandem::kernels {

constexpr int kThreadsPerBlock = 256;
// About four waves of 256-thread blocks on an H200 (132 SMs x 8 resident blocks).
constexpr int64_t kMaxBlocks = 4096;

inline unsigned grid_for(int64_t work_items, int items_per_block = kThreadsPerBlock) {
  const int64_t blocks = (work_items + items_per_block - 1) / items_per_block;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, kMaxBlocks));
}

}  // namespace tandem::kernels
