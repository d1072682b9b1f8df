// Fed runs: the FeedQueue that hands blocks of rows to a worker in its own process, whole fed
// clusters with every role a thread (inproc), the failures a fed run can meet, the coordinator's
// side of a fed run, and the scores channel's subscriber.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "bare_coordinator.h"
#include "cluster_link.h"
#include "cluster_roles.h"
#include "cluster_run.h"
#include "coordinator.h"
#include "coordinator_replies.h"
#include "dataset_store.h"
#include "feed_queue.h"
#include "ps_client.h"
#include "score_subscriber.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "test_support.h"

namespace tandem {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// An owner that counts itself in `live` while it exists (id: what the block carries).
std::shared_ptr<void> counted_owner(std::atomic<int>& live, int id = 0) {
  ++live;
  return std::shared_ptr<int>(new int(id), [&live](int* p) {
    delete p;
    --live;
  });
}

// A block of `rows` rows (no pixels: the queue never reads them) owned by `owner`.
FedBlock bare_block(int64_t rows, std::shared_ptr<void> owner) {
  FedBlock b;
  b.rows.rows = rows;
  b.owner = std::move(owner);
  return b;
}

// A block whose rows live in its owner, counted in `live` until released.
FedBlock data_block(Dataset data, std::atomic<int>& live) {
  ++live;
  std::shared_ptr<Dataset> owner(new Dataset(std::move(data)), [&live](Dataset* p) {
    delete p;
    --live;
  });
  FedBlock b;
  b.rows = owner->view();
  b.owner = owner;
  return b;
}

int id_of(const FedBlock& b) { return *std::static_pointer_cast<int>(b.owner); }

TEST(FeedQueue, BlocksComeOutInTheOrderFedAndAreCounted) {
  std::atomic<int> live{0};
  FeedQueue q;
  for (int i = 1; i <= 3; ++i) EXPECT_TRUE(q.push(bare_block(i * 10, counted_owner(live, i)), 0));
  EXPECT_EQ(q.depth(), 3u);
  EXPECT_EQ(q.blocks_fed(), 3);
  EXPECT_EQ(q.rows_fed(), 60);
  for (int i = 1; i <= 3; ++i) {
    std::optional<FedBlock> b = q.pop(1000);
    ASSERT_TRUE(b);
    EXPECT_EQ(id_of(*b), i);
    EXPECT_EQ(b->rows.rows, i * 10);
    EXPECT_EQ(q.depth(), size_t(3 - i));
  }
  // Counters are what was fed, not what is queued.
  EXPECT_EQ(q.blocks_fed(), 3);
  EXPECT_EQ(q.rows_fed(), 60);
  const auto t0 = Clock::now();
  EXPECT_FALSE(q.pop(50));  // empty: nothing after the timeout
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(40));
  EXPECT_FALSE(q.closed());
  EXPECT_EQ(live.load(), 0);
}

TEST(FeedQueue, AnOwnerIsReleasedOnceThePoppedBlockIsDropped) {
  std::atomic<int> live{0};
  FeedQueue q;
  q.push(bare_block(5, counted_owner(live, 7)));
  EXPECT_EQ(live.load(), 1);
  std::optional<FedBlock> b = q.pop(1000);
  ASSERT_TRUE(b);
  EXPECT_EQ(live.load(), 1);  // the worker still trains on it
  b.reset();
  EXPECT_EQ(live.load(), 0);
}

TEST(FeedQueue, CapacityMakesPushWaitTimeOutAndGoOnAfterAPop) {
  std::atomic<int> live{0};
  FeedQueue q(2);
  EXPECT_TRUE(q.push(bare_block(1, counted_owner(live, 1)), 0));
  EXPECT_TRUE(q.push(bare_block(1, counted_owner(live, 2)), 0));
  const auto t0 = Clock::now();
  EXPECT_FALSE(q.push(bare_block(1, counted_owner(live, 3)), 50));  // full
  EXPECT_GE(Clock::now() - t0, std::chrono::milliseconds(40));
  EXPECT_EQ(live.load(), 2);  // the refused block is not kept
  EXPECT_EQ(q.blocks_fed(), 2);
  EXPECT_EQ(q.depth(), 2u);
  // A push that waits as long as it takes goes in once a block is popped.
  std::atomic<bool> pushed{false};
  std::thread feeder([&] { pushed = q.push(bare_block(1, counted_owner(live, 4)), -1); });
  EXPECT_TRUE(test::eventually([&] { return q.waiting() == 1; }, 10000)) << "never blocked";
  std::optional<FedBlock> first = q.pop(1000);
  feeder.join();
  EXPECT_TRUE(pushed);
  ASSERT_TRUE(first);
  EXPECT_EQ(id_of(*first), 1);
  EXPECT_EQ(q.depth(), 2u);
  EXPECT_EQ(q.blocks_fed(), 3);
  std::optional<FedBlock> second = q.pop(1000), third = q.pop(1000);
  ASSERT_TRUE(second);
  ASSERT_TRUE(third);
  EXPECT_EQ(id_of(*second), 2);
  EXPECT_EQ(id_of(*third), 4);
}

// A check set while a push waits for room (a feeder blocked on a full queue as the worker
// registers) is run on its block before it is queued; and a push to a closed queue says why it
// is closed, whatever the check would say. The check once ran only as push began: the block
// went in unchecked, and failed the whole run when the worker took it.
TEST(FeedQueue, ACheckSetWhileAPushWaitsIsRunOnItsBlock) {
  std::atomic<int> live{0};
  FeedQueue q(1);
  ASSERT_TRUE(q.push(bare_block(1, counted_owner(live, 1)), 0));
  std::string refused;
  std::thread feeder([&] {
    try {
      q.push(bare_block(7, counted_owner(live, 2)), -1);
    } catch (const InputError& e) {
      refused = e.what();
    }
  });
  EXPECT_TRUE(test::eventually([&] { return q.waiting() == 1; }, 10000)) << "never blocked";
  q.check_blocks_with([](const DatasetView& rows) {
    if (rows.rows > 5) throw InputError("a block of " + std::to_string(rows.rows) + " rows");
  });
  feeder.join();  // woken by the check, not by room: the queue is still full
  EXPECT_EQ(refused, "a block of 7 rows");
  EXPECT_EQ(q.depth(), 1u);
  EXPECT_EQ(q.blocks_fed(), 1);
  EXPECT_TRUE(q.push(bare_block(3, counted_owner(live, 3)), 0) == false);  // full, passes
  q.close("the worker stopped on an error");
  try {
    q.push(bare_block(9, counted_owner(live, 4)), 0);
    ADD_FAILURE() << "a closed queue took a block";
  } catch (const InputError& e) {
    ADD_FAILURE() << "the check answered for a closed queue: " << e.what();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "cannot feed this worker: the worker stopped on an error");
  }
  EXPECT_EQ(live.load(), 0);
}

TEST(FeedQueue, CloseWakesABlockedPushWithTheReason) {
  std::atomic<int> live{0};
  FeedQueue q(1);
  q.push(bare_block(1, counted_owner(live)));
  std::string error;
  std::thread feeder([&] {
    try {
      q.push(bare_block(1, counted_owner(live)), 60000);
      error = "pushed";
    } catch (const Error& e) {
      error = e.what();
    }
  });
  EXPECT_TRUE(test::eventually([&] { return q.waiting() == 1; }, 10000)) << "never blocked";
  const auto t0 = Clock::now();
  q.close("worker3 has stopped");
  feeder.join();
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_NE(error.find("worker3 has stopped"), std::string::npos) << error;
  EXPECT_TRUE(q.closed());
  EXPECT_EQ(live.load(), 0);  // the queued block and the refused one
  EXPECT_EQ(q.blocks_fed(), 1);
  // Later pushes too; the first reason stays.
  q.close("another reason");
  try {
    q.push(bare_block(1, counted_owner(live)), 0);
    FAIL() << "a closed feed took a block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker3 has stopped"), std::string::npos) << e.what();
  }
  EXPECT_EQ(live.load(), 0);
}

