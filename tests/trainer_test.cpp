// Training end to end through the public API: learning separable data, bit-identical resume,
// starting from given parameters, and the metrics file.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <fstream>
#include <nlohmann/json.hpp>

#include "dataset_store.h"
#include "parameters_only.h"
#include "tandem/tandem.h"
#include "test_support.h"

namespace tandem {
namespace {

TrainConfig small_config(int epochs) {
  TrainConfig c;
  c.model = ModelConfig::parse("40-16-4");
  c.backend = BackendKind::Cpu;
  c.batch = 32;
  c.epochs = epochs;
  c.threads = 2;
  c.seed = 17;
  return c;
}

std::vector<float> flat(const Model& m) {
  std::vector<float> out;
  for (const auto& t : m.parameters()) out.insert(out.end(), t.values.begin(), t.values.end());
  return out;
}

TEST(Trainer, LearnsSeparableDataToFullAccuracy) {
  const Dataset train = test::separable_dataset(400, 40, 4, 1);
  const Dataset validation = test::separable_dataset(100, 40, 4, 2);
  for (OptimizerKind kind : {OptimizerKind::Adam, OptimizerKind::Sgd}) {
    TrainConfig c = small_config(5);
    c.optimizer.kind = kind;
    if (kind == OptimizerKind::Sgd) c.optimizer.learning_rate = 0.002f;
    Trainer trainer(c);
    const TrainSummary s = trainer.fit(train.view(), validation.view(), validation.view());
    EXPECT_EQ(s.test.accuracy, 1.0) << to_string(kind);
    EXPECT_EQ(s.samples, 5 * 400);
    EXPECT_EQ(s.steps, 5 * 13);  // 400 / 32 -> 12 full batches and one of 16
    EXPECT_LT(s.test.loss_mean, 0.5);
  }
}

// separable_dataset's rows as float32 pixels (0..255 as they are), one of them NaN when
// `nan_row` >= 0.
Dataset float_dataset(int64_t rows, uint32_t seed, int64_t nan_row = -1) {
  const Dataset bytes = test::separable_dataset(rows, 40, 4, seed);
  Dataset floats(PixelType::Float32, rows, 40, 4);
  std::copy(bytes.label_data(), bytes.label_data() + rows, floats.label_data());
  for (int64_t i = 0; i < rows * 40; ++i) {
    const float x = i == nan_row * 40 + 5 ? std::nanf("") : float(bytes.pixel_data()[i]);
    std::memcpy(floats.pixel_data() + i * 4, &x, 4);
  }
  return floats;
}

// A NaN pixel in float32 data trained every parameter to NaN, and the validation loss with it,
// without a word (Model.predict and tandem eval named such a row): each split is refused
// naming its row, and so is a batch streamed from a store.
TEST(Trainer, ANonFinitePixelIsRefusedNamingItsSplitAndRow) {
  const Dataset good = float_dataset(100, 2);
  const auto refusal = [](const Dataset& train, const Dataset& validation) {
    return test::error_of<InputError>(
        [&] { Trainer(small_config(1)).fit(train.view(), validation.view(), DatasetView()); });
  };
  std::string why = refusal(float_dataset(200, 1, 7), good);
  EXPECT_TRUE(test::contains(why, "the training split: row 7 holds a pixel that is not finite "
                                  "(NaN or infinity); training on it would make every parameter "
                                  "NaN")) << why;
  why = refusal(float_dataset(200, 1), float_dataset(100, 2, 3));
  EXPECT_TRUE(test::contains(why, "the validation split: row 3 holds a pixel that is not finite"))
      << why;
  test::TempDir dir;
  DataSplits splits;
  splits.train = float_dataset(200, 1, 150);
  splits.validation = float_dataset(100, 2);
  splits.test = float_dataset(100, 3);
  StoreWriteOptions o;
  o.pixel_type = PixelType::Float32;
  o.chunk_rows = 64;
  write_dataset_store(splits, dir.file("s.zarr"), o, nullptr);
  StreamOptions so;
  so.batch_rows = 50;
  so.shuffle = false;
  so.pin_for_device = -1;
  const auto stream = open_store_stream(dir.file("s.zarr"), so);
  why = test::error_of<InputError>(
      [&] { Trainer(small_config(1)).fit(*stream, good.view(), DatasetView()); });
  EXPECT_TRUE(test::contains(why, "s.zarr/images': row 150 holds a pixel that is not finite "
                                  "(NaN or infinity); a model trained or scored on it gives NaN"))
      << why;
}

TEST(Trainer, SameSeedSameBits) {
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 3);
  Trainer a(small_config(2)), b(small_config(2));
  a.fit(train.view(), {}, {});
  b.fit(train.view(), {}, {});
  EXPECT_EQ(flat(a.model()), flat(b.model()));
  TrainConfig other = small_config(2);
  other.seed = 18;
  Trainer c(other);
  c.fit(train.view(), {}, {});
  EXPECT_NE(flat(a.model()), flat(c.model()));
}

TEST(Trainer, ResumeContinuesBitIdentically) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  const Dataset validation = test::random_dataset(PixelType::UInt8, 50, 40, 4, 5);
  for (bool shuffle : {true, false}) {
    TrainConfig whole = small_config(4);
    whole.shuffle = shuffle;
    whole.keep_best = false;  // resume continues the last state; see KeepsTheBestEpoch
    Trainer uninterrupted(whole);
    const TrainSummary full = uninterrupted.fit(train.view(), validation.view(), {});

    TrainConfig first = whole;
    first.epochs = 2;
    first.checkpoint_path = dir.file("run.safetensors");
    Trainer part1(first);
    part1.fit(train.view(), validation.view(), {});

    TrainConfig second = whole;
    second.resume_path = first.checkpoint_path;
    Trainer part2(second);
    const TrainSummary rest = part2.fit(train.view(), validation.view(), {});
    EXPECT_EQ(rest.epochs, 2) << "a resumed run does only the epochs still missing";
    EXPECT_EQ(rest.steps, full.steps / 2);
    EXPECT_EQ(part2.checkpoint().step, uninterrupted.checkpoint().step);
    EXPECT_EQ(flat(part2.model()), flat(uninterrupted.model())) << "shuffle " << shuffle;
    const Checkpoint a = part2.checkpoint(), b = uninterrupted.checkpoint();
    for (size_t i = 0; i < a.state.m.size(); ++i) {
      EXPECT_EQ(a.state.m[i].values, b.state.m[i].values);
      EXPECT_EQ(a.state.v[i].values, b.state.v[i].values);
    }
    EXPECT_EQ(rest.validation.loss_sum, full.validation.loss_sum);
  }
}

