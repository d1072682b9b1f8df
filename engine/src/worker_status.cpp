#include "worker_status.h"

#include <cstdio>
#include <utility>

namespace tandem::roles {

using Clock = std::chrono::steady_clock;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

nlohmann::json WorkerStatus::counters() const {
  return {{"steps", steps.load()},          {"samples", samples.load()},
          {"batches_done", batches_done.load()}, {"gradients_lost", gradients_lost.load()},
          {"task", task.load()},            {"done", done.load()},
          {"queue_depth", queue_depth.load()}, {"idle", idle.load()}};
}

InBackend::InBackend(WorkerStatus& status, const char* what)
    : status_(status), exceptions_(std::uncaught_exceptions()) {
  status_.busy_in = what;
  status_.busy_since_ns = now_ns();
}

WorkerHeartbeat::WorkerHeartbeat(std::shared_ptr<WorkerStatus> status, double step_timeout_s,
                                 std::string name)
    : status_(std::move(status)),
      step_timeout_s_(step_timeout_s),
      name_(std::move(name)),
      last_beat_(Clock::now()) {}

nlohmann::json WorkerHeartbeat::operator()() {
  const auto now = Clock::now();
  nlohmann::json beat = status_->counters();
  const int64_t samples = beat["samples"];
  const double dt = std::chrono::duration<double>(now - last_beat_).count();
  beat["samples_per_s"] = dt > 0 ? double(samples - samples_at_last_beat_) / dt : 0.0;
  last_beat_ = now;
  samples_at_last_beat_ = samples;
  const int64_t since = status_->busy_since_ns.load();
  const double busy_s = since != 0 ? double(now_ns() - since) / 1e9 : 0.0;
  if (step_timeout_s_ > 0 && busy_s > step_timeout_s_) {
    char text[256];
    std::snprintf(text, sizeof text,
                  "its backend has not returned from %s for %.3g s (step timeout %g s): a hung "
                  "GPU?", status_->busy_in.load(), busy_s, step_timeout_s_);
    beat["stalled"] = text;
    if (!status_->stall_said.exchange(true)) std::fprintf(stderr, "%s: %s\n", name_.c_str(), text);
  } else if (since == 0) {
    status_->stall_said = false;  // returned: a later stall is said again
  }
  return beat;
}

}  // namespace tandem::roles
