#include "thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>
#include <stdexcept>

#include "test_support.h"

namespace tandem {
namespace {

TEST(ThreadPool, EveryMemberRunsEachJobOnce) {
  for (int size : {1, 2, 4}) {
    ThreadPool pool(size);
    std::vector<std::atomic<int>> counts(static_cast<size_t>(size));
    for (int job = 0; job < 500; ++job) pool.run([&](int member) { counts[member]++; });
    for (int m = 0; m < size; ++m) EXPECT_EQ(counts[m].load(), 500) << "member " << m;
  }
}

// Shares are claimed by whichever thread is free (the caller included), so a member that the
// scheduler holds off does not hold the job up. Each share still runs exactly once per job, with
// its own index, on the caller or one of the pool's threads; oversubscribed here (more threads
// than cores), so that threads are late often.
TEST(ThreadPool, EachShareRunsOnceWhicheverThreadTakesIt) {
  const int size = 4 * ThreadPool::available_cores();
  ThreadPool pool(size);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> ran_on(static_cast<size_t>(size));
  std::set<std::thread::id> threads;
  for (int job = 0; job < 300; ++job) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(size));
    pool.run([&](int share) {
      runs[share]++;
      ran_on[share] = std::this_thread::get_id();
    });
    for (int s = 0; s < size; ++s) {
      ASSERT_EQ(runs[s].load(), 1) << "job " << job << " share " << s;
      threads.insert(ran_on[s]);
    }
  }
  EXPECT_TRUE(threads.count(caller));
  EXPECT_LE(threads.size(), size_t(size));  // the caller and the pool's own threads only
}

TEST(ThreadPool, RethrowsAMemberException) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.run([](int member) {
    if (member == 2) throw std::runtime_error("member 2 failed");
  }), std::runtime_error);
  std::atomic<int> ran{0};
  pool.run([&](int) { ran++; });  // still usable afterwards
  EXPECT_EQ(ran.load(), 3);
}

TEST(ThreadPool, WakesAfterSleeping) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  pool.run([&](int) { ran++; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin window
  pool.run([&](int) { ran++; });
  EXPECT_EQ(ran.load(), 4);
}

TEST(ThreadPool, RestingMembersWakeForTheNextJob) {
  ThreadPool pool(2);
  std::atomic<int> ran{0};
  for (int i = 0; i < 50; ++i) {
    pool.run([&](int) { ran++; });
    pool.rest();
    if (i % 10 == 0) std::this_thread::sleep_for(std::chrono::microseconds(300));
  }
  EXPECT_EQ(ran.load(), 100);
}

TEST(ThreadPool, SplitCoversTheRangeExactly) {
  for (int64_t n : {0, 1, 7, 100})
    for (int parts : {1, 2, 3, 8}) {
      EXPECT_EQ(split_begin(n, parts, 0), 0);
      EXPECT_EQ(split_begin(n, parts, parts), n);
      for (int p = 0; p < parts; ++p) EXPECT_LE(split_begin(n, parts, p), split_begin(n, parts, p + 1));
    }
  EXPECT_THROW(ThreadPool(0), std::exception);
}

}  // namespace
}  // namespace tandem
