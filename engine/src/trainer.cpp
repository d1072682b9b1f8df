#include "tandem/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <utility>

#include "model_finite.h"
#include "parameters_only.h"
#include "backend.h"
#include "checkpoint_count.h"
#include "file_io.h"
#include "metrics_log.h"
#include "pixels_finite.h"
#include "predictor.h"
#include "random.h"
#include "record_write.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Writes a run's state to its checkpoint, unless the run diverged (a NaN or infinite
// parameter): no reader takes such a file, and the one it would replace holds the last good
// state, of this run or of the run it resumed.
void save_run_state(const std::string& path, const Checkpoint& state) {
  if (!parameters_finite(state.model))
    throw InputError("training diverged: epoch " + std::to_string(state.epoch) +
                     "'s parameters are not finite (try a lower learning rate, or look for "
                     "NaN or infinite pixels in the data); " + path +
                     " was not written");
  save_checkpoint(path, state);
}

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

EvalResult to_eval(const BatchStats& stats) {
  EvalResult r;
  r.loss_sum = stats.loss_sum;
  r.samples = stats.samples;
  r.correct = stats.correct;
  if (stats.samples > 0) {
    r.loss_mean = stats.loss_sum / static_cast<double>(stats.samples);
    r.accuracy = static_cast<double>(stats.correct) / static_cast<double>(stats.samples);
  }
  return r;
}

// Epoch e's shuffle draws from its own stream, so a run resumed at epoch e shuffles as the
// uninterrupted run did without any saved generator state.
constexpr uint64_t kShuffleStreamBase = 1u << 20;

}  // namespace

Trainer::Trainer(TrainConfig config) : config_(std::move(config)) {
  config_.validate();
  backend_ = make_backend(config_.backend, config_.model, config_.optimizer, config_.threads,
                          config_.precision);
  if (!config_.resume_path.empty()) {
    resume(load_checkpoint(config_.resume_path, &config_.model), config_.resume_path);
  } else if (!config_.init_path.empty()) {
    backend_->set_parameters(load_checkpoint(config_.init_path, &config_.model).model);
  } else {
    backend_->set_parameters(Model::initialized(config_.model, config_.seed));
  }
}

Trainer::~Trainer() = default;

void Trainer::resume(const Checkpoint& ckpt, const std::string& source) {
  refuse_to_resume_parameters_only(ckpt, source);
  if (ckpt.model.config().layers != config_.model.layers)
    throw InputError(source + ": checkpoint holds model " + ckpt.model.config().describe() +
                     ", this run asks for " + config_.model.describe());
  if (ckpt.optimizer.kind != config_.optimizer.kind)
    throw InputError(source + ": checkpoint was trained with " + to_string(ckpt.optimizer.kind) +
                     ", this run asks for " + to_string(config_.optimizer.kind));
  backend_->set_parameters(ckpt.model);
  backend_->set_optimizer_state(ckpt.state, ckpt.step);
  epoch_ = ckpt.epoch;
  resumed_ = true;
  // A kept best epoch's checkpoint says how far its run trained; a rerun that trains nothing
  // saves that again, not the kept epoch (a second rerun would train the epochs after it).
  resumed_epochs_trained_ = epochs_reached(ckpt);
  // An earlier fit's state is not this one's (resume_state() describes the last fit).
  epochs_trained_ = -1;
  validation_rows_ = -1;
  best_.reset();
  best_is_current_ = false;
  last_diverged_ = false;
  last_scored_ = false;
  // The run's best so far: the checkpoint's own state when it was scored best (or was the kept
  // epoch at the end), else the best state saved beside it.
  resumed_best_ = ckpt.best;
  resumed_best_is_current_ = false;
  auto loss = ckpt.extra.find("validation_loss");
  if (!resumed_best_ && loss != ckpt.extra.end()) {
    // Compared with the new epochs' losses in fit(): a value that is no number is refused here,
    // naming the file (load_checkpoint checks the best state's own).
    try {
      size_t used = 0;
      const double value = std::stod(loss->second, &used);
      if (used != loss->second.size()) throw std::invalid_argument("trailing text");
      // -inf would stay the best against every later epoch, NaN against none.
      if (!std::isfinite(value)) throw std::invalid_argument("not finite");
    } catch (const std::exception&) {
      throw InputError(source + ": checkpoint metadata 'validation_loss' = '" + loss->second +
                       "' is not a finite number");
    }
    auto current = std::make_shared<Checkpoint>(ckpt);
    current->best.reset();
    resumed_best_ = std::move(current);
    resumed_best_is_current_ = true;
  }
}

