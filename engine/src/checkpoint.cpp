// Checkpoints as safetensors files: parameters under their own names, Adam's moments beside them
// as NAME.adam_m and NAME.adam_v, and the run's state in __metadata__ (strings, as the format
// requires). Loading checks the whole file before anything is returned.
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <set>

#include "checkpoint_format.h"
#include "parameters_only.h"
#include "safetensors.h"
#include "tandem/error.h"
#include "tandem/model.h"

namespace tandem {

namespace {

constexpr const char* kFormat = kCheckpointFormat;
constexpr const char* kFormatVersion = kCheckpointFormatVersion;

SafeTensor to_safetensor(const NamedTensor& t, const std::string& name) {
  SafeTensor out;
  out.name = name;
  out.dtype = "F32";
  out.shape = t.shape;
  out.data.resize(t.values.size() * sizeof(float));
  if (!t.values.empty()) std::memcpy(out.data.data(), t.values.data(), out.data.size());
  return out;
}

// Tensor `name` of `file`, checked to be float32 of `shape`.
const SafeTensor& checked_tensor(const SafeTensorsFile& file, const std::string& path,
                                 const std::string& name, const std::vector<int64_t>& shape) {
  const SafeTensor* t = file.find(name);
  if (t == nullptr) throw InputError(path + ": checkpoint has no tensor '" + name + "'");
  if (t->dtype != "F32")
    throw InputError(path + ": tensor '" + name + "' has dtype " + t->dtype + ", expected F32");
  if (t->shape != shape) {
    auto text = [](const std::vector<int64_t>& s) {
      std::string r = "[";
      for (size_t i = 0; i < s.size(); ++i) r += (i ? "," : "") + std::to_string(s[i]);
      return r + "]";
    };
    throw InputError(path + ": tensor '" + name + "' has shape " + text(t->shape) +
                     ", the model needs " + text(shape));
  }
  // A file read from disk has its sizes checked against the shapes; a checkpoint being written
  // is made of the caller's tensors, whose values may not match the shapes they claim (read
  // back by save_checkpoint's check, an overrun of the model's own tensors).
  size_t elements = 1;
  for (const int64_t d : shape) elements *= static_cast<size_t>(d);
  if (t->data.size() != elements * sizeof(float))
    throw InputError(path + ": tensor '" + name + "' holds " +
                     std::to_string(t->data.size() / sizeof(float)) + " values, its shape needs " +
                     std::to_string(elements));
  return *t;
}

// Copies tensor `name` of `file` into `into` (whose shape says what is expected).
void read_tensor(const SafeTensorsFile& file, const std::string& path, const std::string& name,
                 NamedTensor& into) {
  const SafeTensor& t = checked_tensor(file, path, name, into.shape);
  std::memcpy(into.values.data(), t.data.data(), t.data.size());
}

// The model's parameters are in the file with its shapes, so that building the model costs no
// more memory than the file holds: `layers` comes from the file too, and a corrupt one
// (784-500000-10 where the tensors are 784x100) would otherwise have gigabytes zero-filled before
// the first shape was compared.
void check_parameter_shapes(const SafeTensorsFile& file, const std::string& path,
                            const ModelConfig& config) {
  const size_t layers = config.layers.size() - 1;
  for (size_t l = 0; l < layers; ++l) {
    checked_tensor(file, path, Model::weight_name(l, layers),
                   {config.layers[l], config.layers[l + 1]});
    checked_tensor(file, path, Model::bias_name(l, layers), {config.layers[l + 1]});
  }
}

// A NaN or infinite parameter (a diverged run's) or a negative second moment would turn every
// later step into NaN, or be evaluated as a loss of nan: refused when the file is read.
void check_finite(const std::string& path, const std::string& name, const NamedTensor& t,
                  bool non_negative) {
  for (size_t i = 0; i < t.values.size(); ++i) {
    const float x = t.values[i];
    if (!std::isfinite(x) || (non_negative && x < 0.0f))
      throw InputError(path + ": tensor '" + name + "' holds " +
                       (std::isfinite(x) ? "a negative value" : "a non-finite value") +
                       " at element " + std::to_string(i) +
                       (std::isfinite(x) ? "" : " (a run that diverged?)"));
  }
}

const std::string& metadata(const SafeTensorsFile& file, const std::string& path,
                            const std::string& key) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end())
    throw InputError(path + ": checkpoint metadata has no '" + key + "'");
  return it->second;
}

