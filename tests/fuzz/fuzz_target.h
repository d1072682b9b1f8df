// What every fuzz target here holds its code to: bad input ends in a tandem::Error (an
// InputError naming what was wrong), never in a crash, an out-of-bounds access (the sanitizers
// see those), another exception or a hang; and input that is accepted keeps the target's
// property (a canonical encoding re-encodes to the same bytes, a round trip loses nothing).
//
// An exception other than tandem::Error leaves LLVMFuzzerTestOneInput and ends the program in
// std::terminate, which libFuzzer and the replay driver (replay_main.cpp) report as a crash.
#pragma once

#include <cstdio>
#include <cstdlib>

#include "tandem/error.h"

namespace tandem::fuzz {

// With FUZZ_SHOW_ERRORS set in the environment, prints why an input was refused (to see that
// seeds get past the first checks, or how an input is refused).
inline void show_refusal(const char* why) {
  static const bool show = std::getenv("FUZZ_SHOW_ERRORS") != nullptr;
  if (show) std::fprintf(stderr, "refused: %s\n", why);
}

// Runs f(): true when it returns, false when it throws a tandem::Error (bad input, refused).
template <typename F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    show_refusal(e.what());
    return false;
  }
}

// A property that does not hold for an accepted input: says which, then aborts (a crash).
[[noreturn]] inline void property_failed(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: fuzz property failed: %s\n", file, line, what);
  std::abort();
}

}  // namespace tandem::fuzz

#define FUZZ_CHECK(condition) \
  ((condition) ? (void)0 : ::tandem::fuzz::property_failed(__FILE__, __LINE__, #condition))
