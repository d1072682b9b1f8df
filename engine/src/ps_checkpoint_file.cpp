#include "ps_checkpoint_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tandem/error.h"

namespace tandem {

namespace {

constexpr const char* kShardFormat = "tandem-ps-shard";

SafeTensor float_tensor(const std::string& name, const std::vector<int64_t>& shape,
                        const float* values, int64_t count) {
  SafeTensor t;
  t.name = name;
  t.dtype = "F32";
  t.shape = shape;
  t.data.resize(size_t(count) * sizeof(float));
  if (count > 0) std::memcpy(t.data.data(), values, t.data.size());
  return t;
}

std::vector<float> floats_of(const SafeTensor& t) {
  std::vector<float> v(t.data.size() / sizeof(float));
  if (!v.empty()) std::memcpy(v.data(), t.data.data(), v.size() * sizeof(float));
  return v;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

std::string reserved_parameter_name_problem(const std::string& name) {
  for (const char* suffix : {".adam_m", ".adam_v"})
    if (ends_with(name, suffix))
      return "initial tensor '" + name + "' ends in " + suffix +
             ", which the server's checkpoints keep for Adam's moments: rename it";
  if (name == "__metadata__")
    return "initial tensor name '__metadata__' is reserved by safetensors (the checkpoints)";
  return "";
}

SafeTensorsFile encode_shard_checkpoint(const PsShard& shard, bool adam,
                                        const ShardCheckpointLabels& labels) {
  SafeTensorsFile file;
  for (const auto& e : shard.entries()) {
    file.tensors.push_back(float_tensor(e.name, e.shape, shard.values(e), e.size));
    if (!adam) continue;
    file.tensors.push_back(float_tensor(e.name + ".adam_m", e.shape, shard.adam_m(e), e.size));
    file.tensors.push_back(float_tensor(e.name + ".adam_v", e.shape, shard.adam_v(e), e.size));
  }
  file.metadata["format"] = kShardFormat;
  file.metadata["step"] = std::to_string(shard.step());
  file.metadata["mode"] = labels.mode;
  file.metadata["shard"] = labels.shard;
  file.metadata["optimizer"] = labels.optimizer;
  file.metadata["model_order"] = labels.model_order;
  if (labels.epochs_whole >= 0) file.metadata["epochs_whole"] = std::to_string(labels.epochs_whole);
  return file;
}

ShardCheckpoint decode_shard_checkpoint(const SafeTensorsFile& file, const std::string& path,
                                        bool adam) {
  auto meta = [&](const std::string& key) -> const std::string& {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) throw InputError(path + ": metadata has no '" + key + "'");
    return it->second;
  };
  if (meta("format") != kShardFormat)
    throw InputError(path + ": metadata format is '" + meta("format") + "', expected " +
                     kShardFormat);
  auto count = [&](const std::string& key, const std::string& text) -> int64_t {
    if (text.empty() || text.size() > 18 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw InputError(path + ": metadata " + key + " '" + text + "' is not a number");
    return std::stoll(text);
  };
  // Another optimizer's run: an SGD server would take an Adam run's parameters and drop its
  // moments, an Adam server would start moments afresh, each going on as if resumed.
  const auto optimizer = file.metadata.find("optimizer");
  const std::string mine = adam ? "adam" : "sgd";
  if (optimizer != file.metadata.end() && optimizer->second != mine)
    throw InputError(path + ": a server updating with " + optimizer->second + " wrote it, this " +
                     "one updates with " + mine + ": resume with that optimizer");
  ShardCheckpoint out;
  out.step = count("step", meta("step"));
  auto order = file.metadata.find("model_order");
  if (order != file.metadata.end()) out.model_order = order->second;
  auto epochs = file.metadata.find("epochs_whole");  // (newer)
  if (epochs != file.metadata.end()) out.epochs_whole = count("epochs_whole", epochs->second);
  size_t expected = 0;
  for (const auto& t : file.tensors) {
    if (ends_with(t.name, ".adam_m") || ends_with(t.name, ".adam_v")) continue;
    if (t.dtype != "F32") throw InputError(path + ": tensor '" + t.name + "' is not F32");
    PsShard::Restored r{t.name, t.shape, floats_of(t), {}, {}};
    for (float x : r.values)
      if (!std::isfinite(x)) throw InputError(path + ": tensor '" + t.name + "' is not finite");
    ++expected;
    const SafeTensor* m = file.find(t.name + ".adam_m");
    const SafeTensor* v = file.find(t.name + ".adam_v");
    if (adam && (m == nullptr || v == nullptr))
      throw InputError(path + ": no Adam moments for '" + t.name + "'");
    for (const SafeTensor* mv : {m, v}) {
      if (mv == nullptr) continue;
      if (mv->dtype != "F32" || mv->shape != t.shape)
        throw InputError(path + ": moment '" + mv->name + "' does not match its parameter");
      ++expected;
    }
    if (m) r.m = floats_of(*m);
    if (v) r.v = floats_of(*v);
    // A corrupt moment would turn the parameters into NaN at the first step after the restart,
    // far from its cause: m must be finite, v (a running mean of squares) finite and not
    // negative.
    for (float x : r.m)
      if (!std::isfinite(x)) throw InputError(path + ": moment '" + m->name + "' is not finite");
    for (float x : r.v)
      if (!std::isfinite(x) || x < 0)
        throw InputError(path + ": moment '" + v->name + "' is not finite and non-negative");
    out.tensors.push_back(std::move(r));
  }
  if (out.tensors.empty()) throw InputError(path + ": no parameters");
  if (expected != file.tensors.size())
    throw InputError(path + ": moments without a parameter");
  return out;
}

}  // namespace tandem