template <typename T>
T parse_number(const std::string& path, const std::string& key, const std::string& text) {
  try {
    size_t used = 0;
    const T value = std::is_floating_point<T>::value ? static_cast<T>(std::stod(text, &used))
                                                     : static_cast<T>(std::stoll(text, &used));
    // No figure of a run is infinite or NaN: a best loss of -inf, say, would keep its epoch
    // against every later one.
    if (used == text.size() && std::isfinite(static_cast<double>(value))) return value;
  } catch (const std::exception&) {
  }
  throw InputError(path + ": checkpoint metadata '" + key + "' = '" + text + "' is not " +
                   (std::is_floating_point<T>::value ? "a finite number"
                                                     : "a whole number within 64 bits"));
}

// Seeds are unsigned 64-bit, all of them (2^63 and above too, which stoll refuses).
uint64_t parse_seed(const std::string& path, const std::string& text) {
  try {
    size_t used = 0;
    const unsigned long long value = std::stoull(text, &used);
    if (used == text.size() && text.find('-') == std::string::npos) return value;
  } catch (const std::exception&) {
  }
  throw InputError(path + ": checkpoint metadata 'seed' = '" + text + "' is not a number");
}

std::string float_text(float x) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.9g", static_cast<double>(x));
  return buffer;
}

// A checkpoint's best state goes beside its own under this prefix, described by these keys.
constexpr const char* kBestPrefix = "best/";
constexpr const char* kBestKeys[] = {"best_epoch", "best_step", "best_validation_loss",
                                     "best_validation_samples"};

