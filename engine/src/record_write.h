// A run's records (its metrics log, its TensorBoard events) are a view of the run, not the run:
// a write that fails (a full disk, a quota) is said once on stderr and that output is given up,
// while training goes on to its stop rule and saves its model. A failed write once ended the
// whole run, every role of a cluster with it, and no model was saved.
#pragma once

#include <cstdio>
#include <utility>

#include "tandem/error.h"

namespace tandem {

// Runs write(); when it throws IoError, says so with what goes on without the output
// ("training goes on without the metrics log") and returns false: the caller gives the output
// up and writes no more to it (one warning, not one per record).
template <typename Write>
[[nodiscard]] bool write_record(const char* goes_on_without, Write&& write) {
  try {
    std::forward<Write>(write)();
    return true;
  } catch (const IoError& e) {
    std::fprintf(stderr, "tandem: warning: %s; %s\n", e.what(), goes_on_without);
    return false;
  }
}

}  // namespace tandem