TEST(FeedQueue, CloseWakesABlockedPop) {
  FeedQueue q;
  std::atomic<bool> got{true};
  const auto t0 = Clock::now();
  std::thread worker([&] { got = q.pop(60000).has_value(); });
  EXPECT_TRUE(test::eventually([&] { return q.waiting() == 1; }, 10000)) << "never blocked";
  q.close("training is over");
  worker.join();
  EXPECT_FALSE(got);
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
  EXPECT_FALSE(q.pop(60000));  // closed and empty: at once
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(10));
}

// The feeder's end of input: no more pushes (saying why), the queued blocks still come out in
// order, then nothing at once.
TEST(FeedQueue, EndOfInputKeepsTheQueuedBlocksForThePops) {
  std::atomic<int> live{0};
  FeedQueue q;
  for (int i = 1; i <= 2; ++i) q.push(bare_block(10, counted_owner(live, i)));
  q.end_input("the feeder is done");
  EXPECT_TRUE(q.closed());
  EXPECT_TRUE(test::contains(
      test::error_of<Error>([&] { q.push(bare_block(1, counted_owner(live, 3)), 0); }),
      "cannot feed this worker: the feeder is done"));
  for (int i = 1; i <= 2; ++i) {
    std::optional<FedBlock> b = q.pop(1000);
    ASSERT_TRUE(b);
    EXPECT_EQ(id_of(*b), i);
  }
  const auto t0 = Clock::now();
  EXPECT_FALSE(q.pop(5000));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(1000));
  EXPECT_EQ(live.load(), 0);
}

TEST(FeedQueue, CloseReleasesTheQueuedBlocksOwners) {
  std::atomic<int> live{0};
  FeedQueue q;
  for (int i = 0; i < 3; ++i) q.push(bare_block(4, counted_owner(live, i)));
  EXPECT_EQ(live.load(), 3);
  q.close("worker0 stopped on an error");
  EXPECT_EQ(live.load(), 0);
  EXPECT_EQ(q.depth(), 0u);
  EXPECT_FALSE(q.pop(0));
  EXPECT_EQ(q.blocks_fed(), 3);
  EXPECT_EQ(q.rows_fed(), 12);
}

TEST(FeedQueue, TwoFeedersOneWorkerSeeEveryBlockExactlyOnceInEachFeedersOrder) {
  std::atomic<int> live{0};
  constexpr int kPerFeeder = 500;
  FeedQueue q(4);
  auto feed = [&](int feeder) {
    for (int i = 0; i < kPerFeeder; ++i)
      q.push(bare_block(1 + i % 3, counted_owner(live, feeder * kPerFeeder + i)));
  };
  std::thread a(feed, 0), b(feed, 1);
  std::vector<int> seen;
  int64_t rows = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (seen.size() < 2 * kPerFeeder && Clock::now() < deadline) {
    std::optional<FedBlock> block = q.pop(100);
    if (!block) continue;
    seen.push_back(id_of(*block));
    rows += block->rows.rows;
    EXPECT_LE(q.depth(), 4u);
  }
  a.join();
  b.join();
  ASSERT_EQ(seen.size(), size_t(2 * kPerFeeder));
  EXPECT_EQ(std::set<int>(seen.begin(), seen.end()).size(), seen.size());
  int last[2] = {-1, -1};
  for (int id : seen) {
    const int feeder = id / kPerFeeder;
    EXPECT_GT(id, last[feeder]) << "feeder " << feeder << "'s blocks out of order";
    last[feeder] = id;
  }
  EXPECT_EQ(q.blocks_fed(), 2 * kPerFeeder);
  EXPECT_EQ(q.rows_fed(), rows);
  EXPECT_EQ(q.depth(), 0u);
  EXPECT_EQ(live.load(), 0);
}

// Roles as threads of this process; what each threw is kept. When a test ends early (a failed
// ASSERT), the run is failed so that every role returns, and the threads are joined.
class RoleThreads {
 public:
  explicit RoleThreads(Coordinator& c) : coordinator_(c) {}
  ~RoleThreads() {
    if (!threads_.empty()) {
      coordinator_.fail("the test ended");
      join();
    }
  }
  // Returns the thread's index, for join_one().
  size_t start(void (*role)(const RoleOptions&), RoleOptions o) {
    threads_.emplace_back([this, role, o] {
      try {
        role(o);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        errors_[o.name] = std::current_exception();
      }
    });
    return threads_.size() - 1;
  }
  void join_one(size_t i) {
    if (threads_[i].joinable()) threads_[i].join();
  }
  void join() {
    for (std::thread& t : threads_)
      if (t.joinable()) t.join();
    threads_.clear();
  }
  std::exception_ptr error(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = errors_.find(name);
    return it == errors_.end() ? nullptr : it->second;
  }
  std::string errors() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::string all;
    for (const auto& [name, e] : errors_) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        all += name + ": " + x.what() + "\n";
      }
    }
    return all;
  }

 private:
  Coordinator& coordinator_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;
  std::map<std::string, std::exception_ptr> errors_;
};

// The text of the InputError a role threw, or a failure naming what it threw instead.
::testing::AssertionResult threw_input_error(RoleThreads& roles, const std::string& name,
                                             std::string& message) {
  std::exception_ptr e = roles.error(name);
  if (!e) return ::testing::AssertionFailure() << name << " threw nothing";
  try {
    std::rethrow_exception(e);
  } catch (const InputError& x) {
    message = x.what();
    return ::testing::AssertionSuccess();
  } catch (const std::exception& x) {
    return ::testing::AssertionFailure() << name << " threw another error: " << x.what();
  }
}

// A fed run's settings: no store, 40 features, 4 classes.
RunSettings fed_settings() {
  RunSettings s;
  s.fed = true;
  s.data = "";
  s.model = ModelConfig::parse("40-16-4");
  s.batch = 50;
  s.score_interval_s = 0.1;
  return s;
}

CoordinatorOptions fed_coordinator(zmq::context_t& context, const RunSettings& s, int ps,
                                   int workers, int scorers) {
  static std::atomic<int> counter{0};
  const std::string n = std::to_string(counter++);
  CoordinatorOptions o;
  o.context = &context;
  o.bind = "inproc://fed-coordinator-" + n;
  o.scores_bind = "inproc://fed-scores-" + n;
  o.expected_ps = ps;
  o.expected_workers = workers;
  o.expected_scorers = scorers;
  o.run_config = to_json(s);
  o.fed = true;
  o.max_seconds = 60;  // a safety: a role that should fail and does not still returns
  o.startup_timeout_ms = 30000;
  return o;
}

RoleOptions role_options(const Coordinator& c, zmq::context_t& context, const std::string& name) {
  RoleOptions o;
  o.coordinator = c.endpoint();
  o.name = name;
  o.context = &context;
  o.heartbeat_ms = 100;
  return o;
}

// Starts ps0 and worker0, fed from `feed`; returns the worker's index in `roles`.
size_t start_server_and_fed_worker(const Coordinator& c, zmq::context_t& context,
                                   RoleThreads& roles, const std::shared_ptr<FeedQueue>& feed) {
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  RoleOptions o = role_options(c, context, "worker0");
  o.feed = feed;
  return roles.start(run_worker_role, o);
}

