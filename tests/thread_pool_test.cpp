#include "thread_pool.h"

#include <atomic>
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
