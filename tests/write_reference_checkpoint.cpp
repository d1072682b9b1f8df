// Writes a checkpoint whose every value follows a formula that Python can recompute exactly
// (multiples of 1/1024, exact in float32), for the safetensors / PyTorch interoperability test.
#include <cstdio>

#include "tandem/tandem.h"

namespace {

float reference_value(int64_t tensor, int64_t index, int64_t kind) {
  const int64_t k = (index * 7919 + tensor * 104729 + kind * 15485863) % 2001;
  return static_cast<float>(k - 1000) / 1024.0f;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s OUT.safetensors LAYERS\n", argv[0]);
    return 2;
  }
  try {
    tandem::Checkpoint c;
    c.model = tandem::Model(tandem::ModelConfig::parse(argv[2]));
    int64_t t = 0;
    for (auto& p : c.model.parameters()) {
      tandem::NamedTensor m{p.name, p.shape, p.values}, v = m;
      for (size_t i = 0; i < p.values.size(); ++i) {
        p.values[i] = reference_value(t, static_cast<int64_t>(i), 0);
        m.values[i] = reference_value(t, static_cast<int64_t>(i), 1);
        v.values[i] = reference_value(t, static_cast<int64_t>(i), 2) + 1.0f;
      }
      c.state.m.push_back(std::move(m));
      c.state.v.push_back(std::move(v));
      ++t;
    }
    c.step = 4321;
    c.epoch = 7;
    c.seed = 99;
    c.batch = 100;
    tandem::save_checkpoint(argv[1], c);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