// A file of parameters alone (a cluster run's model, the scorer's best, Model.save) is written
// as an SGD checkpoint: resumed, an Adam run went on with SGD and undid its training. Refused,
// naming --init; files written before the mark are known by their provenance.
TEST(Trainer, AResumeFromParametersAloneIsRefused) {
  test::TempDir dir;
  Checkpoint marked;
  marked.model = Model::initialized(small_config(1).model, 3);
  mark_parameters_only(marked);
  Checkpoint cluster_before = marked, python_before = marked;
  cluster_before.extra = {{"trained_with", "adam"}};
  python_before.extra = {{"source", "tandem (Python)"}};
  const std::pair<const char*, Checkpoint> files[] = {
      {"marked", marked}, {"cluster", cluster_before}, {"python", python_before}};
  for (const auto& [name, file] : files) {
    save_checkpoint(dir.file(name), file);
    TrainConfig c = small_config(1);
    c.resume_path = dir.file(name);
    const std::string why = test::error_of<InputError>([&] { Trainer t(c); });
    EXPECT_TRUE(test::contains(why, dir.file(name) + ": holds parameters only")) << why;
    EXPECT_TRUE(test::contains(why, "--init")) << why;
    TrainConfig init = small_config(1);
    init.init_path = dir.file(name);
    Trainer starts(init);  // what it is for
  }
}