// Ends a run whose workers and scorer are gone or failed: the servers are told to exit.
void finish_run(Coordinator& c, RoleThreads& roles) {
  c.request_stop("the test is over");
  EXPECT_TRUE(c.wait_workers_gone(30000));
  c.finish();
  EXPECT_TRUE(c.wait_servers_gone(30000));
  roles.join();
}

TEST(FedRun, WorkersTrainOnFedBlocksUntilTheTargetAndReleaseEveryBlock) {
  test::TempDir dir;
  std::atomic<int> live{0}, live_validation{0};
  RunSettings s = fed_settings();
  s.best_model_path = dir.file("best.safetensors");
  zmq::context_t context(1);
  CoordinatorOptions co = fed_coordinator(context, s, 1, 2, 1);
  const double target = 4;  // summed over 400 validation rows: 0.01 per row
  co.target = target;
  co.max_seconds = 120;  // a safety: the target comes in seconds
  Coordinator c(co);
  RoleThreads roles(c);
  std::vector<std::shared_ptr<FeedQueue>> feeds{std::make_shared<FeedQueue>(4),
                                               std::make_shared<FeedQueue>(4)};
  auto validation = std::make_shared<const FedBlock>(
      data_block(test::separable_dataset(400, 40, 4, 2), live_validation));
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  for (int w = 0; w < 2; ++w) {
    RoleOptions o = role_options(c, context, "worker" + std::to_string(w));
    o.feed = feeds[size_t(w)];
    roles.start(run_worker_role, o);
  }
  RoleOptions so = role_options(c, context, "scorer0");
  so.validation = validation;
  roles.start(run_scorer_role, so);

  // Feed each worker blocks of 130 rows (batches of 50, 50 and 30) until training stops.
  constexpr int64_t kRows = 130;
  std::vector<int64_t> pushed(2, 0);
  std::vector<bool> open(2, true);
  std::vector<std::string> closed_why(2);
  uint32_t seed = 100;
  const auto deadline = Clock::now() + std::chrono::seconds(180);
  for (;;) {
    const ClusterPhase phase = c.phase();
    if (phase != ClusterPhase::Starting && phase != ClusterPhase::Training) break;
    ASSERT_LT(Clock::now(), deadline) << "no stop in 180 s; " << roles.errors();
    ASSERT_TRUE(open[0] || open[1]) << "both feeds closed while training: " << roles.errors();
    for (size_t w = 0; w < 2; ++w) {
      if (!open[w]) continue;
      try {
        if (feeds[w]->push(data_block(test::separable_dataset(kRows, 40, 4, seed++), live), 20))
          ++pushed[w];
      } catch (const Error& e) {
        open[w] = false;
        closed_why[w] = e.what();
      }
    }
  }
  for (size_t w = 0; w < 2; ++w) {  // a feed closed under the feeder: by its worker, stopping
    if (!closed_why[w].empty()) {
      EXPECT_NE(closed_why[w].find("worker" + std::to_string(w) + " has stopped"),
                std::string::npos) << closed_why[w];
    }
  }
  ASSERT_EQ(c.phase(), ClusterPhase::Draining) << c.failure() << "; " << roles.errors();
  EXPECT_EQ(c.stop_reason(), "target");
  ASSERT_TRUE(c.wait_workers_gone(30000)) << roles.errors();
  EXPECT_EQ(roles.errors(), "");

  // Each worker closed its feed on the way out: feeding it now is an error that says so, and
  // nothing fed is held any more.
  for (size_t w = 0; w < 2; ++w) {
    EXPECT_TRUE(feeds[w]->closed()) << w;
    EXPECT_EQ(feeds[w]->depth(), 0u) << w;
    EXPECT_EQ(feeds[w]->blocks_fed(), pushed[w]) << w;
    EXPECT_EQ(feeds[w]->rows_fed(), pushed[w] * kRows) << w;
    try {
      feeds[w]->push(data_block(test::separable_dataset(4, 40, 4, 1), live), 0);
      ADD_FAILURE() << "worker" << w << "'s feed took a block after it stopped";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("worker" + std::to_string(w) + " has stopped"),
                std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(live.load(), 0) << "fed blocks still held after the workers stopped";

  // Batches: both workers trained; the coordinator's count is the servers' (async: one step per
  // pushed gradient), and no more than the rows fed make.
  const json state = c.state();
  ASSERT_EQ(state.at("workers").size(), 2u) << state.dump();
  for (const json& w : state.at("workers"))
    EXPECT_GT(w.at("batches_done").get<int64_t>(), 0) << state.dump();
  const int64_t batches = c.batches_done();
  EXPECT_GT(batches, 0);
  EXPECT_LE(batches, (pushed[0] + pushed[1]) * 3);
  EXPECT_EQ(state.at("cluster").at("batches_done").get<int64_t>(), batches);
  Model model(s.model);
  {
    PsClient client(c.ps_endpoints(), cluster_client_options(s, &context));
    PsResult result = client.init({}).wait();
    model.parameters() = std::move(result.tensors);
    EXPECT_EQ(int64_t(result.version), batches);
  }
  c.finish();
  EXPECT_TRUE(c.wait_servers_gone(30000));
  roles.join();
  EXPECT_EQ(roles.errors(), "");

  // The score that met the target, and the parameters the scorer kept for it.
  const std::vector<ScoreRecord> scores = c.scores();
  ASSERT_FALSE(scores.empty());
  EXPECT_LT(scores.back().loss, target);
  EXPECT_EQ(scores.back().samples, 400);
  const Checkpoint best = load_checkpoint(s.best_model_path, &s.model);
  const EvalResult kept = evaluate_model(best.model, validation->rows, 1);
  EXPECT_LT(kept.loss_sum, target * (1 + 1e-3));
  // The servers' final parameters: workers stepped on for a moment after that score.
  const EvalResult last = evaluate_model(model, validation->rows, 1);
  EXPECT_LT(last.loss_sum, 2 * target);
  EXPECT_GT(last.accuracy, 0.95);
  validation.reset();
  so.validation.reset();
  EXPECT_EQ(live_validation.load(), 0);
}

// Owners that a test can wait on: each block's owner counts itself until released.
class Owners {
 public:
  FedBlock block(Dataset data) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++live_;
    }
    std::shared_ptr<Dataset> owner(new Dataset(std::move(data)), [this](Dataset* p) {
      delete p;
      std::lock_guard<std::mutex> lock(mutex_);
      --live_;
      released_.notify_all();
    });
    FedBlock b;
    b.rows = owner->view();
    b.owner = owner;
    return b;
  }
  bool wait_all_released(int timeout_ms) {
    std::unique_lock<std::mutex> lock(mutex_);
    return released_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] { return live_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable released_;
  int live_ = 0;
};

// One worker (a group of `members`) trains on blocks of `block_rows` rows, batch 50, async;
// the coordinator must count `batches` batches and the servers `steps` steps (one per push).
void expect_fed_blocks_trained(int members, const std::vector<int64_t>& block_rows,
                               int64_t batches, uint64_t steps) {
  Owners owners;
  RunSettings s = fed_settings();  // batch 50
  s.worker_group = members;
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));
  RoleThreads roles(c);
  auto feed = std::make_shared<FeedQueue>();
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  RoleOptions o = role_options(c, context, "worker0");
  o.feed = feed;
  roles.start(run_worker_role, o);
  int64_t rows_fed = 0;
  for (int64_t rows : block_rows) {
    feed->push(owners.block(test::separable_dataset(rows, 40, 4, uint32_t(rows))));
    rows_fed += rows;
  }
  // Each owner goes once its block's batches have been trained and pushed.
  ASSERT_TRUE(owners.wait_all_released(60000)) << roles.errors();
  EXPECT_EQ(feed->rows_fed(), rows_fed);
  c.request_stop("every block trained");
  ASSERT_TRUE(c.wait_workers_gone(30000)) << roles.errors();
  EXPECT_EQ(roles.errors(), "");
  EXPECT_EQ(c.batches_done(), batches);
  {
    PsClient client(c.ps_endpoints(), cluster_client_options(s, &context));
    EXPECT_EQ(client.init({}).wait().version, steps);
  }
  c.finish();
  EXPECT_TRUE(c.wait_servers_gone(30000));
  roles.join();
}

