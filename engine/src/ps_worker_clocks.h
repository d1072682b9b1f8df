// Bounded-staleness and sync bookkeeping: each worker's clock and when it was last heard from,
// keyed by its ZeroMQ routing identity. A worker silent for longer than its allowance stops
// counting as active, so one that left (ROUTER sockets do not report disconnects) cannot hold the
// others back forever. The allowance is the timeout, or kGapsAllowed times the time between the
// worker's last two pushes when that is longer (at most `longest_ms`): a worker whose batch takes
// 3 s computes in silence for 3 s, and a 2 s timeout alone would count it gone at every step (a
// sync server then stepped without it and dropped its gradient as stale, every round).
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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

namespace tandem {

class WorkerClocks {
 public:
  using Clock = std::chrono::steady_clock;

  // longest_ms: the most a worker's allowance (and slowest_gaps) may grow to, a timeout_ms
  // above it included; below the clients' request timeout, or a sync step's held replies would
  // time out while it waits.
  WorkerClocks(int timeout_ms, int longest_ms)
      : timeout_(std::chrono::milliseconds(timeout_ms)),
        longest_(std::chrono::milliseconds(longest_ms)) {}

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
  void idle(const std::string& worker, Clock::time_point now);
  // A Pull from `worker` (sync mode): it is back at work after idling and computes its next
  // gradient on the parameters pulled, so it counts again at once; a step applied before its
  // push would leave that gradient stale. Unknown workers (readers) are ignored.
  void resumed(const std::string& worker, Clock::time_point now);
  // Every idle worker counts again (a sync step was applied: the next waits for them again,
  // unless they say Idle again).
  void clear_idle();
  // The clock of a registered worker, or false.
  bool clock(const std::string& worker, uint64_t& out) const;
  // May a worker at `clock` be answered: true when no active worker is more than `bound`
  // pushes behind it (or none is active).
  bool within(uint64_t clock, int64_t bound, Clock::time_point now) const;
  // Workers heard from within their allowance and not idle.
  int active(Clock::time_point now) const;
  // kGapsAllowed times the longest push gap of the workers counting (zero when none is known):
  // a sync step waits at least this long for its gradients before it is applied without them,
  // so that a worker whose batches take longer than the step timeout is not left out of every
  // step.
  Clock::duration slowest_gaps(Clock::time_point now) const;
  // How many of a worker's push gaps it may stay silent for.
  static constexpr int kGapsAllowed = 3;
  // Registrations: a worker forgotten (forget_departed) that pushes again under the same
  // identity counts twice; a reconnect is a new identity anyway.
  int known() const { return registered_; }

 private:
  struct Worker {
    uint64_t pushes = 0;  // the clock
    Clock::time_point last_heard;
    Clock::time_point last_push;  // epoch: it has not pushed (rejoin may level `pushes` above 0)
    // Between its last two pushes, with no Idle between them (zero: not known yet).
    Clock::duration push_gap{};
    bool idle = false;
    bool idle_since_push = false;
    Clock::time_point last_idle;  // its last Idle message: a waiting worker sends them all along
  };
  // Forgets workers silent for kForgetAfterTimeouts allowances: a worker that reconnects comes
  // back under a new routing identity, so without this the table (scanned on every request)
  // would grow by one entry per reconnect for the whole run. Runs at most once a timeout. A
  // worker idle since its last push is forgotten only once its Idle messages too have stopped
  // for kForgetAfterTimeouts longest waits (it was never forgotten: one entry per worker that
  // left while it waited for work).
  void forget_departed(Clock::time_point now);
  static constexpr int kForgetAfterTimeouts = 10;
  // Registered, not idle and heard from within its allowance: it holds faster workers back.
  bool counts(const Worker& w, Clock::time_point now) const;
  Clock::duration allowance(const Worker& w) const;
  // A worker that did not count comes back one push behind the slowest that counts (at least
  // where it was), so that its next push brings it level.
  void rejoin(Worker& w, Clock::time_point now);
  Clock::duration timeout_;
  Clock::duration longest_;
  std::map<std::string, Worker> workers_;
  Clock::time_point last_forget_{};
  int registered_ = 0;
};

}  // namespace tandem
