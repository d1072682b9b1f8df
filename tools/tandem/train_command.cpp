// tandem train: single-process training on a data set directory of MNIST-format IDX files.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "json_text.h"
#include "number_checks.h"
#include "parameters_only.h"
#include "chunk_manager.h"
#include "batch_count.h"
#include "checkpoint_count.h"
#include "checkpoint_format.h"
#include "commands.h"
#include "file_io.h"
#include "fit_divergence.h"
#include "hidden_widths.h"
#include "idx_reader.h"
#include "json_output.h"
#include "progress_line.h"
#include "resumed_settings.h"
#include "run_dir_lock.h"
#include "stop_signals.h"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

struct TrainOptions {
  std::string data = default_data_dir();
  std::string backend = "auto";
  std::string precision = "fp32";
  std::string hidden = "100";
  std::string optimizer = "adam";
  std::string shuffle = "on";
  std::string keep = "best";
  int64_t validation_rows = 5000;
  int64_t memory_budget_mib = 256;
  bool json = false;
  TrainConfig config;
  // Options a resumed run takes from its checkpoint unless they are given.
  CLI::Option* hidden_option = nullptr;
  CLI::Option* optimizer_option = nullptr;
  CLI::Option* lr_option = nullptr;
  CLI::Option* batch_option = nullptr;
  CLI::Option* seed_option = nullptr;
  CLI::Option* shuffle_option = nullptr;
  CLI::Option* keep_option = nullptr;
  CLI::Option* validation_rows_option = nullptr;
  CLI::Option* memory_budget_option = nullptr;
  CLI::Option* epochs_option = nullptr;  // (only to say whether --epochs was given)
};

// A resumed run continues the checkpointed one: what the command line leaves out comes from the
// checkpoint (its hidden widths, optimizer, learning rate, batch, seed and shuffle), and what it
// gives differently is said, since the run then no longer continues as it would have. Returns the
// checkpoint, read once: the trainer resumes from it.
Checkpoint continue_checkpointed_run(TrainOptions& o) {
  Checkpoint ckpt = load_checkpoint(o.config.resume_path);
  // Before anything is said of continuing it (the trainer would refuse it after those notes).
  refuse_to_resume_parameters_only(ckpt, o.config.resume_path);
  TrainConfig& config = o.config;
  // --epochs counts the run's epochs in all: one the checkpoint has reached already trains
  // nothing (Trainer::fit, by epochs_reached: a run that kept an earlier epoch does not train
  // the epochs after it again), and the checkpoint is evaluated (a requeued job's rerun of a
  // finished run). Said, since it exits 0 as if the run had gone on. (--epochs 0 asks for just
  // that, unsaid.)
  const int64_t reached = epochs_reached(ckpt);
  if (config.epochs > 0 && config.epochs <= reached) {
    std::fprintf(stderr,
                 "tandem train: the run in %s is at epoch %lld, and --epochs %d%s counts the "
                 "run's epochs in all: nothing to train; evaluating its checkpoint\n",
                 config.resume_path.c_str(), static_cast<long long>(reached), config.epochs,
                 o.epochs_option->count() == 0 ? " (the default)" : "");
  }
  auto note = [&](const std::string& flag, const std::string& given, const std::string& theirs) {
    if (given != theirs)
      std::fprintf(stderr, "tandem train: resuming with %s %s; the checkpoint's run used %s\n",
                   flag.c_str(), given.c_str(), theirs.c_str());
  };
  const auto& layers = ckpt.model.config().layers;
  std::string hidden;
  for (size_t i = 1; i + 1 < layers.size(); ++i) hidden += (i > 1 ? "," : "") + std::to_string(layers[i]);
  if (o.hidden_option->count() == 0) o.hidden = hidden;
  // (config holds the command line's optimizer and shuffle already: run_train parsed them.)
  GivenSettings given;
  given.optimizer = o.optimizer_option->count() > 0;
  given.learning_rate = o.lr_option->count() > 0;
  given.batch = o.batch_option->count() > 0;
  given.seed = o.seed_option->count() > 0;
  given.shuffle = o.shuffle_option->count() > 0;
  given.keep = o.keep_option->count() > 0;
  for (const DifferentSetting& d :
       take_checkpointed_settings(ckpt, given, "checkpoint " + o.config.resume_path, config))
    note(d.name == "learning_rate" ? "--lr" : "--" + d.name, d.given, d.theirs);
  // From IDX files the validation split is the training file's last --validation-rows rows:
  // another count trains on other rows (and drops the carried best, scored on another split).
  // Older checkpoints name it only when scored (validation_samples).
  std::optional<int64_t> rows = checkpoint_count(ckpt, "validation_rows");
  if (!rows) rows = checkpoint_count(ckpt, "validation_samples");
  if (rows) {
    if (o.validation_rows_option->count() == 0) o.validation_rows = *rows;
    else note("--validation-rows", std::to_string(o.validation_rows), std::to_string(*rows));
  }
  return ckpt;
}

