// The public cluster API (tandem/cluster.h) keeping its header's promises: bad options refused
// before anything starts, long timeouts that are long, a score stream that ends when its
// coordinator is gone.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tandem/cluster.h"
#include "tandem/model.h"
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
  refused([](ClusterCoordinatorOptions& o) { o.settings = "{}"; },
          "the run needs a store (setting 'data')");
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

// Settings each role would refuse once started, every role failing with the same error (a
// generic Error, after the roles started); refused by both ways of running a cluster before
// anything starts, as InputError. A best_model_path file is left as it was.
TEST(PublicCluster, SettingsTheRolesWouldRefuseAreRefusedBeforeAnythingStarts) {
  const Store store;
  const std::string best = store.dir.file("best.safetensors");
  test::write_bytes(best, std::string("a file of the user's"));
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"backend", "gpu"}}, "backend 'gpu': expected cpu, cuda or auto"},
      {{{"precision", "fp16"}}, "precision 'fp16': expected fp32, tf32 or bf16"},
      {{{"ps_mode", "syncc"}}, "parameter server mode must be async, sync or bounded_staleness"},
      {{{"ps_device", "gpu"}}, "parameter server device must be cpu, cuda or auto"},
      {{{"backend", "cpu"}, {"precision", "bf16"}}, "precision bf16 needs the CUDA backend"},
      {{{"worker_threads", -3}}, "worker_threads: thread count must be at least 1, got -3"},
      {{{"scorer_threads", 5000}}, "scorer_threads: thread count 5000 is above the limit"},
      {{{"readers", 0}}, "readers must be >= 1, not 0"},
      {{{"assemblers", -1}}, "assemblers must be >= 1, not -1"},
      {{{"memory_budget_mib", 0}}, "memory_budget_mib must be >= 1, not 0"},
      {{{"memory_budget_mib", int64_t{1} << 40}}, "memory_budget_mib must be <= 1073741824"},
      {{{"ps_timeout_ms", 0}}, "ps_timeout_ms must be >= 1, not 0"},
      {{{"init_timeout_ms", -1}}, "init_timeout_ms must be >= 1, not -1"},
      {{{"model", "20-8-3"}}, "its rows have 40 features, the model 20-8-3 takes 20"},
      {{{"model", "40-8-2"}}, "its labels have 4 classes, the model 40-8-2 has 2 outputs"},
  };
  for (const auto& [change, expected] : cases) {
    json settings{{"data", store.path}, {"model", "40-16-4"}, {"batch", 50},
                  {"best_model_path", best}};
    settings.update(change);
    ClusterCoordinatorOptions c = store.coordinator_options();
    c.settings = settings.dump();
    std::string why = error_of<InputError>([&] { ClusterCoordinator coordinator(c); });
    EXPECT_TRUE(contains(why, expected)) << why;
    ClusterRunOptions r;
    r.settings = c.settings;
    r.max_seconds = 30;
    const auto start = Clock::now();
    why = error_of<InputError>([&] { train_cluster(r); });
    EXPECT_TRUE(contains(why, expected)) << why;
    EXPECT_LT(seconds_since(start), 10);
    EXPECT_EQ(test::read_bytes(best), "a file of the user's") << change.dump();
  }
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
  // An inproc:// address (train_cluster's on_listening) is out of its reach: said at once, not
  // after its timeout.
  const auto inproc = Clock::now();
  const std::string unreachable =
      error_of<InputError>([] { ClusterScoreStream("inproc://tandem-coordinator", 30); });
  EXPECT_TRUE(contains(unreachable, "over tcp:// or ipc://, not inproc://")) << unreachable;
  EXPECT_LT(seconds_since(inproc), 5);
  ClusterScoreStream unlimited(live.address(), -1);
}

// coordinator_lost_s bounds the wait for a coordinator that never answers from the first
// request on: registration waited a fixed 10 s whatever it said.
TEST(PublicCluster, ARoleGivesUpOnASilentCoordinatorAfterItsCoordinatorLostTime) {
  ClusterRoleOptions o;
  o.coordinator_lost_s = 1;
  const auto start = Clock::now();
  ClusterRole role = ClusterRole::worker("tcp://127.0.0.1:1", "", o);
  const std::string why = error_of<Error>([&] { role.join(30); });
  EXPECT_TRUE(contains(why, "did not answer")) << why;
  EXPECT_LT(seconds_since(start), 6);
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
  o.model_out.clear();
  // The scorer's best model too: a run that reached its stop before the scorer's first write
  // failed ended well, its scores lost.
  const std::string best = store.dir.file("no/such/dir/best.safetensors");
  ClusterRunOptions with_best = o;
  with_best.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"batch", 50},
                            {"best_model_path", best}}.dump();
  const std::string best_why = error_of<IoError>([&] { train_cluster(with_best); });
  EXPECT_TRUE(contains(best_why, "cannot write '" + best + "'")) << best_why;
  EXPECT_LT(seconds_since(start), 10);
  // The final evaluation's threads too: once checked only then, after the whole run.
  o.test_threads = -1;
  const std::string threads = error_of<InputError>([&] { train_cluster(o); });
  EXPECT_TRUE(contains(threads, "test_threads (0: every core): thread count must be at least 1"))
      << threads;
  EXPECT_LT(seconds_since(start), 10);
}

