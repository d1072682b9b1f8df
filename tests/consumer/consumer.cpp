// Uses only the installed public headers: builds a small data set in memory, trains the seed's
// kind of model on it, saves and reloads a checkpoint, and checks the model learned. Then the
// same data as a dataset store trains a parameter-server cluster through tandem/cluster.h: once
// with train_cluster (every role a thread), once from the pieces (a coordinator and a parameter
// server, a worker and a scorer each started as a ClusterRole over tcp://127.0.0.1).
#include <tandem/tandem.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

// Rows whose class is which tenth of the features is bright: learnable in a few epochs.
tandem::Dataset make_rows(int64_t rows, int64_t features, int64_t offset) {
  tandem::Dataset data(tandem::PixelType::UInt8, rows, features, 3);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t r = i + offset;
    const int label = static_cast<int>(r % 3);
    data.label_data()[i] = static_cast<uint8_t>(label);
    for (int64_t f = 0; f < features; ++f)
      data.pixel_data()[i * features + f] = static_cast<uint8_t>(f / 10 == label ? 200 + r % 50 : r % 40);
  }
  return data;
}

bool check(bool ok, const char* what) {
  if (!ok) std::fprintf(stderr, "consumer: FAILED: %s\n", what);
  return ok;
}

// The run's settings for the cluster runs, as JSON.
std::string settings(const std::string& store, const std::string& best) {
  return "{\"data\": \"" + store + "\", \"model\": \"30-8-3\", \"batch\": 50, \"lr\": 0.05, "
         "\"backend\": \"cpu\", \"score_interval_s\": 0.05, \"best_model_path\": \"" + best + "\"}";
}

// Validation loss (summed over 150 rows) the cluster runs train to: about 0.27 per row, where
// an untrained model is at ln 3 = 1.1.
constexpr double kTarget = 40.0;

int train_single(const std::string& checkpoint) {
  const int64_t rows = 600, features = 30;
  const tandem::Dataset data = make_rows(rows, features, 0);
  tandem::TrainConfig config;
  config.model = tandem::ModelConfig::parse("30-8-3");
  config.backend = tandem::BackendKind::Auto;
  config.batch = 50;
  config.epochs = 3;
  config.checkpoint_path = checkpoint;
  tandem::Trainer trainer(config);
  const tandem::TrainSummary summary = trainer.fit(data.view(), data.view(), data.view());
  const tandem::Checkpoint reloaded = tandem::load_checkpoint(checkpoint);
  const tandem::EvalResult again = tandem::evaluate_model(reloaded.model, data.view());
  std::printf("tandem %s (cuda %d): backend %s, %lld steps, test accuracy %.4f, reloaded %.4f\n",
              TANDEM_VERSION, TANDEM_WITH_CUDA, summary.backend.c_str(),
              static_cast<long long>(summary.steps), summary.test.accuracy, again.accuracy);
  if (summary.test.accuracy != 1.0 || again.loss_sum != summary.test.loss_sum) return EXIT_FAILURE;
  return EXIT_SUCCESS;
}

// train_cluster: 1 parameter server, 1 worker and the scorer as threads, to the target.
bool train_local_cluster(const std::string& store, const std::string& base) {
  tandem::ClusterRunOptions o;
  o.settings = settings(store, base + ".best.safetensors");
  o.target = kTarget;
  o.max_seconds = 60;  // a safety net: the run must stop by the target
  o.model_out = base + ".cluster.safetensors";
  o.test_threads = 1;
  std::string address;
  int scores_seen = 0;
  o.on_listening = [&](const std::string& a) { address = a; };
  o.on_score = [&](const tandem::ClusterScore&) { ++scores_seen; };
  const tandem::ClusterRunSummary s = tandem::train_cluster(o);
  std::printf("train_cluster: stopped (%s) after %.2f s, %lld epochs, %lld steps, %zu scores "
              "(loss %.2f at step %lld to %.2f at step %lld), kept %s: validation accuracy %.4f, "
              "test accuracy %.4f\n",
              s.stop_reason.c_str(), s.seconds, static_cast<long long>(s.epochs),
              static_cast<long long>(s.steps), s.scores.size(),
              s.scores.empty() ? -1.0 : s.scores.front().loss,
              static_cast<long long>(s.scores.empty() ? -1 : s.scores.front().step),
              s.scores.empty() ? -1.0 : s.scores.back().loss,
              static_cast<long long>(s.scores.empty() ? -1 : s.scores.back().step), s.kept.c_str(),
              s.validation.accuracy, s.test.accuracy);
  const tandem::Checkpoint saved = tandem::load_checkpoint(o.model_out);
  const std::string json = s.to_json();
  bool ok = check(address.rfind("inproc://", 0) == 0, "train_cluster's coordinator address");
  ok &= check(s.stop_reason == "target", "train_cluster stopped by the target");
  ok &= check(!s.scores.empty() && s.scores.back().loss < kTarget, "a score below the target");
  ok &= check(scores_seen == int(s.scores.size()), "on_score saw every score");
  ok &= check(s.steps > 0 && s.batches > 0, "the parameter server counted steps");
  ok &= check(s.validation.accuracy >= 0.9 && s.test.accuracy >= 0.9, "the cluster's model learned");
  ok &= check(s.validation.loss_sum < kTarget * 1.5, "the kept parameters' validation loss");
  ok &= check(s.model_path == o.model_out && saved.model.config().describe() == "30-8-3",
              "the kept parameters were saved");
  ok &= check(json.find("\"stop_reason\":\"target\"") != std::string::npos, "the summary's JSON");
  return ok;
}

