// A fixed team of threads that run one function together: fn(share) for every share in
// [0, size()), the caller taking part.
//
// Why not std::thread per call or a task queue: a training step is a few hundred microseconds at
// small batches, and waking a sleeping thread on another vCPU costs ~100 us on these machines.
// Members therefore spin briefly after each job (a step follows the previous one almost at once)
// and only then sleep on a condition variable.
//
// Shares are claimed, not assigned: whichever thread is free takes the next share not yet taken,
// the caller included. On a machine whose cores are busy with other work a member may not run for
// a scheduler slice (milliseconds); the caller then runs its share too instead of waiting, where
// a fixed share per thread made training at batch 100 on two threads 7x slower than on one
// (bench/RESULTS.md). A share's work and results depend on its index only, never on the thread
// that runs it, so the bits are the same whoever runs which share.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace tandem {

class ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1; threads - 1 are started
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return size_; }

  // Calls fn(share) for share in [0, size()), concurrently as threads are free, and returns when
  // all are done. fn must not depend on which thread runs a share. An exception thrown by any
  // share is rethrown here (the first one).
  template <typename Fn>
  void run(Fn&& fn) {
    run_erased(&fn, [](void* f, int member) { (*static_cast<Fn*>(f))(member); });
  }

  // Sends the spinning members to sleep at once instead of at the end of their spin window: for
  // callers that know no job will come for a while and whose other threads need the cores (the
  // trainer before it waits on the chunk manager). The next run() wakes them.
  void rest();

  // Number of cores this process may run on.
  static int available_cores();
  // Every step wakes and waits for each member: thousands of them (a typo for 16) make a run
  // crawl for minutes while holding gigabytes of stacks. 1,024 still reproduces, thread for
  // thread, a run of a machine with that many cores.
  static constexpr int kMaxThreads = 1024;
  // InputError unless 1 <= threads <= kMaxThreads, saying so: what the constructor refuses, for a
  // caller that checks before it writes anything.
  static void check_thread_count(int threads);

 private:
  using Trampoline = void (*)(void*, int);
  void run_erased(void* fn, Trampoline trampoline);
  void member_loop();
  void stop_members();  // wakes the members to stop, and joins them
  // Claims and runs shares of job `generation` until none is left to claim.
  void run_shares(uint64_t generation);
  void call_share(int share);

  void pause() const;

  int size_;
  bool oversubscribed_;  // more members than cores: spinning would starve the others, so yield
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  // The job's generation (low 32 bits) in the high half and the next share to claim in the low
  // half: a claim is one compare-and-swap, and a thread late for a job cannot claim a share of
  // the next one under the old job's function.
  std::atomic<uint64_t> claims_{0};
  std::atomic<int> done_{0};  // shares of the current job finished
  std::atomic<bool> stopping_{false};
  std::atomic<bool> resting_{false};
  void* job_ = nullptr;
  Trampoline trampoline_ = nullptr;
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

// Splits [0, n) into `parts` contiguous ranges and returns the begin of range `part`
// (range `part` is [split_begin(n, parts, part), split_begin(n, parts, part + 1))).
inline int64_t split_begin(int64_t n, int parts, int part) {
  return n * part / parts;
}

}  // namespace tandem