std::string Trainer::backend_name() const { return backend_->name(); }
int Trainer::threads() const { return backend_->threads(); }

EvalResult Trainer::evaluate(const DatasetView& data) { return to_eval(backend_->evaluate(data)); }

Model Trainer::model() const {
  Model model(config_.model);
  backend_->get_parameters(model);
  return model;
}

namespace {

// `ckpt` with the validation loss it was scored at, and on how many rows: a resumed run compares
// its new epochs with it only when they are scored on as many.
Checkpoint scored(Checkpoint ckpt, double loss, int64_t validation_rows) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.17g", loss);
  ckpt.extra["validation_loss"] = text;
  ckpt.extra["validation_samples"] = std::to_string(validation_rows);
  return ckpt;
}

// The validation split's rows (0: none; -1: not known yet, left out) and what they are
// (TrainConfig::validation_split; empty: not said). From a directory of IDX files they are the
// training file's last rows, so a resumed run must split it the same way (tandem train
// --resume), and tandem eval holds as many out.
void label_validation(Checkpoint& ckpt, int64_t rows, const std::string& split) {
  if (rows >= 0) ckpt.extra["validation_rows"] = std::to_string(rows);
  if (split.empty()) ckpt.extra.erase("validation_split");
  else ckpt.extra["validation_split"] = split;
}

}  // namespace

Checkpoint Trainer::resume_state() const {
  Checkpoint ckpt;
  if (best_is_current_ || last_diverged_) {
    // A diverged epoch's state (parameters of NaN) is refused by every reader of the file, the
    // best beside it included: while the run has a finite best, that is what the file holds.
    ckpt = *best_;
  } else {
    ckpt = last_scored_ ? scored(checkpoint(), last_validation_loss_, validation_rows_)
                        : checkpoint();
    ckpt.best = best_;
  }
  // Once fit has ended, how far the run went is said beside a kept earlier epoch, so that
  // resuming the finished run (a requeued job, or Python's resume=state) trains nothing rather
  // than the epochs after the kept one once more.
  if (epochs_trained_ >= 0)
    ckpt.extra["epochs_trained"] = std::to_string(std::max(epochs_trained_, ckpt.epoch));
  // A best state carried over from a resumed file came with that file's labels. It was carried
  // only as scored on as many validation rows as this run's, which this run labels: its own
  // label, or none.
  label_validation(ckpt, validation_rows_, config_.validation_split);
  return ckpt;
}

Checkpoint Trainer::checkpoint() const {
  Checkpoint ckpt;
  ckpt.model = model();
  ckpt.optimizer = config_.optimizer;
  backend_->get_optimizer_state(ckpt.state);
  ckpt.step = backend_->step();
  ckpt.epoch = epoch_;
  ckpt.seed = config_.seed;
  ckpt.batch = config_.batch;
  ckpt.extra["shuffle"] = config_.shuffle ? "on" : "off";
  ckpt.extra["keep"] = config_.keep_best ? "best" : "last";
  label_validation(ckpt, validation_rows_, config_.validation_split);
  return ckpt;
}

