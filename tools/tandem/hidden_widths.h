// --hidden of train, launch and the cluster commands: the widths between the data's inputs and
// its classes, "100", "256,128", or "256x128" as a search's grid writes them (what a search
// reports as its best trial's configuration is then a valid --hidden too); empty: none (a
// softmax-only model, which the Python API trains and train --resume continues).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "tandem/config.h"

namespace tandem::cli {

inline ModelConfig model_with_hidden(int64_t features, std::string hidden, int64_t classes) {
  std::replace(hidden.begin(), hidden.end(), 'x', ',');
  return ModelConfig::parse(std::to_string(features) + "," + (hidden.empty() ? "" : hidden + ",") +
                            std::to_string(classes));
}

}  // namespace tandem::cli
