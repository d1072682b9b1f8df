// Whether a finished fit diverged: its model is then of no use, and a script (or a search
// trial) must see the run fail, whichever front end ran it (`tandem train` exits 1, Python's
// tandem.train raises). A Python run once returned NaN parameters, and a resume state its own
// resume refused, as if it had trained.
#pragma once

#include <cmath>
#include <string>

#include "tandem/trainer.h"

namespace tandem {

// Why (e.g. "the kept parameters give a validation loss of nan"), or "" when the run's figures
// are finite. Judged by the kept parameters' validation loss, or without a validation split by
// the test split's, or else by the last epoch's training loss (nothing to judge: "").
inline std::string why_diverged(const TrainSummary& s) {
  std::string judged_by;
  double loss = 0.0;
  if (s.validation.samples > 0) {
    judged_by = "the kept parameters give a validation loss of";
    loss = s.validation.loss_sum;
  } else if (s.test.samples > 0) {
    judged_by = "the parameters give a test loss of";
    loss = s.test.loss_sum;
  } else if (s.epochs > 0) {
    judged_by = "the last epoch's training loss is";
    loss = s.train_loss_mean;
  }
  return std::isfinite(loss) ? std::string() : judged_by + " " + std::to_string(loss);
}

}  // namespace tandem
