// Uses only the installed public headers: builds a small data set in memory, trains the seed's
// kind of model on it, saves and reloads a checkpoint, and checks the model learned.
#include <tandem/tandem.h>

#include <cstdio>
#include <cstdlib>
#include <string>

int main(int argc, char** argv) {
  const std::string checkpoint = argc > 1 ? argv[1] : "consumer.safetensors";
  const int64_t rows = 600, features = 30;
  tandem::Dataset data(tandem::PixelType::UInt8, rows, features, 3);
  for (int64_t r = 0; r < rows; ++r) {
    const int label = static_cast<int>(r % 3);
    data.label_data()[r] = static_cast<uint8_t>(label);
    for (int64_t f = 0; f < features; ++f)
      data.pixel_data()[r * features + f] = static_cast<uint8_t>(f / 10 == label ? 200 + r % 50 : r % 40);
  }
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
