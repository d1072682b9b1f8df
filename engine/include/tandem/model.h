// A model's parameters (and, for a checkpoint, its optimizer state), their initialisation and
// their safetensors files.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/export.h"

namespace tandem {

// A named float32 tensor.
struct TANDEM_API NamedTensor {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// The parameter tensors of a model, in a fixed order: for each layer its weight [in, out] and
// bias [out]. The seed's names: hid_w, hid_b for the (first) hidden layer, hid2_w ... for more,
// sm_w, sm_b for the softmax layer.
class TANDEM_API Model {
 public:
  explicit Model(ModelConfig config);  // zero parameters of the right shapes

  // TensorFlow's initialisers: weights ~ truncated normal with stddev 1/sqrt(fan_in) (redrawn
  // beyond two stddev), biases zero. The same seed gives the same parameters on every machine.
  static Model initialized(ModelConfig config, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  std::vector<NamedTensor>& parameters() { return parameters_; }
  const std::vector<NamedTensor>& parameters() const { return parameters_; }
  const NamedTensor& parameter(const std::string& name) const;
  int64_t parameter_count() const;

  static std::string weight_name(size_t layer, size_t num_layers);
  static std::string bias_name(size_t layer, size_t num_layers);

 private:
  ModelConfig config_;
  std::vector<NamedTensor> parameters_;
};

// Adam's moments, one tensor per parameter, in the model's order (empty for SGD).
struct TANDEM_API OptimizerState {
  std::vector<NamedTensor> m;
  std::vector<NamedTensor> v;
};

// Everything needed to continue a run where it stopped.
struct TANDEM_API Checkpoint {
  Model model{ModelConfig{}};
  OptimizerConfig optimizer;
  OptimizerState state;
  int64_t step = 0;      // optimizer steps taken (TensorFlow's global_step)
  int64_t epoch = 0;     // epochs completed
  uint64_t seed = 0;
  int64_t batch = 0;
  std::map<std::string, std::string> extra;  // further provenance, kept as given
  // The run's state with the lowest validation loss so far, when that is not this state (its
  // extra holds "validation_loss" and "validation_samples"): a run resumed from this checkpoint
  // that keeps its best epoch compares its own with it. Saved in the same file, as tensors
  // best/NAME and metadata best_epoch, best_step, best_validation_loss and best_validation_samples.
  std::shared_ptr<const Checkpoint> best;
};

// Writes a safetensors file atomically (temporary file, fsync, rename): the parameters under
// their names, Adam's moments as NAME.adam_m / NAME.adam_v, everything else in __metadata__.
// With extra["parameters_only"] = "true" it writes the parameters alone (no optimizer state,
// no best state): a model to evaluate, predict with or start a run from, not one to resume.
TANDEM_API void save_checkpoint(const std::string& path, const Checkpoint& checkpoint);

// Reads and validates a whole checkpoint. Throws InputError naming the file and the problem for a
// truncated or corrupt file, or when it does not hold a complete model. When `expected` is given,
// the model's layers must match it.
TANDEM_API Checkpoint load_checkpoint(const std::string& path,
                                      const ModelConfig* expected = nullptr);

// The same as the bytes of that safetensors file, for a checkpoint that travels between
// processes (a search trial resumed on another machine); decoding checks it as loading does,
// naming it `name`.
TANDEM_API std::vector<uint8_t> encode_checkpoint(const Checkpoint& checkpoint);
TANDEM_API Checkpoint decode_checkpoint(const uint8_t* data, size_t size,
                                        const std::string& name,
                                        const ModelConfig* expected = nullptr);

}  // namespace tandem
