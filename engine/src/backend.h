// The interface every compute backend implements (the CPU backend here, the CUDA one beside it).
// A backend owns device-side copies of the parameters, gradients and optimizer state; the trainer
// (and later the parameter-server roles) move them in and out through this interface.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "parameter_arena.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "tandem/model.h"

namespace tandem {

struct BatchStats {
  double loss_sum = 0.0;
  int64_t correct = 0;
  int64_t samples = 0;
};

// InputError unless a batch of `count` rows can be taken from `data`: without `rows` the first
// `count` rows (count <= data.rows); with them every listed index in [0, data.rows). An index
// outside reads past the data: on the CPU undefined behaviour, on a GPU an illegal address
// that ends the device's context for the whole process. The batch's labels, when the view has
// them, must be below `classes` (the model's outputs): the loss kernels index by them, and a
// label past the outputs writes past the gradient. Only the batch's rows are looked at, so a
// step over a large resident view costs O(batch), not O(view).
inline void check_batch_rows(const DatasetView& data, const int32_t* rows, int64_t count,
                             int classes) {
  if (count < 0 || (rows == nullptr && count > data.rows))
    throw InputError("batch of " + std::to_string(count) + " rows from a view of " +
                     std::to_string(data.rows));
  if (rows != nullptr)
    for (int64_t i = 0; i < count; ++i)
      if (rows[i] < 0 || rows[i] >= data.rows)
        throw InputError("row " + std::to_string(rows[i]) + " (entry " + std::to_string(i) +
                         " of the batch) is outside a view of " + std::to_string(data.rows) +
                         " rows");
  if (data.labels == nullptr) return;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t row = rows != nullptr ? rows[i] : i;
    if (data.labels[row] >= classes)
      throw InputError("row " + std::to_string(row) + " has label " +
                       std::to_string(int(data.labels[row])) + "; expected a class in [0, " +
                       std::to_string(classes) + ") for a model with " + std::to_string(classes) +
                       " outputs");
  }
}

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  virtual int threads() const = 0;

  virtual void set_parameters(const Model& model) = 0;
  // The same from parameters in pieces (a parameter server's reply read in place): one copy.
  virtual void set_parameters(const ParameterRuns& runs) = 0;
  virtual void get_parameters(Model& model) const = 0;
  // Adam's moments and the step count (bias corrections depend on it).
  virtual void set_optimizer_state(const OptimizerState& state, int64_t step) = 0;
  virtual void get_optimizer_state(OptimizerState& state) const = 0;
  virtual int64_t step() const = 0;

  // Forward and backward over `count` rows of `data` (the rows listed in `rows`, or the first
  // `count` rows when `rows` is null), keeping the summed gradients for apply_gradients().
  virtual BatchStats compute_gradients(const DatasetView& data, const int32_t* rows,
                                       int64_t count) = 0;
  // One optimizer step with the gradients of the last compute_gradients().
  virtual void apply_gradients() = 0;
  // The summed gradients of the last compute_gradients(), one tensor per parameter in the
  // model's order (a cluster worker pushes them to the parameter servers instead of applying).
  virtual void get_gradients(std::vector<NamedTensor>& out) const = 0;

  // compute_gradients + apply_gradients without waiting for the batch's loss: the statistics
  // are added to totals that take_stats() returns (and resets). A GPU backend queues the whole
  // step and returns at once; reading the loss every step would synchronise every step.
  virtual void train_step(const DatasetView& data, const int32_t* rows, int64_t count) {
    const BatchStats stats = compute_gradients(data, rows, count);
    apply_gradients();
    pending_.loss_sum += stats.loss_sum;
    pending_.correct += stats.correct;
    pending_.samples += stats.samples;
  }
  virtual BatchStats take_stats() { return std::exchange(pending_, BatchStats{}); }

  // A hint that `data` will be read many times (the training split of an in-memory run): a GPU
  // backend copies it to device memory once and later calls whose view lies inside it read that
  // copy. The caller keeps the bytes alive and unchanged until release_resident().
  virtual void keep_resident(const DatasetView& /*data*/) {}
  virtual void release_resident() {}

  // A hint that no work will come for a while (the caller is about to wait for data): threads
  // kept hot between steps should release their cores.
  virtual void rest() {}

  // Summed loss and correct predictions over every row of `data`; no gradients.
  virtual BatchStats evaluate(const DatasetView& data) = 0;
  // Arg-max class of every row of `data` into out[data.rows].
  virtual void predict(const DatasetView& data, uint8_t* out) = 0;
  // predict() and, beside it, the last layer's outputs (logits) of every row into
  // logits[data.rows * classes]: the classes are predict()'s, bit for bit. The default throws
  // InputError naming the backend (the CPU and CUDA backends give logits).
  virtual void predict_logits(const DatasetView& data, uint8_t* classes, float* logits);

  // For a worker group whose collective sums on GPU memory (NCCL, group_collective.h), so a
  // group's gradients and parameters never leave the GPUs. Host backends keep the defaults:
  // device_buffers() says device -1, the two gradient calls throw InputError naming the backend.
  struct DeviceBuffers {
    int device = -1;              // the GPU both arenas are on; -1: the backend is on the host
    float* parameters = nullptr;  // flat arenas in ParameterLayout order, zero padding between
    float* gradients = nullptr;   // tensors (a sum of arenas keeps the padding zero)
    int64_t count = 0;            // floats in each
  };
  // Waits for the backend's queued work and returns its arenas: until the next call into the
  // backend, the caller may read and write them from another stream of that device.
  virtual DeviceBuffers device_buffers() { return {}; }
  // A range of the gradient arena (in floats) and the event (a cudaEvent_t of the backend's
  // device) that completes once the queued backward pass has written that range.
  struct GradientPiece {
    int64_t offset = 0;
    int64_t count = 0;
    void* ready = nullptr;
  };
  // compute_gradients without waiting for it: queues forward and backward over `count` rows of
  // `data` (as compute_gradients) and returns the gradient arena's pieces in the order the
  // backward pass finishes them, the last layer first, so that a collective can sum one piece
  // while the earlier layers' backward still runs. The pieces cover the arena, and every call
  // returns the same ranges (members of a group issue the same collectives). count 0 queues zero
  // gradients (a member with no batch this step adds nothing). finish_gradients() then waits for
  // the backend's work and returns the batch statistics; in between, the caller may read and
  // write the gradient arena from its own stream once a piece's event has completed, and must
  // not call anything else on the backend. A caller whose collective failed may skip
  // finish_gradients (its wait could hang on a GPU that hangs): the next enqueue_gradients is
  // ordered after the unfinished one.
  // The pieces stay valid as long as the backend (they are the same every call).
  virtual const std::vector<GradientPiece>& enqueue_gradients(const DatasetView& data,
                                                              const int32_t* rows, int64_t count);
  virtual BatchStats finish_gradients();

 protected:
  BatchStats pending_;  // train_step's totals in the default implementation
};