TEST(Trainer, KeepsTheBestEpoch) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  const Dataset validation = test::random_dataset(PixelType::UInt8, 100, 40, 4, 5);
  // Random labels: the validation loss rises as the model memorises the training rows, so the
  // best epoch is an early one, not the last.
  TrainConfig c = small_config(8);
  c.optimizer.learning_rate = 0.1f;
  c.checkpoint_path = dir.file("best.safetensors");
  c.metrics_path = dir.file("metrics.jsonl");
  c.validation_split = "idx-last-rows";
  std::vector<double> losses;
  Trainer trainer(c);
  trainer.on_epoch = [&](const EpochReport& r) { losses.push_back(r.validation.loss_sum); };
  const TrainSummary s = trainer.fit(train.view(), validation.view(), {});
  const auto best = std::min_element(losses.begin(), losses.end());
  const int64_t best_epoch = best - losses.begin() + 1;
  ASSERT_LT(best_epoch, 8) << "the test needs a best epoch before the last";
  EXPECT_EQ(s.kept_epoch, best_epoch);
  EXPECT_EQ(s.validation.loss_sum, *best);
  const Checkpoint saved = load_checkpoint(c.checkpoint_path);
  EXPECT_EQ(saved.epoch, best_epoch);
  // How far the run went, beside the kept epoch: `tandem train --resume` of this finished run
  // (a requeued job) trains nothing, rather than the epochs after the best once more.
  EXPECT_EQ(saved.extra.at("epochs_trained"), "8");
  EXPECT_EQ(saved.extra.at("validation_rows"), "100");
  // Resumed with nothing to train (as the command line does for such a rerun), it is saved again
  // saying 8, not its kept epoch: a second rerun would train the epochs after the best.
  const std::string logged = test::read_bytes(c.metrics_path);
  {
    TrainConfig again = c;
    again.epochs = static_cast<int>(best_epoch);
    Trainer rerun(again);
    // (a file of a version that did not say what its validation rows are: the rerun's file
    // says, though the state it keeps is the file's)
    Checkpoint unlabelled = saved;
    ASSERT_EQ(unlabelled.extra.erase("validation_split"), 1u);
    rerun.resume(unlabelled, c.checkpoint_path);
    EXPECT_EQ(rerun.fit(train.view(), validation.view(), {}).epochs, 0);
    const Checkpoint rewritten = load_checkpoint(c.checkpoint_path);
    EXPECT_EQ(rewritten.extra.at("epochs_trained"), "8");
    EXPECT_EQ(rewritten.extra.at("validation_split"), "idx-last-rows");
  }
  // Its metrics keep the records of the epochs after the kept one: they stand, trained once (a
  // rerun that trains nothing dropped them as if it would train them again).
  EXPECT_EQ(test::read_bytes(c.metrics_path), logged);
  EXPECT_EQ(flat(saved.model), flat(trainer.model()));
  EXPECT_EQ(evaluate_model(saved.model, validation.view(), 2).loss_sum, *best);
}

// A view of a negative row count (a caller's arithmetic gone wrong) is an InputError, not a
// std::length_error from sizing a vector by it.
TEST(Trainer, AViewOfNegativeRowsIsRefused) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 20, 40, 4, 6);
  DatasetView bad = data.view();
  bad.rows = -5;
  Trainer trainer(small_config(1));
  std::string e = test::error_of<InputError>([&] { trainer.fit(bad, {}, {}); });
  EXPECT_NE(e.find("a training view of -5 rows"), std::string::npos) << e;
  e = test::error_of<InputError>([&] { predict(trainer.model(), bad, 1); });
  EXPECT_NE(e.find("a data view of -5 rows"), std::string::npos) << e;
  e = test::error_of<InputError>([&] { evaluate_model(trainer.model(), bad, 1); });
  EXPECT_NE(e.find("a data view of -5 rows"), std::string::npos) << e;
}

// fit called again on the same trainer continues the run, as resuming the first fit's state
// would: the epochs it trained count (it went as far as asked: none more), the kept best stays,
// and the metrics log is added to. It once truncated the log and, keeping the best, trained
// the epochs after the kept one again.
TEST(Trainer, ASecondFitContinuesTheRunItsFirstLeft) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  const Dataset validation = test::random_dataset(PixelType::UInt8, 100, 40, 4, 5);
  for (const bool keep_best : {true, false}) {
    TrainConfig c = small_config(6);
    c.optimizer.learning_rate = 0.1f;  // random labels: an early epoch is the best
    c.keep_best = keep_best;
    c.metrics_path = dir.file("metrics.jsonl");
    Trainer trainer(c);
    const TrainSummary first = trainer.fit(train.view(), validation.view(), {});
    ASSERT_EQ(first.epochs, 6);
    if (keep_best) {
      ASSERT_LT(first.kept_epoch, 6) << "the test needs a best before the last";
    }
    const std::vector<float> kept = flat(trainer.model());
    const std::string logged = test::read_bytes(c.metrics_path);
    const TrainSummary second = trainer.fit(train.view(), validation.view(), {});
    EXPECT_EQ(second.epochs, 0) << "keep_best " << keep_best;
    EXPECT_EQ(second.steps, 0);
    EXPECT_EQ(second.kept_epoch, first.kept_epoch);
    EXPECT_EQ(flat(trainer.model()), kept);
    EXPECT_EQ(second.validation.loss_sum, first.validation.loss_sum);
    const std::string now = test::read_bytes(c.metrics_path);
    EXPECT_EQ(now.substr(0, logged.size()), logged) << "the first fit's records were lost";
  }
}

