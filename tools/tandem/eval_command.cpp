// tandem eval: loss and accuracy of a saved model on one split of a data set.
#include <cstdio>
#include <memory>

#include "number_checks.h"
#include "commands.h"
#include "json_output.h"
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
};

void run_eval(const EvalOptions& o) {
  const Checkpoint ckpt = load_checkpoint(o.model);
  const bool store = is_dataset_store(o.data);
  if (store && o.split == "train")
    throw InputError(o.data + ": evaluating a store's training split is not supported; use "
                     "--split validation or test");
  const DataSplits data = store ? load_store_eval_splits(o.data)
                                : load_mnist_splits(o.data, o.validation_rows);
  const Dataset& split = o.split == "train" ? data.train
                         : o.split == "validation" ? data.validation : data.test;
  const EvalResult r = evaluate_model(ckpt.model, split.view(), o.threads);
  if (o.json) {
    nlohmann::json j = to_json(r);
    j["split"] = o.split;
    j["model"] = ckpt.model.config().describe();
    std::printf("%s\n", j.dump().c_str());
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
  cmd->add_option("--validation-rows", o->validation_rows, "Validation rows")->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)")->check(non_negative_number());
  cmd->add_flag("--json", o->json, "Print one line of JSON");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace tandem::cli
