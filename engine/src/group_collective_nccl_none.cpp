// A build without NCCL (no CUDA, or CUDA without NCCL found): the GPU worker group cannot be made.
#include "group_collective.h"

namespace tandem {

std::unique_ptr<GroupCollective> make_nccl_collective(std::vector<int>, int) {
  throw InputError("a GPU worker group needs NCCL: this build has no NCCL");
}

void prepare_nccl_environment() {}

}  // namespace tandem