namespace {

// The log is dropped when a write fails (record_write.h).
template <typename Write>
void log_or_drop(std::unique_ptr<MetricsLog>& metrics, Write&& write) {
  if (!write_record("training goes on without the metrics log", std::forward<Write>(write)))
    metrics.reset();  // and its steps' losses are no longer read back for it
}

// Data sets a run reads again and again stay on the device for the run (a GPU backend copies
// them once), and are let go when the run ends however it ends.
class ResidentData {
 public:
  ResidentData(Backend& backend, std::initializer_list<const DatasetView*> views) : backend_(backend) {
    for (const DatasetView* view : views)
      if (view->rows > 0) backend_.keep_resident(*view);
  }
  ~ResidentData() {
    try {
      backend_.release_resident();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem: releasing device data failed: %s\n", e.what());
    }
  }
  ResidentData(const ResidentData&) = delete;
  ResidentData& operator=(const ResidentData&) = delete;

 private:
  Backend& backend_;
};

}  // namespace

namespace {

// Each split against the model before anything is trained, named: the backend's own check of a
// batch did not say which split it came from.
void check_splits(const ModelConfig& model,
                  std::initializer_list<std::pair<const char*, const DatasetView*>> splits) {
  for (const auto& [name, view] : splits) {
    if (view->rows <= 0) continue;
    try {
      check_model_data(model, *view, true);
    } catch (const InputError& e) {
      throw InputError(std::string("the ") + name + " split: " + e.what());
    }
    // A NaN pixel trained on turns every parameter NaN within a step, silently; scored on, it
    // makes the validation loss NaN.
    check_pixels_finite(*view, 0, std::string("the ") + name + " split",
                        std::string(name) == "training" ? kNaNParameters : kNoLossScored);
  }
}

}  // namespace

TrainSummary Trainer::fit(const DatasetView& train, const DatasetView& validation,
                          const DatasetView& test) {
  if (train.rows <= 0)
    throw InputError(train.rows == 0 ? std::string("the training split is empty")
                                     : "a training view of " + std::to_string(train.rows) +
                                           " rows");
  if (train.rows > INT32_MAX) throw InputError("more than 2^31 training rows are not supported");
  check_splits(config_.model, {{"training", &train}, {"validation", &validation}, {"test", &test}});
  ResidentData resident(*backend_, {&train, &validation, &test});
  std::vector<int32_t> order;
  // In memory, a shuffled batch is a list of row indices: the backend gathers the rows itself.
  return train_epochs(train.rows, [&](int64_t epoch, const StepDone& done) {
    if (config_.shuffle)
      order = seeded_permutation(train.rows, config_.seed, kShuffleStreamBase + static_cast<uint64_t>(epoch));
    for (int64_t begin = 0; begin < train.rows; begin += config_.batch) {
      const int64_t n = std::min(config_.batch, train.rows - begin);
      if (config_.shuffle)
        backend_->train_step(train, order.data() + begin, n);
      else
        backend_->train_step(train.slice(begin, begin + n), nullptr, n);
      done(n);
    }
  }, validation, test);
}

TrainSummary Trainer::fit(BatchStream& train, const DatasetView& validation,
                          const DatasetView& test) {
  if (train.rows_per_epoch() == 0) throw InputError("the training stream yields no rows");
  check_splits(config_.model, {{"validation", &validation}, {"test", &test}});
  ResidentData resident(*backend_, {&validation, &test});
  return train_epochs(train.rows_per_epoch(), [&](int64_t epoch, const StepDone& done) {
    train.start_epoch(epoch);
    DatasetView batch;
    // The stream's reader threads need the cores while this thread waits for the next batch.
    // (They refuse a NaN pixel of a float32 store: ChunkManager::check_band_finite.)
    for (backend_->rest(); train.next(batch); backend_->rest()) {
      backend_->train_step(batch, nullptr, batch.rows);
      done(batch.rows);
    }
  }, validation, test);
}

