// SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) turned into a flag that a
// long-running command polls, so that it stops between two units of work and leaves its files
// whole instead of dying in the middle of one. Handlers restart interrupted system calls
// (SA_RESTART), so a write in flight completes; poll-like waits still return early.
#pragma once

#include <atomic>

namespace tandem::cli {

// Installs the handlers (once; later calls only return the flag). The flag turns true at the
// first of those signals.
const std::atomic<bool>& stop_on_signals();

// The signal that set the flag (0: none yet), and its name ("SIGTERM").
int stop_signal();
const char* stop_signal_name();

}  // namespace tandem::cli
