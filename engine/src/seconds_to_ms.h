// Seconds from a public API (C++ or Python) as the engine's int milliseconds.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

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

// A time limit that has no "no end" (how long to wait for the roles to start, for a heartbeat,
// for the coordinator's answer): above 0, or InputError naming it. 0, a negative number and NaN
// would make the run fail at once, or every role lost at every tick.
inline int limit_seconds_to_ms(double seconds, const std::string& what) {
  if (!(seconds > 0))
    throw InputError(what + " must be a number of seconds above 0, got " + std::to_string(seconds));
  return std::max(1, seconds_to_ms(seconds));
}

// The longest silence or interval a run takes (a score interval, the silence after which a
// coordinator counts as lost): a day. Beyond it a setting is a typo, and one past the clock's
// range would wrap into no wait at all.
constexpr double kMaxIntervalSeconds = 86400;

// The silence after which a coordinator counts as lost, however an API names it: above 0 and at
// most a day, or InputError "WHAT must be above 0 and at most 86400, got S".
inline int lost_after_to_ms(double seconds, const std::string& what) {
  if (!(seconds > 0 && seconds <= kMaxIntervalSeconds))
    throw InputError(what + " must be above 0 and at most 86400, got " + std::to_string(seconds));
  return limit_seconds_to_ms(seconds, what);
}

// The silence after which a coordinator counts a role lost: at least two of the roles' heartbeats
// (every 0.5 s, RoleOptions::heartbeat_ms), or live roles would be lost and back at every tick
// (and a worker's task orphaned each time); at most a day. InputError naming `what` otherwise.
constexpr double kMinHeartbeatTimeoutSeconds = 1.0;
inline int heartbeat_timeout_to_ms(double seconds, const std::string& what) {
  if (!(seconds >= kMinHeartbeatTimeoutSeconds && seconds <= kMaxIntervalSeconds))
    throw InputError(what + " must be at least 1 (two of the roles' heartbeats, every 0.5 s) " +
                     "and at most 86400 seconds, got " + std::to_string(seconds));
  return seconds_to_ms(seconds);
}

}  // namespace tandem