// Appends the parameters (and Adam's moments) of `checkpoint` to `file`, names prefixed.
void add_state(SafeTensorsFile& file, const std::string& path, const Checkpoint& checkpoint,
               const std::string& prefix) {
  const bool adam = checkpoint.optimizer.kind == OptimizerKind::Adam;
  const auto& params = checkpoint.model.parameters();
  if (adam && (checkpoint.state.m.size() != params.size() || checkpoint.state.v.size() != params.size()))
    throw InputError(path + ": Adam state has " + std::to_string(checkpoint.state.m.size()) +
                     " tensors, the model " + std::to_string(params.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    file.tensors.push_back(to_safetensor(params[i], prefix + params[i].name));
    if (!adam) continue;
    file.tensors.push_back(to_safetensor(checkpoint.state.m[i], prefix + params[i].name + ".adam_m"));
    file.tensors.push_back(to_safetensor(checkpoint.state.v[i], prefix + params[i].name + ".adam_v"));
  }
}

// The checkpoint as a safetensors file; `path` names it in errors. One marked parameters_only
// ("true") is written as parameters alone, whatever optimizer state it holds (parameters_only.h).
SafeTensorsFile checkpoint_file(const std::string& path, const Checkpoint& given) {
  const auto marked = given.extra.find(kParametersOnlyKey);
  std::optional<Checkpoint> parameters_only;
  if (marked != given.extra.end() && marked->second == "true" &&
      (given.optimizer.kind != OptimizerKind::Sgd || given.best)) {
    parameters_only.emplace(given);
    parameters_only->state = {};
    parameters_only->best.reset();
    mark_parameters_only(*parameters_only);
  }
  const Checkpoint& checkpoint = parameters_only ? *parameters_only : given;
  SafeTensorsFile file;
  add_state(file, path, checkpoint, "");
  file.metadata = checkpoint.extra;
  // Keys that describe a best state are written from `best` alone: a checkpoint read from a file
  // and saved again without its best must not claim one.
  for (const char* key : kBestKeys) file.metadata.erase(key);
  if (const Checkpoint* best = checkpoint.best.get()) {
    if (best->model.config().layers != checkpoint.model.config().layers ||
        best->optimizer.kind != checkpoint.optimizer.kind)
      throw InputError(path + ": the best state's model or optimizer differs from the checkpoint's");
    auto loss = best->extra.find("validation_loss");
    if (loss == best->extra.end())
      throw InputError(path + ": the best state has no validation loss");
    add_state(file, path, *best, kBestPrefix);
    file.metadata["best_epoch"] = std::to_string(best->epoch);
    file.metadata["best_step"] = std::to_string(best->step);
    file.metadata["best_validation_loss"] = loss->second;
    auto samples = best->extra.find("validation_samples");
    if (samples != best->extra.end()) file.metadata["best_validation_samples"] = samples->second;
  }
  const OptimizerConfig& opt = checkpoint.optimizer;
  file.metadata["format"] = kFormat;
  file.metadata["format_version"] = kFormatVersion;
  file.metadata["layers"] = checkpoint.model.config().describe();
  file.metadata["optimizer"] = to_string(opt.kind);
  file.metadata["learning_rate"] = float_text(opt.learning_rate);
  file.metadata["beta1"] = float_text(opt.beta1);
  file.metadata["beta2"] = float_text(opt.beta2);
  file.metadata["epsilon"] = float_text(opt.epsilon);
  file.metadata["step"] = std::to_string(checkpoint.step);
  file.metadata["epoch"] = std::to_string(checkpoint.epoch);
  file.metadata["seed"] = std::to_string(checkpoint.seed);
  file.metadata["batch"] = std::to_string(checkpoint.batch);
  return file;
}

// Reads the parameters (and Adam's moments) of `into`'s model from tensors named with `prefix`,
// refusing values a run cannot continue from; returns how many tensors that was.
size_t read_state(const SafeTensorsFile& file, const std::string& path, const std::string& prefix,
                  Checkpoint& into) {
  const bool adam = into.optimizer.kind == OptimizerKind::Adam;
  size_t tensors = 0;
  for (auto& p : into.model.parameters()) {
    read_tensor(file, path, prefix + p.name, p);
    check_finite(path, prefix + p.name, p, false);
    ++tensors;
    if (!adam) continue;
    NamedTensor m{p.name, p.shape, std::vector<float>(p.values.size())};
    NamedTensor v = m;
    read_tensor(file, path, prefix + p.name + ".adam_m", m);
    read_tensor(file, path, prefix + p.name + ".adam_v", v);
    check_finite(path, prefix + p.name + ".adam_m", m, false);
    check_finite(path, prefix + p.name + ".adam_v", v, true);
    into.state.m.push_back(std::move(m));
    into.state.v.push_back(std::move(v));
    tensors += 2;
  }
  return tensors;
}

// ", besides them: NAME, ..." for the tensors of `file` that are none of the checkpoint's state
// (its parameters and their moments, with `best_prefix` too when given): "" when there is none.
std::string others_text(const SafeTensorsFile& file, const Checkpoint& checkpoint,
                        const char* best_prefix) {
  std::set<std::string> known;
  for (const NamedTensor& p : checkpoint.model.parameters())
    for (const char* suffix : {"", ".adam_m", ".adam_v"}) {
      known.insert(p.name + suffix);
      if (best_prefix) known.insert(best_prefix + p.name + suffix);
    }
  std::string others;
  size_t count = 0;
  for (const SafeTensor& t : file.tensors)
    if (known.count(t.name) == 0 && ++count <= 5) others += (count > 1 ? ", " : "") + t.name;
  if (count == 0) return "";
  if (count > 5) others += ", ... (" + std::to_string(count) + " in all)";
  return " (besides them: " + others + ")";
}

// A safetensors file of a model's parameters alone, under Tandem's names and without Tandem's
// metadata (written from PyTorch or NumPy): the layers its weights chain, as a checkpoint of
// parameters alone (eval, predict and --init take it; --resume does not). nullopt when `file`
// has metadata naming a format.
std::optional<Checkpoint> bare_parameters(const SafeTensorsFile& file, const std::string& path,
                                          const ModelConfig* expected) {
  if (file.metadata.count("format") != 0) return std::nullopt;
  // hid_w, hid2_w, ... then sm_w: Model::weight_name's names for a model of `count` layers.
  size_t count = 1;
  while (file.find(Model::weight_name(count - 1, count + 1)) != nullptr) ++count;
  const SafeTensor* out = file.find(Model::weight_name(count - 1, count));
  if (out == nullptr) {
    std::string names;
    for (size_t i = 0; i < file.tensors.size() && i < 5; ++i)
      names += (i ? ", " : "") + file.tensors[i].name;
    if (file.tensors.size() > 5) names += ", ...";
    throw InputError(path + ": not a Tandem checkpoint: its metadata names no format, and its "
                     "tensors (" + (names.empty() ? "none" : names) + ") are not a model's "
                     "parameters under Tandem's names (hid_w, hid_b, hid2_w, ... and sm_w, "
                     "sm_b; README, Checkpoints)");
  }
  std::vector<int64_t> layers;
  for (size_t l = 0; l < count; ++l) {
    const std::string name = Model::weight_name(l, count);
    const SafeTensor& w = *file.find(name);
    if (w.shape.size() != 2)
      throw InputError(path + ": tensor '" + name + "' has " + std::to_string(w.shape.size()) +
                       " dimensions; a weight has 2 (inputs x outputs)");
    if (l == 0) layers.push_back(w.shape[0]);
    layers.push_back(w.shape[1]);
  }
  Checkpoint checkpoint;
  ModelConfig config;
  config.layers = layers;
  try {
    config.validate();
  } catch (const InputError& e) {
    throw InputError(path + ": the weights chain layers " + e.what());
  }
  if (expected && expected->layers != config.layers)
    throw InputError(path + ": its parameters are model " + config.describe() + ", expected " +
                     expected->describe());
  check_parameter_shapes(file, path, config);
  checkpoint.model = Model(config);
  mark_parameters_only(checkpoint);
  checkpoint.extra["source"] = "a safetensors file of parameters without Tandem's metadata";
  const size_t tensors = read_state(file, path, "", checkpoint);
  if (file.tensors.size() != tensors)
    throw InputError(path + ": holds " + std::to_string(file.tensors.size()) + " tensors, the "
                     "parameters of model " + config.describe() + " are " +
                     std::to_string(tensors) + others_text(file, checkpoint, nullptr));
  return checkpoint;
}

// Checks a whole checkpoint file (read from `path`) and returns what it holds.
Checkpoint checkpoint_of(const SafeTensorsFile& file, const std::string& path,
                         const ModelConfig* expected) {
  if (std::optional<Checkpoint> parameters = bare_parameters(file, path, expected))
    return std::move(*parameters);
  if (metadata(file, path, "format") != kFormat)
    throw InputError(path + ": not a Tandem checkpoint (metadata format is '" +
                     metadata(file, path, "format") + "', expected '" + kFormat + "')");
  if (metadata(file, path, "format_version") != kFormatVersion)
    throw InputError(path + ": checkpoint format version " + metadata(file, path, "format_version") +
                     ", this tandem reads version " + kFormatVersion);
  ModelConfig config;
  const std::string& layers = metadata(file, path, "layers");
  try {
    config = ModelConfig::parse(layers);
  } catch (const InputError& e) {
    throw InputError(path + ": " + e.what());
  }
  if (expected && expected->layers != config.layers)
    throw InputError(path + ": checkpoint holds model " + config.describe() + ", expected " +
                     expected->describe());

  check_parameter_shapes(file, path, config);
  Checkpoint checkpoint;
  checkpoint.model = Model(config);
  OptimizerConfig& opt = checkpoint.optimizer;
  const std::string& optimizer = metadata(file, path, "optimizer");
  try {
    opt.kind = parse_optimizer(optimizer);
  } catch (const InputError& e) {
    throw InputError(path + ": checkpoint metadata: " + e.what());
  }
  // A file of parameters alone has no moments, whichever optimizer trained them (Tandem writes
  // such files as SGD's; one written elsewhere may name Adam).
  const auto parameters_only = file.metadata.find(kParametersOnlyKey);
  if (parameters_only != file.metadata.end() && parameters_only->second == "true")
    opt.kind = OptimizerKind::Sgd;
  opt.learning_rate = parse_number<float>(path, "learning_rate", metadata(file, path, "learning_rate"));
  opt.beta1 = parse_number<float>(path, "beta1", metadata(file, path, "beta1"));
  opt.beta2 = parse_number<float>(path, "beta2", metadata(file, path, "beta2"));
  opt.epsilon = parse_number<float>(path, "epsilon", metadata(file, path, "epsilon"));
  try {
    opt.validate();
  } catch (const InputError& e) {
    throw InputError(path + ": checkpoint metadata: " + e.what());
  }
  checkpoint.step = parse_number<int64_t>(path, "step", metadata(file, path, "step"));
  checkpoint.epoch = parse_number<int64_t>(path, "epoch", metadata(file, path, "epoch"));
  checkpoint.seed = parse_seed(path, metadata(file, path, "seed"));
  checkpoint.batch = parse_number<int64_t>(path, "batch", metadata(file, path, "batch"));
  // Beyond 2^53 no run gets (and a step near 2^63 overflowed Adam's bias correction to NaN).
  constexpr int64_t kMostSteps = int64_t(1) << 53;
  if (checkpoint.step < 0 || checkpoint.epoch < 0 || checkpoint.step > kMostSteps ||
      checkpoint.epoch > kMostSteps)
    throw InputError(path + ": step or epoch in checkpoint metadata is negative or past 2^53");

  size_t expected_tensors = read_state(file, path, "", checkpoint);
  const bool has_best = file.metadata.count("best_epoch") > 0;
  if (has_best) {
    auto best = std::make_shared<Checkpoint>();
    best->model = Model(config);
    best->optimizer = opt;
    best->step = parse_number<int64_t>(path, "best_step", metadata(file, path, "best_step"));
    best->epoch = parse_number<int64_t>(path, "best_epoch", metadata(file, path, "best_epoch"));
    if (best->step < 0 || best->epoch < 0 || best->step > kMostSteps || best->epoch > kMostSteps)
      throw InputError(path + ": step or epoch of the best state in checkpoint metadata is "
                       "negative or past 2^53");
    best->seed = checkpoint.seed;
    best->batch = checkpoint.batch;
    const std::string& loss = metadata(file, path, "best_validation_loss");
    parse_number<double>(path, "best_validation_loss", loss);
    best->extra["validation_loss"] = loss;
    // Scored on the split the checkpoint's own state was (files written before the best had a
    // key of its own).
    auto samples = file.metadata.find("best_validation_samples");
    if (samples == file.metadata.end()) samples = file.metadata.find("validation_samples");
    if (samples != file.metadata.end()) best->extra["validation_samples"] = samples->second;
    expected_tensors += read_state(file, path, kBestPrefix, *best);
    checkpoint.best = std::move(best);
  }
  if (file.tensors.size() != expected_tensors)
    throw InputError(path + ": checkpoint holds " + std::to_string(file.tensors.size()) +
                     " tensors, model " + config.describe() + " with " + to_string(opt.kind) +
                     (has_best ? " and a best state" : "") + " needs " +
                     std::to_string(expected_tensors) +
                     others_text(file, checkpoint, has_best ? kBestPrefix : nullptr));
  for (const auto& [key, value] : file.metadata) checkpoint.extra[key] = value;
  for (const char* key : kBestKeys) checkpoint.extra.erase(key);
  return checkpoint;
}

}  // namespace

void save_checkpoint(const std::string& path, const Checkpoint& checkpoint) {
  const SafeTensorsFile file = checkpoint_file(path, checkpoint);
  // What load_checkpoint would refuse (a NaN parameter, a negative second moment, in the best
  // state too) is not written: a file no reader takes, in place of one that may be good.
  checkpoint_of(file, path, nullptr);
  write_safetensors_atomic(path, file);
}

Checkpoint load_checkpoint(const std::string& path, const ModelConfig* expected) {
  return checkpoint_of(read_safetensors(path), path, expected);
}

std::vector<uint8_t> encode_checkpoint(const Checkpoint& checkpoint) {
  const std::string name = "(checkpoint in memory)";
  return encode_safetensors(checkpoint_file(name, checkpoint), name);
}

Checkpoint decode_checkpoint(const uint8_t* data, size_t size, const std::string& name,
                             const ModelConfig* expected) {
  return checkpoint_of(decode_safetensors(data, size, name), name, expected);
}

}  // namespace tandem
