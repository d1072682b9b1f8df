// Fuzz target: safetensors bytes (a checkpoint, a search trial's state) through
// decode_safetensors. Malformed input is an InputError; a file it accepts encodes again and
// decodes to the same tensors and metadata.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz_target.h"
#include "safetensors.h"

namespace {

bool same(const tandem::SafeTensorsFile& a, const tandem::SafeTensorsFile& b) {
  if (a.metadata != b.metadata || a.tensors.size() != b.tensors.size()) return false;
  for (size_t i = 0; i < a.tensors.size(); ++i) {
    const tandem::SafeTensor &x = a.tensors[i], &y = b.tensors[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape || x.data != y.data)
      return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tandem::SafeTensorsFile file;
  if (!tandem::fuzz::accepts([&] { file = tandem::decode_safetensors(data, size, "fuzz"); }))
    return 0;
  std::vector<uint8_t> encoded;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { encoded = tandem::encode_safetensors(file, "fuzz"); }));
  tandem::SafeTensorsFile again;
  FUZZ_CHECK(tandem::fuzz::accepts(
      [&] { again = tandem::decode_safetensors(encoded.data(), encoded.size(), "fuzz"); }));
  FUZZ_CHECK(same(file, again));
  return 0;
}
