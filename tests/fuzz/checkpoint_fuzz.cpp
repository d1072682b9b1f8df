// Fuzz target: safetensors bytes through decode_checkpoint, what `tandem eval/predict --model`,
// `train --resume/--init` and a search trial's resumed state read: the checkpoint's metadata
// (layers, optimizer, step, epoch, seed, batch, the best state's keys) and its tensors' names,
// shapes and count. Malformed input is an InputError; a checkpoint it accepts encodes again and
// decodes to the same checkpoint, bit for bit.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_target.h"
#include "tandem/model.h"

namespace {

bool same_tensors(const std::vector<tandem::NamedTensor>& a,
                  const std::vector<tandem::NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].shape != b[i].shape ||
        a[i].values.size() != b[i].values.size())
      return false;
    if (!a[i].values.empty() && std::memcmp(a[i].values.data(), b[i].values.data(),
                                            a[i].values.size() * sizeof(float)) != 0)
      return false;
  }
  return true;
}

bool same(const tandem::Checkpoint& a, const tandem::Checkpoint& b) {
  return a.step == b.step && a.epoch == b.epoch && a.seed == b.seed && a.batch == b.batch &&
         a.model.config().describe() == b.model.config().describe() &&
         a.optimizer.kind == b.optimizer.kind &&
         std::memcmp(&a.optimizer.learning_rate, &b.optimizer.learning_rate, sizeof(float)) == 0 &&
         same_tensors(a.model.parameters(), b.model.parameters()) &&
         same_tensors(a.state.m, b.state.m) && same_tensors(a.state.v, b.state.v) &&
         (a.best == nullptr) == (b.best == nullptr) &&
         (a.best == nullptr || same(*a.best, *b.best));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::Checkpoint checkpoint;
  if (!tandem::fuzz::accepts(
          [&] { checkpoint = tandem::decode_checkpoint(data, size, "fuzz", nullptr); }))
    return 0;
  std::vector<uint8_t> again;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { again = tandem::encode_checkpoint(checkpoint); }));
  tandem::Checkpoint back;
  FUZZ_CHECK(tandem::fuzz::accepts(
      [&] { back = tandem::decode_checkpoint(again.data(), again.size(), "fuzz", nullptr); }));
  FUZZ_CHECK(same(checkpoint, back));
  return 0;
}
