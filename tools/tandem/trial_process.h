// One trial process: `tandem train ...` started as a child of this process, its stdout and stderr
// appended to the trial's log. Both ways of running trials use it: tandem search's own processes
// (--processes) and a slot server's (tandem trial-slots, for tandem search --slots).
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace tandem::cli {

// Forks and execs argv[0] with argv, stdout and stderr appended to `log` (created if missing).
// The child gets PR_SET_PDEATHSIG SIGKILL: it dies with this process however that ends (a
// SIGKILL included), so a dead search or slot server leaves no trial behind. Call it from the
// thread that lives as long as the process (the kernel ties the signal to the forking thread).
// Throws Error naming `what` when fork fails; an exec failure is written to the log and the
// child exits with status 127.
pid_t start_trial_process(const std::vector<std::string>& argv, const std::string& log,
                          const std::string& what);

// "exited with status N" or "killed by signal N", for a waitpid status.
std::string describe_exit(int status);

// This program's path (/proc/self/exe), to run it again as `tandem train` (or predict).
std::string self_path();

// The last `lines` lines of a log joined by " | " (what a failed process said last), or "" when
// the file is missing or empty.
std::string log_tail(const std::string& path, size_t lines);

}  // namespace tandem::cli