// An earlier run's model_out was left by a run that then failed or stopped before training,
// and read as its own: it is removed as a run starts. A file there that is no checkpoint is
// refused, kept; so is a bind to inproc:// for roles of other processes, which none can reach
// (the run waited out its start-up timeout).
TEST(PublicCluster, AnEarlierRunsModelGoesAndOtherFilesAreRefused) {
  const Store store;
  ClusterRunOptions o;
  o.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"batch", 50}}.dump();
  o.model_out = store.dir.file("model.safetensors");
  Checkpoint earlier;
  earlier.model = Model::initialized(ModelConfig::parse("40-16-4"), 1);
  earlier.extra["parameters_only"] = "true";
  save_checkpoint(o.model_out, earlier);
  o.max_seconds = 30;
  ClusterRunOptions failing = o;  // a run that fails before it trains: no model saved
  failing.on_listening = [](const std::string&) { throw std::runtime_error("caller gave up"); };
  EXPECT_THROW(train_cluster(failing), std::runtime_error);
  EXPECT_FALSE(std::filesystem::exists(o.model_out));
  test::write_bytes(o.model_out, std::string("a file of the user's"));
  std::string why = error_of<InputError>([&] { train_cluster(o); });
  EXPECT_TRUE(contains(why, "the run's model file " + o.model_out + " exists and is not a "
                            "Tandem checkpoint")) << why;
  EXPECT_EQ(test::read_bytes(o.model_out), "a file of the user's");
  o.model_out.clear();
  // (train_cluster once said "zarr store '': empty path".)
  ClusterRunOptions no_data = o;
  no_data.settings = "{}";
  why = error_of<InputError>([&] { train_cluster(no_data); });
  EXPECT_TRUE(contains(why, "the run needs a store (setting 'data')")) << why;
  o.roles_as_threads = false;
  o.bind = "inproc://mine";
  const auto start = Clock::now();
  why = error_of<InputError>([&] { train_cluster(o); });
  EXPECT_TRUE(contains(why, "bind inproc://mine: an inproc:// address is for roles on threads"))
      << why;
  EXPECT_LT(seconds_since(start), 10);
}

// A coordinator by hand: a run failed has nothing to pull, said as such (its servers are told to
// exit: a pull from one waited out its 10 s request timeout), and a finished run is not made
// failed by a late fail().
TEST(PublicCluster, AFailedRunHasNothingToPullAndAFinishedOneStaysDone) {
  const Store store;
  {
    ClusterCoordinator c(store.coordinator_options());
    c.fail("given up");
    const std::string why = error_of<Error>([&] { c.pull_model(); });
    EXPECT_TRUE(contains(why, "the run failed (given up)")) << why;
  }
  ClusterCoordinator c(store.coordinator_options());
  c.finish(1);
  c.fail("late");
  EXPECT_EQ(c.phase(), "done");
  EXPECT_EQ(c.failure(), "");
}

