// Single-process training and evaluation: the embeddable entry point of the engine.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/model.h"
#include "tandem/export.h"

namespace tandem {

struct TANDEM_API EvalResult {
  double loss_sum = 0.0;   // the seed's summed clipped cross-entropy
  double loss_mean = 0.0;  // per sample
  double accuracy = 0.0;
  int64_t correct = 0;
  int64_t samples = 0;
};

struct TANDEM_API StepReport {
  int64_t step = 0;        // global step after this update
  int epoch = 0;           // 0-based epoch this step belongs to
  double loss_sum = 0.0;   // summed over the batch
  int64_t samples = 0;
  double samples_per_s = 0.0;  // this step's own rate
};

struct TANDEM_API EpochReport {
  int epoch = 0;  // 1-based count of epochs completed
  int64_t step = 0;
  double train_loss_mean = 0.0;
  double samples_per_s = 0.0;
  double seconds = 0.0;
  EvalResult validation;
};

struct TANDEM_API TrainSummary {
  std::string backend;
  int threads = 0;
  int epochs = 0;          // epochs trained by this call
  int64_t kept_epoch = 0;  // the epoch whose parameters the model holds now (see keep_best)
  int64_t steps = 0;       // optimizer steps taken by this call
  int64_t samples = 0;
  double seconds = 0.0;  // training time, excluding evaluation
  double samples_per_s = 0.0;
  double train_loss_mean = 0.0;  // the last epoch's (its loss per sample); 0 when none trained
  EvalResult validation;
  EvalResult test;
};

class Backend;  // internal

class TANDEM_API Trainer {
 public:
  // Builds the backend and the model: from `init_path` or `resume_path` when given, otherwise
  // initialised from the seed. Throws InputError for a bad configuration or checkpoint. Resuming
  // takes the checkpoint's parameters, optimizer state, step and epochs; the seed, batch and
  // shuffle stay this config's, so give the checkpoint's (Checkpoint::seed, batch, extra
  // "shuffle", as tandem train --resume does) for the uninterrupted run's bits.
  explicit Trainer(TrainConfig config);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Continues the run saved in `checkpoint` instead (what resume_path does, for a checkpoint
  // already in memory): parameters, optimizer state, step and epochs done. `source` names it in
  // errors: InputError when its model or optimizer differs from this run's.
  void resume(const Checkpoint& checkpoint, const std::string& source);

  std::function<void(const StepReport&)> on_step;
  std::function<void(const EpochReport&)> on_epoch;
  // Called after each step is queued; unlike on_step it reads nothing back from the device, so
  // it costs a GPU run nothing. An exception it throws ends fit with that exception, the trainer
  // keeping the steps already taken (Python's tandem.train answers Ctrl-C through it).
  std::function<void()> between_steps;

  // Trains up to config.epochs epochs in total (a resumed run counts the epochs it already did,
  // and one that went as far already, though it kept an earlier epoch, trains none),
  // evaluating the validation split after every epoch and the test split (if not empty) at the
  // end, on the kept parameters (config.keep_best). The checkpoint is written after every epoch
  // and, at the end, holds the kept state (so resuming it continues from the kept epoch). The
  // best is chosen among the epochs of this call and, for a resumed run, the best its checkpoint
  // recorded when that was scored on a validation split of as many rows. An epoch whose
  // validation loss is not finite is never chosen over one whose loss is. Called again, fit
  // continues the run (the metrics log added to): after a fit that ended, as resuming
  // resume_state() would; after one that between_steps ended, from the parameters its steps
  // reached, the interrupted epoch trained again from its first batch (its batches before the
  // interruption a second time).
  TrainSummary fit(const DatasetView& train, const DatasetView& validation,
                   const DatasetView& test);
  // The same, with training batches from a stream (a persisted store through the chunk manager).
  TrainSummary fit(BatchStream& train, const DatasetView& validation, const DatasetView& test);

  EvalResult evaluate(const DatasetView& data);
  // Current parameters and optimizer state, as a checkpoint would hold them.
  Checkpoint checkpoint() const;
  // After fit: what its checkpoint file holds (written or not), the state to resume the run
  // from, carrying the run's best so far, so that a resumed run keeps the best across both
  // calls. The kept state itself when fit restored the best (config.keep_best), saying how far
  // the run went (metadata epochs_trained): resumed with as many epochs, it trains none.
  Checkpoint resume_state() const;
  Model model() const;
  const TrainConfig& config() const { return config_; }
  std::string backend_name() const;
  int threads() const;

 private:
  // Called after each optimizer step is queued, with the batch's rows.
  using StepDone = std::function<void(int64_t)>;
  // Runs one epoch's steps, calling StepDone after each.
  using EpochRunner = std::function<void(int64_t epoch, const StepDone&)>;
  TrainSummary train_epochs(int64_t rows_per_epoch, const EpochRunner& run_epoch,
                            const DatasetView& validation, const DatasetView& test);

  TrainConfig config_;
  std::unique_ptr<Backend> backend_;
  int64_t epoch_ = 0;
  bool resumed_ = false;
  std::shared_ptr<const Checkpoint> resumed_best_;  // the resumed run's best so far
  bool resumed_best_is_current_ = false;            // ... which is the state it resumed from
  int64_t resumed_epochs_trained_ = 0;  // how far the resumed run had trained (its checkpoint's)
  // The run as fit leaves it after each epoch, what resume_state() builds on:
  std::shared_ptr<const Checkpoint> best_;  // the best state so far (null: none scored)
  double best_loss_ = 0.0;                  // its validation loss
  bool best_is_current_ = false;            // the backend holds it
  bool last_diverged_ = false;       // the last epoch's loss was not finite, the best's was
  bool last_scored_ = false;         // the last epoch was scored ...
  double last_validation_loss_ = 0.0;  // ... at this loss
  int64_t validation_rows_ = -1;       // ... on this many rows (-1: train() has not run)
  int64_t epochs_trained_ = -1;  // once fit has ended: how far the run went (-1: not ended)
};

// Evaluates a model on the CPU with `threads` threads (0: all cores).
TANDEM_API EvalResult evaluate_model(const Model& model, const DatasetView& data, int threads = 0);

// Predicted class of every row (the arg-max of its logits, first maximum). InputError naming the
// first row that has none: a NaN or infinite pixel, or pixels so large that its logits are not
// finite.
TANDEM_API std::vector<uint8_t> predict(const Model& model, const DatasetView& data,
                                        int threads = 0);

}  // namespace tandem
