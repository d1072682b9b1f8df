// A build without NCCL (no CUDA, or no NCCL 2.14 or newer found): no GPU worker group can be made.
#include "group_collective.h"

namespace tandem {

std::unique_ptr<GroupCollective> make_nccl_collective(std::vector<int>, int) {
  throw InputError("a GPU worker group needs NCCL 2.14 or newer: this build has no NCCL");
}

void prepare_nccl_environment() {}

}  // namespace tandem