TEST(FedRun, EachBlockIsCutIntoBatchesOfTheRunsBatchSizeTheLastOneShorter) {
  // 130 rows: 50, 50, 30; 20 rows: one batch; 100 rows: 50, 50. One step per batch.
  expect_fed_blocks_trained(1, {130, 20, 100}, 6, 6);
}

// A worker whose group has three CPU members: a step takes up to three batches of a block, so a
// block of 5 batches is 2 steps (3 + 2) and one of 1 batch is a step whose other two members have
// none. The coordinator counts the batches, the servers one step per push.
TEST(FedRun, AWorkerGroupOfThreeStepsOverBlocksWhoseBatchesAreNotAMultipleOfThree) {
  // Batches (steps): 130 rows: 50, 50, 30 (1); 20 rows: 20 (1); 250 rows: 5 x 50 (2);
  // 100 rows: 50, 50 (1). 11 batches, 5 steps.
  expect_fed_blocks_trained(3, {130, 20, 250, 100}, 11, 5);
}

// How many of the run's scores were taken at this step.
size_t scores_at_step(const Coordinator& c, int64_t step) {
  size_t n = 0;
  for (const ScoreRecord& r : c.scores()) n += r.step == step ? 1 : 0;
  return n;
}

bool wait_for_score_at_step(const Coordinator& c, int64_t step, int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (scores_at_step(c, step) == 0) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

TEST(FedRun, TheScorerScoresParametersOnceWhileTheWorkersWaitForBlocks) {
  Owners owners;
  RunSettings s = fed_settings();  // batch 50, a score every 0.1 s
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 1));
  RoleThreads roles(c);
  auto feed = std::make_shared<FeedQueue>();
  std::atomic<int> live_validation{0};
  RoleOptions so = role_options(c, context, "scorer0");
  so.validation = std::make_shared<const FedBlock>(
      data_block(test::separable_dataset(200, 40, 4, 2), live_validation));
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  RoleOptions o = role_options(c, context, "worker0");
  o.feed = feed;
  roles.start(run_worker_role, o);
  roles.start(run_scorer_role, so);
  // One block of 130 rows: three steps; then the worker waits for the next block.
  feed->push(owners.block(test::separable_dataset(130, 40, 4, 7)));
  ASSERT_TRUE(owners.wait_all_released(60000)) << roles.errors();
  ASSERT_TRUE(wait_for_score_at_step(c, 3, 30000)) << roles.errors();
  // Ten score intervals with nothing trained: the same parameters are not scored again.
  std::this_thread::sleep_for(std::chrono::seconds(1));
  EXPECT_EQ(scores_at_step(c, 3), 1u);
  // New parameters are scored as before.
  feed->push(owners.block(test::separable_dataset(100, 40, 4, 8)));
  ASSERT_TRUE(owners.wait_all_released(60000)) << roles.errors();
  EXPECT_TRUE(wait_for_score_at_step(c, 5, 30000)) << roles.errors();
  EXPECT_EQ(scores_at_step(c, 3), 1u);
  finish_run(c, roles);
  EXPECT_EQ(roles.errors(), "");
}

TEST(FedRun, ABadLabelFailsTheWorkerNamingTheLabelAndRowAndClosesItsFeed) {
  std::atomic<int> live{0};
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  CoordinatorOptions co = fed_coordinator(context, s, 1, 1, 0);
  co.max_seconds = 120;
  co.heartbeat_timeout_ms = 1000;
  Coordinator c(co);
  RoleThreads roles(c);
  auto feed = std::make_shared<FeedQueue>();
  // A good block first (trained on), then one whose row 3 has label 7 in a 4-class model.
  feed->push(data_block(test::separable_dataset(60, 40, 4, 5), live));
  Dataset bad = test::separable_dataset(8, 40, 4, 6);
  bad.label_data()[3] = 7;
  feed->push(data_block(std::move(bad), live));
  const size_t worker = start_server_and_fed_worker(c, context, roles, feed);
  roles.join_one(worker);  // it stops on its own, on the bad block
  std::string why;
  ASSERT_TRUE(threw_input_error(roles, "worker0", why));
  EXPECT_NE(why.find("worker0"), std::string::npos) << why;
  EXPECT_NE(why.find("label 7 at row 3"), std::string::npos) << why;
  EXPECT_NE(why.find("4 classes"), std::string::npos) << why;
  // It said so to the coordinator as it left (the coordinator named only a missing heartbeat).
  bool said = false;
  const nlohmann::json state = c.state();
  for (const nlohmann::json& role : state["roles"])
    if (role["name"] == "worker0") {
      said = true;
      EXPECT_EQ(role["state"], "stopped") << role.dump();
      EXPECT_NE(role.value("error", "").find("label 7 at row 3"), std::string::npos)
          << role.dump();
    }
  EXPECT_TRUE(said);
  EXPECT_TRUE(feed->closed());
  try {
    feed->push(data_block(test::separable_dataset(4, 40, 4, 1), live), 0);
    ADD_FAILURE() << "the failed worker's feed took a block";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker0 stopped on an error"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(live.load(), 0);
  c.mark_lost("worker0", "it failed in the test");
  finish_run(c, roles);
}

// A server that fails after registering (here: its address is taken) says why to the coordinator
// as it leaves: the coordinator's log and state named only a missing heartbeat, 3 s later.
TEST(FedRun, AServerThatCannotBindSaysWhyToTheCoordinator) {
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));
  RoleThreads roles(c);
  zmq::socket_t squatter(context, zmq::socket_type::router);
  squatter.bind("tcp://127.0.0.1:*");
  const std::string taken = squatter.get(zmq::sockopt::last_endpoint);
  RoleOptions o = role_options(c, context, "ps0");
  o.bind = taken;
  roles.join_one(roles.start(run_ps_role, o));
  const std::string thrown = roles.errors();
  EXPECT_TRUE(test::contains(thrown, taken)) << thrown;
  bool said = false;
  const nlohmann::json state = c.state();
  for (const nlohmann::json& role : state["roles"])
    if (role["name"] == "ps0") {
      said = true;
      EXPECT_EQ(role["state"], "stopped") << role.dump();
      EXPECT_TRUE(test::contains(role.value("error", ""), taken)) << role.dump();
    }
  EXPECT_TRUE(said) << state.dump();
}

// Starts a server and `role` (named `name`, alone in its kind) in a fed run, and checks that the
// role fails with an InputError naming it and containing each of `says`.
void expect_fed_role_fails(void (*role)(const RoleOptions&), const std::string& name, int workers,
                           int scorers, const std::vector<std::string>& says) {
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, workers, scorers));
  RoleThreads roles(c);
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  roles.join_one(roles.start(role, role_options(c, context, name)));
  std::string why;
  ASSERT_TRUE(threw_input_error(roles, name, why));
  EXPECT_NE(why.find(name), std::string::npos) << why;
  for (const std::string& part : says) EXPECT_NE(why.find(part), std::string::npos) << why;
  c.mark_lost(name, "it failed in the test");
  finish_run(c, roles);
}

