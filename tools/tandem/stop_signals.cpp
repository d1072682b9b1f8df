#include "stop_signals.h"

#include <pthread.h>
#include <signal.h>

namespace tandem::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<bool> g_handled[3] = {{false}, {false}, {false}};  // SIGINT, SIGTERM, SIGHUP
constexpr int kStopSignals[3] = {SIGINT, SIGTERM, SIGHUP};

void on_stop_signal(int sig) {
  int none = 0;
  g_signal.compare_exchange_strong(none, sig);  // the first signal is the one reported
  g_stop.store(true);
}

}  // namespace

const std::atomic<bool>& stop_on_signals() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int i = 0; i < 3; ++i) {
      struct sigaction old {};
      if (sigaction(kStopSignals[i], nullptr, &old) == 0 && old.sa_handler == SIG_IGN) continue;
      if (sigaction(kStopSignals[i], &sa, nullptr) == 0) g_handled[i].store(true);
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

const char* stop_signal_name() {
  switch (g_signal.load()) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "no signal";
  }
}

StopSignalsBlocked::StopSignalsBlocked() {
  sigset_t block;
  sigemptyset(&block);
  for (const int sig : kStopSignals) sigaddset(&block, sig);
  pthread_sigmask(SIG_BLOCK, &block, &old_);
}

StopSignalsBlocked::~StopSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }

void reset_stop_signals_in_child() {
  struct sigaction fallback {};
  fallback.sa_handler = SIG_DFL;
  sigemptyset(&fallback.sa_mask);
  for (int i = 0; i < 3; ++i)
    if (g_handled[i].load()) sigaction(kStopSignals[i], &fallback, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
}

}  // namespace tandem::cli