// --checkpoint is written over after the first epoch. A file there that is no Tandem checkpoint
// (one of the data's own files, a model written elsewhere, notes) is refused before anything
// runs; a checkpoint that this run does not resume is replaced, and said so.
void check_checkpoint_path(const std::string& path, const std::string& resume_path) {
  std::error_code ec;
  if (path.empty() || !std::filesystem::exists(path, ec)) return;
  if (!resume_path.empty() && std::filesystem::equivalent(path, resume_path, ec)) return;
  refuse_to_write_over_other_than_a_checkpoint(path, "--checkpoint");
  std::fprintf(stderr, "tandem train: --checkpoint %s holds a checkpoint already: this run "
               "writes over it after its first epoch (--resume %s would continue it, unless it "
               "holds parameters alone)\n", path.c_str(), path.c_str());
}

// One run per checkpoint file: two runs given one --checkpoint each said they had saved it, the
// last writer's file passing for the other's. Locked by FILE.lock beside the file written (a
// link's target: two runs given the link and its target write one file), flock: it goes with
// its process however that ends. The lock file is removed when the run ends (one a killed run
// left too, which this run took).
class CheckpointLock {
 public:
  explicit CheckpointLock(const std::string& path) {
    if (path.empty()) return;
    // (A directory that is not there, or a device, is refused by the trainer's check, which
    // names it.)
    std::error_code ec;
    const std::string target = replacement_target(path);
    const std::filesystem::path dir = std::filesystem::path(target).parent_path();
    const bool regular_or_none = !std::filesystem::exists(target, ec) ||
                                 std::filesystem::is_regular_file(target, ec);
    if (regular_or_none && std::filesystem::is_directory(dir.empty() ? "." : dir, ec))
      lock_.emplace(path, "--checkpoint", target + ".lock");
  }
  ~CheckpointLock() {
    if (lock_) lock_->remove_file();
  }
  CheckpointLock(const CheckpointLock&) = delete;
  CheckpointLock& operator=(const CheckpointLock&) = delete;

 private:
  std::optional<RunDirLock> lock_;
};

