#include "tandem/config.h"

#include <cmath>
#include <filesystem>
#include <utility>
#include <cstdio>
#include <sstream>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

void ModelConfig::validate() const {
  if (layers.size() < 2)
    throw InputError("model layers: need at least an input and an output width, got '" +
                     describe() + "'");
  for (int64_t width : layers)
    if (width <= 0 || width > (int64_t{1} << 24))
      throw InputError("model layers '" + describe() + "': width " + std::to_string(width) +
                       " is outside [1, 16777216]");
  if (classes() > 256)
    throw InputError("model layers '" + describe() + "': " + std::to_string(classes()) +
                     " output classes, at most 256 are supported (labels are bytes)");
  // Widths within bounds can still multiply past any machine's memory (16777216-16777216-10:
  // a petabyte), which building the model only said as std::bad_alloc. Each layer's count is
  // below 2^49 (widths below 2^24 + 1), so the sum cannot overflow before it passes the bound.
  constexpr int64_t kMaxParameters = int64_t{1} << 32;
  int64_t parameters = 0;
  for (size_t l = 0; l + 1 < layers.size() && parameters <= kMaxParameters; ++l)
    parameters += (layers[l] + 1) * layers[l + 1];
  if (parameters > kMaxParameters)
    throw InputError("model layers '" + describe() + "': more than 2^32 parameters (16 GiB of "
                     "float32, three times that with Adam's moments)");
}

std::string ModelConfig::describe() const {
  std::string text;
  for (size_t i = 0; i < layers.size(); ++i) text += (i ? "-" : "") + std::to_string(layers[i]);
  return text;
}

ModelConfig ModelConfig::parse(const std::string& text) {
  ModelConfig config;
  config.layers.clear();
  const char separator = text.find(',') != std::string::npos ? ',' : '-';
  // getline yields no empty last field: "784-100-" would read as the model 784-100.
  if (!text.empty() && text.back() == separator)
    throw InputError("model layers '" + text + "': ends with '" + std::string(1, separator) +
                     "' (expected widths like 784-100-10)");
  std::string item;
  std::istringstream in(text);
  while (std::getline(in, item, separator)) {
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty())
      throw InputError("model layers '" + text + "': '" + item +
                       "' is not a whole number (expected widths like 784-100-10)");
    config.layers.push_back(value);
  }
  config.validate();
  return config;
}

namespace {

// 0.001 as "0.001", 1e-50 (a float's 0) as "0": what was given, not std::to_string's "0.001000".
std::string shortest_text(float x) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", static_cast<double>(x));
  return text;
}

}  // namespace

void OptimizerConfig::validate() const {
  if (!(learning_rate > 0.0f) || !std::isfinite(learning_rate))
    throw InputError("learning rate must be a positive finite number, got " +
                     shortest_text(learning_rate));
  if (!(beta1 >= 0.0f && beta1 < 1.0f) || !(beta2 >= 0.0f && beta2 < 1.0f))
    throw InputError("Adam betas must be in [0, 1), got " + shortest_text(beta1) + " and " +
                     shortest_text(beta2));
  if (!(epsilon > 0.0f) || !std::isfinite(epsilon))
    throw InputError("Adam epsilon must be a positive finite number, got " +
                     shortest_text(epsilon));
}

namespace {

// Whether two paths name one file: spelled alike once resolved (neither need exist yet), or
// one file under two names (a hard link).
bool same_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ec;
  return resolved_path(a) == resolved_path(b) || std::filesystem::equivalent(a, b, ec);
}

}  // namespace

void TrainConfig::validate() const {
  model.validate();
  if (batch < 1) throw InputError("batch size must be at least 1, got " + std::to_string(batch));
  if (epochs < 0) throw InputError("epochs must be >= 0, got " + std::to_string(epochs));
  if (threads < 0) throw InputError("threads must be >= 0, got " + std::to_string(threads));
  optimizer.validate();
  if (!init_path.empty() && !resume_path.empty())
    throw InputError("give either an initial model (" + init_path + ") or a checkpoint to resume (" +
                     resume_path + "), not both");
  // The metrics log is opened for writing first: over the model read, it destroyed it; over the
  // checkpoint, each save's rename took the log away.
  for (const auto& [what, path] : {std::pair<const char*, const std::string&>{"initial model",
                                                                              init_path},
                                   {"checkpoint to resume", resume_path},
                                   {"checkpoint", checkpoint_path}})
    if (same_file(metrics_path, path))
      throw InputError("the metrics file " + metrics_path + " is the " + what + " " + path +
                       ": give the metrics another file");
  if (precision != Precision::Fp32 && backend == BackendKind::Cpu)
    throw InputError(std::string("precision ") + to_string(precision) +
                     " needs the CUDA backend; the CPU backend computes in fp32");
}

const char* to_string(BackendKind kind) {
  switch (kind) {
    case BackendKind::Cpu: return "cpu";
    case BackendKind::Cuda: return "cuda";
    case BackendKind::Auto: return "auto";
  }
  return "?";
}

const char* to_string(OptimizerKind kind) { return kind == OptimizerKind::Adam ? "adam" : "sgd"; }

const char* to_string(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return "fp32";
    case Precision::Tf32: return "tf32";
    case Precision::Bf16: return "bf16";
  }
  return "?";
}

Precision parse_precision(const std::string& text) {
  if (text == "fp32") return Precision::Fp32;
  if (text == "tf32") return Precision::Tf32;
  if (text == "bf16") return Precision::Bf16;
  throw InputError("precision '" + text + "': expected fp32, tf32 or bf16");
}

BackendKind parse_backend(const std::string& text) {
  if (text == "cpu") return BackendKind::Cpu;
  if (text == "cuda") return BackendKind::Cuda;
  if (text == "auto") return BackendKind::Auto;
  throw InputError("backend '" + text + "': expected cpu, cuda or auto");
}

OptimizerKind parse_optimizer(const std::string& text) {
  if (text == "adam") return OptimizerKind::Adam;
  if (text == "sgd") return OptimizerKind::Sgd;
  throw InputError("optimizer '" + text + "': expected adam or sgd");
}

}  // namespace tandem
