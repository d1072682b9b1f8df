// A fixed team of threads that run one function together, the caller being member 0.
//
// Why not std::thread per call or a task queue: a training step is a few hundred microseconds at
// small batches, and waking a sleeping thread on another vCPU costs ~100 us on these machines.
// Members therefore spin briefly after each job (a step follows the previous one almost at once)
// and only then sleep on a condition variable.
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

  // Calls fn(member) for member in [0, size()) concurrently and returns when all are done.
  // An exception thrown by any member is rethrown here (the first one).
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
  void member_loop(int member);
  void stop_members();  // wakes the members to stop, and joins them
  void call_member(int member);

  void pause() const;

  int size_;
  bool oversubscribed_;  // more members than cores: spinning would starve the others, so yield
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
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
