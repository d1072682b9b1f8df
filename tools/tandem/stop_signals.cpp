#include "stop_signals.h"

#include <signal.h>

#include <initializer_list>

namespace tandem::cli {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};

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
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
    return true;
  }();
  (void)installed;
  return g_stop;
}

int stop_signal() { return g_signal.load(); }

const char* stop_signal_name() {
  switch (g_signal.load()) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "no signal";
  }
}

}  // namespace tandem::cli