TEST(FedRun, AScorerWithoutAStoreOrValidationRowsFailsSayingSo) {
  expect_fed_role_fails(run_scorer_role, "scorer0", 0, 1, {"no store", "no validation rows"});
}

TEST(FedRun, AWorkerWithoutAFeedFailsSayingSo) {
  expect_fed_role_fails(run_worker_role, "worker0", 1, 0, {"without a feed"});
}

// `tandem worker --gpus`: a run on the CPU backend, or a GPU listed twice, is refused before any
// device is touched (so this runs without GPUs), naming the worker and the problem.
TEST(FedRun, AWorkerGivenGpusInACpuRunOrAGpuTwiceFailsSayingSo) {
  struct Case {
    const char* backend;
    std::vector<int> gpus;
    const char* says;
  };
  for (const Case& k : {Case{"cpu", {0, 1}, "--gpus needs a run on the cuda or auto backend"},
                        Case{"auto", {1, 0, 1}, "--gpus lists GPU 1 twice"},
                        Case{"cuda", {-1}, "--gpus lists GPU -1; GPUs are numbered from 0"}}) {
    SCOPED_TRACE(k.says);
    RunSettings s = fed_settings();
    s.backend = k.backend;
    zmq::context_t context(1);
    Coordinator c(fed_coordinator(context, s, 1, 1, 0));
    RoleThreads roles(c);
    roles.start(run_ps_role, role_options(c, context, "ps0"));
    RoleOptions o = role_options(c, context, "worker0");
    o.feed = std::make_shared<FeedQueue>();
    o.gpus = k.gpus;
    roles.join_one(roles.start(run_worker_role, o));
    std::string why;
    ASSERT_TRUE(threw_input_error(roles, "worker0", why));
    EXPECT_NE(why.find("worker0"), std::string::npos) << why;
    EXPECT_NE(why.find(k.says), std::string::npos) << why;
    EXPECT_TRUE(o.feed->closed());
    c.mark_lost("worker0", "it failed in the test");
    finish_run(c, roles);
  }
}

// A full feed (capacity 1) and a thread waiting up to 20 s to push one more block into it.
struct BlockedFeeder {
  explicit BlockedFeeder(std::atomic<int>& live) : feed(std::make_shared<FeedQueue>(1)) {
    feed->push(data_block(test::separable_dataset(10, 40, 4, 1), live));
    thread = std::thread([this, &live] {
      try {
        saw = feed->push(data_block(test::separable_dataset(10, 40, 4, 2), live), 20000)
                  ? "pushed" : "timed out";
      } catch (const Error& e) {
        saw = e.what();
      }
    });
  }
  ~BlockedFeeder() {
    if (thread.joinable()) thread.join();
  }
  std::string join() {  // what the push came to: "pushed", "timed out" or the error
    thread.join();
    return saw;
  }
  std::shared_ptr<FeedQueue> feed;
  std::string saw;
  std::thread thread;
};

// A feeder waiting for room in a worker's feed must not wait forever when the worker stops
// before training: the feed is closed whichever way the worker leaves.
TEST(FedRun, AWorkerThatStopsBeforeTrainingClosesItsFeed) {
  std::atomic<int> live{0};
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));  // the server never comes
  RoleThreads roles(c);
  BlockedFeeder feeder(live);
  const std::shared_ptr<FeedQueue>& feed = feeder.feed;
  RoleOptions o = role_options(c, context, "worker0");
  o.feed = feed;
  const size_t worker = roles.start(run_worker_role, o);
  c.request_stop("stopped before it started");
  roles.join_one(worker);
  EXPECT_EQ(roles.errors(), "");
  EXPECT_TRUE(feed->closed());
  const std::string feeder_saw = feeder.join();
  EXPECT_NE(feeder_saw.find("worker0"), std::string::npos) << feeder_saw;
  EXPECT_EQ(live.load(), 0);
  c.finish();
  roles.join();
}

// A feeder that has no more blocks ends the worker's input: the worker trains every block still
// queued (3 blocks of 130 rows: 9 batches) and leaves the run, instead of dropping them and then
// polling its empty, closed queue at full speed until the run ended.
TEST(FedRun, AWorkerWhoseInputEndsTrainsWhatWasQueuedAndLeaves) {
  std::atomic<int> live{0};
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));
  RoleThreads roles(c);
  auto feed = std::make_shared<FeedQueue>();
  for (uint32_t i = 0; i < 3; ++i)
    feed->push(data_block(test::separable_dataset(130, 40, 4, 300 + i), live));
  feed->end_input("no more blocks");
  const size_t worker = start_server_and_fed_worker(c, context, roles, feed);
  roles.join_one(worker);
  EXPECT_EQ(roles.errors(), "");
  EXPECT_EQ(c.batches_done(), 9);
  EXPECT_EQ(live.load(), 0);
  EXPECT_TRUE(c.wait_workers_gone(5000));
  finish_run(c, roles);
}

