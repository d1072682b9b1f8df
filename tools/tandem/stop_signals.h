// SIGINT, SIGTERM and SIGHUP (a closed terminal or ssh session) turned into a flag that a
// long-running command polls, so that it stops between two units of work and leaves its files
// whole instead of dying in the middle of one. Handlers restart interrupted system calls
// (SA_RESTART), so a write in flight completes; poll-like waits still return early.
#pragma once

#include <signal.h>
#include <sys/types.h>

#include <atomic>
#include <memory>
#include <string>

namespace tandem::cli {

// Installs the handlers (once; later calls only return the flag), and ignores SIGPIPE (a write
// to a closed pipe fails instead). The flag turns true at the first of those signals (said on
// stderr). Another one, a second or more after the first,
// ends the process at once, killed by that signal: whoever sends it will not wait for the clean
// stop (its children die with it, PR_SET_PDEATHSIG). Within the first second it is the same
// stop arriving twice: a Ctrl-C that reaches a child both from the terminal and from its
// parent. A signal this process was started ignoring (nohup, a background job of a
// non-interactive shell) stays ignored.
const std::atomic<bool>& stop_on_signals();

// The same flag (handlers installed as above) for code that takes a shared cancel flag, such as
// RoleOptions::cancel: a role process stopped by a signal ends as if its run were over (a
// parameter server writes its final checkpoint) instead of dying with its state unsaved.
std::shared_ptr<std::atomic<bool>> shared_stop_flag();

// Ctrl-Z (SIGTSTP) said and ignored, for the coordinator (launch, coordinator): suspended alone
// (launch's roles run in process groups of their own, a hand-started role elsewhere), it would
// be given up as gone by its roles within seconds and the run would fail.
void refuse_to_suspend();

// For a role process whose run is stopped by another process: the one that started it (`tandem
// launch`, `stopper` its pid) or the run's coordinator (`tandem rank`, stopper 0). That process
// stops the run in order, reading the final parameters from the servers and saving the model,
// then ends the roles. A signal sent to every process of the run at once (systemd stopping a
// service's control group, a batch system signalling every task) would otherwise stop the
// servers under it before it read them. Such a signal is said on stderr (`who` names the role,
// `to_whom` what it is left to) and otherwise ignored; one sent by `stopper` stops this process
// as stop_on_signals() does (the launcher ending its roles). SIGKILL still ends the role.
// Installs stop_on_signals() first.
void leave_stops_to(pid_t stopper, const std::string& who, const std::string& to_whom);
// The name of the signal that set the flag ("SIGTERM"; "no signal" before one came).
const char* stop_signal_name();

// Held around fork() by a parent that may have the handlers: the stop signals are blocked in
// the calling thread, so the child cannot take one with the parent's handler before its exec
// (it would only set the child's copy of the flag, and exec would drop it). The child calls
// reset_stop_signals_in_child() before exec.
class StopSignalsBlocked {
 public:
  StopSignalsBlocked();
  ~StopSignalsBlocked();
  StopSignalsBlocked(const StopSignalsBlocked&) = delete;
  StopSignalsBlocked& operator=(const StopSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

// In a forked child (async-signal-safe): the signals this process handles go back to their
// default action, and every signal is unblocked, so one sent since the fork acts as it would on
// the program exec'd next. `keep_stop_signals_blocked`: SIGINT, SIGTERM and SIGHUP stay blocked
// through the exec, for a program that unblocks them once its handlers are in place.
void reset_stop_signals_in_child(bool keep_stop_signals_blocked = false);

// Unblocks SIGINT, SIGTERM and SIGHUP in the calling thread (a role started with them blocked,
// start_child_process): one that came since the exec acts now, on the handlers installed.
void unblock_stop_signals();

}  // namespace tandem::cli
