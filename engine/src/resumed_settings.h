// What a run resumed from a training checkpoint takes from it. The settings its caller did not
// give come from the checkpoint's run, so that resuming alone goes on as the uninterrupted run
// would; one given differently is handed back to be said, since the run then no longer goes on
// as it would have. `tandem train --resume` and `tandem.train(resume=...)` both go through it
// (each says the differences in its own terms: flags and stderr, keywords and warnings).
#pragma once

#include <string>
#include <vector>

#include "tandem/config.h"
#include "tandem/model.h"

namespace tandem {

// Which of the settings below the caller gave (the rest are the checkpoint's).
struct GivenSettings {
  bool optimizer = false;  // its kind (another than the checkpoint's is refused on resuming)
  bool learning_rate = false;
  bool batch = false;
  bool seed = false;
  bool shuffle = false;
  bool keep = false;  // keep_best
};

// A setting given differently from the checkpoint's run: "learning_rate", "batch", "seed",
// "shuffle" or "keep", with both values as text (a shuffle as on / off, keep as best / last).
struct DifferentSetting {
  std::string name;
  std::string given;
  std::string theirs;
};

// Completes `config` for a run continuing `checkpoint`: the optimizer's kind, learning rate,
// batch, seed, shuffle and keep_best not given, and the betas and epsilon (no caller sets them),
// from the checkpoint (shuffle and keep when it records them). Returns the given settings that
// differ, in that order. InputError naming `source` for a checkpoint whose shuffle is neither
// on nor off, or whose keep is neither best nor last.
std::vector<DifferentSetting> take_checkpointed_settings(const Checkpoint& checkpoint,
                                                         const GivenSettings& given,
                                                         const std::string& source,
                                                         TrainConfig& config);

}  // namespace tandem
