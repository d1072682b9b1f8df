#include "thread_pool.h"

#include <sched.h>

#include <chrono>
#include <system_error>

#include "tandem/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
static inline void cpu_relax() { _mm_pause(); }
#else
static inline void cpu_relax() {}
#endif

namespace tandem {

namespace {
// How long a member spins for the next job before it sleeps: long enough to span the gap between
// two steps even when the scheduler interrupts (at 100 us, batch-100 training lost 20% to wake-ups
// on an idle machine). Callers whose other threads need the cores between jobs call rest().
constexpr auto kSpinTime = std::chrono::microseconds(2000);
// How long the caller spins for the last shares before it yields its core between looks: shares
// of one job end within microseconds of each other on idle cores, but a member that was preempted
// mid-share may need the caller's core to finish.
constexpr auto kCallerSpinTime = std::chrono::microseconds(50);

uint64_t claim_word(uint64_t generation, uint64_t share) {
  return (generation & 0xffffffffu) << 32 | share;
}
}  // namespace

int ThreadPool::available_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

void ThreadPool::check_thread_count(int threads) {
  if (threads < 1) throw InputError("thread count must be at least 1, got " + std::to_string(threads));
  if (threads > kMaxThreads)
    throw InputError("thread count " + std::to_string(threads) + " is above the limit of " +
                     std::to_string(kMaxThreads) + " (this machine has " +
                     std::to_string(available_cores()) + " cores; 0 takes them all)");
}

ThreadPool::ThreadPool(int threads)
    : size_(threads), oversubscribed_(threads > available_cores()) {
  check_thread_count(threads);
  threads_.reserve(static_cast<size_t>(threads - 1));
  try {
    for (int member = 1; member < threads; ++member)
      threads_.emplace_back([this] { member_loop(); });
  } catch (const std::system_error& e) {
    // No destructor runs for a constructor that throws: the threads already started are stopped
    // here, or destroying them joinable would call std::terminate.
    stop_members();
    throw Error("cannot start " + std::to_string(threads) + " threads (" + e.what() +
                "): use fewer with --threads");
  } catch (...) {  // bad_alloc for a thread's state
    stop_members();
    throw;
  }
}

void ThreadPool::stop_members() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

ThreadPool::~ThreadPool() { stop_members(); }

void ThreadPool::rest() { resting_.store(true, std::memory_order_relaxed); }

void ThreadPool::pause() const {
  if (oversubscribed_) std::this_thread::yield();
  else cpu_relax();
}

void ThreadPool::call_share(int share) {
  try {
    trampoline_(job_, share);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
}

void ThreadPool::run_erased(void* fn, Trampoline trampoline) {
  if (size_ == 1) {
    trampoline(fn, 0);
    return;
  }
  uint64_t generation;
  {
    // The job is published under the mutex so a member that goes to sleep cannot miss it.
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = fn;
    trampoline_ = trampoline;
    error_ = nullptr;
    done_.store(0, std::memory_order_relaxed);
    resting_.store(false, std::memory_order_relaxed);
    generation = generation_.load(std::memory_order_relaxed) + 1;
    claims_.store(claim_word(generation, 0), std::memory_order_release);
    generation_.store(generation, std::memory_order_release);
  }
  wake_.notify_all();
  run_shares(generation);
  const auto spin_until = std::chrono::steady_clock::now() + kCallerSpinTime;
  for (int i = 0; done_.load(std::memory_order_acquire) != size_; ++i) {
    if ((i & 63) == 63 && std::chrono::steady_clock::now() > spin_until)
      std::this_thread::yield();
    else
      pause();
  }
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::run_shares(uint64_t generation) {
  for (;;) {
    uint64_t word = claims_.load(std::memory_order_acquire);
    do {
      if (word >> 32 != (generation & 0xffffffffu) || int(word & 0xffffffffu) >= size_) return;
    } while (!claims_.compare_exchange_weak(word, word + 1, std::memory_order_acq_rel));
    // The job cannot change before this share is done (the caller waits for it): job_ and
    // trampoline_ are this generation's.
    call_share(int(word & 0xffffffffu));
    done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::member_loop() {
  uint64_t seen = 0;
  for (;;) {
    const auto started = std::chrono::steady_clock::now();
    const auto spin_until = started + kSpinTime, yield_after = started + kCallerSpinTime;
    uint64_t now = generation_.load(std::memory_order_acquire);
    for (int i = 0; now == seen; ++i) {
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > yield_after)
        std::this_thread::yield();
      else
        pause();
      if ((i & 255) == 255 && (resting_.load(std::memory_order_relaxed) ||
                               std::chrono::steady_clock::now() > spin_until)) {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      }
      now = generation_.load(std::memory_order_acquire);
    }
    seen = now;
    if (stopping_.load(std::memory_order_acquire)) return;
    run_shares(seen);
  }
}

}  // namespace tandem
