#include "tandem/model.h"

#include <cmath>

#include "parameter_layout.h"
#include "random.h"
#include "tandem/error.h"

namespace tandem {

std::string Model::weight_name(size_t layer, size_t num_layers) {
  if (layer + 1 == num_layers) return "sm_w";
  return layer == 0 ? "hid_w" : "hid" + std::to_string(layer + 1) + "_w";
}

std::string Model::bias_name(size_t layer, size_t num_layers) {
  if (layer + 1 == num_layers) return "sm_b";
  return layer == 0 ? "hid_b" : "hid" + std::to_string(layer + 1) + "_b";
}

ParameterLayout ParameterLayout::for_model(const ModelConfig& config) {
  config.validate();
  ParameterLayout layout;
  const size_t num_layers = config.layers.size() - 1;
  auto add = [&](std::string name, std::vector<int64_t> shape) {
    Entry entry;
    entry.name = std::move(name);
    entry.size = 1;
    for (int64_t d : shape) entry.size *= d;
    entry.shape = std::move(shape);
    entry.offset = layout.total;
    layout.total += (entry.size + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
    layout.entries.push_back(std::move(entry));
  };
  for (size_t l = 0; l < num_layers; ++l) {
    add(Model::weight_name(l, num_layers), {config.layers[l], config.layers[l + 1]});
    add(Model::bias_name(l, num_layers), {config.layers[l + 1]});
  }
  return layout;
}

Model::Model(ModelConfig config) : config_(std::move(config)) {
  const ParameterLayout layout = ParameterLayout::for_model(config_);
  for (const auto& entry : layout.entries)
    parameters_.push_back({entry.name, entry.shape, std::vector<float>(static_cast<size_t>(entry.size), 0.0f)});
}

Model Model::initialized(ModelConfig config, uint64_t seed) {
  Model model(std::move(config));
  // Weights get stddev 1/sqrt(fan_in): 1/28 for hid_w [784,100] and 1/10 for sm_w [100,10],
  // the seed's values. Each tensor draws from its own stream so adding a layer changes no other.
  for (size_t i = 0; i < model.parameters_.size(); i += 2) {
    NamedTensor& w = model.parameters_[i];
    const double stddev = 1.0 / std::sqrt(static_cast<double>(w.shape[0]));
    Rng rng(seed, i);
    for (float& x : w.values) x = static_cast<float>(rng.truncated_normal(stddev));
  }
  return model;
}

const NamedTensor& Model::parameter(const std::string& name) const {
  for (const auto& p : parameters_)
    if (p.name == name) return p;
  throw InputError("model " + config_.describe() + " has no parameter '" + name + "'");
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const auto& p : parameters_) n += static_cast<int64_t>(p.values.size());
  return n;
}

}  // namespace tandem
