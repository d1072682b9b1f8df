// Seconds from a public API (C++ or Python) as the engine's int milliseconds.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>

#include "tandem/error.h"

namespace tandem {

// Negative: -1 (no end, where a wait takes that). An infinite or huge number of seconds is the
// most an int holds (24.8 days), not an overflow into a negative count that times out at once.
// NaN: InputError.
inline int seconds_to_ms(double seconds) {
  if (std::isnan(seconds)) throw InputError("a number of seconds cannot be NaN");
  if (seconds < 0) return -1;
  return int(std::min(seconds * 1000.0, double(std::numeric_limits<int>::max())));
}

}  // namespace tandem
