#include "stop_signals.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>

namespace tandem::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

struct StopSignal {
  int number;
  std::atomic<bool> handled{false};  // a handler is installed (not ignored when it was)
  // leave_stops_to()'s message, made before its handler is installed (a handler may not
  // allocate) and written whole by one write(): the roles of a run share their stderr, and
  // messages written in pieces came out mixed with each other's.
  char left_message[400] = {};
};
StopSignal g_stop_signals[] = {{SIGINT}, {SIGTERM}, {SIGHUP}};

// The stop signals as a set (async-signal-safe: a forked child uses it).
sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const StopSignal& s : g_stop_signals) sigaddset(&set, s.number);
  return set;
}

// write(2) of a text, from a signal handler (SIGPIPE is ignored once the handlers are
// installed: stderr on a pipe whose reader has gone must not kill the clean stop).
void say(const char* text) {
  [[maybe_unused]] const ssize_t ignored = ::write(2, text, std::strlen(text));
}

// Keeps errno as the interrupted code left it: a handler's own calls may change it.
struct SavedErrno {
  const int saved = errno;
  ~SavedErrno() { errno = saved; }
};

const char* name_of(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "no signal";
  }
}

int64_t monotonic_ms() {  // clock_gettime is async-signal-safe
  timespec now {};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return int64_t(now.tv_sec) * 1000 + now.tv_nsec / 1000000;
}

// When the first stop signal came (monotonic ms).
std::atomic<int64_t> g_first_ms{0};
// Signals this soon after the first are the same stop reaching this process twice: a terminal's
// Ctrl-C delivered to a child and passed on by its parent, or a batch system signalling every
// process of a job whose parent passes it on too.
constexpr int64_t kSameStopMs = 1000;

void on_stop_signal(int sig) {
  const SavedErrno saved;
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) {  // the first signal is the one reported
    g_first_ms.store(monotonic_ms());
    g_stop.store(true);
    say("tandem: ");
    say(name_of(sig));
    say(": stopping cleanly; another stop signal, a second or more from now, stops at once\n");
    return;
  }
  // (0: the first signal's handler, on another thread, has not noted its time yet.)
  const int64_t first = g_first_ms.load();
  if (first == 0 || monotonic_ms() - first < kSameStopMs) return;
  // A second stop signal: the clean stop takes too long for whoever sends it. Die of this signal
  // (children die with this process: PR_SET_PDEATHSIG).
  say("tandem: ");
  say(name_of(sig));
  say(" again: stopping at once\n");
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  sigaction(sig, &fallback, nullptr);
  sigset_t just_this;
  sigemptyset(&just_this);
  sigaddset(&just_this, sig);
  pthread_sigmask(SIG_UNBLOCK, &just_this, nullptr);
  raise(sig);
}

}  // namespace

const std::atomic<bool>& stop_on_signals() {
  static const bool installed = [] {
    std::signal(SIGPIPE, SIG_IGN);  // (see say())
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sa.sa_mask = stop_signal_set();  // one handler at a time on a thread: none interrupts another
    for (StopSignal& s : g_stop_signals) {
      struct sigaction old {};
      if (sigaction(s.number, nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
      if (sigaction(s.number, &sa, nullptr) == 0) s.handled.store(true);
    }
    return true;
  }();
  (void)installed;
  return g_stop;
}

std::shared_ptr<std::atomic<bool>> shared_stop_flag() {
  stop_on_signals();
  // Owns nothing: the flag lives as long as the program.
  return std::shared_ptr<std::atomic<bool>>(std::shared_ptr<void>(), &g_stop);
}

const char* stop_signal_name() { return name_of(g_signal.load()); }

namespace {
pid_t g_stopper = 0;  // whose stop signals still stop this process (0: nobody's)

void on_stop_signal_left(int sig, siginfo_t* info, void*) {
  if (g_stopper > 0 && info != nullptr && info->si_pid == g_stopper) {
    on_stop_signal(sig);  // the launcher ending its roles (after the run, or failing)
    return;
  }
  const SavedErrno saved;
  for (const StopSignal& s : g_stop_signals)
    if (s.number == sig) say(s.left_message);
}
}  // namespace

void leave_stops_to(pid_t stopper, const std::string& who, const std::string& to_whom) {
  // Blocked while the handlers change: a signal in between waits for this one, instead of
  // stopping the role through stop_on_signals()'s.
  const StopSignalsBlocked blocked;
  stop_on_signals();
  g_stopper = stopper;
  for (StopSignal& s : g_stop_signals)
    std::snprintf(s.left_message, sizeof s.left_message,
                  "%s: %s left to %s, which stops the run in order and this role with it "
                  "(SIGKILL ends it at once)\n",
                  who.c_str(), name_of(s.number), to_whom.c_str());
  struct sigaction sa {};
  sa.sa_sigaction = on_stop_signal_left;
  sa.sa_flags = SA_RESTART | SA_SIGINFO;
  sa.sa_mask = stop_signal_set();
  for (const StopSignal& s : g_stop_signals)
    if (s.handled.load()) sigaction(s.number, &sa, nullptr);
}

namespace {
void say_not_suspended(int) {
  const SavedErrno saved;
  say("tandem: the coordinator does not suspend (its roles would give it up); Ctrl-C stops "
      "the run\n");
}
}  // namespace

void refuse_to_suspend() {
  struct sigaction sa {};
  sa.sa_handler = say_not_suspended;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTSTP, &sa, nullptr);
}

StopSignalsBlocked::StopSignalsBlocked() {
  const sigset_t block = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &block, &old_);
}

StopSignalsBlocked::~StopSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

void reset_stop_signals_in_child(bool keep_stop_signals_blocked) {
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  for (const StopSignal& s : g_stop_signals)
    if (s.handled.load()) sigaction(s.number, &fallback, nullptr);
  sigset_t mask;
  sigemptyset(&mask);
  if (keep_stop_signals_blocked) mask = stop_signal_set();
  sigprocmask(SIG_SETMASK, &mask, nullptr);
}

void unblock_stop_signals() {
  const sigset_t stops = stop_signal_set();
  pthread_sigmask(SIG_UNBLOCK, &stops, nullptr);
}

}  // namespace tandem::cli