// Throws InputError unless `data` fits `config` (row width, classes, labels when needed).
void check_model_data(const ModelConfig& config, const DatasetView& data, bool need_labels);

// The CPU backend: OpenBLAS sgemm for the dense layers, `threads` threads (0: all cores).
std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& model, const OptimizerConfig& opt,
                                          int threads);

// The CUDA backend on device `device`: parameters, gradients and Adam's state in device memory,
// every step on one stream (and replayed as a CUDA Graph). Throws InputError when this build has
// no CUDA or the device cannot be used.
std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& model, const OptimizerConfig& opt,
                                           Precision precision, int device = 0);

// Picks the backend: `Auto` is CUDA when a device is present, the CPU otherwise. Throws
// InputError when CUDA is asked for and cannot be had, saying why. A CUDA backend runs on
// `device` (a worker group's member m on its own GPU); the CPU backend ignores it.
std::unique_ptr<Backend> make_backend(BackendKind kind, const ModelConfig& model,
                                      const OptimizerConfig& opt, int threads,
                                      Precision precision = Precision::Fp32, int device = 0);

// InputError for a precision the backend can never give, on any machine (the CPU backend
// computes in fp32): what make_backend refuses first, for a caller that checks before it starts.
void check_backend_precision(BackendKind kind, Precision precision);

}  // namespace tandem