// A metrics log that cannot be written (a full disk: /dev/full) is dropped, said once; the run
// trains on (it once ended with the write's error).
TEST(Trainer, AMetricsLogThatFailsIsDroppedAndTrainingGoesOn) {
  const Dataset train = test::separable_dataset(64, 40, 4, 9);
  TrainConfig c = small_config(2);
  c.metrics_path = "/dev/full";
  Trainer trainer(c);
  ::testing::internal::CaptureStderr();
  const TrainSummary s = trainer.fit(train.view(), {}, {});
  const std::string said = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.epochs, 2);
  EXPECT_NE(said.find("writing metrics file /dev/full: No space left on device; training goes "
                      "on without the metrics log"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find("warning", said.find("warning") + 1), std::string::npos) << said;
}

// A fit that between_steps ended (Python's Ctrl-C) is gone on with by the next fit, from the
// steps it took, to the epochs asked for in all; the log keeps the first fit's records.
TEST(Trainer, AFitAfterAnInterruptedOneGoesOnFromItsSteps) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 320, 40, 4, 8);
  TrainConfig c = small_config(3);  // 10 steps an epoch
  c.metrics_path = dir.file("metrics.jsonl");
  Trainer trainer(c);
  int steps = 0;
  trainer.between_steps = [&] {
    if (++steps == 15) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(trainer.fit(train.view(), {}, {}), std::runtime_error);
  EXPECT_EQ(trainer.checkpoint().step, 15);
  const std::string logged = test::read_bytes(c.metrics_path);
  const TrainSummary rest = trainer.fit(train.view(), {}, {});
  EXPECT_EQ(rest.epochs, 2) << "epoch 2 again, then epoch 3";
  EXPECT_EQ(trainer.checkpoint().step, 35);
  const std::string now = test::read_bytes(c.metrics_path);
  EXPECT_EQ(now.substr(0, logged.size()), logged) << "the first fit's records were lost";

  // Keeping the best: an epoch of the interrupted fit stays in the running (it was forgotten).
  const Dataset validation = test::random_dataset(PixelType::UInt8, 100, 40, 4, 5);
  TrainConfig k = small_config(6);
  k.optimizer.learning_rate = 0.1f;  // random labels: an early epoch is the best
  Trainer keeping(k);
  std::vector<double> losses;
  keeping.on_epoch = [&](const EpochReport& r) { losses.push_back(r.validation.loss_sum); };
  steps = 0;
  keeping.between_steps = [&] {
    if (++steps == 25) throw std::runtime_error("interrupted");  // in epoch 3
  };
  EXPECT_THROW(keeping.fit(train.view(), validation.view(), {}), std::runtime_error);
  ASSERT_EQ(losses.size(), 2u);
  keeping.between_steps = nullptr;
  const TrainSummary kept = keeping.fit(train.view(), validation.view(), {});
  ASSERT_EQ(losses.size(), 6u);
  const int64_t best = std::min_element(losses.begin(), losses.end()) - losses.begin() + 1;
  ASSERT_LE(best, 2) << "the test needs the best in the interrupted fit";
  EXPECT_EQ(kept.kept_epoch, best);
  EXPECT_EQ(kept.validation.loss_sum, losses[size_t(best - 1)]);
}

// A run that diverges (SGD at a rate of 1e30) after a finite epoch keeps that epoch's state in
// its checkpoint, even kept as `last`: a file of NaN parameters is refused by every reader, and
// the best beside it with it.
TEST(Trainer, ADivergedRunsCheckpointHoldsItsBestFiniteState) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  const Dataset validation = test::random_dataset(PixelType::UInt8, 100, 40, 4, 5);
  TrainConfig c = small_config(1);
  c.optimizer.kind = OptimizerKind::Sgd;
  c.optimizer.learning_rate = 0.002f;
  c.keep_best = false;
  c.checkpoint_path = dir.file("run.safetensors");
  Trainer first(c);
  const TrainSummary s = first.fit(train.view(), validation.view(), {});
  ASSERT_TRUE(std::isfinite(s.validation.loss_sum));
  const std::vector<float> epoch_one = flat(first.model());

  c.epochs = 3;
  c.optimizer.learning_rate = 1e30f;
  c.resume_path = c.checkpoint_path;
  Trainer diverging(c);
  std::vector<double> losses;
  diverging.on_epoch = [&](const EpochReport& r) { losses.push_back(r.validation.loss_sum); };
  diverging.fit(train.view(), validation.view(), {});
  ASSERT_EQ(losses.size(), 2u);
  ASSERT_FALSE(std::isfinite(losses.back())) << "the test needs a run that diverges";
  const Checkpoint saved = load_checkpoint(c.checkpoint_path);
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(flat(saved.model), epoch_one);
}

