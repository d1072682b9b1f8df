// Bounded-staleness bookkeeping: each worker's clock and when it was last heard from, keyed by its
// ZeroMQ routing identity. A worker silent for longer than the timeout stops counting as active,
// so one that left (ROUTER sockets do not report disconnects) cannot hold the others back forever.
//
// The clock counts the worker's pushes (stale synchronous parallel's clock: its steps), and a
// worker first heard from, or back after a silence or from idling, starts level with the slowest
// active one. That levelling is each server's own, so servers may disagree on a rejoining
// worker's clock by the pushes in flight when it rejoined; with a small bound that can still hold
// two workers for each other, each on another server, until the worker timeout, as the version
// clocks did on every push. (A clock kept by the worker and levelled across servers would close
// that; not built.) Every push goes to every
// server, so all servers agree on every worker's clock. The parameter version a push was computed
// on would not do: each server's versions follow the order pushes reached it, so worker A could
// be ahead on one server and B on another, each held for the other until one stopped counting as
// active.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace tandem {

class WorkerClocks {
 public:
  using Clock = std::chrono::steady_clock;

  explicit WorkerClocks(int timeout_ms) : timeout_(std::chrono::milliseconds(timeout_ms)) {}

  // A valid push from `worker`: moves its clock on by one (from where rejoin puts it when it did
  // not count: new, silent too long, or idle).
  void pushed(const std::string& worker, Clock::time_point now);
  // Any message from `worker`: a registered worker stays active, or counts again after a silence
  // (rejoin); unknown ones are ignored: a worker counts once it has pushed, so a reader that
  // never pushes holds nobody back.
  void heard(const std::string& worker, Clock::time_point now);
  // `worker` has no batch to train for now (an Idle message): until its next push it holds
  // nobody back (active and within leave it out), as if it had left; sync steps end it sooner
  // (clear_idle). Unknown workers are ignored.
  void idle(const std::string& worker);
  // Every idle worker counts again (a sync step was applied: the next waits for them again,
  // unless they say Idle again).
  void clear_idle();
  // The clock of a registered worker, or false.
  bool clock(const std::string& worker, uint64_t& out) const;
  // May a worker at `clock` be answered: true when no active worker is more than `bound`
  // pushes behind it (or none is active).
  bool within(uint64_t clock, int64_t bound, Clock::time_point now) const;
  // Workers heard from within the timeout and not idle.
  int active(Clock::time_point now) const;
  // Registrations: a worker forgotten (forget_departed) that pushes again under the same
  // identity counts twice; a reconnect is a new identity anyway.
  int known() const { return registered_; }

 private:
  struct Worker {
    uint64_t pushes = 0;  // the clock
    Clock::time_point last_heard;
    bool idle = false;
  };
  // Forgets workers silent for kForgetAfterTimeouts timeouts: a worker that reconnects comes
  // back under a new routing identity, so without this the table (scanned on every request)
  // would grow by one entry per reconnect for the whole run. Runs at most once a timeout.
  void forget_departed(Clock::time_point now);
  static constexpr int kForgetAfterTimeouts = 10;
  // Registered, not idle and heard from within the timeout: it holds faster workers back.
  bool counts(const Worker& w, Clock::time_point now) const;
  // A worker that did not count comes back one push behind the slowest that counts (at least
  // where it was), so that its next push brings it level.
  void rejoin(Worker& w, Clock::time_point now);
  Clock::duration timeout_;
  std::map<std::string, Worker> workers_;
  Clock::time_point last_forget_{};
  int registered_ = 0;
};

}  // namespace tandem