// Once the worker knows its model, a block that does not fit it (a label past its classes, rows
// of another width) is refused to its feeder at once, and the run goes on. Taken, such a block
// failed the worker, and with it the run (tandem.dask.stop then returned no model).
TEST(FedRun, ABadBlockFedWhileTrainingIsRefusedToItsFeederAndTheRunGoesOn) {
  std::atomic<int> live{0};
  RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));
  RoleThreads roles(c);
  auto feed = std::make_shared<FeedQueue>();
  const size_t worker = start_server_and_fed_worker(c, context, roles, feed);
  // A good block taken off the queue: the worker is training, its check set.
  feed->push(data_block(test::separable_dataset(60, 40, 4, 5), live));
  for (int i = 0; i < 600 && feed->depth() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(feed->depth(), 0u);
  Dataset bad = test::separable_dataset(8, 40, 4, 6);
  bad.label_data()[3] = 7;
  try {
    feed->push(data_block(std::move(bad), live));
    ADD_FAILURE() << "a block with label 7 was queued for a model of 4 classes";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("worker0: a fed block has label 7 at row 3; the model "
                                         "has 4 classes"),
              std::string::npos)
        << e.what();
  }
  try {
    feed->push(data_block(test::separable_dataset(8, 30, 4, 7), live));
    ADD_FAILURE() << "rows of 30 features were queued for a model of 40 inputs";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("worker0: a fed block: data has 30 features"),
              std::string::npos)
        << e.what();
  }
  // A NaN pixel (float32 rows) made the gradient NaN: the server refused it as "training
  // diverged?", and the worker and the run failed.
  Dataset nan_rows = test::random_dataset(PixelType::Float32, 8, 40, 4, 9);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(nan_rows.pixel_data() + (2 * 40 + 17) * sizeof(float), &nan, sizeof nan);
  try {
    feed->push(data_block(std::move(nan_rows), live));
    ADD_FAILURE() << "a block with a NaN pixel was queued";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("worker0: a fed block: row 2 holds a pixel that is not "
                                         "finite"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(feed->closed());
  EXPECT_EQ(feed->blocks_fed(), 1);  // the refused ones were not counted as fed
  feed->push(data_block(test::separable_dataset(60, 40, 4, 8), live));  // and it trains on
  feed->end_input("no more blocks");
  roles.join_one(worker);
  EXPECT_EQ(roles.errors(), "");
  EXPECT_EQ(c.batches_done(), 4);  // two blocks of 60 rows in batches of 50: 50 and 10 each
  EXPECT_EQ(live.load(), 0);
  EXPECT_TRUE(c.wait_workers_gone(5000));
  finish_run(c, roles);
}

TEST(FedRun, AWorkerThatFailsBeforeTrainingClosesItsFeed) {
  std::atomic<int> live{0};
  RunSettings s = fed_settings();
  s.backend = "abacus";
  zmq::context_t context(1);
  CoordinatorOptions co = fed_coordinator(context, s, 1, 1, 0);
  co.heartbeat_timeout_ms = 1000;
  Coordinator c(co);
  RoleThreads roles(c);
  BlockedFeeder feeder(live);
  const std::shared_ptr<FeedQueue>& feed = feeder.feed;
  const size_t worker = start_server_and_fed_worker(c, context, roles, feed);
  roles.join_one(worker);
  std::string why;
  ASSERT_TRUE(threw_input_error(roles, "worker0", why));
  EXPECT_NE(why.find("abacus"), std::string::npos) << why;
  EXPECT_TRUE(feed->closed());
  const std::string feeder_saw = feeder.join();
  EXPECT_NE(feeder_saw.find("worker0 stopped on an error"), std::string::npos) << feeder_saw;
  EXPECT_EQ(live.load(), 0);
  c.mark_lost("worker0", "it failed in the test");
  finish_run(c, roles);
}

TEST(RoleCancel, RolesStoppedFromTheirProcessEndAtOnceWhenTheCoordinatorIsGone) {
  std::atomic<int> live{0};
  const RunSettings s = fed_settings();
  zmq::context_t context(1);
  auto coordinator = std::make_unique<Coordinator>(fed_coordinator(context, s, 1, 1, 1));
  auto feed = std::make_shared<FeedQueue>();
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::vector<std::thread> threads;
  std::mutex mutex;
  std::vector<std::string> errors;
  auto start = [&](void (*role)(const RoleOptions&), RoleOptions o) {
    o.cancel = cancel;
    threads.emplace_back([&, role, o] {
      try {
        role(o);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mutex);
        errors.push_back(o.name + ": " + e.what());
      }
    });
  };
  start(run_ps_role, role_options(*coordinator, context, "ps0"));
  RoleOptions wo = role_options(*coordinator, context, "worker0");
  wo.feed = feed;
  start(run_worker_role, wo);
  RoleOptions so = role_options(*coordinator, context, "scorer0");
  so.validation = std::make_shared<const FedBlock>(
      data_block(test::separable_dataset(100, 40, 4, 3), live));
  start(run_scorer_role, so);
  ASSERT_EQ(coordinator->wait_for(ClusterPhase::Training, 30000), ClusterPhase::Training);
  for (int i = 0; i < 20; ++i) feed->push(data_block(test::separable_dataset(200, 40, 4, i), live));
  coordinator.reset();  // gone while the roles train: every request to it would time out (10 s)
  const auto t0 = Clock::now();
  *cancel = true;
  for (std::thread& t : threads) t.join();
  // Well under the coordinator's 10 s request timeout and its 15 s lost-after.
  EXPECT_LT(Clock::now() - t0, std::chrono::seconds(5));
  EXPECT_TRUE(errors.empty()) << errors.front();
  EXPECT_TRUE(feed->closed());
  so.validation.reset();
  wo.feed.reset();
}

// A coordinator at the address of one just destroyed (`o.bind`, a tcp port it had): the port comes
// free once ZeroMQ's I/O thread has closed the old socket, so it binds until it does (10 s).
std::unique_ptr<Coordinator> coordinator_bound_again(const CoordinatorOptions& o) {
  std::unique_ptr<Coordinator> again;
  test::eventually([&] {
    try {
      again = std::make_unique<Coordinator>(o);
    } catch (const std::exception&) {
    }
    return again != nullptr;
  }, 10000, 50);
  return again;
}

// A run that fails (the coordinator's fail(), as a start-up timeout or a role's error would) ends
// every role with that error, not a normal return: a role started by hand, or a batch system's
// task, must not report success after a failed run.
TEST(RoleEnd, ARoleEndsWithTheErrorOfARunThatFailed) {
  const RunSettings s = fed_settings();
  zmq::context_t context(1);
  Coordinator c(fed_coordinator(context, s, 1, 1, 0));  // the worker never comes
  RoleThreads roles(c);
  const size_t ps = roles.start(run_ps_role, role_options(c, context, "ps0"));
  ASSERT_TRUE(test::eventually([&] { return !c.ps_endpoints().empty(); }, 30000));
  c.fail("a test said so");
  roles.join_one(ps);
  EXPECT_TRUE(test::contains(roles.errors(), "ps0: ps0: the run failed: a test said so"))
      << roles.errors();
  roles.join();
}

