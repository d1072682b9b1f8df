// Bounded-staleness bookkeeping (ps_worker_clocks.h) on a clock of its own: levelling on rejoin,
// and the table forgetting workers long gone without forgetting that they registered.
#include "ps_worker_clocks.h"

#include <gtest/gtest.h>

namespace tandem {
namespace {

using std::chrono::milliseconds;

TEST(WorkerClocks, AReturningWorkerComesBackLevelWithTheSlowest) {
  WorkerClocks clocks(100, 6000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  clocks.pushed("a", t0);
  clocks.pushed("b", t0);  // new: levelled one behind a, then its push
  clocks.pushed("a", t0);
  clocks.pushed("a", t0);
  uint64_t clock = 0;
  ASSERT_TRUE(clocks.clock("b", clock));
  EXPECT_EQ(clock, 1u);
  EXPECT_FALSE(clocks.within(3, 1, t0));  // a is 2 ahead of b
  // b silent past the timeout holds a back no longer; back, it starts one behind a.
  const auto later = t0 + milliseconds(150);
  clocks.pushed("a", later);
  EXPECT_TRUE(clocks.within(4, 1, later));
  clocks.pushed("b", later);
  ASSERT_TRUE(clocks.clock("b", clock));
  EXPECT_EQ(clock, 4u);
}

// Each reconnect is a new routing identity: the old ones are dropped after ten timeouts of
// silence, but still count as registered (a sync server's start waits for that many).
TEST(WorkerClocks, WorkersLongGoneAreForgottenButStayCountedAsRegistered) {
  WorkerClocks clocks(100, 6000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  clocks.pushed("old", t0);
  clocks.pushed("new", t0);
  EXPECT_EQ(clocks.known(), 2);
  uint64_t clock = 0;
  const auto soon = t0 + milliseconds(500);  // five timeouts: kept
  clocks.heard("new", soon);
  EXPECT_TRUE(clocks.clock("old", clock));
  const auto much_later = t0 + milliseconds(1200);  // twelve: forgotten
  clocks.heard("new", much_later);
  EXPECT_FALSE(clocks.clock("old", clock));
  EXPECT_TRUE(clocks.clock("new", clock));
  EXPECT_EQ(clocks.known(), 2);
  EXPECT_EQ(clocks.active(much_later), 1);
}

// A worker whose pushes come 150 ms apart, with a timeout of 100 ms: it counts for three of its
// gaps (450 ms) after its last push, not for the timeout, and is not forgotten while it does. An
// Idle between two pushes is not a gap.
TEST(WorkerClocks, AWorkerSlowerThanTheTimeoutCountsForThreeOfItsPushGaps) {
  WorkerClocks clocks(100, 6000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  clocks.pushed("fast", t0);
  clocks.pushed("slow", t0);
  clocks.pushed("slow", t0 + milliseconds(150));
  EXPECT_EQ(clocks.slowest_gaps(t0 + milliseconds(150)), milliseconds(450));
  const auto later = t0 + milliseconds(500);  // the slow one's last push 350 ms ago
  clocks.pushed("fast", later);
  EXPECT_EQ(clocks.active(later), 2);
  clocks.pushed("fast", t0 + milliseconds(550));
  EXPECT_EQ(clocks.active(t0 + milliseconds(600)), 2);  // slow: its last push 450 ms ago
  EXPECT_EQ(clocks.active(t0 + milliseconds(601)), 1);
  EXPECT_EQ(clocks.active(t0 + milliseconds(700)), 1);  // fast (gap 50 ms): for 150 ms
  EXPECT_EQ(clocks.active(t0 + milliseconds(701)), 0);
  uint64_t clock = 0;
  clocks.heard("fast", t0 + milliseconds(1500));  // forgetting runs: 1,350 ms < 10 x 450 ms
  EXPECT_TRUE(clocks.clock("slow", clock));
  // An Idle between two pushes: the spell is not measured as a gap (fast's stays 50 ms).
  clocks.idle("fast", t0 + milliseconds(1500));
  clocks.pushed("fast", t0 + milliseconds(2500));
  EXPECT_EQ(clocks.slowest_gaps(t0 + milliseconds(2500)), milliseconds(150));
}

// A worker first heard from after the others have pushed is levelled to their clock (rejoin), but
// it has no push gap yet: its first gap came out as the steady clock's age (its last push never
// set), and every sync step then waited the longest allowance for it.
TEST(WorkerClocks, ALateJoinerHasNoPushGapUntilItsSecondPush) {
  WorkerClocks clocks(100, 6000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  for (int k = 0; k < 4; ++k) {
    clocks.pushed("a", t0 + milliseconds(50 * k));
    clocks.pushed("b", t0 + milliseconds(50 * k));
  }
  clocks.pushed("late", t0 + milliseconds(200));
  EXPECT_EQ(clocks.slowest_gaps(t0 + milliseconds(200)), milliseconds(150));
  EXPECT_EQ(clocks.active(t0 + milliseconds(301)), 0);  // all three past their 100 ms
}

// The allowance stops at the longest wait (a server's: below its clients' request timeout).
TEST(WorkerClocks, AnAllowanceStopsAtTheLongestWait) {
  WorkerClocks clocks(100, 1000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  clocks.pushed("slow", t0);
  clocks.pushed("slow", t0 + milliseconds(900));  // three gaps: 2,700 ms
  EXPECT_EQ(clocks.slowest_gaps(t0 + milliseconds(900)), milliseconds(1000));
  EXPECT_EQ(clocks.active(t0 + milliseconds(1900)), 1);
  EXPECT_EQ(clocks.active(t0 + milliseconds(1901)), 0);
}

// A sync worker idle for longer than ten allowances (nothing it sends while idle counts as heard)
// was forgotten by its own resuming Pull, and then left out of the next step again.
TEST(WorkerClocks, AWorkerBackFromALongIdleSpellCountsAgain) {
  WorkerClocks clocks(100, 6000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  clocks.pushed("a", t0);
  clocks.pushed("b", t0);
  clocks.idle("b", t0);
  const auto later = t0 + std::chrono::seconds(30);  // 300 timeouts
  clocks.pushed("a", later);
  clocks.resumed("b", later);
  uint64_t clock = 0;
  EXPECT_TRUE(clocks.clock("b", clock));
  EXPECT_EQ(clocks.active(later), 2);
  // Nor by another's: c, idle as long, is still known when b's Pull forgets the departed.
  WorkerClocks three(100, 6000);
  for (const char* w : {"a", "b", "c"}) three.pushed(w, t0);
  three.idle("b", t0);
  three.idle("c", t0);
  three.pushed("a", later);
  three.resumed("b", later);
  EXPECT_TRUE(three.clock("c", clock));
  three.resumed("c", later);
  EXPECT_EQ(three.active(later), 3);
}

// A worker that left while it waited for work (its last message an Idle) is forgotten once its
// Idle messages have stopped for ten longest waits; one still sending them is kept however long
// it waits. Such a worker was kept for good: one entry per worker that left waiting.
TEST(WorkerClocks, AWorkerThatLeftWhileIdleIsForgottenOnceItsIdleMessagesStop) {
  WorkerClocks clocks(100, 1000);
  const auto t0 = WorkerClocks::Clock::time_point{} + std::chrono::hours(1);
  for (const char* w : {"a", "left", "waiting"}) clocks.pushed(w, t0);
  clocks.idle("left", t0);
  for (int s = 1; s <= 12; ++s) {
    const auto now = t0 + std::chrono::seconds(s);
    clocks.idle("waiting", now);  // a waiting worker says so all along
    clocks.pushed("a", now);
    clocks.heard("a", now);
  }
  uint64_t clock = 0;
  EXPECT_FALSE(clocks.clock("left", clock));  // silent 12 s > 10 x 1,000 ms
  EXPECT_TRUE(clocks.clock("waiting", clock));
  EXPECT_TRUE(clocks.clock("a", clock));
  EXPECT_EQ(clocks.known(), 3);
}

}  // namespace
}  // namespace tandem
