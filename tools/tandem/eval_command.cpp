// tandem eval: loss and accuracy of a saved model on one split of a data set.
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>

#include "checkpoint_count.h"
#include "json_text.h"
#include "number_checks.h"
#include "commands.h"
#include "json_output.h"
#include "pixels_finite.h"
#include "tandem/tandem.h"

namespace tandem::cli {

namespace {

struct EvalOptions {
  std::string model;
  std::string data = default_data_dir();
  std::string split = "test";
  int64_t validation_rows = 5000;
  int threads = 0;
  bool json = false;
  CLI::Option* validation_rows_option = nullptr;
};

// A store's training split can be far larger than memory (prepare --copies 20): streamed through
// the chunk manager in store order, batch by batch, the sums added up.
EvalResult evaluate_store_training_split(const Model& model, const std::string& path,
                                         int threads) {
  StreamOptions so;
  so.batch_rows = 10000;
  so.shuffle = false;
  so.pin_for_device = -1;  // evaluated on the CPU
  const std::unique_ptr<BatchStream> stream = open_store_stream(path, so);
  EvalResult total;
  DatasetView batch;
  stream->start_epoch(0);
  // (A float32 store's NaN pixel is refused by the stream itself, naming the store and row.)
  while (stream->next(batch)) {
    const EvalResult r = evaluate_model(model, batch, threads);
    total.loss_sum += r.loss_sum;
    total.correct += r.correct;
    total.samples += r.samples;
  }
  if (total.samples > 0) {
    total.loss_mean = total.loss_sum / double(total.samples);
    total.accuracy = double(total.correct) / double(total.samples);
  }
  return total;
}

void run_eval(const EvalOptions& o) {
  const Checkpoint ckpt = load_checkpoint(o.model);
  const bool store = is_dataset_store(o.data);
  // As tandem train says: a store's split is its own, and the option would be silently ignored.
  if (store && o.validation_rows_option->count() > 0)
    throw InputError("--validation-rows is for a directory of IDX files: the store " + o.data +
                     " holds its own validation split (tandem prepare --validation-rows)");
  // From IDX files the validation split is the training file's last rows, as many as the model
  // was trained without when tandem train split them off IDX files (it says so in its
  // checkpoints; a count of the Python API's own validation arrays or of a store's split says
  // nothing of these files): the default count would score a model trained with
  // --validation-rows 0 on rows it learned from.
  int64_t validation_rows = o.validation_rows;
  const auto said = ckpt.extra.find("validation_split");
  const std::optional<int64_t> held_out =
      said != ckpt.extra.end() && said->second == "idx-last-rows"
          ? checkpoint_count(ckpt, "validation_rows")
          : std::nullopt;
  // A count without a label (tandem train of an earlier version, or the Python API): not used,
  // but said, since for an earlier tandem train on IDX files it is the right one to give.
  const std::optional<int64_t> unlabelled = said == ckpt.extra.end()
                                                ? checkpoint_count(ckpt, "validation_rows")
                                                : std::nullopt;
  if (!store && unlabelled && o.split != "test" &&
      o.validation_rows_option->count() == 0 && *unlabelled != validation_rows)
    std::fprintf(stderr, "tandem eval: %s says it held out %lld validation rows, not that they "
                 "were these files' (tandem train of an earlier version, or the Python API): "
                 "the split "
                 "holds the default %lld; give --validation-rows %lld if it was trained on them\n",
                 o.model.c_str(), static_cast<long long>(*unlabelled),
                 static_cast<long long>(validation_rows), static_cast<long long>(*unlabelled));
  if (!store && held_out) {
    if (o.validation_rows_option->count() == 0) validation_rows = *held_out;
    else if (validation_rows != *held_out)
      std::fprintf(stderr, "tandem eval: --validation-rows %lld, but %s was trained with %lld "
                   "(its validation split holds other rows than the run's)\n",
                   static_cast<long long>(validation_rows), o.model.c_str(),
                   static_cast<long long>(*held_out));
  }
  const DataSplits data = store ? load_store_eval_splits(o.data)
                                : load_mnist_splits(o.data, validation_rows);
  const bool streamed = store && o.split == "train";
  const Dataset& split = o.split == "train" ? data.train
                         : o.split == "validation" ? data.validation : data.test;
  if (!streamed && split.rows() == 0)
    throw InputError("the " + o.split + " split of " + o.data + " has no rows: nothing to "
                     "evaluate");
  const EvalResult r = streamed ? evaluate_store_training_split(ckpt.model, o.data, o.threads)
                                : evaluate_model(ckpt.model, split.view(), o.threads);
  if (r.samples == 0)
    throw InputError("the train split of " + o.data + " has no rows: nothing to evaluate");
  // Logits that overflow (parameters or pixels past what the model can take: a run that
  // diverged, say) give no loss, and their rows no predicted class (predict refuses them): not
  // a result to report.
  // A pixel that is NaN or infinite makes the loss NaN: the row is named, not the model blamed.
  // (Streamed, the store's readers refused such a pixel already: ChunkManager.)
  if (!std::isfinite(r.loss_sum) && !streamed)
    check_pixels_finite(split.view(), 0, "the " + o.split + " split of " + o.data, kNoLossScored);
  if (!std::isfinite(r.loss_sum))
    throw InputError("model " + o.model + ": its loss on the " + o.split + " split of " +
                     o.data + " is not finite (its logits overflow: parameters or pixels too "
                     "large for it, a run that diverged?); no loss or accuracy to report");
  if (o.json) {
    nlohmann::json j = to_json(r);
    j["split"] = o.split;
    j["model"] = ckpt.model.config().describe();
    std::printf("%s\n", json_text(j).c_str());
  } else {
    std::printf("%s split of %s: %lld samples, loss %.2f (%.4f/sample), accuracy %.4f\n",
                o.split.c_str(), data.source.c_str(), static_cast<long long>(r.samples),
                r.loss_sum, r.loss_mean, r.accuracy);
  }
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  CLI::App* cmd = app.add_subcommand("eval", "Evaluate a saved model on a data split");
  cmd->add_option("--model", o->model, "Checkpoint file (safetensors)")->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--data", o->data, "Directory of MNIST-format IDX files, or a dataset store")->capture_default_str();
  cmd->add_option("--split", o->split, "train, validation or test")
      ->check(CLI::IsMember({"train", "validation", "test"}))->capture_default_str();
  o->validation_rows_option =
      cmd->add_option("--validation-rows", o->validation_rows,
                      "Validation rows of IDX files (default: as many as the model's training "
                      "run held out, else 5000)");
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one line of JSON");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace tandem::cli