// The pieces: a coordinator on tcp://127.0.0.1, and each role a ClusterRole joining it, as
// roles started in other processes would.
bool train_from_pieces(const std::string& store, const std::string& base) {
  tandem::ClusterCoordinatorOptions co;
  co.settings = settings(store, base + ".best2.safetensors");
  co.target = kTarget;
  co.max_seconds = 60;
  tandem::ClusterCoordinator coordinator(co);
  const std::string address = coordinator.address();
  tandem::ClusterRole ps = tandem::ClusterRole::parameter_server(address, "ps0");
  tandem::ClusterRole worker = tandem::ClusterRole::worker(address);
  tandem::ClusterRole scorer = tandem::ClusterRole::scorer(address);
  tandem::ClusterScoreStream stream(address);

  bool ok = coordinator.wait(60);
  ok &= check(ok, "the coordinator's run ended within 60 s");
  ok &= check(worker.join(10) && scorer.join(10), "the worker and the scorer ended");
  // A parameter server answers a fresh client: the parameters it holds now.
  const tandem::Model model = coordinator.pull_model();
  const tandem::Dataset validation = make_rows(150, 30, 600);
  const tandem::EvalResult e = tandem::evaluate_model(model, validation.view(), 1);
  ok &= check(coordinator.finish(10), "the parameter server left on finish");
  ok &= check(ps.join(10), "the parameter server's thread ended");
  ok &= check(!ps.running() && ps.kind() == "ps", "the parameter server's role");
  tandem::ClusterScore score;
  int streamed = 0;
  while (stream.next(score, 2.0)) ++streamed;
  const std::vector<tandem::ClusterScore> scores = coordinator.scores();
  std::printf("pieces: phase %s, stopped (%s), %zu scores (%d streamed, end: %s), pulled model: "
              "validation loss %.2f, accuracy %.4f\n",
              coordinator.phase().c_str(), coordinator.stop_reason().c_str(), scores.size(),
              streamed, stream.end_reason().c_str(), e.loss_sum, e.accuracy);
  ok &= check(coordinator.phase() == "done" && coordinator.stop_reason() == "target",
              "the run stopped by the target and is done");
  ok &= check(!scores.empty() && scores.back().loss < kTarget, "a score below the target");
  ok &= check(streamed >= 1 && stream.ended() && stream.end_reason() == "target",
              "the scores channel carried the scores and the end");
  ok &= check(e.accuracy >= 0.9, "the pulled parameters learned");
  ok &= check(coordinator.summary_json().find("\"phase\":\"done\"") != std::string::npos,
              "the coordinator's summary JSON");
  // Errors come back as tandem errors: an unknown setting, a coordinator nobody serves.
  bool refused = false;
  try {
    tandem::ClusterCoordinatorOptions bad = co;
    bad.settings = "{\"no_such_setting\": 1}";
    tandem::ClusterCoordinator never(bad);
  } catch (const tandem::InputError&) {
    refused = true;
  }
  ok &= check(refused, "an unknown setting is an InputError");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string checkpoint = argc > 1 ? argv[1] : "consumer.safetensors";
  if (train_single(checkpoint) != EXIT_SUCCESS) return EXIT_FAILURE;

  // The cluster's store: 600 training rows, 150 validation and 150 test rows, 2 chunks each.
  tandem::DataSplits splits;
  splits.train = make_rows(600, 30, 0);
  splits.validation = make_rows(150, 30, 600);
  splits.test = make_rows(150, 30, 750);
  const std::string store = checkpoint + ".store";
  tandem::write_cluster_store(splits, store, 300, /*overwrite=*/true);
  try {
    if (!train_local_cluster(store, checkpoint)) return EXIT_FAILURE;
    if (!train_from_pieces(store, checkpoint)) return EXIT_FAILURE;
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return EXIT_FAILURE;
  }
  std::printf("consumer: cluster ok\n");
  return EXIT_SUCCESS;
}
