// A build without CUDA: parameter servers keep their shards on the CPU.
#include "ps_shard_device.h"
#include "tandem/error.h"

namespace tandem {

std::unique_ptr<ShardDevice> make_shard_device(const OptimizerConfig&, int) {
  throw InputError("a GPU shard needs a build with CUDA (this one has none)");
}

int shard_device_count() { return 0; }

}  // namespace tandem
