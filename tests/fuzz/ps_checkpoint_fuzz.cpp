// Fuzz target: a parameter server's checkpoint file (safetensors bytes) through
// decode_shard_checkpoint and PsShard::restore, as a server restarting over a checkpoint
// directory reads it, once as an Adam server and once as an SGD one (Adam needs both moments of
// every parameter; SGD reads them when present). Malformed input is an InputError. A checkpoint
// accepted and restored is written again from the shard (encode_shard_checkpoint) and must read
// back to the same step, model order, names, shapes and values, bit for bit, moments included
// for Adam.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "ps_checkpoint_file.h"

namespace {

using namespace tandem;

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// A restored tensor without a moment holds zeros there: what the file gave, or zeros.
std::vector<float> moment_or_zeros(const std::vector<float>& moment, size_t size) {
  return moment.empty() ? std::vector<float>(size, 0.0f) : moment;
}

void check_round_trip(const ShardCheckpoint& read, bool adam) {
  OptimizerConfig optimizer;
  optimizer.kind = adam ? OptimizerKind::Adam : OptimizerKind::Sgd;
  PsShard shard(optimizer);
  shard.restore(read.tensors, read.step);
  const SafeTensorsFile file = encode_shard_checkpoint(
      shard, adam, {"async", "fuzz", adam ? "adam" : "sgd", read.model_order});
  const std::vector<uint8_t> bytes = encode_safetensors(file, "fuzz");
  ShardCheckpoint again;
  FUZZ_CHECK(fuzz::accepts([&] {
    again = decode_shard_checkpoint(decode_safetensors(bytes.data(), bytes.size(), "fuzz"),
                                    "fuzz", adam);
  }));
  FUZZ_CHECK(again.step == read.step && again.model_order == read.model_order);
  FUZZ_CHECK(again.tensors.size() == read.tensors.size());
  for (size_t i = 0; i < read.tensors.size(); ++i) {
    const PsShard::Restored &a = read.tensors[i], &b = again.tensors[i];
    FUZZ_CHECK(a.name == b.name && a.shape == b.shape && same_floats(a.values, b.values));
    if (!adam) {
      FUZZ_CHECK(b.m.empty() && b.v.empty());
      continue;
    }
    FUZZ_CHECK(same_floats(moment_or_zeros(a.m, a.values.size()), b.m));
    FUZZ_CHECK(same_floats(moment_or_zeros(a.v, a.values.size()), b.v));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  SafeTensorsFile file;
  if (!fuzz::accepts([&] { file = decode_safetensors(data, size, "fuzz"); })) return 0;
  for (const bool adam : {true, false}) {
    ShardCheckpoint read;
    if (fuzz::accepts([&] { read = decode_shard_checkpoint(file, "fuzz", adam); }))
      check_round_trip(read, adam);
  }
  return 0;
}
