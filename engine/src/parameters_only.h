// Checkpoints that hold parameters alone: a cluster run's model (Adam's moments stay in the
// servers' shard checkpoints), the scorer's best, tandem.Model.save. They are written as SGD
// checkpoints (SGD has no state to save), so a run resumed from one went on with SGD at the
// file's learning rate whatever had trained it, and undid the training in a few epochs. They
// start runs (--init: the optimizer begins afresh); they do not continue one (--resume).
#pragma once

#include <string>

#include "tandem/error.h"
#include "tandem/model.h"

namespace tandem {

constexpr const char* kParametersOnlyKey = "parameters_only";

inline void mark_parameters_only(Checkpoint& checkpoint) {
  checkpoint.optimizer.kind = OptimizerKind::Sgd;  // no moments to save
  checkpoint.extra[kParametersOnlyKey] = "true";
}

// Files written before the mark are known too: a cluster run's say what trained them
// ("trained_with"), Python's name their source.
inline bool holds_parameters_only(const Checkpoint& checkpoint) {
  const auto source = checkpoint.extra.find("source");
  const auto marked = checkpoint.extra.find(kParametersOnlyKey);
  return (marked != checkpoint.extra.end() && marked->second == "true") ||
         checkpoint.extra.count("trained_with") > 0 ||
         (source != checkpoint.extra.end() && source->second == "tandem (Python)");
}

// What a run resumed from such a file is told: InputError naming `where` and --init.
inline void refuse_to_resume_parameters_only(const Checkpoint& checkpoint,
                                             const std::string& where) {
  if (holds_parameters_only(checkpoint))
    throw InputError(where + ": holds parameters only, no optimizer state (the model of a "
                     "cluster run, the scorer's best, or tandem.Model.save's): start a run "
                     "from it with --init (init= in Python), which begins the optimizer afresh");
}

}  // namespace tandem