// Without a validation split there is no best to fall back on: the run that diverges fails,
// saying so, and the checkpoint it resumed from (the same file) keeps its good state.
TEST(Trainer, ADivergedRunWithoutABestFailsAndKeepsTheFileItWouldReplace) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  TrainConfig c = small_config(1);
  c.optimizer.kind = OptimizerKind::Sgd;
  c.optimizer.learning_rate = 0.002f;
  c.checkpoint_path = dir.file("run.safetensors");
  Trainer first(c);
  first.fit(train.view(), {}, {});
  const std::vector<float> epoch_one = flat(first.model());

  c.epochs = 3;
  c.optimizer.learning_rate = 1e30f;
  c.resume_path = c.checkpoint_path;
  Trainer diverging(c);
  const std::string why =
      test::error_of<InputError>([&] { diverging.fit(train.view(), {}, {}); });
  EXPECT_TRUE(test::contains(why, "training diverged: epoch 2's parameters are not finite")) << why;
  EXPECT_TRUE(test::contains(why, c.checkpoint_path + " was not written")) << why;
  const Checkpoint saved = load_checkpoint(c.checkpoint_path);
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(flat(saved.model), epoch_one);
}

// A checkpoint that cannot be written fails the run before its first step, not after an epoch
// of work: a missing directory, a directory by the checkpoint's name. Nothing is left behind.
TEST(Trainer, RefusesACheckpointItCannotWriteBeforeTraining) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  for (const std::string& path : {dir.file("absent/run.safetensors"), dir.path().string()}) {
    TrainConfig c = small_config(2);
    c.checkpoint_path = path;
    Trainer trainer(c);
    int steps = 0;
    trainer.on_step = [&](const StepReport&) { ++steps; };
    const std::string why = test::error_of<IoError>([&] { trainer.fit(train.view(), {}, {}); });
    EXPECT_TRUE(test::contains(why, "cannot write '" + path + "'")) << why;
    EXPECT_EQ(steps, 0);
  }
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
}

// An embedder's data set with a label past the model's outputs trained "successfully" while the
// loss kernel wrote past each bad row's gradient. The first batch holding one is refused.
TEST(Trainer, RefusesALabelPastTheModelsOutputs) {
  Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  train.label_data()[123] = 4;  // a 4-class model: labels 0..3
  Trainer trainer(small_config(1));
  const std::string why = test::error_of<InputError>([&] { trainer.fit(train.view(), {}, {}); });
  EXPECT_TRUE(test::contains(why, "row 123 has label 4; expected a class in [0, 4)")) << why;
}

// A run that keeps its best epoch, cut in two and resumed, keeps the same epoch as the run done
// in one go, whether the checkpoint it resumes is its best state or a later one (the best then
// travels beside it in the checkpoint).
TEST(Trainer, ResumedRunKeepsTheBestOfTheRunItContinues) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 300, 40, 4, 4);
  const Dataset validation = test::random_dataset(PixelType::UInt8, 100, 40, 4, 5);
  TrainConfig whole = small_config(8);
  whole.optimizer.learning_rate = 0.1f;
  Trainer uninterrupted(whole);
  const TrainSummary full = uninterrupted.fit(train.view(), validation.view(), {});
  ASSERT_LT(full.kept_epoch, 7) << "the test needs a best epoch well before the last";

  for (const int64_t cut : {full.kept_epoch, full.kept_epoch + 1}) {
    TrainConfig first = whole;
    first.epochs = static_cast<int>(cut);
    first.keep_best = false;  // the checkpoint holds epoch `cut`, the best beside it
    first.checkpoint_path = dir.file("cut" + std::to_string(cut) + ".safetensors");
    Trainer(first).fit(train.view(), validation.view(), {});
    const Checkpoint saved = load_checkpoint(first.checkpoint_path);
    EXPECT_EQ(saved.epoch, cut);
    if (cut > full.kept_epoch) {
      ASSERT_NE(saved.best, nullptr);
      EXPECT_EQ(saved.best->epoch, full.kept_epoch);
    }

    TrainConfig second = whole;
    second.resume_path = first.checkpoint_path;
    second.checkpoint_path = dir.file("resumed" + std::to_string(cut) + ".safetensors");
    Trainer resumed(second);
    const TrainSummary rest = resumed.fit(train.view(), validation.view(), {});
    EXPECT_EQ(rest.epochs, 8 - cut);
    EXPECT_EQ(rest.kept_epoch, full.kept_epoch) << "cut after epoch " << cut;
    EXPECT_EQ(rest.validation.loss_sum, full.validation.loss_sum);
    EXPECT_EQ(flat(resumed.model()), flat(uninterrupted.model()));
    EXPECT_EQ(load_checkpoint(second.checkpoint_path).epoch, full.kept_epoch);
  }

  // A checkpoint whose own validation loss is no number is refused by name, not compared.
  Trainer fresh(whole);
  Checkpoint odd = fresh.checkpoint();
  odd.extra["validation_loss"] = "12.5x";
  try {
    fresh.resume(odd, "odd.safetensors");
    ADD_FAILURE() << "resumed with validation_loss 12.5x";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("odd.safetensors"), std::string::npos) << e.what();
  }
}

