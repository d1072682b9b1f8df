#include "ps_worker_clocks.h"

#include <algorithm>

namespace tandem {

void WorkerClocks::pushed(const std::string& worker, uint64_t version, Clock::time_point now) {
  Worker& w = workers_[worker];
  w.version = std::max(w.version, version);  // replies may overtake each other: keep the newest
  w.last_heard = now;
  w.idle = false;
}

void WorkerClocks::idle(const std::string& worker) {
  const auto it = workers_.find(worker);
  if (it != workers_.end()) it->second.idle = true;
}

void WorkerClocks::clear_idle() {
  for (auto& kv : workers_) kv.second.idle = false;
}

void WorkerClocks::heard(const std::string& worker, Clock::time_point now) {
  const auto it = workers_.find(worker);
  if (it != workers_.end()) it->second.last_heard = now;
}

bool WorkerClocks::clock(const std::string& worker, uint64_t& out) const {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) return false;
  out = it->second.version;
  return true;
}

bool WorkerClocks::within(uint64_t clock, int64_t bound, Clock::time_point now) const {
  for (const auto& kv : workers_) {
    const Worker& w = kv.second;
    if (w.idle || now - w.last_heard > timeout_) continue;  // idle, departed or stalled
    if (clock > w.version && int64_t(clock - w.version) > bound) return false;
  }
  return true;
}

int WorkerClocks::active(Clock::time_point now) const {
  int n = 0;
  for (const auto& kv : workers_) n += !kv.second.idle && now - kv.second.last_heard <= timeout_;
  return n;
}

}  // namespace tandem