TrainSummary Trainer::train_epochs(int64_t rows_per_epoch, const EpochRunner& run_epoch,
                                   const DatasetView& validation, const DatasetView& test) {
  // A second fit continues the run: after a fit that ended, as resuming its state would (its
  // epochs count, its best stays in the running, the kept state is where it goes on); after one
  // an exception ended (between_steps), from the steps it took. Either way the metrics log is
  // added to. It once started the epoch count over from the kept epoch, and truncated the log.
  if (epochs_trained_ >= 0) {
    resume(resume_state(), "the trainer's previous fit");
  } else if (validation_rows_ >= 0) {
    resumed_ = true;
    resumed_best_ = best_;  // still in the running (carried when scored on as many rows)
    resumed_best_is_current_ = false;  // the steps after it were taken
  }
  // A checkpoint that cannot be written is said now, not after the first epoch's work.
  if (!config_.checkpoint_path.empty()) check_replaceable(config_.checkpoint_path);
  // A resumed run that went as far as asked already (it kept an earlier epoch, and said how far
  // it went beside it) trains nothing: not the epochs after the kept one a second time.
  const int64_t last_epoch = resumed_epochs_trained_ >= config_.epochs
                                 ? std::min<int64_t>(epoch_, config_.epochs)
                                 : config_.epochs;
  std::unique_ptr<MetricsLog> metrics;
  // A resumed run adds to the metrics of the run it continues, from its checkpoint's step: the
  // records past it are of epochs it trains again. One that trains nothing keeps them all (they
  // are of epochs that stand: a finished run's, kept beside its earlier best).
  if (!config_.metrics_path.empty())
    metrics = std::make_unique<MetricsLog>(config_.metrics_path, resumed_,
                                           resumed_ && epoch_ < last_epoch ? backend_->step()
                                                                           : -1);

  TrainSummary summary;
  summary.backend = backend_->name();
  summary.threads = backend_->threads();
  double train_seconds = 0.0;
  const int64_t first_step = backend_->step();
  // The state with the lowest validation loss so far, tracked whenever there is a validation
  // split (a run kept as `last` still records it for a later run that keeps the best), and
  // carried over from a resumed run's checkpoint when it was scored on as many rows. The
  // members are what resume_state() (and so the checkpoint file) holds from here.
  best_.reset();
  best_loss_ = 0.0;
  best_is_current_ = false;
  last_diverged_ = false;
  last_scored_ = false;
  validation_rows_ = validation.rows;
  if (validation.rows > 0 && resumed_best_) {
    auto samples = resumed_best_->extra.find("validation_samples");
    if (samples != resumed_best_->extra.end() &&
        samples->second == std::to_string(validation.rows)) {
      best_ = resumed_best_;
      best_is_current_ = resumed_best_is_current_;
      best_loss_ = std::stod(best_->extra.at("validation_loss"));
    }
  }
  bool said_diverged = false;
  epochs_trained_ = -1;
  while (epoch_ < last_epoch) {
    const auto epoch_start = Clock::now();
    auto step_start = epoch_start;
    double loss_sum = 0.0;
    // The step's loss is read back only when someone looks at it: on a GPU that read waits for
    // the step, so without a listener the epoch's steps run back to back and the loss is read
    // once, at the end of the epoch.
    const bool report_steps = metrics != nullptr || static_cast<bool>(on_step);
    run_epoch(epoch_, [&](int64_t n) {
      if (between_steps) between_steps();
      if (!report_steps) return;
      const double step_loss = backend_->take_stats().loss_sum;
      loss_sum += step_loss;
      const auto now = Clock::now();
      const double seconds = std::chrono::duration<double>(now - step_start).count();
      step_start = now;
      StepReport report{backend_->step(), static_cast<int>(epoch_), step_loss, n,
                        static_cast<double>(n) / std::max(seconds, 1e-9)};
      if (metrics) log_or_drop(metrics, [&] { metrics->step(report); });
      if (on_step) on_step(report);
    });
    loss_sum += backend_->take_stats().loss_sum;
    const double epoch_seconds = seconds_since(epoch_start);
    train_seconds += epoch_seconds;
    summary.samples += rows_per_epoch;
    ++epoch_;
    ++summary.epochs;

    EpochReport report;
    report.epoch = static_cast<int>(epoch_);
    report.step = backend_->step();
    report.train_loss_mean = loss_sum / static_cast<double>(rows_per_epoch);
    summary.train_loss_mean = report.train_loss_mean;
    report.seconds = epoch_seconds;
    report.samples_per_s = static_cast<double>(rows_per_epoch) / std::max(epoch_seconds, 1e-9);
    // The members change together once the epoch is scored: an exception before (from the
    // evaluation) leaves them describing the last epoch completed, as the checkpoint file does.
    bool new_best = false;
    if (validation.rows > 0) {
      report.validation = evaluate(validation);
      const double loss = report.validation.loss_sum;
      // NaN compares false with everything: a diverged epoch must never stand as the lowest, and
      // must not keep a later finite epoch from being kept.
      if (!best_ || (std::isfinite(loss) && !(loss >= best_loss_))) {
        best_ = std::make_shared<const Checkpoint>(scored(checkpoint(), loss, validation.rows));
        best_loss_ = loss;
        new_best = true;
      }
    }
    best_is_current_ = new_best;
    last_diverged_ = validation.rows > 0 && !std::isfinite(report.validation.loss_sum) &&
                     best_ && std::isfinite(best_loss_);
    if (last_diverged_ && !said_diverged && !config_.checkpoint_path.empty()) {
      said_diverged = true;
      std::fprintf(stderr,
                   "tandem: epoch %lld's validation loss is not finite; the checkpoint holds "
                   "the best epoch's state (epoch %lld) instead\n",
                   static_cast<long long>(epoch_), static_cast<long long>(best_->epoch));
    }
    last_scored_ = validation.rows > 0;
    last_validation_loss_ = report.validation.loss_sum;
    if (!config_.checkpoint_path.empty()) save_run_state(config_.checkpoint_path, resume_state());
    if (metrics) log_or_drop(metrics, [&] { metrics->epoch(report); });
    if (on_epoch) on_epoch(report);
  }
  summary.steps = backend_->step() - first_step;
  // Keeping the best: the backend goes back to it, and the checkpoint holds it (resuming it
  // continues from the kept epoch).
  const bool restore = config_.keep_best && best_ && !best_is_current_;
  const int64_t trained_to = epoch_;
  if (restore) {
    backend_->set_parameters(best_->model);
    backend_->set_optimizer_state(best_->state, best_->step);
    epoch_ = best_->epoch;
    best_is_current_ = true;
  }
  summary.kept_epoch = epoch_;
  epochs_trained_ = std::max({trained_to, resumed_epochs_trained_, epoch_});
  // The file holds the kept epoch, with how far the run went beside it (resume_state()).
  if (!config_.checkpoint_path.empty() && (summary.epochs == 0 || restore))
    save_run_state(config_.checkpoint_path, resume_state());
  summary.seconds = train_seconds;
  summary.samples_per_s = train_seconds > 0 ? static_cast<double>(summary.samples) / train_seconds : 0.0;
  if (validation.rows > 0) summary.validation = evaluate(validation);
  if (test.rows > 0) summary.test = evaluate(test);
  return summary;
}

EvalResult evaluate_model(const Model& model, const DatasetView& data, int threads) {
  auto backend = make_cpu_backend(model.config(), OptimizerConfig{}, threads);
  backend->set_parameters(model);
  return to_eval(backend->evaluate(data));
}

std::vector<uint8_t> predict(const Model& model, const DatasetView& data, int threads) {
  check_model_data(model.config(), data, false);  // before the output is sized by its rows
  std::vector<uint8_t> out(static_cast<size_t>(data.rows));
  predict_in_blocks(model, data, threads, out.data(), nullptr);
  return out;
}

}  // namespace tandem
