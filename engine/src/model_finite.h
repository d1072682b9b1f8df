// Whether a model's parameters are all finite: a diverged run's are not, and no reader takes a
// checkpoint of them (checkpoint.cpp refuses one, naming the element).
#pragma once

#include <algorithm>
#include <cmath>

#include "tandem/model.h"

namespace tandem {

inline bool parameters_finite(const Model& model) {
  return std::all_of(model.parameters().begin(), model.parameters().end(),
                     [](const NamedTensor& t) {
                       return std::all_of(t.values.begin(), t.values.end(),
                                          [](float x) { return std::isfinite(x); });
                     });
}

}  // namespace tandem
