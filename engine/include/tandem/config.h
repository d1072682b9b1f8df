// The settings of a model and of a training run. Plain values with TensorFlow's seed defaults.
#pragma once

#include <cstdint>
#include <string>
#include <vector>
#include "tandem/export.h"

namespace tandem {

// Layer widths from input to output: 784-100-10 is the seed's model (one ReLU hidden layer and a
// softmax output). Every layer but the last is dense + bias + ReLU; the last is dense + bias.
struct TANDEM_API ModelConfig {
  std::vector<int64_t> layers{784, 100, 10};

  int64_t inputs() const { return layers.front(); }
  int64_t classes() const { return layers.back(); }
  // Throws InputError unless there are at least two layers, all widths are positive and the
  // output has at most 256 classes (labels are stored as bytes).
  void validate() const;
  // "784-100-10"
  std::string describe() const;
  // Parses "784-100-10" (or "784,100,10"); throws InputError naming the text otherwise.
  static ModelConfig parse(const std::string& text);
};

enum class OptimizerKind { Adam, Sgd };

struct TANDEM_API OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Adam;
  float learning_rate = 0.01f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float epsilon = 1e-8f;

  // InputError unless the rate is positive and finite, the betas in [0, 1) and epsilon positive
  // and finite (0 divides a parameter that never had a gradient, a dead pixel's, 0 by 0: NaN).
  void validate() const;
};

enum class BackendKind { Cpu, Cuda, Auto };

// How the CUDA backend's matrix products compute. Fp32 is plain float32 (no TF32); Tf32 and Bf16
// let the tensor cores round the operands while parameters, gradients and Adam's state stay
// float32. The CPU backend computes in float32 only.
enum class Precision { Fp32, Tf32, Bf16 };

struct TANDEM_API TrainConfig {
  ModelConfig model;
  OptimizerConfig optimizer;
  BackendKind backend = BackendKind::Auto;
  Precision precision = Precision::Fp32;
  int64_t batch = 1000;
  int epochs = 15;
  uint64_t seed = 1;
  int threads = 0;       // 0: every core this process may use
  bool shuffle = true;   // false: batches in store order, for reproducible comparisons
  // Keep the parameters of the epoch with the lowest validation loss (restored, with their
  // optimizer state, when training ends), rather than the last epoch's. At the seed's learning
  // rate the validation loss jumps by +-10% from epoch to epoch; the last epoch is a lottery.
  bool keep_best = true;
  std::string init_path;        // start from these parameters (a checkpoint file)
  std::string resume_path;      // continue a checkpointed run: parameters, optimizer state, step
  std::string checkpoint_path;  // written atomically after every epoch and at the end
  std::string metrics_path;     // JSON lines: one per step, one per epoch (one writer at a
                                // time: a file another log has open is refused)
  // What the validation rows are, written into checkpoints beside their count (empty: not
  // said). "idx-last-rows": the training file's last rows, which tandem eval then holds out too.
  std::string validation_split;

  void validate() const;
};

TANDEM_API const char* to_string(BackendKind kind);
TANDEM_API const char* to_string(OptimizerKind kind);
TANDEM_API const char* to_string(Precision precision);
TANDEM_API BackendKind parse_backend(const std::string& text);
TANDEM_API OptimizerKind parse_optimizer(const std::string& text);
TANDEM_API Precision parse_precision(const std::string& text);  // "fp32", "tf32" or "bf16"

}  // namespace tandem