// A role whose heartbeats are answered by a coordinator that does not know it (the one it
// registered with restarted at its address) ends, saying so, instead of serving a run that is
// over under a name the new run may give another role.
TEST(RoleEnd, ARoleWhoseCoordinatorRestartedEndsSayingSo) {
  const RunSettings s = fed_settings();
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, s, 1, 1, 0);
  o.bind = "tcp://127.0.0.1:*";
  auto first = std::make_unique<Coordinator>(o);
  std::string error;
  RoleOptions ro = role_options(*first, context, "ps0");
  std::thread ps([&] {
    try {
      run_ps_role(ro);
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  ASSERT_TRUE(test::eventually([&] { return !first->ps_endpoints().empty(); }, 30000));
  o.bind = first->endpoint();
  first.reset();
  std::unique_ptr<Coordinator> second = coordinator_bound_again(o);
  ps.join();
  ASSERT_NE(second, nullptr);
  EXPECT_TRUE(test::contains(error, "ps0: the coordinator at " + o.bind +
                                        " does not know this role (it restarted"))
      << error;
}

// A role of the earlier run that reconnected on its own (its link's socket does) is not the new
// run's role of the same name: its heartbeats are told the coordinator does not know it (no
// batches counted, no phase), and what else it asks is refused naming both runs. Before, once
// the new run had a worker0, the old worker0's reports were counted and its goodbye ended the
// new one.
TEST(RoleEnd, ARoleOfAnEarlierRunIsNotTakenForTheNewRunsRoleOfItsName) {
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, fed_settings(), 0, 1, 0);
  o.bind = "tcp://127.0.0.1:*";
  o.heartbeat_timeout_ms = 60000;
  auto first = std::make_unique<Coordinator>(o);
  const std::string first_run = first->state().at("cluster").at("run").get<std::string>();
  CoordinatorLink stale(first->endpoint(), context, 5000);
  stale.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  o.bind = first->endpoint();
  first.reset();
  std::unique_ptr<Coordinator> second = coordinator_bound_again(o);
  ASSERT_NE(second, nullptr);
  const std::string second_run = second->state().at("cluster").at("run").get<std::string>();
  ASSERT_NE(first_run, second_run);
  CoordinatorLink fresh(second->endpoint(), context, 5000);
  fresh.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  ASSERT_EQ(second->wait_for(ClusterPhase::Training, 5000), ClusterPhase::Training);

  const json beat = stale.request(
      {{"type", "heartbeat"}, {"name", "worker0"}, {"status", {{"batches_done", 999}}}});
  EXPECT_TRUE(beat.value("unknown", false)) << beat.dump();
  EXPECT_FALSE(beat.contains("phase")) << beat.dump();
  EXPECT_EQ(second->batches_done(), 0);
  const std::string why = test::error_of<Error>(
      [&] { stale.request({{"type", "goodbye"}, {"name", "worker0"}}); });
  EXPECT_TRUE(test::contains(why, "'goodbye' from 'worker0' of run " + first_run +
                                      ": this coordinator serves run " + second_run))
      << why;
  EXPECT_EQ(second->phase(), ClusterPhase::Training);
  // The new run's own worker0 is heard as before (a fed run has no epochs to count).
  const json own = fresh.request(
      {{"type", "heartbeat"}, {"name", "worker0"}, {"status", {{"batches_done", 4}}}});
  EXPECT_EQ(own.at("phase"), "training") << own.dump();
  EXPECT_FALSE(own.contains("epochs_whole")) << own.dump();
  EXPECT_EQ(second->batches_done(), 4);
  fresh.request({{"type", "goodbye"}, {"name", "worker0"}});
}

// A store of separable rows in `dir` (4 classes, 40 features, 2,000 training rows in chunks of
// 500) and the settings of a run on it: model 40-16-4, batches of 100.
RunSettings small_store_settings(const test::TempDir& dir) {
  StoreWriteOptions w;
  w.chunk_rows = 500;
  RunSettings s;
  s.data = dir.file("small.zarr");
  write_dataset_store(test::separable_splits(2000, 400, 1), s.data, w,
                      json{{"source", "feed_test"}});
  s.model = ModelConfig::parse("40-16-4");
  s.batch = 100;
  return s;
}

// A sync-mode worker back at work after idling (no batch while another worker held the epoch's
// last ones) pulls before its first gradient: the servers stepped without it meanwhile, and a
// gradient computed on its older parameters would be dropped as stale, a batch counted but never
// applied. Here the test plays worker1: it takes the second half of the only epoch and holds it;
// once worker0 has trained its half and says it is idle, the test steps the server with a push
// of its own and is marked lost, so its batches go to worker0.
TEST(SyncRun, AWorkerBackFromIdleRefreshesBeforeItsFirstGradient) {
  test::TempDir dir;
  RunSettings s = small_store_settings(dir);
  s.ps_mode = "sync";
  s.replicas_to_aggregate = 1;
  zmq::context_t context(1);
  CoordinatorOptions co = fed_coordinator(context, s, 1, 2, 0);
  co.fed = false;
  co.batches_per_epoch = 20;
  co.max_epochs = 1;
  co.heartbeat_timeout_ms = 60000;
  Coordinator c(co);
  CoordinatorLink worker1(c.endpoint(), context);
  worker1.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
  RoleThreads roles(c);
  roles.start(run_ps_role, role_options(c, context, "ps0"));
  roles.start(run_worker_role, role_options(c, context, "worker0"));
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 30000), ClusterPhase::Training);
  const WorkReply held = read_work_reply(worker1.request({{"type", "work"}, {"name", "worker1"}}));
  ASSERT_TRUE(held.has_task);
  const auto worker0_idle = [&] {
    const json state = c.state();
    for (const json& w : state.at("workers"))
      if (w.at("name") == "worker0") return w.at("idle").get<bool>();
    return false;
  };
  ASSERT_TRUE(test::eventually(worker0_idle, 30000, 10)) << roles.errors();
  ASSERT_EQ(c.batches_done(), 20 - int64_t(held.batches.size()));

  // The server steps without worker0.
  ClientOptions client;
  client.context = &context;
  PsClient other(c.ps_endpoints(), client);
  const std::vector<NamedTensor> params = other.init({}).wait().tensors;
  std::vector<NamedTensor> zero = params;
  for (NamedTensor& t : zero) std::fill(t.values.begin(), t.values.end(), 0.0f);
  other.push_pull(zero).wait();
  c.mark_lost("worker1", "the test let its batches go");
  ASSERT_TRUE(test::eventually([&] { return c.phase() != ClusterPhase::Training; }, 30000))
      << roles.errors();
  finish_run(c, roles);  // (worker0's goodbye carries its last counters)
  EXPECT_EQ(roles.errors(), "");
  EXPECT_EQ(c.batches_done(), 20);
  EXPECT_EQ(c.gradients_lost(), 0) << "worker0's first gradient after idling was dropped";
}

// The final parameters are read once every server serves: a server that restarted as the workers
// left (registered again, without an address until it has loaded its checkpoint) is waited for,
// not read at its old address or taken for gone. Here the test plays that restart on ps0's
// name (the real ps0 goes on serving at its address) as the run drains, and says ps0 is ready
// again at that address on the second tick that finds the workers gone (the first may still be
// the drain's; the second is the final read's wait).
TEST(ClusterRun, TheFinalReadWaitsForAServerRestartingAsTheWorkersLeave) {
  test::TempDir dir;
  ClusterOptions o;
  o.inproc = false;
  o.ps = 1;
  o.workers = 1;
  o.scorers = 0;
  o.max_epochs = 1;
  o.keep_best = false;
  o.heartbeat_ms = 100;
  o.test_threads = 1;
  o.model_out = dir.file("model.safetensors");
  o.settings = small_store_settings(dir);
  RunSettings& s = o.settings;
  s.checkpoint_dir = dir.file("checkpoints");
  s.init_timeout_ms = 20000;
  ClusterRun run(o);
  zmq::context_t context(1);
  const std::string coordinator = run.coordinator().endpoint();
  const auto role = [&](const std::string& name) {
    RoleOptions r;
    r.coordinator = coordinator;
    r.name = name;
    r.context = &context;
    r.heartbeat_ms = 100;
    return r;
  };
  std::vector<std::thread> roles;
  std::string role_errors;
  std::mutex errors_mutex;
  for (const auto& [name, body] : {std::pair<std::string, void (*)(const RoleOptions&)>{
                                       "ps0", run_ps_role},
                                   {"worker0", run_worker_role}})
    roles.emplace_back([&, name = name, body = body] {
      try {
        body(role(name));
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(errors_mutex);
        role_errors += name + ": " + e.what() + "\n";
      }
    });
  CoordinatorLink link(coordinator, context, 5000);
  std::string address;
  int stage = 0, ticks_without_workers = 0;
  bool serving_when_ready_said = true;
  run.set_callbacks(nullptr, [&](const Coordinator& c) {
    if (stage == 0 && c.phase() == ClusterPhase::Draining) {
      address = c.ps_endpoints().at(0);
      // "Restarted": counted lost first, as a server that died is (a server registering under
      // the name of one still heard from waits for that).
      run.coordinator().mark_lost("ps0", "the test restarts it");
      link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}});
      stage = 1;
    } else if (stage == 1 && c.wait_workers_gone(0) && ++ticks_without_workers == 2) {
      serving_when_ready_said = c.servers_serving();
      link.request({{"type", "ready"}, {"name", "ps0"}, {"address", address}});
      stage = 2;
    }
  });
  ClusterSummary summary;
  std::string failure;
  try {
    summary = run.run(nullptr);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) run.coordinator().fail(failure);  // (the roles end on it, not hang)
  for (std::thread& t : roles) t.join();
  EXPECT_EQ(failure, "") << "(the final read did not wait for ps0)";
  EXPECT_EQ(stage, 2);
  EXPECT_FALSE(serving_when_ready_said) << "ps0 was serving before it said it was ready again";
  EXPECT_EQ(summary.kept, "last");
  EXPECT_GT(summary.steps, 0);
  EXPECT_TRUE(std::filesystem::exists(o.model_out));
  EXPECT_EQ(role_errors, "");
}

