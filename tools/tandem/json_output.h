// JSON forms of the engine's results, shared by the subcommands' --json output.
#pragma once

#include <nlohmann/json.hpp>

#include "tandem/trainer.h"

namespace tandem::cli {

// A split of no rows (the data has none) is null, not a row of zeros whose loss of 0 reads as
// perfect (the Python package's None).
inline nlohmann::json to_json(const EvalResult& r) {
  if (r.samples == 0) return nullptr;
  return {{"loss", r.loss_sum},   {"loss_mean", r.loss_mean}, {"accuracy", r.accuracy},
          {"correct", r.correct}, {"samples", r.samples}};
}

}  // namespace tandem::cli
