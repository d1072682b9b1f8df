// The public cluster API (tandem/cluster.h) keeping its header's promises: bad options refused
// before anything starts, long timeouts that are long, a score stream that ends when its
// coordinator is gone.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "tandem/cluster.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
using test::contains;
using test::error_of;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Store {
  test::TempDir dir;
  std::string path = dir.file("small.zarr");
  explicit Store(bool with_validation = true) {
    DataSplits splits = test::separable_splits(400, 100, 1);
    if (!with_validation) splits.validation = Dataset();
    write_cluster_store(splits, path, 200);
  }
  ClusterCoordinatorOptions coordinator_options() const {
    ClusterCoordinatorOptions o;
    o.settings = json{{"data", path}, {"model", "40-16-4"}, {"batch", 50}}.dump();
    o.max_seconds = 60;
    return o;
  }
};

// train_cluster refused these; the coordinator of a run by hand took them, and the run failed
// (or never stopped) later, far from the bad value.
TEST(PublicCluster, TheCoordinatorRefusesWhatTrainClusterRefuses) {
  const Store store;
  const auto refused = [&](auto change, const std::string& expected) {
    ClusterCoordinatorOptions o = store.coordinator_options();
    change(o);
    const std::string why = error_of<InputError>([&] { ClusterCoordinator c(o); });
    EXPECT_TRUE(contains(why, expected)) << why;
  };
  refused([&](ClusterCoordinatorOptions& o) {
    o.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"score_interval_s", 0}}.dump();
  }, "score_interval_s must be above 0");
  refused([&](ClusterCoordinatorOptions& o) {
    o.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"checkpoint_every_steps", -1}}
                     .dump();
  }, "checkpoint_every_steps must be >= 0");
  refused([](ClusterCoordinatorOptions& o) { o.scorers = 3; }, "0 or 1 scorer");
  // The roles heartbeat every 0.5 s: a shorter timeout lost live roles at every tick.
  refused([](ClusterCoordinatorOptions& o) { o.heartbeat_timeout_s = 0.5; },
          "heartbeat_timeout_s must be at least 1");
  refused([](ClusterCoordinatorOptions& o) { o.max_epochs = -1; }, "max_epochs must be >= 0");
  refused([](ClusterCoordinatorOptions& o) { o.target = std::nan(""); }, "target must be a finite");
  refused([](ClusterCoordinatorOptions& o) {
    o.scorers = 0;
    o.target = 5;
  }, "needs a scorer");
  const Store no_validation(false);
  const std::string why = error_of<InputError>(
      [&] { ClusterCoordinator c(no_validation.coordinator_options()); });
  EXPECT_TRUE(contains(why, "no validation split for the scorer")) << why;
}

// Seconds past an int's milliseconds (24.8 days) overflowed into a negative count: a wait of
// 1e7 s returned at once, and a start-up timeout that long failed the run at once.
TEST(PublicCluster, AHugeTimeoutIsALongWaitNotNone) {
  const Store store;
  ClusterCoordinatorOptions o = store.coordinator_options();
  o.startup_timeout_s = 1e7;
  ClusterCoordinator coordinator(o);
  std::thread failer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    coordinator.fail("ended by the test");
  });
  const auto start = Clock::now();
  EXPECT_EQ(coordinator.wait_for("training", 1e7), "failed");
  EXPECT_GE(seconds_since(start), 0.25);
  failer.join();
  EXPECT_TRUE(contains(coordinator.failure(), "ended by the test")) << coordinator.failure();
  const std::string why = error_of<InputError>([&] { coordinator.wait_for("done", std::nan("")); });
  EXPECT_TRUE(contains(why, "cannot be NaN")) << why;
}

// A stream of a coordinator that died without ending the run waited forever for the end.
TEST(PublicCluster, AScoreStreamOfACoordinatorThatIsGoneThrows) {
  const Store store;
  auto coordinator = std::make_unique<ClusterCoordinator>(store.coordinator_options());
  ClusterScoreStream stream(coordinator->address(), 5, {}, 2.0);
  coordinator.reset();  // gone, no end message sent
  ClusterScore score;
  const auto start = Clock::now();
  const std::string why = error_of<Error>([&] { stream.next(score, 30); });
  EXPECT_TRUE(contains(why, "has not answered for 2")) << why;
  EXPECT_LT(seconds_since(start), 20);
  EXPECT_THROW(ClusterScoreStream(store.path, 5, {}, 0), InputError);
  // A timeout of 0 was a 1 ms wait (it threw "did not answer" almost always); negative, no
  // limit as elsewhere in the API, a stream all the same.
  const ClusterCoordinator live(store.coordinator_options());
  EXPECT_THROW(ClusterScoreStream(live.address(), 0), InputError);
  ClusterScoreStream unlimited(live.address(), -1);
}

// The model was first written after the whole run: a path that could not take it lost the
// trained parameters, after the training time was spent.
TEST(PublicCluster, AModelPathThatCannotBeWrittenIsRefusedBeforeTraining) {
  const Store store;
  ClusterRunOptions o;
  o.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"batch", 50}}.dump();
  o.max_seconds = 30;
  o.model_out = store.dir.file("no/such/dir/model.safetensors");
  const auto start = Clock::now();
  const std::string why = error_of<IoError>([&] { train_cluster(o); });
  EXPECT_TRUE(contains(why, "cannot write '" + o.model_out + "'")) << why;
  EXPECT_LT(seconds_since(start), 10);
}

}  // namespace
}  // namespace tandem
