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
  // A two-valued setting the checkpoint records as text (`yes` or `no`): not given, the
  // checkpoint's; given differently, named. (keep is recorded since 0.3: an older checkpoint
  // leaves the caller's, unsaid; a resumed --keep last run once went on keeping the best.)
  auto take_choice = [&](const char* key, const char* yes, const char* no, bool given_it,
                         bool& value) {
    const auto it = checkpoint.extra.find(key);
    if (it == checkpoint.extra.end()) return;
    if (it->second != yes && it->second != no)
      throw InputError(source + ": its " + key + " is '" + it->second + "', expected " + yes +
                       " or " + no + " (was it edited?)");
    if (!given_it) value = it->second == yes;
    else compare(key, value ? yes : no, it->second);
  };
  take_choice("shuffle", "on", "off", given.shuffle, config.shuffle);
  take_choice("keep", "best", "last", given.keep, config.keep_best);
  return differ;
}

}  // namespace tandem
