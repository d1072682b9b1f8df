// What a worker's heartbeats carry, and how they tell a backend hung in one call (a hung GPU)
// from a slow step. Written by the worker's thread, read by its heartbeat thread. Internal to the
// engine.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

namespace tandem::roles {

struct WorkerStatus {
  // batches_done: batches whose gradients the servers applied; gradients_lost: batches whose
  // gradients a server never answered (it died, or restarted). `done` counts both: the task's
  // progress, batches this worker will not train again.
  std::atomic<int64_t> steps{0}, samples{0}, batches_done{0}, gradients_lost{0}, task{0}, done{0};
  std::atomic<int> queue_depth{0};
  // No batch for now: the coordinator has none to hand out until the others finish the epoch
  // (or one of them is lost and its batches come back).
  std::atomic<bool> idle{false};
  // Since when the backend has been in a call (steady-clock ns; 0: in none), and which: the
  // heartbeats report a call older than the step timeout (RunSettings::step_timeout_s).
  std::atomic<int64_t> busy_since_ns{0};
  std::atomic<const char*> busy_in{""};
  std::atomic<bool> stall_said{false};

  // The counters, as a heartbeat and the goodbye carry them.
  nlohmann::json counters() const;
};

// Marks the backend as in a call, for the heartbeats' stall check. A call that ends in an
// exception leaves the mark: the role is on its way out, and what it still does (a CUDA
// backend's destructor waits for its streams, which a hung GPU never finishes) stays under the
// check, so the coordinator hears of the stall and hands the task to another worker (the link
// outlives the backends) instead of taking the worker for a healthy one.
class InBackend {
 public:
  InBackend(WorkerStatus& status, const char* what);
  ~InBackend() {
    if (std::uncaught_exceptions() == exceptions_) status_.busy_since_ns = 0;
  }
  InBackend(const InBackend&) = delete;
  InBackend& operator=(const InBackend&) = delete;

 private:
  WorkerStatus& status_;
  const int exceptions_;
};

// A heartbeat's message: the counters, the samples per second since the previous beat, and
// `stalled` (said once on stderr too) while the backend has been in one call for longer than
// the step timeout (0: no check).
class WorkerHeartbeat {
 public:
  WorkerHeartbeat(std::shared_ptr<WorkerStatus> status, double step_timeout_s, std::string name);
  nlohmann::json operator()();

 private:
  std::shared_ptr<WorkerStatus> status_;
  double step_timeout_s_;
  std::string name_;
  std::chrono::steady_clock::time_point last_beat_;
  int64_t samples_at_last_beat_ = 0;
};

}  // namespace tandem::roles