void run_train(TrainOptions& o) {
  TrainConfig& config = o.config;
  check_checkpoint_path(config.checkpoint_path, config.resume_path);
  const CheckpointLock checkpoint_lock(config.checkpoint_path);
  config.backend = parse_backend(o.backend);
  config.precision = parse_precision(o.precision);
  config.optimizer.kind = parse_optimizer(o.optimizer);
  config.shuffle = o.shuffle == "on";
  config.keep_best = o.keep == "best";
  // A resumed run takes from its checkpoint what the command line does not give (these included).
  std::optional<Checkpoint> resume_from;
  if (!config.resume_path.empty()) resume_from = continue_checkpointed_run(o);
  // --data is either a directory of IDX files (read into memory) or a dataset store (the training
  // split streamed through the chunk manager, validation and test read into memory).
  DataSplits data;
  std::unique_ptr<BatchStream> stream;
  if (is_dataset_store(o.data)) {
    if (o.validation_rows_option->count() > 0)
      throw InputError("--validation-rows is for a directory of IDX files: the store " + o.data +
                       " holds its own validation split (tandem prepare --validation-rows)");
    data = load_store_eval_splits(o.data);
    StreamOptions so;
    so.batch_rows = config.batch;
    so.shuffle = config.shuffle;
    so.seed = config.seed;
    so.memory_budget = static_cast<size_t>(o.memory_budget_mib) << 20;  // (kMaxMemoryBudgetMib)
    // The CPU backend reads the batches where they are: no page-locked memory, no CUDA context.
    so.pin_for_device = config.backend == BackendKind::Cpu ? -1 : 0;
    stream = open_store_stream(o.data, so);
    // (The trainer would say only that its stream yields no rows.)
    if (stream->rows_per_epoch() == 0)
      throw InputError(o.data + ": the train split has no rows: nothing to train on");
    config.validation_split = "store";  // (its own split: not rows eval holds out of IDX files)
    config.model = model_with_hidden(stream->features(), o.hidden, stream->num_classes());
  } else {
    // IDX files are read into memory whole: nothing is read ahead, and the budget meant nothing.
    if (o.memory_budget_option->count() > 0 && holds_idx_images(o.data))
      throw InputError("--memory-budget is for a dataset store (its chunks are read ahead): " +
                       o.data + " is read into memory whole (tandem prepare makes a store)");
    data = load_mnist_splits(o.data, o.validation_rows);
    config.validation_split = "idx-last-rows";  // (what tandem eval holds out of the same files)
    config.model = model_with_hidden(data.train.features(), o.hidden, data.train.num_classes());
  }
  const int64_t train_rows = stream ? stream->rows_per_epoch() : data.train.rows();

  // The checkpoint already read goes to the trainer as it is, not by its path (read again).
  // Checked first with the path in: --init and --resume together are refused.
  config.validate();
  const std::string resume_path = std::exchange(config.resume_path, std::string());
  Trainer trainer(config);
  if (resume_from) trainer.resume(*resume_from, resume_path);
  resume_from.reset();  // the trainer holds what it needs of it
  ProgressLine progress;
  const int64_t steps_per_epoch = batch_count(train_rows, config.batch);
  // Counted here, not from the global step: a run resumed with another --batch took its earlier
  // epochs' steps at another size.
  int progress_epoch = -1;
  int64_t in_epoch = 0;
  trainer.on_step = [&](const StepReport& r) {
    if (r.epoch != progress_epoch) {
      progress_epoch = r.epoch;
      in_epoch = 0;
    }
    ++in_epoch;
    progress.update("epoch " + std::to_string(r.epoch + 1) + "/" + std::to_string(config.epochs) +
                    "  step " + std::to_string(in_epoch) + "/" + std::to_string(steps_per_epoch) +
                    "  loss/sample " + std::to_string(r.loss_sum / static_cast<double>(r.samples)) +
                    "  " + human(r.samples_per_s) + " samples/s");
  };
  // Whether this run has written its checkpoint (the trainer saves before on_epoch): a file
  // already there when it started may be another run's.
  bool checkpointed = false;
  trainer.on_epoch = [&](const EpochReport& r) {
    checkpointed = !config.checkpoint_path.empty();
    char scored[96] = "no validation split";
    if (r.validation.samples > 0)
      std::snprintf(scored, sizeof(scored), "validation loss %.1f  accuracy %.4f",
                    r.validation.loss_sum, r.validation.accuracy);
    char line[256];
    std::snprintf(line, sizeof(line), "epoch %d/%d  train loss/sample %.4f  %s  %s samples/s",
                  r.epoch, config.epochs, r.train_loss_mean, scored,
                  human(r.samples_per_s).c_str());
    progress.print_line(line);
  };
  // Resuming from the file it checkpoints to, a run's file holds its last epoch from the start.
  std::error_code no_file;
  const bool resumed_in_place =
      !resume_path.empty() && !config.checkpoint_path.empty() &&
      std::filesystem::equivalent(resume_path, config.checkpoint_path, no_file);
  // SIGINT, SIGTERM or SIGHUP end the run between two steps, not inside a checkpoint's write
  // (which a default-handled signal could cut, leaving its temporary file): the checkpoint then
  // holds the state after the last epoch completed, whole, and --resume goes on from it.
  const std::atomic<bool>& stop = stop_on_signals();
  auto end_if_stopped = [&] {
    if (!stop.load()) return;
    progress.finish();
    const std::string& path = config.checkpoint_path;
    std::string saved = "the checkpoint " + path + " holds the last epoch completed (--resume it "
                        "to go on)";
    if (path.empty()) saved = "nothing was saved (no --checkpoint)";
    else if (!checkpointed && !resumed_in_place)
      saved = "no epoch was completed, nothing was saved";
    throw Error(std::string("stopped by ") + stop_signal_name() + "; " + saved);
  };
  trainer.between_steps = end_if_stopped;
  const TrainSummary s =
      stream ? trainer.fit(*stream, data.validation.view(), data.test.view())
             : trainer.fit(data.train.view(), data.validation.view(), data.test.view());
  // fit returned: the checkpoint is written (also by a run of no epoch: the kept state).
  checkpointed = !config.checkpoint_path.empty();
  end_if_stopped();  // a signal during the last evaluations is not passed over either
  progress.finish();
  if (o.json) {
    nlohmann::json j{{"backend", s.backend},     {"threads", s.threads},
                     {"model", config.model.describe()},
                     {"batch", config.batch},    {"epochs", s.epochs},
                     {"kept_epoch", s.kept_epoch},
                     {"steps", s.steps},         {"samples", s.samples},
                     {"seconds", s.seconds},     {"samples_per_s", s.samples_per_s},
                     {"validation", to_json(s.validation)}, {"test", to_json(s.test)}};
    std::printf("%s\n", json_text(j).c_str());
  } else {
    std::printf("trained %s on %s (%s, %d threads): %d epochs, %lld steps, %.1f s, %s samples/s\n",
                config.model.describe().c_str(), data.source.c_str(), s.backend.c_str(), s.threads,
                s.epochs, static_cast<long long>(s.steps), s.seconds, human(s.samples_per_s).c_str());
    std::printf("kept the parameters of epoch %lld (%s)\n", static_cast<long long>(s.kept_epoch),
                s.validation.samples == 0 ? "the last: there is no validation split"
                : config.keep_best        ? "lowest validation loss"
                                          : "the last");
    auto print_split = [](const char* label, const EvalResult& r) {
      if (r.samples == 0)
        std::printf("%s none (no rows in this split)\n", label);
      else
        std::printf("%s loss %.1f (%.4f/sample), accuracy %.4f\n", label, r.loss_sum,
                    r.loss_mean, r.accuracy);
    };
    print_split("validation:", s.validation);
    print_split("test:      ", s.test);
  }
  // A run whose kept parameters score NaN diverged (fit_divergence.h).
  if (const std::string why = why_diverged(s); !why.empty())
    throw InputError("training diverged: " + why + " (try a lower --lr; or the data holds NaN or "
                     "infinite pixels, a store's fill value for its missing chunks say: tandem "
                     "inspect shows their min and max)");
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto o = std::make_shared<TrainOptions>();
  CLI::App* cmd = app.add_subcommand("train", "Train a model in this process");
  cmd->add_option("--data", o->data,
                  "Directory of MNIST-format IDX files (raw or .gz), or a dataset store (tandem prepare)")
      ->capture_default_str();
  cmd->add_option("--backend", o->backend, "cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "CUDA matrix products: fp32, or tf32 / bf16 tensor cores (float32 parameters "
                  "and Adam state either way)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))->capture_default_str();
  o->hidden_option = cmd->add_option("--hidden", o->hidden,
                                     "Hidden layer widths, e.g. 100, 256,128 or 256x128")
      ->capture_default_str();
  o->optimizer_option = cmd->add_option("--optimizer", o->optimizer, "adam or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}))->capture_default_str();
  o->lr_option = cmd->add_option("--lr", o->config.optimizer.learning_rate, "Learning rate")
                     ->check(positive_number())  // (as launch's: said naming --lr)
                     ->capture_default_str();
  o->batch_option = cmd->add_option("--batch", o->config.batch, "Batch size")->check(positive_number())
      ->capture_default_str();
  o->epochs_option = cmd->add_option("--epochs", o->config.epochs,
                                     "Epochs in total (a resumed run counts its own)")
      ->check(non_negative_number())->capture_default_str();
  o->seed_option = cmd->add_option("--seed", o->config.seed, "Seed for initialisation and shuffling")
      ->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--threads", o->config.threads, "Threads (0: all cores)")
      ->check(non_negative_number())->capture_default_str();
  o->shuffle_option = cmd->add_option("--shuffle", o->shuffle, "on, or off for store order")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  o->keep_option = cmd->add_option("--keep", o->keep,
                  "Parameters to keep at the end: best (lowest validation loss) or last epoch's")
      ->check(CLI::IsMember({"best", "last"}))->capture_default_str();
  o->memory_budget_option = cmd->add_option("--memory-budget", o->memory_budget_mib,
                  "MiB of a store's chunks read ahead (two of its chunk rows at least)")
      ->check(number_in(1, double(kMaxMemoryBudgetMib), false, "MIB"))->capture_default_str();
  o->validation_rows_option = cmd->add_option("--validation-rows", o->validation_rows,
                  "Last training rows held out for validation")->capture_default_str();
  cmd->add_option("--init", o->config.init_path, "Start from the parameters of this checkpoint")
      ->check(CLI::ExistingFile);
  cmd->add_option("--resume", o->config.resume_path,
                  "Continue the run saved in this checkpoint (its model, optimizer, learning rate, "
                  "batch, seed, shuffle and, from IDX files, validation rows unless given)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--checkpoint", o->config.checkpoint_path,
                  "Write a checkpoint (safetensors) here after every epoch");
  cmd->add_option("--metrics", o->config.metrics_path, "Write JSON lines per step and epoch here");
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary");
  cmd->callback([o] { run_train(*o); });
}

}  // namespace tandem::cli