// A run resumed through the public API (resume = true) goes on with the epoch after those its
// servers' checkpoints come after, as `tandem launch --resume` does: with one worker and one
// server (async: a step per batch, in the worker's order) its parameters come out bit for bit
// those of an uninterrupted run. Before, train_cluster's servers started from the checkpoints
// while the epochs counted from the first: 2 + 3 epochs for a limit of 3, the first ones'
// batches again. Not asked to resume, such a directory is refused; asked, one without
// checkpoints is.
TEST(PublicCluster, ATrainClusterRunResumedGoesOnWithTheEpochAfterItsCheckpoints) {
  const Store store;
  auto run_in = [&](const std::string& name, int64_t max_epochs) {
    ClusterRunOptions o;
    o.settings = json{{"data", store.path},
                      {"model", "40-16-4"},
                      {"batch", 50},
                      {"optimizer", "adam"},
                      {"checkpoint_dir", store.dir.file(name + "-checkpoints")}}
                     .dump();
    o.scorers = 0;
    o.max_epochs = max_epochs;
    o.model_out = store.dir.file(name + ".safetensors");
    return o;
  };
  const ClusterRunOptions whole = run_in("whole", 3);
  const ClusterRunSummary uninterrupted = train_cluster(whole);
  ASSERT_EQ(uninterrupted.epochs, 3);
  EXPECT_EQ(uninterrupted.resumed_epochs, 0);
  const ClusterRunSummary first = train_cluster(run_in("first", 2));
  ASSERT_EQ(first.steps, 2 * 8);  // 400 rows in batches of 50

  ClusterRunOptions again = run_in("first", 3);
  const std::string unasked = error_of<InputError>([&] { train_cluster(again); });
  EXPECT_TRUE(contains(unasked, "holds parameter server checkpoints")) << unasked;
  EXPECT_TRUE(contains(unasked, "(resume continues that run")) << unasked;

  again.resume = true;
  testing::internal::CaptureStderr();
  const ClusterRunSummary resumed = train_cluster(again);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(said, "tandem: the servers' checkpoints come after 2 epochs: training "
                             "goes on with epoch 3")) << said;
  EXPECT_EQ(resumed.resumed_epochs, 2);
  EXPECT_EQ(resumed.epochs, 3);
  EXPECT_EQ(resumed.batches, 8);  // this run's own
  EXPECT_EQ(resumed.steps, 3 * 8);
  EXPECT_EQ(json::parse(resumed.to_json())["resumed_epochs"], 2);
  const Checkpoint a = load_checkpoint(whole.model_out), b = load_checkpoint(again.model_out);
  const auto pa = a.model.parameters(), pb = b.model.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_EQ(pa[i].values.size(), pb[i].values.size());
    ASSERT_FALSE(pa[i].values.empty());
    EXPECT_EQ(std::memcmp(pa[i].values.data(), pb[i].values.data(),
                          pa[i].values.size() * sizeof(float)),
              0)
        << pa[i].name;
  }

  // Another number of servers or another model than the checkpoints': refused before anything
  // starts (the servers refused the chief's Init once every role had started).
  ClusterRunOptions other = again;
  other.max_epochs = 4;
  other.ps = 2;
  const std::string servers = error_of<InputError>([&] { train_cluster(other); });
  EXPECT_TRUE(contains(servers, "resume: ps0's checkpoint holds ")) << servers;
  EXPECT_TRUE(contains(servers, "where this run (model 40-16-4 on 2 servers) places ")) << servers;
  other.ps = 1;
  json with_model = json::parse(again.settings);
  with_model["model"] = "40-8-4";
  other.settings = with_model.dump();
  const std::string model = error_of<InputError>([&] { train_cluster(other); });
  EXPECT_TRUE(contains(model, "where this run (model 40-8-4 on 1 server) places ")) << model;

  // Resumed on as many servers as wrote the checkpoints, each split part matches (the check
  // above refuses only a difference): a 2-server run goes on with its next epoch.
  ClusterRunOptions two = run_in("two", 1);
  two.ps = 2;
  ASSERT_EQ(train_cluster(two).epochs, 1);
  two.resume = true;
  two.max_epochs = 2;
  const ClusterRunSummary two_resumed = train_cluster(two);
  EXPECT_EQ(two_resumed.resumed_epochs, 1);
  EXPECT_EQ(two_resumed.epochs, 2);
  EXPECT_EQ(two_resumed.batches, 8);

  ClusterRunOptions nothing = run_in("none", 3);
  nothing.resume = true;
  const std::string none = error_of<InputError>([&] { train_cluster(nothing); });
  EXPECT_TRUE(contains(none, "resume: no parameter server checkpoint in " +
                                 store.dir.file("none-checkpoints")))
      << none;
  nothing.settings = json{{"data", store.path}, {"model", "40-16-4"}}.dump();
  const std::string no_dir = error_of<InputError>([&] { train_cluster(nothing); });
  EXPECT_TRUE(contains(no_dir, "resume needs the settings' checkpoint_dir")) << no_dir;
}

// The coordinator of a run by hand takes the same rule, and its summary says where the epochs
// go on.
TEST(PublicCluster, ACoordinatorByHandResumesOnlyWhenAsked) {
  const Store store;
  ClusterRunOptions first;
  const std::string checkpoints = store.dir.file("checkpoints");
  first.settings = json{{"data", store.path}, {"model", "40-16-4"}, {"batch", 50},
                        {"checkpoint_dir", checkpoints}}.dump();
  first.scorers = 0;
  first.max_epochs = 1;
  ASSERT_EQ(train_cluster(first).steps, 8);

  ClusterCoordinatorOptions o = store.coordinator_options();
  o.settings = first.settings;
  o.scorers = 0;
  const std::string unasked = error_of<InputError>([&] { ClusterCoordinator c(o); });
  EXPECT_TRUE(contains(unasked, "checkpoint_dir " + checkpoints + " holds parameter server"))
      << unasked;
  o.resume = true;
  const ClusterCoordinator resumed(o);
  const json summary = json::parse(resumed.summary_json());
  EXPECT_EQ(summary["resumed_epochs"], 1);
  EXPECT_EQ(summary["epochs"], 1);  // counted as completed
}

}  // namespace
}  // namespace tandem
