// Signals landing on the threads a test started: for code that must go on through EINTR. A
// process-directed signal goes to any one thread that does not block it; Tandem's stop handler
// (SIGINT, SIGTERM, SIGHUP) is not blocked anywhere, so Ctrl-C may interrupt a serving thread's
// poll. Here SIGUSR1 with an empty handler stands for it: the storm blocks it in the thread that
// starts the storm and in its own sending thread, so each one goes to a thread started before
// (ZeroMQ's I/O threads block every signal), interrupting whatever that thread waits in.
#pragma once

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <string>
#include <thread>

namespace tandem::test {

class SignalStorm {
 public:
  explicit SignalStorm(std::chrono::microseconds period = std::chrono::microseconds(200)) {
    struct sigaction action {};
    action.sa_handler = [](int) {};
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // as the stop handler's: poll-like calls still see EINTR
    sigaction(SIGUSR1, &action, nullptr);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_BLOCK, &usr1, &old_mask_);
    sender_ = std::thread([this, period] {
      while (!stop_) {
        kill(getpid(), SIGUSR1);
        sent_.fetch_add(1);
        std::this_thread::sleep_for(period);
      }
    });
  }
  ~SignalStorm() {
    stop_ = true;
    sender_.join();
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
    // The empty handler stays: a signal sent last may not have reached its thread yet, and
    // SIGUSR1's default action would end the test process.
  }
  SignalStorm(const SignalStorm&) = delete;
  SignalStorm& operator=(const SignalStorm&) = delete;

  int64_t sent() const { return sent_.load(); }

 private:
  sigset_t old_mask_{};
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> sent_{0};
  std::thread sender_;
};

struct StormRun {
  int64_t signals = 0;  // sent during the run
  int64_t steps = 0;    // calls of `step` that returned
  std::string failure;  // what the step that threw said; "" when none did
};

// Calls `step` over and over for `duration` on a thread started before a storm (so signals land
// on it too, as on every thread started earlier), until the first exception.
template <typename F>
StormRun repeat_during_signal_storm(std::chrono::milliseconds duration, F&& step) {
  StormRun run;
  std::atomic<bool> go{false};
  std::thread worker([&] {
    while (!go) std::this_thread::yield();
    const auto until = std::chrono::steady_clock::now() + duration;
    try {
      for (; std::chrono::steady_clock::now() < until; ++run.steps) step();
    } catch (const std::exception& e) {
      run.failure = e.what();
    }
  });
  SignalStorm storm;
  go = true;
  worker.join();
  run.signals = storm.sent();
  return run;
}

}  // namespace tandem::test
