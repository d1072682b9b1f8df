#include "resumed_settings.h"

#include <cstdio>

#include "tandem/error.h"

namespace tandem {

namespace {

std::string number_text(float x) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", static_cast<double>(x));
  return text;
}

}  // namespace

std::vector<DifferentSetting> take_checkpointed_settings(const Checkpoint& checkpoint,
                                                         const GivenSettings& given,
                                                         const std::string& source,
                                                         TrainConfig& config) {
  std::vector<DifferentSetting> differ;
  auto compare = [&](const char* name, const std::string& mine, const std::string& theirs) {
    if (mine != theirs) differ.push_back({name, mine, theirs});
  };
  const OptimizerConfig mine = config.optimizer;
  config.optimizer = checkpoint.optimizer;
  if (given.optimizer) config.optimizer.kind = mine.kind;
  if (given.learning_rate) {
    config.optimizer.learning_rate = mine.learning_rate;
    compare("learning_rate", number_text(mine.learning_rate),
            number_text(checkpoint.optimizer.learning_rate));
  }
  // (A batch of 0: a checkpoint older than the batch's record.)
  if (checkpoint.batch > 0) {
    if (!given.batch) config.batch = checkpoint.batch;
    else compare("batch", std::to_string(config.batch), std::to_string(checkpoint.batch));
  }
  if (!given.seed) config.seed = checkpoint.seed;
  else compare("seed", std::to_string(config.seed), std::to_string(checkpoint.seed));
  const auto shuffle = checkpoint.extra.find("shuffle");
  if (shuffle != checkpoint.extra.end()) {
    if (shuffle->second != "on" && shuffle->second != "off")
      throw InputError(source + ": its shuffle is '" + shuffle->second +
                       "', expected on or off (was it edited?)");
    if (!given.shuffle) config.shuffle = shuffle->second == "on";
    else compare("shuffle", config.shuffle ? "on" : "off", shuffle->second);
  }
  // (Recorded since 0.3: an older checkpoint leaves the caller's keep, unsaid.) A resumed run
  // that kept its last epoch once went on keeping the best, the default.
  const auto keep = checkpoint.extra.find("keep");
  if (keep != checkpoint.extra.end()) {
    if (keep->second != "best" && keep->second != "last")
      throw InputError(source + ": its keep is '" + keep->second +
                       "', expected best or last (was it edited?)");
    if (!given.keep) config.keep_best = keep->second == "best";
    else compare("keep", config.keep_best ? "best" : "last", keep->second);
  }
  return differ;
}

}  // namespace tandem