// A caller's tick that throws ends run() with its error, and fails the run first: roles started
// elsewhere (by hand, on other nodes) learn that it is over rather than serve a coordinator that
// nobody runs any more.
TEST(ClusterRun, ATickThatThrowsFailsTheRun) {
  test::TempDir dir;
  ClusterOptions o;
  o.scorers = 0;
  o.max_epochs = 1;
  o.settings = small_store_settings(dir);
  ClusterRun run(o);
  run.set_callbacks(nullptr, [](const Coordinator&) { throw Error("the caller's own trouble"); });
  const std::string why = test::error_of<Error>([&] { run.run(nullptr); });
  EXPECT_TRUE(test::contains(why, "the caller's own trouble")) << why;
  EXPECT_EQ(run.coordinator().phase(), ClusterPhase::Failed);
  EXPECT_TRUE(test::contains(run.coordinator().failure(), "the run's caller failed: the caller's "
                                                          "own trouble"))
      << run.coordinator().failure();
}

TEST(FedCoordinator, RefusesMaxEpochs) {
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, fed_settings(), 0, 0, 0);
  o.max_epochs = 2;
  try {
    Coordinator c(o);
    FAIL() << "a fed coordinator took max_epochs";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("no epochs"), std::string::npos) << e.what();
  }
  o.max_epochs = 0;
  o.max_seconds = 60;
  Coordinator c(o);  // the same options less max_epochs: the sockets bind
  EXPECT_EQ(c.wait_for(ClusterPhase::Training, 5000), ClusterPhase::Training);
}

TEST(FedCoordinator, HandsOutNoWorkAndCountsTheBatchesWorkersReport) {
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, fed_settings(), 0, 2, 0);
  o.heartbeat_timeout_ms = 60000;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  for (const char* name : {"worker0", "worker1"})
    link.request({{"type", "register"}, {"role", "worker"}, {"name", name}});
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 5000), ClusterPhase::Training);
  try {
    link.request({{"type", "work"}, {"name", "worker0"}});
    FAIL() << "a fed run handed out work";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fed blocks"), std::string::npos) << e.what();
  }
  EXPECT_EQ(c.batches_done(), 0);
  link.request({{"type", "heartbeat"}, {"name", "worker0"},
                {"status", {{"batches_done", 5}, {"task", 0}, {"done", 5}}}});
  link.request({{"type", "heartbeat"}, {"name", "worker1"},
                {"status", {{"batches_done", 7}, {"task", 0}, {"done", 7}}}});
  EXPECT_EQ(c.batches_done(), 12);
  link.request({{"type", "heartbeat"}, {"name", "worker0"},
                {"status", {{"batches_done", 6}, {"task", 0}, {"done", 6}}}});
  EXPECT_EQ(c.batches_done(), 13);  // each worker's newest report, not their sum over time
  EXPECT_EQ(c.state().at("cluster").at("batches_done").get<int64_t>(), 13);
  EXPECT_EQ(c.epochs_completed(), 0);
  EXPECT_EQ(c.phase(), ClusterPhase::Training);  // no epochs to run out of
}

// Reads a subscriber's scores until the one with seq `newest`; their seqs in order.
std::vector<int64_t> read_scores_until(ScoreSubscriber& sub, int64_t newest) {
  std::vector<int64_t> seqs;
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while ((seqs.empty() || seqs.back() < newest) && Clock::now() < deadline) {
    std::optional<json> m = sub.next(200);
    if (!m) continue;
    EXPECT_FALSE(m->value("end", false)) << m->dump();
    if (m->value("end", false)) break;
    seqs.push_back(m->at("seq").get<int64_t>());
    EXPECT_DOUBLE_EQ(m->at("loss").get<double>(), 1000.0 - double(m->at("step").get<int64_t>()));
  }
  return seqs;
}

std::vector<int64_t> seq_range(int64_t first, int64_t last) {
  std::vector<int64_t> v;
  for (int64_t s = first; s <= last; ++s) v.push_back(s);
  return v;
}

// A follower (`tandem scores --follow`) of a coordinator restarted at its address: the new one
// answers the liveness check, its scores go out on another channel, and the follower waited in
// silence for an end that never came. It ends now, saying so.
TEST(ScoreSubscriber, AFollowerOfARestartedCoordinatorEndsSayingSo) {
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, fed_settings(), 0, 0, 0);
  o.bind = "tcp://127.0.0.1:*";
  o.scores_bind = "tcp://127.0.0.1:*";
  auto first = std::make_unique<Coordinator>(o);
  ScoreSubscriber follower(first->endpoint(), context, 5000, {});
  follower.fail_when_coordinator_lost(30);
  o.bind = first->endpoint();
  first.reset();
  std::unique_ptr<Coordinator> second = coordinator_bound_again(o);
  ASSERT_NE(second, nullptr);
  const std::string why = test::error_of<Error>([&] {
    for (int k = 0; k < 100; ++k) follower.next(100);  // (10 s)
  });
  EXPECT_TRUE(test::contains(why, "now serves another run (restarted)")) << why;
}

TEST(ScoreSubscriber, ALateSubscriberGetsTheHistoryOnceThenNewScoresThenTheEnd) {
  zmq::context_t context(1);
  CoordinatorOptions o = fed_coordinator(context, fed_settings(), 0, 0, 0);
  o.fed = false;
  Coordinator c(o);
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 5000), ClusterPhase::Training);
  CoordinatorLink link(c.endpoint(), context);
  test::register_scorer(link);
  for (int i = 1; i <= 12; ++i)
    link.request(test::score_request(i, 1000.0 - i, 0.5));
  // The newest 10 come again for a new subscriber, oldest first. (Scores still being sent
  // when it subscribed may reach it live as well: then it sees those once, and older ones too.)
  ScoreSubscriber a(c.endpoint(), context);
  EXPECT_EQ(a.endpoint(), c.scores_endpoint());
  const std::vector<int64_t> first = read_scores_until(a, 12);
  ASSERT_FALSE(first.empty());
  EXPECT_TRUE(std::is_sorted(first.begin(), first.end()));
  EXPECT_EQ(std::set<int64_t>(first.begin(), first.end()).size(), first.size());  // once each
  EXPECT_LE(first.front(), 3);
  EXPECT_EQ(first.back(), 12);
  EXPECT_EQ(first.size(), size_t(13 - first.front()));  // nothing missing from the newest 10
  // Another subscriber's replay (everything long sent: exactly the newest 10) goes to `a` too:
  // `a` drops what it has seen.
  ScoreSubscriber b(c.endpoint(), context);
  EXPECT_EQ(read_scores_until(b, 12), seq_range(3, 12));
  link.request(test::score_request(13, 987.0, 0.5));
  EXPECT_EQ(read_scores_until(a, 13), std::vector<int64_t>{13});
  EXPECT_EQ(read_scores_until(b, 13), std::vector<int64_t>{13});
  c.request_stop("enough");
  c.finish();
  for (ScoreSubscriber* sub : {&a, &b}) {
    std::optional<json> end = sub->next(10000);
    ASSERT_TRUE(end);
    EXPECT_TRUE(end->value("end", false)) << end->dump();
    EXPECT_EQ(end->value("reason", std::string()), "enough");
    EXPECT_TRUE(sub->ended());
    EXPECT_FALSE(sub->next(100));  // nothing after the end
  }
  // After the run: the history, then the end at once.
  ScoreSubscriber late(c.endpoint(), context);
  EXPECT_EQ(read_scores_until(late, 13), seq_range(4, 13));
  std::optional<json> end = late.next(10000);
  ASSERT_TRUE(end);
  EXPECT_TRUE(end->value("end", false)) << end->dump();
  EXPECT_FALSE(late.next(100));
}

}  // namespace
}  // namespace tandem
