// Child processes of this tandem: a search's trials (`tandem train ...`, from tandem search's own
// processes or a slot server's), a prediction's shares and launch's roles, all started the same
// way by start_child_process.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::cli {

// Forks and execs argv[0] with argv, stdout and stderr appended to `log` (created if missing;
// empty: the child keeps this process's). The child gets PR_SET_PDEATHSIG SIGKILL: it dies with
// this process however that ends (a SIGKILL included), so a dead search, slot server or
// launcher leaves nothing behind. The stop signals' handlers (stop_signals.h) do not reach it.
// Call it from the thread that lives as long as the process (the kernel ties the signal to the
// forking thread). Throws Error naming `what` when fork fails; an exec failure is written to the
// child's stderr and it exits with status 127.
// `own_process_group`: the child leads a process group of its own, so that a signal to this
// process's group (a terminal's Ctrl-C, a batch system's cancel) reaches this process alone,
// which then stops the child in its own order (launch's roles: the servers last, with their
// final checkpoints).
// `working_dir`: where the child runs (empty: this process's working directory).
// `stop_signals_blocked`: the child starts with SIGINT, SIGTERM and SIGHUP blocked, pending until
// it has installed its handlers and calls unblock_stop_signals() (launch's roles, which leave
// those signals to the launcher: one sent between the exec and the handlers ended the role, a
// server without its final checkpoint). Otherwise the child starts with no signal blocked.
pid_t start_child_process(const std::vector<std::string>& argv, const std::string& log,
                          const std::string& what, bool own_process_group = false,
                          const std::string& working_dir = "", bool stop_signals_blocked = false);

// Reaps each of `pids` that has ended (or is no child of this process any more), polling until
// all have or `deadline` passes; returns those still running.
std::vector<pid_t> reap_until(std::vector<pid_t> pids,
                              std::chrono::steady_clock::time_point deadline);

// SIGKILL to each pid, then waits up to timeout_ms in all for them to be reaped: true once all
// are. A process in uninterruptible sleep (a hung GPU driver, a dead NFS server) dies only when
// it leaves the kernel; the caller goes on without it (said on stderr) rather than hanging.
bool kill_and_reap(std::vector<pid_t> pids, int timeout_ms = 5000);

// SIGTERM to each pid, up to grace_ms for them to end on their own terms (a role's last
// checkpoint, a trial's result), then kill_and_reap for the rest.
void terminate_and_reap(std::vector<pid_t> pids, int grace_ms);

// "exited with status N" or "killed by signal N", for a waitpid status.
std::string describe_exit(int status);

// This program's path (/proc/self/exe), to run it again as `tandem train` (or predict).
std::string self_path();

// The last `lines` lines of a log joined by " | " (what a failed process said last), or "" when
// the file is missing or empty. Only what follows byte `from` counts (a log appended to by
// several runs: the last one's own lines).
std::string log_tail(const std::string& path, size_t lines, uintmax_t from = 0);

}  // namespace tandem::cli
