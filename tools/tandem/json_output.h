// JSON forms of the engine's results, shared by the subcommands' --json output.
#pragma once

#include <nlohmann/json.hpp>

#include "tandem/trainer.h"

namespace tandem::cli {

inline nlohmann::json to_json(const EvalResult& r) {
  return {{"loss", r.loss_sum},   {"loss_mean", r.loss_mean}, {"accuracy", r.accuracy},
          {"correct", r.correct}, {"samples", r.samples}};
}

}  // namespace tandem::cli
