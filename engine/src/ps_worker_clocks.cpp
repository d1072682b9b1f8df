#include "ps_worker_clocks.h"

#include <algorithm>

namespace tandem {

void WorkerClocks::pushed(const std::string& worker, Clock::time_point now) {
  auto [it, added] = workers_.try_emplace(worker);
  Worker& w = it->second;  // (a new one: no pushes, never heard from, so not counting)
  registered_ += added ? 1 : 0;
  if (!counts(w, now)) rejoin(w, now);
  // The gap is measured even when the worker stopped counting meanwhile: that is how a worker
  // slower than the timeout gets the allowance it needs. An Idle between the two pushes makes
  // the gap the idle spell's, not a batch's: not measured.
  if (w.last_push != Clock::time_point{} && !w.idle_since_push) w.push_gap = now - w.last_push;
  ++w.pushes;
  w.last_heard = w.last_push = now;
  w.idle = w.idle_since_push = false;
}

void WorkerClocks::rejoin(Worker& w, Clock::time_point now) {
  // Joining late, back after a silence or from idling (or restarted, under a new identity), a
  // worker must not hold the others back until it has made up their pushes: its next push
  // brings it level with the slowest worker counting.
  uint64_t slowest = 0;
  bool any = false;
  for (const auto& kv : workers_) {
    if (&kv.second == &w || !counts(kv.second, now)) continue;
    slowest = any ? std::min(slowest, kv.second.pushes) : kv.second.pushes;
    any = true;
  }
  if (any) w.pushes = std::max(w.pushes, slowest - 1);  // (counting: at least one push)
}

WorkerClocks::Clock::duration WorkerClocks::allowance(const Worker& w) const {
  return std::min(std::max(timeout_, kGapsAllowed * w.push_gap), longest_);
}

bool WorkerClocks::counts(const Worker& w, Clock::time_point now) const {
  return w.pushes > 0 && !w.idle && now - w.last_heard <= allowance(w);
}

WorkerClocks::Clock::duration WorkerClocks::slowest_gaps(Clock::time_point now) const {
  Clock::duration longest{};
  for (const auto& kv : workers_)
    if (counts(kv.second, now)) longest = std::max(longest, kv.second.push_gap);
  return std::min(kGapsAllowed * longest, longest_);
}

void WorkerClocks::idle(const std::string& worker, Clock::time_point now) {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  it->second.idle = it->second.idle_since_push = true;
  it->second.last_idle = now;
}

void WorkerClocks::clear_idle() {
  for (auto& kv : workers_) kv.second.idle = false;
}

void WorkerClocks::forget_departed(Clock::time_point now) {
  if (now - last_forget_ < timeout_) return;
  last_forget_ = now;
  // (A worker that said Idle since its last push by its Idle messages: nothing it sends while
  // idle counts as heard by a sync server, and another's Pull would forget it before its own
  // came.)
  const auto departed = [&](const Worker& w) {
    if (!w.idle_since_push) return now - w.last_heard > kForgetAfterTimeouts * allowance(w);
    return now - std::max(w.last_heard, w.last_idle) > kForgetAfterTimeouts * longest_;
  };
  for (auto it = workers_.begin(); it != workers_.end();)
    it = departed(it->second) ? workers_.erase(it) : std::next(it);
}

void WorkerClocks::heard(const std::string& worker, Clock::time_point now) {
  forget_departed(now);
  const auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  Worker& w = it->second;
  if (!w.idle && !counts(w, now)) rejoin(w, now);  // back after a silence
  w.last_heard = now;
}

void WorkerClocks::resumed(const std::string& worker, Clock::time_point now) {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) return;
  // Heard now, before heard() forgets workers long silent: an idle worker sends nothing a sync
  // server counts, so a long idle spell would have it forgotten by its own Pull.
  it->second.idle = false;
  it->second.last_heard = now;
  heard(worker, now);
}

bool WorkerClocks::clock(const std::string& worker, uint64_t& out) const {
  const auto it = workers_.find(worker);
  if (it == workers_.end()) return false;
  out = it->second.pushes;
  return true;
}

bool WorkerClocks::within(uint64_t clock, int64_t bound, Clock::time_point now) const {
  for (const auto& kv : workers_) {
    const Worker& w = kv.second;
    if (!counts(w, now)) continue;  // idle, departed or stalled
    if (clock > w.pushes && int64_t(clock - w.pushes) > bound) return false;
  }
  return true;
}

int WorkerClocks::active(Clock::time_point now) const {
  int n = 0;
  for (const auto& kv : workers_) n += counts(kv.second, now);
  return n;
}

}  // namespace tandem