TEST(Trainer, StartsFromGivenParameters) {
  test::TempDir dir;
  const Dataset train = test::random_dataset(PixelType::UInt8, 100, 40, 4, 6);
  Checkpoint init;
  init.optimizer.kind = OptimizerKind::Sgd;  // parameters only: no Adam state to store
  init.model = Model::initialized(ModelConfig::parse("40-16-4"), 99);
  init.model.parameters()[1].values.assign(16, 0.25f);
  save_checkpoint(dir.file("init.safetensors"), init);
  TrainConfig c = small_config(0);
  c.init_path = dir.file("init.safetensors");
  Trainer trainer(c);
  EXPECT_EQ(flat(trainer.model()), flat(init.model));
  TrainConfig wrong = small_config(0);
  wrong.model = ModelConfig::parse("40-17-4");
  wrong.init_path = c.init_path;
  EXPECT_THROW(Trainer{wrong}, InputError);
}

TEST(Trainer, WritesMetricsLines) {
  test::TempDir dir;
  const Dataset train = test::separable_dataset(64, 40, 4, 7);
  TrainConfig c = small_config(2);
  c.metrics_path = dir.file("metrics.jsonl");
  Trainer trainer(c);
  trainer.fit(train.view(), train.view(), {});
  std::ifstream in(c.metrics_path);
  std::string line;
  int steps = 0, epochs = 0;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line);
    if (j["type"] == "step") {
      ++steps;
      EXPECT_GT(j["samples_per_s"].get<double>(), 0.0);
      EXPECT_GE(j["loss"].get<double>(), 0.0);
    } else {
      ++epochs;
      EXPECT_EQ(j["type"], "epoch");
      EXPECT_TRUE(j.contains("validation_accuracy"));
    }
  }
  EXPECT_EQ(steps, 4);
  EXPECT_EQ(epochs, 2);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// Without a step listener the loss is read once per epoch (a GPU then never waits inside an
// epoch); the epoch's mean training loss must be the same either way, and equal the steps' sum.
TEST(Trainer, EpochLossIsTheSameWithAndWithoutStepReports) {
  const Dataset train = test::separable_dataset(300, 40, 4, 5);
  const Dataset validation = test::separable_dataset(60, 40, 4, 6);
  std::vector<double> quiet, listened;
  double step_sum = 0.0;
  {
    Trainer trainer(small_config(2));
    trainer.on_epoch = [&](const EpochReport& r) { quiet.push_back(r.train_loss_mean); };
    trainer.fit(train.view(), validation.view(), DatasetView{});
  }
  {
    Trainer trainer(small_config(2));
    trainer.on_step = [&](const StepReport& r) {
      if (r.epoch == 0) step_sum += r.loss_sum;
    };
    trainer.on_epoch = [&](const EpochReport& r) { listened.push_back(r.train_loss_mean); };
    trainer.fit(train.view(), validation.view(), DatasetView{});
  }
  ASSERT_EQ(quiet.size(), 2u);
  EXPECT_EQ(quiet, listened);
  EXPECT_DOUBLE_EQ(step_sum / 300.0, quiet[0]);
  EXPECT_GT(quiet[0], quiet[1]);
}

}  // namespace
}  // namespace tandem
