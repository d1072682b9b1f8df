// The cluster: the work queue's hand-outs (shares, stealing, orphans of lost workers, epoch
// limits), the coordinator's scores channel, start-up timeout and lost workers over real
// ZeroMQ sockets, and whole runs with every role as a thread (inproc) on a small store.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "bare_coordinator.h"
#include "chunk_manager.h"
#include "cluster_link.h"
#include "cluster_metrics.h"
#include "cluster_ranks.h"
#include "cluster_resume.h"
#include "cluster_role_support.h"
#include "cluster_run.h"
#include "cluster_work_queue.h"
#include "coordinator.h"
#include "dataset_store.h"
#include "ps_checkpoint_file.h"
#include "ps_client.h"
#include "score_subscriber.h"
#include "signal_storm.h"
#include "tandem/cluster.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "test_support.h"

namespace tandem {
namespace {

using nlohmann::json;

std::vector<int64_t> range(int64_t begin, int64_t end) {
  std::vector<int64_t> v;
  for (int64_t b = begin; b < end; ++b) v.push_back(b);
  return v;
}

TEST(WorkQueue, NewEpochIsCutIntoContiguousSharesOfTheLiveWorkers) {
  WorkQueue q(10, 0);
  const auto a = q.next("a", {"a", "b"});
  ASSERT_TRUE(a);
  EXPECT_EQ(a->epoch, 0);
  EXPECT_EQ(a->batches, range(0, 5));
  const auto b = q.next("b", {"a", "b"});
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, 0);
  EXPECT_EQ(b->batches, range(5, 10));
  EXPECT_EQ(q.epochs_opened(), 1);
}

TEST(WorkQueue, AFastWorkerTakesHalfOfAShareNotStarted) {
  WorkQueue q(10, 0);
  const auto a = q.next("a", {"a", "b"});
  q.finish("a", a->id);
  const auto again = q.next("a", {"a", "b"});  // b has not started its share yet
  ASSERT_TRUE(again);
  EXPECT_EQ(again->epoch, 0);
  EXPECT_EQ(again->batches, range(7, 10));
  const auto b = q.next("b", {"a", "b"});
  EXPECT_EQ(b->batches, range(5, 7));
  q.finish("a", again->id);
  q.finish("b", b->id);
  EXPECT_EQ(q.epochs_completed(), 1);
  EXPECT_EQ(q.batches_done(), 10);
}

TEST(WorkQueue, ALostWorkersBatchesAfterItsLastReportAreHandedOutFirst) {
  WorkQueue q(10, 0);
  const auto a = q.next("a", {"a", "b"});
  const auto b = q.next("b", {"a", "b"});
  q.progress("a", a->id, 2);
  q.worker_lost("a");
  q.finish("b", b->id);
  const auto orphans = q.next("b", {"b"});
  ASSERT_TRUE(orphans);
  EXPECT_EQ(orphans->epoch, 0);
  EXPECT_EQ(orphans->batches, range(2, 5));
  q.finish("b", orphans->id);
  EXPECT_EQ(q.epochs_completed(), 1);
  EXPECT_EQ(q.batches_done(), 10);
}

TEST(WorkQueue, StopsHandingOutAtMaxEpochs) {
  WorkQueue q(3, 2);
  for (int e = 0; e < 2; ++e) {
    const auto t = q.next("a", {"a"});
    ASSERT_TRUE(t);
    EXPECT_EQ(t->epoch, e);
    EXPECT_FALSE(q.exhausted());
    q.finish("a", t->id);
  }
  EXPECT_FALSE(q.next("a", {"a"}));
  EXPECT_TRUE(q.exhausted());
  EXPECT_EQ(q.epochs_completed(), 2);
}

// A resumed run's queue: the epochs its checkpoints hold are counted, and the next opened is the
// one after them (the batch order an uninterrupted run would have had next).
TEST(WorkQueue, AResumedRunOpensTheEpochAfterThoseItTrained) {
  WorkQueue q(3, 4, 2);
  EXPECT_EQ(q.epochs_completed(), 2);
  EXPECT_EQ(q.epochs_whole(), 2);
  EXPECT_FALSE(q.exhausted());
  for (int e = 2; e < 4; ++e) {
    const auto t = q.next("a", {"a"});
    ASSERT_TRUE(t);
    EXPECT_EQ(t->epoch, e);
    EXPECT_EQ(t->batches, range(0, 3));
    q.finish("a", t->id);
    EXPECT_EQ(q.epochs_whole(), e + 1);
  }
  EXPECT_TRUE(q.exhausted());
  EXPECT_FALSE(q.next("a", {"a"}));
  EXPECT_EQ(q.batches_done(), 6);  // this run's own
  WorkQueue done(3, 2, 2);  // resumed with no epoch left to train
  EXPECT_TRUE(done.exhausted());
  EXPECT_FALSE(done.next("a", {"a"}));
  EXPECT_THROW(WorkQueue(3, 0, -1), InputError);
}

// Epochs complete out of order (a fast worker goes on to the next while a slow one still trains
// its share): only the epochs before the oldest open one are whole.
TEST(WorkQueue, EpochsWholeStopAtTheOldestOpenEpoch) {
  WorkQueue q(2, 0);
  const auto a0 = q.next("a", {"a", "b"});
  const auto b0 = q.next("b", {"a", "b"});
  ASSERT_TRUE(a0 && b0);
  q.finish("a", a0->id);
  const auto a1 = q.next("a", {"a", "b"});  // epoch 1, a's share
  ASSERT_TRUE(a1);
  EXPECT_EQ(a1->epoch, 1);
  q.finish("a", a1->id);
  const auto a1b = q.next("a", {"a", "b"});  // b's share of epoch 1, not started
  ASSERT_TRUE(a1b);
  EXPECT_EQ(a1b->epoch, 1);
  q.finish("a", a1b->id);
  EXPECT_EQ(q.epochs_completed(), 1);  // epoch 1
  EXPECT_EQ(q.epochs_whole(), 0);      // epoch 0 is still b's
  q.finish("b", b0->id);
  EXPECT_EQ(q.epochs_completed(), 2);
  EXPECT_EQ(q.epochs_whole(), 2);
}

TEST(WorkQueue, LateReportsOfAnOldTaskChangeNothing) {
  WorkQueue q(4, 0);
  const auto first = q.next("a", {"a"});
  q.finish("a", first->id);
  const auto second = q.next("a", {"a"});
  q.progress("a", first->id, 4);  // late and stale
  q.finish("a", first->id);
  EXPECT_EQ(q.batches_done(), 4);
  q.progress("a", second->id, 1);
  EXPECT_EQ(q.batches_done(), 5);
}

// Random asks, reports and losses: every batch of every epoch is trained at least once, and an
// epoch completes only when all its batches are.
TEST(WorkQueue, EveryBatchIsTrainedDespiteRandomLosses) {
  std::mt19937 gen(7);
  const int64_t batches = 17, epochs = 5;
  WorkQueue q(batches, epochs);
  std::vector<std::string> live{"w0", "w1", "w2"};
  std::map<std::string, WorkTask> held;
  std::map<std::string, size_t> done;
  std::vector<std::set<int64_t>> trained(epochs);
  int fresh = 3;
  for (int round = 0; round < 100000 && !q.exhausted(); ++round) {
    const std::string w = live[gen() % live.size()];
    auto it = held.find(w);
    if (it == held.end()) {
      if (auto t = q.next(w, live)) {
        held[w] = *t;
        done[w] = 0;
      }
      continue;
    }
    const uint32_t dice = gen() % 20;
    if (dice == 0) {  // the worker dies; a new one takes its place
      q.worker_lost(w);
      held.erase(w);
      live.erase(std::find(live.begin(), live.end(), w));
      live.push_back("w" + std::to_string(fresh++));
    } else if (done[w] < it->second.batches.size()) {
      trained[size_t(it->second.epoch)].insert(it->second.batches[done[w]++]);
      if (gen() % 3 == 0) q.progress(w, it->second.id, int64_t(done[w]));
    } else {
      q.finish(w, it->second.id);
      held.erase(w);
    }
  }
  ASSERT_TRUE(q.exhausted());
  for (int64_t e = 0; e < epochs; ++e) EXPECT_EQ(trained[size_t(e)].size(), size_t(batches)) << e;
}

TEST(ClusterRanks, RanksMapToCoordinatorServersScorerAndWorkers) {
  EXPECT_EQ(role_for_rank(0, 6, 2, 1).kind, "coordinator");
  EXPECT_EQ(role_for_rank(0, 6, 2, 1).workers, 2);
  EXPECT_EQ(role_for_rank(1, 6, 2, 1).kind, "ps");
  EXPECT_EQ(role_for_rank(2, 6, 2, 1).index, 1);
  EXPECT_EQ(role_for_rank(3, 6, 2, 1).kind, "scorer");
  EXPECT_EQ(role_for_rank(4, 6, 2, 1).kind, "worker");
  EXPECT_EQ(role_for_rank(5, 6, 2, 1).index, 1);
  EXPECT_THROW(role_for_rank(0, 4, 2, 1), InputError);  // no room for a worker
  EXPECT_THROW(role_for_rank(6, 6, 2, 1), InputError);
}

TEST(ClusterRanks, RankComesFromSlurmOrMpiEnvironment) {
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID",
                        "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE"})
    unsetenv(v);
  EXPECT_FALSE(launcher_rank_from_environment());
  setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  setenv("OMPI_COMM_WORLD_SIZE", "8", 1);
  auto r = launcher_rank_from_environment();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->rank, 3);
  EXPECT_EQ(r->size, 8);
  EXPECT_EQ(r->launcher, "openmpi");
  setenv("SLURM_PROCID", "1", 1);  // SLURM first when both are there (srun --mpi)
  setenv("SLURM_NTASKS", "4", 1);
  setenv("SLURM_JOB_ID", "777", 1);
  r = launcher_rank_from_environment();
  EXPECT_EQ(r->launcher, "slurm");
  EXPECT_EQ(r->job, "777");
  setenv("SLURM_STEP_ID", "2", 1);  // the allocation's third srun: not the previous step's job
  EXPECT_EQ(launcher_rank_from_environment()->job, "777.2");
  unsetenv("SLURM_STEP_ID");
  setenv("SLURM_PROCID", "4", 1);
  EXPECT_THROW(launcher_rank_from_environment(), InputError);  // rank 4 of 4
  setenv("SLURM_PROCID", "x", 1);
  EXPECT_THROW(launcher_rank_from_environment(), InputError);
  for (const char* v : {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "OMPI_COMM_WORLD_RANK",
                        "OMPI_COMM_WORLD_SIZE"})
    unsetenv(v);
}

TEST(ClusterRanks, AnyInterfaceAddressesAreAdvertisedByHost) {
  EXPECT_EQ(advertised_endpoint("tcp://0.0.0.0:5555", "node7"), "tcp://node7:5555");
  EXPECT_EQ(advertised_endpoint("tcp://127.0.0.1:5555", "node7"), "tcp://127.0.0.1:5555");
  EXPECT_EQ(advertised_endpoint("inproc://x", "node7"), "inproc://x");
  EXPECT_NE(advertised_endpoint("tcp://0.0.0.0:1").find("tcp://"), std::string::npos);
  // The scores channel goes beside the control socket: on every interface when it is.
  EXPECT_EQ(scores_bind_beside("tcp://0.0.0.0:5555"), "tcp://0.0.0.0:*");
  EXPECT_EQ(scores_bind_beside("tcp://127.0.0.1:*"), "tcp://127.0.0.1:*");
  EXPECT_EQ(scores_bind_beside("tcp://[::1]:7"), "tcp://[::1]:*");
  EXPECT_EQ(scores_bind_beside("inproc://coordinator"), "tcp://127.0.0.1:*");
}

// --advertise goes only with a bind to every interface, tcp://*:PORT as well as 0.0.0.0 (the
// servers', the coordinator's and the trial-slot servers' alike); elsewhere it was dropped.
TEST(ClusterRanks, AnAdvertisedHostNeedsABindToEveryInterface) {
  EXPECT_TRUE(binds_every_interface("tcp://*:5555"));
  EXPECT_EQ(advertised_endpoint("tcp://*:5555", "node7"), "tcp://node7:5555");
  EXPECT_EQ(advertise_problem("tcp://0.0.0.0:5555", "node7", "a server"), "");
  EXPECT_EQ(advertise_problem("tcp://*:5555", "node7", "a server"), "");
  EXPECT_EQ(advertise_problem("tcp://127.0.0.1:5555", "", "a server"), "");
  EXPECT_EQ(advertise_problem("tcp://127.0.0.1:5555", "node7", "a coordinator"),
            "--advertise is for a coordinator bound to every interface (--bind "
            "tcp://0.0.0.0:PORT); this one binds tcp://127.0.0.1:5555");
}

TEST(ClusterRanks, RendezvousFileCarriesTheAddressOfThisJobOnly) {
  test::TempDir dir;
  const std::string path = dir.file("coordinator.address");
  write_rendezvous(path, "tcp://node1:5555", "job-1");
  EXPECT_EQ(wait_for_rendezvous(path, "job-1", 0, 1000), "tcp://node1:5555");
  try {
    wait_for_rendezvous(path, "job-2", 0, 300);  // an older job's file
    FAIL() << "expected a timeout";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("older one: tcp://node1:5555 (job 'job-1')"),
              std::string::npos) << e.what();
  }
  write_rendezvous(path, "tcp://node2:6000", "");
  EXPECT_EQ(wait_for_rendezvous(path, "", 0, 1000), "tcp://node2:6000");
  EXPECT_THROW(wait_for_rendezvous(dir.file("none"), "", 0, 200), Error);
  // Rank 0 removes its own file as it ends, not a newer rank 0's (nor a missing one).
  remove_rendezvous(path, "tcp://node1:5555", "job-1");
  EXPECT_TRUE(std::filesystem::exists(path));
  remove_rendezvous(path, "tcp://node2:6000", "");
  EXPECT_FALSE(std::filesystem::exists(path));
  remove_rendezvous(path, "tcp://node2:6000", "");
}


TEST(Coordinator, TheStateShowsALongRunsOlderScoresThinnedAndNoTargetAsNull) {
  zmq::context_t context(1);
  Coordinator c(test::bare_coordinator_options(context));  // no target
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  CoordinatorLink link(c.endpoint(), context);
  test::register_scorer(link);
  for (int i = 1; i <= 2500; ++i)
    link.request(test::score_request(i, 5000.0 - i, 0.5));
  const json state = c.state();
  EXPECT_TRUE(state.at("cluster").at("target").is_null()) << state.at("cluster").dump();
  EXPECT_EQ(state.at("cluster").at("scores_total"), 2500);
  const json& scores = state.at("scores");
  ASSERT_EQ(scores.size(), 2000u);
  EXPECT_EQ(scores.front().at("step"), 1);
  for (size_t k = 1; k < scores.size(); ++k)  // in order, each once
    ASSERT_LT(scores[k - 1].at("step").get<int64_t>(), scores[k].at("step").get<int64_t>());
  for (size_t k = 1000; k < 2000; ++k)  // the newest 1,000 all there
    ASSERT_EQ(scores[k].at("step").get<int64_t>(), int64_t(k) + 501);
  EXPECT_EQ(c.scores().size(), 2500u);  // the run keeps them all
  // What a caller polling ten times a second asks for: the figures without the points, and the
  // scores it has not seen.
  const json figures = c.state(/*with_scores=*/false);
  EXPECT_EQ(figures.at("scores").size(), 0u);
  EXPECT_EQ(figures.at("cluster").at("scores_total"), 2500);
  const std::vector<ScoreRecord> tail = c.scores_since(2497);
  ASSERT_EQ(tail.size(), 3u);
  EXPECT_EQ(tail.front().seq, 2498);
  EXPECT_EQ(tail.back().step, 2500);
  EXPECT_TRUE(c.scores_since(2500).empty());
  EXPECT_TRUE(c.scores_since(9999).empty());
}

// Bound but not answering until start_serving(): launch clears the previous run's files in
// between. A request sent meanwhile waits and is answered; the start-up timeout counts from the
// start of serving, not from the bind.
TEST(Coordinator, ServesOnlyFromStartServingAndAnswersWhatWaited) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.serve_at_once = false;
  Coordinator c(o);
  EXPECT_EQ(c.wait_for(ClusterPhase::Training, 300), ClusterPhase::Starting);
  json reply;
  std::thread early([&] {
    CoordinatorLink link(c.endpoint(), context, 10000);
    test::register_scorer(link);
    reply = link.request(test::score_request(1, 5.0, 0.5));
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_TRUE(c.scores().empty());  // not answered yet
  c.start_serving();
  c.start_serving();  // once only
  early.join();
  EXPECT_FALSE(reply.contains("error")) << reply.dump();
  EXPECT_EQ(c.scores().size(), 1u);
  EXPECT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);

  CoordinatorOptions waiting = test::bare_coordinator_options(context);
  waiting.serve_at_once = false;
  waiting.expected_workers = 1;
  waiting.startup_timeout_ms = 400;
  Coordinator late(waiting);
  std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the timeout, not serving
  late.start_serving();
  EXPECT_EQ(late.wait_for(ClusterPhase::Failed, 150), ClusterPhase::Starting);
  EXPECT_EQ(late.wait_for(ClusterPhase::Failed, 5000), ClusterPhase::Failed);
}

// Which run a state is: the id the roles are told when they register, another for another run.
TEST(Coordinator, TheStateNamesItsRun) {
  zmq::context_t context(1);
  Coordinator a(test::bare_coordinator_options(context));
  Coordinator b(test::bare_coordinator_options(context));
  const std::string run = a.state().at("cluster").at("run").get<std::string>();
  EXPECT_EQ(run.size(), 32u);
  EXPECT_EQ(run.find_first_not_of("0123456789abcdef"), std::string::npos) << run;
  EXPECT_NE(b.state().at("cluster").at("run").get<std::string>(), run);
  CoordinatorLink link(a.endpoint(), context);
  const json registered = link.request({{"type", "register"}, {"role", "worker"}});
  EXPECT_EQ(registered.value("run", std::string()), run) << registered.dump();
}

TEST(Coordinator, ALateSubscriberGetsTheNewestTenScoresAtOnce) {
  zmq::context_t context(1);
  Coordinator c(test::bare_coordinator_options(context));
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  CoordinatorLink link(c.endpoint(), context);
  test::register_scorer(link);
  for (int i = 1; i <= 12; ++i)
    link.request(test::score_request(i, 1000.0 - i, 0.5));
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "scores");
  sub.connect(c.scores_endpoint());
  // Scores queued before the subscription took effect may come live as well as replayed, and
  // before the replay: the coordinator answers a score before it publishes it, so the newest one
  // may still be on its way live when the subscriber connects. Subscribers drop a seq they have
  // seen, as this one does, and it waits for every seq it expects, not only the newest.
  std::set<int64_t> seqs;
  auto receive_until = [&](int64_t newest) {
    const auto all_in = [&] {
      for (int64_t seq = std::max<int64_t>(1, newest - 9); seq <= newest; ++seq)
        if (!seqs.count(seq)) return false;
      return true;
    };
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!all_in() && std::chrono::steady_clock::now() < deadline) {
      zmq::pollitem_t item{sub.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      zmq::message_t topic, body;
      ASSERT_TRUE(sub.recv(topic));
      ASSERT_TRUE(sub.recv(body));
      EXPECT_EQ(topic.to_string(), "scores");
      const json m = json::parse(body.to_string());
      if (!m.contains("seq")) continue;  // a replay's opening or closing message
      seqs.insert(m.at("seq").get<int64_t>());
      EXPECT_DOUBLE_EQ(m.at("loss").get<double>(), 1000.0 - double(m.at("step").get<int64_t>()));
    }
  };
  receive_until(12);
  for (int64_t seq = 3; seq <= 12; ++seq) EXPECT_TRUE(seqs.count(seq)) << seq;
  link.request(test::score_request(13, 987.0, 0.5));
  receive_until(13);
  EXPECT_TRUE(seqs.count(13));
}

// A run that failed after its stop rule fired ends "failed: ...": for a subscriber that comes
// after the end too, whose replay once gave the stop rule's reason ("target") instead.
TEST(Coordinator, ALateSubscriberHearsThatARunFailedAfterItsStop) {
  zmq::context_t context(1);
  Coordinator c(test::bare_coordinator_options(context));
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  c.request_stop("target");
  c.fail("reading the final parameters: gone");
  ScoreSubscriber late(c.endpoint(), context);
  std::optional<json> m;
  while ((m = late.next(10000)) && !is_end_message(*m)) {
  }
  ASSERT_TRUE(m) << "no end message";
  EXPECT_EQ(end_reason_of(*m), "failed: reading the final parameters: gone");
}

// A diverged scorer's NaN loss travels as null (JSON has no NaN): the coordinator took it with
// value("loss", 0.0), which throws nlohmann's type_error on null. It is a NaN score now, kept and
// published, and the public stream reads it back as NaN.
TEST(Coordinator, ANaNScoreIsKeptAsNaN) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.context = nullptr;  // on tcp, so that the public stream, with a context of its own, reaches it
  o.bind = "tcp://127.0.0.1:*";
  o.scores_bind = "tcp://127.0.0.1:*";
  Coordinator c(o);
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  ClusterScoreStream stream(c.endpoint(), 5);
  CoordinatorLink link(c.endpoint(), context);
  test::register_scorer(link);
  const json reply = link.request({{"type", "score"}, {"name", "scorer0"}, {"step", 1},
                                   {"loss", std::numeric_limits<double>::quiet_NaN()},
                                   {"accuracy", 0.1}});
  EXPECT_FALSE(reply.contains("error")) << reply.dump();
  ASSERT_EQ(c.scores().size(), 1u);
  EXPECT_TRUE(std::isnan(c.scores()[0].loss));
  ClusterScore score;
  ASSERT_TRUE(stream.next(score, 5));
  EXPECT_TRUE(std::isnan(score.loss));
  EXPECT_EQ(score.accuracy, 0.1);
}

// The coordinator's side of the scores channel by hand, to make an interleaving that a real
// coordinator produces only by chance: a live score reaching a new subscriber before its replay.
class ScoreChannelByHand : public ::testing::Test {
 protected:
  void SetUp() override {
    control_.bind("inproc://scores-by-hand-control");
    scores_.set(zmq::sockopt::rcvtimeo, 5000);
    scores_.bind("inproc://scores-by-hand");
    std::thread answer([&] {  // the subscriber's one request: where the channel is
      zmq::message_t id, body;
      if (!control_.recv(id) || !control_.recv(body)) return;
      const json request = json::parse(body.to_string());
      const json reply{{"spec", {{"scores", "inproc://scores-by-hand"}}}, {"seq", request.at("seq")}};
      control_.send(id, zmq::send_flags::sndmore);
      control_.send(zmq::buffer(reply.dump()));
    });
    subscriber_ = std::make_unique<ScoreSubscriber>("inproc://scores-by-hand-control", context_);
    answer.join();
    zmq::message_t subscription;  // published messages reach the subscriber from here on
    ASSERT_TRUE(scores_.recv(subscription));
  }
  void publish(const json& m) {
    scores_.send(zmq::str_buffer("scores"), zmq::send_flags::sndmore);
    scores_.send(zmq::buffer(m.dump()));
  }
  static json score(int64_t seq, int64_t replay = 0) {
    json m{{"seq", seq}, {"step", seq}, {"loss", 100.0 - double(seq)}};
    if (replay > 0) m["replay"] = replay;
    return m;
  }
  // Replay number `id` of seqs first..last, as the coordinator sends one; `opened`: with its
  // opening message (without: its tail, as a subscriber attached in its middle sees it).
  void replay(int64_t id, int64_t first, int64_t last, bool opened = true) {
    if (opened) publish({{"replaying", id}});
    for (int64_t seq = first; seq <= last; ++seq) publish(score(seq, id));
    publish({{"replayed", id}});
  }
  // The seqs given until the end message (which must come).
  std::vector<int64_t> seqs_until_the_end() {
    std::vector<int64_t> seqs;
    while (auto m = subscriber_->next(10000)) {
      if (m->value("end", false)) break;
      EXPECT_FALSE(m->contains("replay")) << m->dump();
      EXPECT_DOUBLE_EQ(m->at("loss").get<double>(), 100.0 - double(m->at("seq").get<int64_t>()));
      seqs.push_back(m->at("seq").get<int64_t>());
    }
    EXPECT_TRUE(subscriber_->ended());
    return seqs;
  }
  static std::vector<int64_t> seq_range(int64_t first, int64_t last) {
    std::vector<int64_t> out;
    for (int64_t s = first; s <= last; ++s) out.push_back(s);
    return out;
  }
  zmq::context_t context_{1};
  zmq::socket_t control_{context_, zmq::socket_type::router};
  zmq::socket_t scores_{context_, zmq::socket_type::xpub};
  std::unique_ptr<ScoreSubscriber> subscriber_;
};

TEST_F(ScoreChannelByHand, ALiveScoreBeforeTheReplayComesAfterItInOrder) {
  publish(score(12));  // live, before the subscriber's replay
  replay(1, 3, 12);
  publish(score(13));
  replay(2, 4, 13);  // a later subscriber's replay: nothing new in it
  publish(score(14));
  publish({{"end", true}, {"reason", "test over"}});
  EXPECT_EQ(seqs_until_the_end(), seq_range(3, 14));
}

TEST_F(ScoreChannelByHand, TheTailOfAnotherSubscribersReplayIsNotTakenForOnesOwn) {
  // Attached in the middle of replay 1 (for another subscriber): its last scores and close come
  // first, then a live score, then this subscriber's own replay.
  replay(1, 10, 12, /*opened=*/false);
  publish(score(13));
  replay(2, 4, 13);
  publish(score(14));
  publish({{"end", true}, {"reason", "test over"}});
  EXPECT_EQ(seqs_until_the_end(), seq_range(4, 14));
}

TEST_F(ScoreChannelByHand, WithoutAReplayLiveScoresComeAfterAHold) {
  publish(score(1));
  publish(score(2));
  publish({{"end", true}, {"reason", "test over"}});
  EXPECT_EQ(seqs_until_the_end(), seq_range(1, 2));  // after the 2 s hold for a replay
}

TEST_F(ScoreChannelByHand, MessagesWithFieldsOfTheWrongTypeArePassedOver) {
  replay(1, 1, 2);
  publish({{"seq", "x"}, {"loss", 1.0}});  // before, each of these threw json's type_error
  publish({{"end", "yes"}, {"seq", 3}, {"loss", 97.0}});  // not an end: a score
  publish({{"end", false}, {"seq", 4}, {"loss", 96.0}});
  publish({{"end", true}, {"reason", 5}});
  std::vector<int64_t> seqs;
  while (auto m = subscriber_->next(10000)) {
    if (is_end_message(*m)) {
      EXPECT_EQ(end_reason_of(*m), "");
      break;
    }
    seqs.push_back(m->at("seq").get<int64_t>());
  }
  EXPECT_TRUE(subscriber_->ended());
  EXPECT_EQ(seqs, seq_range(1, 4));
}

TEST(Coordinator, AScoreUnderTheTargetStopsTraining) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.target = 500;
  Coordinator c(o);
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  CoordinatorLink link(c.endpoint(), context);
  test::register_scorer(link);
  link.request({{"type", "score"}, {"name", "scorer0"}, {"step", 1}, {"loss", 600.0}});
  EXPECT_EQ(c.phase(), ClusterPhase::Training);
  link.request({{"type", "score"}, {"name", "scorer0"}, {"step", 2}, {"loss", 499.0}});
  EXPECT_EQ(c.phase(), ClusterPhase::Draining);
  EXPECT_EQ(c.stop_reason(), "target");
}

// Ctrl-C reaches `tandem launch` as a signal the kernel hands to any one thread that does not
// block it: the coordinator's serving thread, or a role's thread waiting for an answer. The
// interrupted poll (EINTR, thrown by cppzmq) ended the process with std::terminate; both must
// go on instead.
TEST(Coordinator, ServesThroughSignalsLandingOnItsThreads) {
  zmq::context_t context;
  Coordinator c(test::bare_coordinator_options(context));
  CoordinatorLink link(c.endpoint(), context, 5000);
  const test::StormRun run = test::repeat_during_signal_storm(
      std::chrono::seconds(1), [&] { link.request({{"type", "status"}}); });
  EXPECT_EQ(run.failure, "");
  EXPECT_GT(run.steps, 10);
  EXPECT_GT(run.signals, 100);
  EXPECT_NO_THROW(link.request({{"type", "status"}}));  // still serving
}

// A server the placement gives no part would never be initialised (the chief's Init skips it):
// the other workers waited for it until their init timeout. Refused before anything starts.
TEST(Coordinator, RefusesMoreServersThanTheModelHasPartsFor) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.run_config["model"] = "4-2-3";  // 4 tensors of 4, 2, 2 and 3 rows: 11 parts at most
  o.expected_ps = 12;
  try {
    Coordinator c(o);
    ADD_FAILURE() << "12 servers for a model of 11 rows were accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("server 11 would hold no part"), std::string::npos)
        << e.what();
  }
  for (const auto& [model, servers] : {std::pair<std::string, int>{"4-2-3", 4}, {"784-100-10", 64}}) {
    CoordinatorOptions fits = test::bare_coordinator_options(context);  // (its own address)
    fits.run_config["model"] = model;
    fits.expected_ps = servers;
    EXPECT_NO_THROW(Coordinator c(fits)) << model << " on " << servers;
  }
}

TEST(Coordinator, StartupTimeoutNamesWhoIsMissing) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 2;
  o.expected_workers = 1;
  // (2 s: ps0's registration must land before it on a loaded machine, or ps0 is named as not
  // registered.)
  o.startup_timeout_ms = 2000;
  Coordinator c(o);
  c.expect("ps1", "pid 4242 on this machine");
  c.expect("worker0", "pid 4343 on this machine");
  CoordinatorLink link(c.endpoint(), context);
  const json reply = link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}, {"pid", 42}});
  EXPECT_EQ(reply.at("name"), "ps0");
  // A server under another name than ps0 or ps1 was accepted and never counted: the run waited
  // out its timeout naming the ps it lacked. Refused now, saying which names the run takes.
  for (const char* name : {"alpha", "ps2", "ps01"}) {
    const std::string refused = test::error_of<Error>(
        [&] { link.request({{"type", "register"}, {"role", "ps"}, {"name", name}}); });
    EXPECT_TRUE(test::contains(refused, "this run's parameter servers are ps0 to ps1, not '" +
                                            std::string(name) + "'"))
        << refused;
  }
  link.start_heartbeats("ps0", nullptr, 50);
  EXPECT_EQ(c.wait_for(ClusterPhase::Training, 20000), ClusterPhase::Failed);
  const std::string why = c.failure();
  EXPECT_NE(why.find("ps0 (registered, not serving, pid 42)"), std::string::npos) << why;
  EXPECT_NE(why.find("ps1 (not registered; expected from pid 4242 on this machine)"),
            std::string::npos) << why;
  EXPECT_NE(why.find("workers (0 of 1 registered: worker0 from pid 4343 on this machine)"),
            std::string::npos) << why;
}

TEST(Coordinator, RejectsMalformedAndUnknownRequests) {
  zmq::context_t context(1);
  Coordinator c(test::bare_coordinator_options(context));
  CoordinatorLink link(c.endpoint(), context);
  EXPECT_THROW(link.request({{"type", "register"}, {"role", "boss"}}), Error);
  EXPECT_THROW(link.request({{"type", "work"}, {"name", "nobody"}}), Error);
  // Scores only from a registered scorer: one left from an earlier run, whose coordinator
  // restarted at this address, would stop this run on that run's parameters.
  EXPECT_TRUE(test::contains(
      test::error_of<Error>([&] {
        link.request({{"type", "score"}, {"name", "scorer0"}, {"step", 1}, {"loss", 1.0}});
      }),
      "'score' from 'scorer0', which is not a registered scorer"));
  EXPECT_TRUE(c.scores().empty());
  test::register_scorer(link);
  EXPECT_THROW(link.request({{"type", "launch-missiles"}, {"name", "x"}}), Error);
  zmq::socket_t raw(context, zmq::socket_type::dealer);
  raw.connect(c.endpoint());
  raw.send(zmq::str_buffer("{not json"), zmq::send_flags::none);
  zmq::message_t reply;
  ASSERT_TRUE(raw.recv(reply));
  EXPECT_NE(reply.to_string().find("error"), std::string::npos);
  // A message nested 100,000 deep (200 KB) is refused before it is parsed: an error naming its
  // type field showed the value with dump(), which recursed once per level off the stack.
  const std::string deep = "{\"type\":" + std::string(100'000, '[') +
                           std::string(100'000, ']') + "}";
  raw.send(zmq::buffer(deep), zmq::send_flags::none);
  ASSERT_TRUE(raw.recv(reply));
  EXPECT_TRUE(test::contains(reply.to_string(), "nested at most 64 levels deep")) << reply.str();
  // Numbers that are not integers where integers belong are refused, naming the field (read
  // as int64 by nlohmann, 1e300 would be undefined behaviour).
  std::string why = test::error_of<Error>([&] {
    link.request({{"type", "register"}, {"role", "worker"}, {"name", "w"}, {"pid", 1e300}});
  });
  EXPECT_TRUE(test::contains(why, "\"pid\" is 1e+300, expected an integer")) << why;
  why = test::error_of<Error>(
      [&] { link.request({{"type", "score"}, {"name", "scorer0"}, {"step", 2.5}}); });
  EXPECT_TRUE(test::contains(why, "\"step\" is 2.5")) << why;
  // Text fields of another type are refused naming the field (nlohmann's own conversion named
  // none), and a refused registration adds no role.
  why = test::error_of<Error>([&] {
    link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}, {"address", 5}});
  });
  EXPECT_TRUE(test::contains(why, "\"address\" is 5, expected text")) << why;
  why = test::error_of<Error>(
      [&] { link.request({{"type", "register"}, {"role", json::array()}}); });
  EXPECT_TRUE(test::contains(why, "\"role\" is [], expected text")) << why;
  why = test::error_of<Error>([&] {
    link.request({{"type", "register"}, {"role", "worker"}, {"host", {{"h", 1}}}});
  });
  EXPECT_TRUE(test::contains(why, "\"host\" is {\"h\":1}, expected text")) << why;
  // The coordinator itself and the scorer registered above.
  EXPECT_EQ(c.state().at("roles").size(), 2u) << c.state().dump();
  // A worker's status with counters of the wrong type: its heartbeat is refused, and the state
  // still reads (those counters as 0).
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker9"}});
  why = test::error_of<Error>([&] {
    link.request({{"type", "heartbeat"}, {"name", "worker9"},
                  {"status", {{"task", "x"}, {"steps", json::array()}, {"samples_per_s", "y"}}}});
  });
  EXPECT_TRUE(test::contains(why, "\"task\" is \"x\"")) << why;
  const json state = c.state();
  ASSERT_EQ(state.at("workers").size(), 1u) << state.dump();
  EXPECT_EQ(state.at("workers").at(0).at("steps"), 0) << state.dump();
  // Still serving.
  EXPECT_TRUE(link.request({{"type", "spec"}}).contains("spec"));
}

// A message larger than any the coordinator takes (one frame of 16 MiB and a byte, on a TCP
// endpoint open without CURVE) ends the connection it came on rather than being buffered whole
// and parsed; one just under the limit is answered, and the coordinator goes on serving.
TEST(Coordinator, AMessageOverItsSizeLimitEndsItsConnection) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.bind = "tcp://127.0.0.1:*";
  o.scores_bind = "tcp://127.0.0.1:*";
  Coordinator c(o);
  zmq::socket_t raw(context, zmq::socket_type::dealer);
  raw.set(zmq::sockopt::linger, 0);
  raw.set(zmq::sockopt::rcvtimeo, 2000);
  raw.connect(c.endpoint());
  std::string text(1 << 20, ' ');
  text.front() = '{';
  raw.send(zmq::buffer(text), zmq::send_flags::none);
  zmq::message_t reply;
  ASSERT_TRUE(raw.recv(reply)) << "a message of 1 MiB was not answered";
  EXPECT_TRUE(test::contains(reply.to_string(), "error")) << reply.to_string();
  // The connection ends: the DEALER's monitor sees it closed (the socket reconnects after).
  ASSERT_EQ(zmq_socket_monitor(raw.handle(), "inproc://over-the-limit", ZMQ_EVENT_DISCONNECTED),
            0);
  zmq::socket_t monitor(context, zmq::socket_type::pair);
  monitor.set(zmq::sockopt::rcvtimeo, 20000);
  monitor.connect("inproc://over-the-limit");
  const std::string huge(static_cast<size_t>(kCoordinatorMaxMessageBytes) + 1, ' ');
  raw.send(zmq::buffer(huge), zmq::send_flags::none);
  zmq::message_t event;
  ASSERT_TRUE(monitor.recv(event)) << "the connection of a message over the limit was not ended";
  ASSERT_GE(event.size(), 2u);
  uint16_t id = 0;
  std::memcpy(&id, event.data(), sizeof id);
  EXPECT_EQ(id, ZMQ_EVENT_DISCONNECTED);
  zmq_socket_monitor(raw.handle(), nullptr, 0);  // (stops the monitor before its PAIR closes)
  CoordinatorLink link(c.endpoint(), context);
  EXPECT_TRUE(link.request({{"type", "spec"}}).contains("spec"));
}

// The link reads only what answers its request: replies that are not objects, or whose seq is
// not its request's, are passed over; a heartbeat reply's phase that is not text is ignored
// (before, it threw out of the heartbeat thread and ended the process).
TEST(CoordinatorLink, PassesOverRepliesThatAreNotAnswersToItsRequest) {
  zmq::context_t context(1);
  zmq::socket_t fake(context, zmq::socket_type::router);
  fake.set(zmq::sockopt::rcvtimeo, 50);
  fake.bind("inproc://fake-coordinator");
  std::atomic<bool> stop{false};
  std::atomic<int> beats{0};
  std::thread answer([&] {
    while (!stop) {
      zmq::message_t peer, body;
      if (!fake.recv(peer)) continue;
      if (!fake.recv(body)) return;
      const json request = json::parse(body.to_string());
      const auto reply = [&](const std::string& text) {
        fake.send(zmq::buffer(peer.to_string()), zmq::send_flags::sndmore);
        fake.send(zmq::buffer(text), zmq::send_flags::none);
      };
      if (request.at("type") == "heartbeat") {
        reply("{\"phase\": 5}");
        reply("[\"training\"]");
        ++beats;
        continue;
      }
      reply("[1]");
      reply("{\"seq\": \"x\"}");
      reply("{\"seq\": 12345}");
      reply(json{{"seq", request.at("seq")}, {"answer", 42}}.dump());
    }
  });
  {
    CoordinatorLink link("inproc://fake-coordinator", context, 5000);
    link.start_heartbeats("worker0", nullptr, 20);
    EXPECT_EQ(link.request({{"type", "spec"}}).at("answer"), 42);
    EXPECT_TRUE(test::eventually([&] { return beats.load() >= 3; }, 10000, 10));
    EXPECT_EQ(link.phase(), "");  // none said yet
  }
  stop = true;
  answer.join();
}

// An error on the heartbeat thread (here the status callback's; ZeroMQ refusing a socket when
// no file descriptor is left, in a run) stops the beats and is kept for the role to raise
// (check_coordinator). It was thrown out of the thread: std::terminate ended the process, every
// in-process role and a Python interpreter with it, naming no role.
TEST(CoordinatorLink, AnErrorOnTheHeartbeatThreadIsKeptForTheRoleNotTheEndOfTheProcess) {
  zmq::context_t context(1);
  Coordinator c(test::bare_coordinator_options(context));
  CoordinatorLink link(c.endpoint(), context);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  EXPECT_EQ(link.heartbeat_failure(), "");
  link.start_heartbeats("worker0", []() -> json { throw Error("the status broke"); }, 20);
  EXPECT_TRUE(test::eventually([&] { return !link.heartbeat_failure().empty(); }, 10000, 10));
  EXPECT_EQ(link.heartbeat_failure(), "the status broke");
}

TEST(Coordinator, ASilentWorkerIsLostAndItsBatchesGoToAnother) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_workers = 2;
  o.heartbeat_timeout_ms = 1000;  // the live worker's 50 ms heartbeats never leave such a gap
  Coordinator c(o);
  CoordinatorLink silent(c.endpoint(), context), alive(c.endpoint(), context);
  silent.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  alive.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
  alive.start_heartbeats("worker1", nullptr, 50);
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  const json task = silent.request({{"type", "work"}, {"name", "worker0"}}).at("task");
  EXPECT_EQ(task.at("batches").get<std::vector<int64_t>>(), range(0, 5));
  // worker0 sends nothing more: lost after 1 s (waited for, up to 20 s); its batches come to
  // worker1 first.
  json state;
  const bool lost = test::eventually(
      [&] {
        state = c.state();
        for (const json& r : state.at("roles"))
          if (r.at("name") == "worker0") return r.at("state") == "lost";
        return false;
      },
      20000, 50);
  EXPECT_TRUE(lost) << state.dump();
  for (const json& r : state.at("roles")) {
    if (r.at("name") == "worker1") {
      EXPECT_EQ(r.at("state"), "running") << state.dump();
    }
  }
  const json orphans = alive.request({{"type", "work"}, {"name", "worker1"}}).at("task");
  EXPECT_EQ(orphans.at("batches").get<std::vector<int64_t>>(), range(0, 5));
  // A worker registering without a name does not take the lost one's: lost is only silent, and
  // worker0 comes back here (a process stopped for a while), to run under its own name alone.
  CoordinatorLink newcomer(c.endpoint(), context);
  EXPECT_EQ(newcomer.request({{"type", "register"}, {"role", "worker"}}).at("name"), "worker2");
  silent.request({{"type", "heartbeat"}, {"name", "worker0"}});
  state = c.state();
  for (const json& r : state.at("roles")) {
    if (r.at("name") == "worker0") {
      EXPECT_EQ(r.at("state"), "running") << state.dump();
    }
  }
}

// A resumed run's coordinator goes on with the epoch after those its servers' checkpoints hold,
// counts them, and tells its roles in each heartbeat reply how many epochs have every batch done
// (a server writes that count into its checkpoints); a role it does not know is not told.
TEST(Coordinator, AResumedRunGoesOnAfterTheEpochsItHeldAndSaysHowManyAreWhole) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_workers = 1;
  o.first_epoch = 3;
  o.max_epochs = 5;
  Coordinator c(o);
  CoordinatorLink worker(c.endpoint(), context);
  worker.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  auto beat = [&] { return worker.request({{"type", "heartbeat"}, {"name", "worker0"}}); };
  EXPECT_EQ(beat().at("epochs_whole"), 3);
  EXPECT_EQ(c.epochs_completed(), 3);
  const json task = worker.request({{"type", "work"}, {"name", "worker0"}}).at("task");
  EXPECT_EQ(task.at("epoch"), 3);
  EXPECT_EQ(task.at("batches").get<std::vector<int64_t>>(), range(0, 10));
  EXPECT_EQ(beat().at("epochs_whole"), 3);  // handed out, not trained
  worker.request({{"type", "work"}, {"name", "worker0"}, {"finished", task.at("id")}});
  EXPECT_EQ(beat().at("epochs_whole"), 4);
  EXPECT_EQ(c.state().at("cluster").at("epoch"), 4) << c.state().dump();
  // The heartbeat thread of a link keeps the highest count it was told.
  EXPECT_EQ(worker.epochs_whole(), -1);
  worker.start_heartbeats("worker0", nullptr, 20);
  EXPECT_TRUE(test::eventually([&] { return worker.epochs_whole() == 4; }, 5000, 10));
  CoordinatorLink stranger(c.endpoint(), context);
  const json unknown = stranger.request({{"type", "heartbeat"}, {"name", "ps7"}});
  EXPECT_TRUE(unknown.value("unknown", false)) << unknown.dump();
  EXPECT_FALSE(unknown.contains("epochs_whole")) << unknown.dump();
}

CoordinatorOptions two_worker_options(zmq::context_t& context) {
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_workers = 2;
  return o;
}

// A coordinator expecting two workers, and a link for each (worker0, worker1).
struct TwoWorkers {
  zmq::context_t context{1};
  Coordinator c{two_worker_options(context)};
  CoordinatorLink worker0{c.endpoint(), context}, worker1{c.endpoint(), context};

  // Both registered through their own links; training has started.
  void start_training() {
    worker0.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
    worker1.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
    ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  }
};

TEST(Coordinator, AWorkerStoppingMidTaskHasOnlyTheBatchesAfterItsGoodbyeHandedOutAgain) {
  TwoWorkers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_training());
  Coordinator& c = cluster.c;
  CoordinatorLink &stopping = cluster.worker0, &staying = cluster.worker1;
  const json task = stopping.request({{"type", "work"}, {"name", "worker0"}}).at("task");
  EXPECT_EQ(task.at("batches").get<std::vector<int64_t>>(), range(0, 5));
  // One batch reported by a heartbeat, three by the goodbye (trained since).
  stopping.request({{"type", "heartbeat"}, {"name", "worker0"},
                    {"status", {{"task", task.at("id")}, {"done", 1}}}});
  stopping.request({{"type", "goodbye"}, {"name", "worker0"},
                    {"status", {{"task", task.at("id")}, {"done", 4}}}});
  const json orphans = staying.request({{"type", "work"}, {"name", "worker1"}}).at("task");
  EXPECT_EQ(orphans.at("batches").get<std::vector<int64_t>>(), range(4, 5));
  EXPECT_EQ(c.batches_done(), 4);
}

// A batch whose gradient a server never answered is done (not handed out again), and the
// cluster says how many were lost, in the state and the metrics; a worker registering again
// under its name (restarted) keeps what it counted before.
TEST(Coordinator, LostGradientsAreCountedApartAndKeptAcrossAWorkersRestart) {
  TwoWorkers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_training());
  Coordinator& c = cluster.c;
  CoordinatorLink& first = cluster.worker0;
  const json task = first.request({{"type", "work"}, {"name", "worker0"}}).at("task");
  first.request({{"type", "heartbeat"}, {"name", "worker0"},
                 {"status", {{"task", task.at("id")}, {"done", 5}, {"batches_done", 3},
                             {"gradients_lost", 2}}}});
  EXPECT_EQ(c.batches_done(), 5);
  EXPECT_EQ(c.gradients_lost(), 2);
  json state = c.state();
  EXPECT_EQ(state.at("cluster").at("batches_done"), 5) << state.dump();
  EXPECT_EQ(state.at("cluster").at("gradients_lost"), 2) << state.dump();
  for (const json& w : state.at("workers")) {
    if (w.at("name") == "worker0") {
      EXPECT_EQ(w.at("gradients_lost"), 2) << state.dump();
    }
  }
  EXPECT_NE(prometheus_from_state(state).find("tandem_cluster_gradients_lost_total 2"),
            std::string::npos);
  // Restarted under its name: its new status starts from zero, the two lost stay counted.
  CoordinatorLink restarted(c.endpoint(), cluster.context);
  restarted.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  restarted.request({{"type", "heartbeat"}, {"name", "worker0"},
                     {"status", {{"batches_done", 1}, {"gradients_lost", 1}}}});
  EXPECT_EQ(c.gradients_lost(), 3);
}

// ps0 registered and serving at tcp://10.0.0.1:5000, as the coordinator tests by hand have it.
void register_serving_ps0(CoordinatorLink& link) {
  link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}});
  link.request({{"type", "ready"}, {"name", "ps0"}, {"address", "tcp://10.0.0.1:5000"}});
}

// A role's state in the coordinator's state ("(none)" when it is not there). (The state is held:
// a loop over a temporary's member would dangle.)
std::string role_state(const Coordinator& c, const std::string& name) {
  const json state = c.state();
  for (const json& role : state.at("roles"))
    if (role.at("name") == name) return role.at("state").get<std::string>();
  return "(none)";
}

// A server restarted straight after a crash registers before the coordinator has counted its old
// self lost (no heartbeat for heartbeat_timeout_ms): it was refused at once, "all serving", and
// the run, short of that server, failed. It waits for that now and takes the place; while every
// server is alive, it gives up after the coordinator's wait_ms, saying why.
TEST(Coordinator, AServerRestartedBeforeItsOldSelfIsLostWaitsAndTakesItsPlace) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  o.expected_workers = 1;
  // (2 s: ps0's heartbeats, every 50 ms, must not miss it on a loaded machine while the
  // restart waits.)
  o.heartbeat_timeout_ms = 2000;
  RunSettings s;  // what the registration's reply carries (a fed run's: no store to name)
  s.fed = true;
  s.data = "";
  o.run_config = to_json(s);
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  RoleOptions ro;
  ro.coordinator = c.endpoint();
  ro.context = &context;
  auto old_server = std::make_unique<CoordinatorLink>(c.endpoint(), context);
  old_server->start_heartbeats("ps0", [] { return json::object(); }, 50);
  CoordinatorLink restarted(c.endpoint(), context);
  auto started = std::chrono::steady_clock::now();
  const std::string why =
      test::error_of<InputError>([&] { roles::register_role(restarted, ro, "ps"); });
  EXPECT_TRUE(test::contains(why, "all serving: no other can join")) << why;
  EXPECT_GE(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(4900))
      << "gave up before the coordinator's wait_ms (5 s)";
  old_server.reset();  // its heartbeats stop, as a killed server's
  started = std::chrono::steady_clock::now();
  const RoleRegistration r = roles::register_role(restarted, ro, "ps");
  EXPECT_EQ(r.name, "ps0");
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(4900))
      << "it took the place only once its wait was over, not once ps0 was counted lost";
  EXPECT_EQ(link.request({{"type", "spec"}}).at("spec").at("ps").at(0).at("address"),
            "tcp://10.0.0.1:5000");  // where the restarted server must serve again
}

// A scorer past the run's count (a second `tandem scorer` in a --scorer 1 run) scored beside
// the first, and each wrote the best parameters over the other's: it is refused now, as a
// server past --ps is; a stopped one's place is free.
TEST(Coordinator, AScorerPastTheRunsCountIsRefused) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_scorers = 1;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "scorer"}}).at("name"), "scorer0");
  const json full = link.request({{"type", "register"}, {"role", "scorer"}});
  EXPECT_TRUE(test::contains(full.value("full", ""), "1 scorer(s), all scoring")) << full.dump();
  const std::string why = test::error_of<Error>([&] {
    link.request({{"type", "register"}, {"role", "scorer"}, {"name", "scorer1"}});
  });
  EXPECT_TRUE(test::contains(why, "this run's scorers are scorer0, not 'scorer1'")) << why;
  link.request({{"type", "goodbye"}, {"name", "scorer0"}});
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "scorer"}}).at("name"), "scorer0");
}

// A run by hand whose workers all stopped on errors (a GPU backend on a machine without one)
// stayed in training, and wait(-1) never returned. With every worker stopped on an error for
// startup_timeout_ms it fails, naming their errors; a worker started again within that time goes
// on with the run, and one that left without an error (a fed worker whose feed ended) or is lost
// (it may come back) fails nothing.
TEST(Coordinator, ARunWhoseWorkersAllFailedForItsStartupTimeoutFails) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  o.expected_workers = 2;
  o.startup_timeout_ms = 1000;
  o.heartbeat_timeout_ms = 60000;  // (no heartbeats here: no role is lost by its silence)
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  link.request({{"type", "goodbye"}, {"name", "worker0"}, {"error", "no usable CUDA device"}});
  link.request({{"type", "goodbye"}, {"name", "worker1"}});  // left well
  EXPECT_EQ(c.wait_for(ClusterPhase::Failed, 2000), ClusterPhase::Training);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
  c.mark_lost("worker1", "test");  // lost: it may come back
  EXPECT_EQ(c.wait_for(ClusterPhase::Failed, 2000), ClusterPhase::Training);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker1"}});
  link.request({{"type", "goodbye"}, {"name", "worker1"}, {"error", "no usable CUDA device"}});
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  EXPECT_EQ(c.wait_for(ClusterPhase::Failed, 2000), ClusterPhase::Training);
  link.request({{"type", "goodbye"}, {"name", "worker0"}, {"error", "out of memory"}});
  const auto left = std::chrono::steady_clock::now();
  EXPECT_EQ(c.wait_for(ClusterPhase::Failed, 10000), ClusterPhase::Failed);
  EXPECT_GE(std::chrono::steady_clock::now() - left, std::chrono::milliseconds(900));
  EXPECT_EQ(c.failure(), "no worker has run for 1 s (worker0 stopped on an error: out of "
                         "memory; worker1 stopped on an error: no usable CUDA device): nothing "
                         "trains the run");
}

// The state's per-role figures say each role's state, and a server gone serves nothing: a killed
// server's last rates were shown as its own (the metrics log's per-second records, the
// dashboard) for the rest of the run.
TEST(Coordinator, AGoneServersRatesAreZeroAndItsStateSaid) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  link.request({{"type", "heartbeat"}, {"name", "ps0"},
                {"status", {{"stats", {{"pushes_per_s", 290.5}, {"pulls_per_s", 12.0}}}}}});
  json servers = c.state().at("servers");
  ASSERT_EQ(servers.size(), 1u);
  EXPECT_EQ(servers[0].at("state"), "running");
  EXPECT_EQ(servers[0].at("pushes_per_s"), 290.5);
  c.mark_lost("ps0", "killed in the test");
  servers = c.state().at("servers");
  EXPECT_EQ(servers[0].at("state"), "lost");
  EXPECT_EQ(servers[0].at("pushes_per_s"), 0.0);
  EXPECT_EQ(servers[0].at("pulls_per_s"), 0.0);
}

// A second server started under the name of one still heard from (by mistake) gets "full" and
// gives up after the wait, leaving the first as it was: it was counted lost at once and, the
// newcomer refused for its address, left stopped though serving.
TEST(Coordinator, AServerUnderTheNameOfOneStillHeardFromLeavesItAsItWas) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  const json full = link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}});
  EXPECT_TRUE(test::contains(full.value("full", ""), "ps0 is registered and still heard from"))
      << full.dump();
  EXPECT_EQ(c.state().at("servers").size(), 0u);  // (no figures yet; the roles say the state)
  EXPECT_EQ(role_state(c, "ps0"), "running");
  EXPECT_TRUE(c.servers_serving());
  c.mark_lost("ps0", "killed in the test");  // once lost, a restart takes the place
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}}).at("name"),
            "ps0");
}

// A restart that takes a lost server's place and leaves before it serves (it could not bind the
// address: the old server, only stalled, still held it) gives the place back: the old server,
// lost, comes back with its next heartbeat. It was left "stopped", never counted again, and the
// run's final read found no server.
TEST(Coordinator, ARestartThatLeavesBeforeServingGivesThePlaceBack) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  c.mark_lost("ps0", "stalled in the test");
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}, {"name", "ps0"}}).at("name"),
            "ps0");
  link.request({{"type", "goodbye"}, {"name", "ps0"},
                {"error", "cannot bind to tcp://10.0.0.1:5000: Address already in use"}});
  EXPECT_EQ(role_state(c, "ps0"), "lost");
  link.request({{"type", "heartbeat"}, {"name", "ps0"}});  // the old one, back from its stall
  EXPECT_EQ(role_state(c, "ps0"), "running");
  EXPECT_TRUE(c.servers_serving());
  EXPECT_EQ(c.ps_endpoints().at(0), "tcp://10.0.0.1:5000");
}

// Before training starts, a server that stopped (one that failed to bind its address, and said
// so) frees its place: the next unnamed server takes it. The stopped one held it, the next was
// refused as "not another" past the run's count, and the run waited out its start-up timeout.
TEST(Coordinator, AServerThatStoppedBeforeTrainingFreesItsPlace) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 2;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}}).at("name"), "ps0");
  link.request({{"type", "goodbye"}, {"name", "ps0"}, {"error", "cannot bind"}});
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}}).at("name"), "ps0");
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}}).at("name"), "ps1");
}

// A worker restarted without --name takes the name of one that stopped, the lowest first, and
// what that one counted stays counted; a running one's name is never taken (nor a lost one's:
// Coordinator.ASilentWorkerIsLostAndItsBatchesGoToAnother). Each restart once got
// a new name, and the roles (the dashboard's document, the metrics log's per-second record,
// the Prometheus series) grew for the run's life.
TEST(Coordinator, AnUnnamedWorkerTakesTheNameOfOneThatStopped) {
  TwoWorkers cluster;
  ASSERT_NO_FATAL_FAILURE(cluster.start_training());
  Coordinator& c = cluster.c;
  cluster.worker0.request({{"type", "heartbeat"}, {"name", "worker0"},
                           {"status", {{"gradients_lost", 4}}}});
  cluster.worker0.request({{"type", "goodbye"}, {"name", "worker0"}});
  for (int restart = 0; restart < 5; ++restart) {
    CoordinatorLink again(c.endpoint(), cluster.context);
    EXPECT_EQ(again.request({{"type", "register"}, {"role", "worker"}}).at("name"), "worker0");
    again.request({{"type", "heartbeat"}, {"name", "worker0"},
                   {"status", {{"gradients_lost", 1}}}});
    again.request({{"type", "goodbye"}, {"name", "worker0"}});
  }
  EXPECT_EQ(c.gradients_lost(), 4 + 5);  // each one's count, as the workers' statuses said
  // worker0 live again and worker1 live: the next takes worker2.
  CoordinatorLink live(c.endpoint(), cluster.context), third(c.endpoint(), cluster.context);
  EXPECT_EQ(live.request({{"type", "register"}, {"role", "worker"}}).at("name"), "worker0");
  EXPECT_EQ(third.request({{"type", "register"}, {"role", "worker"}}).at("name"), "worker2");
  EXPECT_EQ(c.state().at("workers").size(), 3u) << c.state().dump();
}

// Once training has started the servers are fixed: an unnamed server registering then takes the
// place of one that is gone, and must serve at its address (the workers know that one); with
// every server serving, none can join. A server refused for its address counts as gone again.
TEST(Coordinator, AServerRestartedDuringTrainingTakesTheGoneOnesPlaceAndAddress) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  o.expected_workers = 1;
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);
  register_serving_ps0(link);
  link.request({{"type", "register"}, {"role", "worker"}, {"name", "worker0"}});
  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  // (Not refused at once: register_role asks again for wait_ms, until one is counted lost.)
  const json full = link.request({{"type", "register"}, {"role", "ps"}});
  EXPECT_TRUE(test::contains(full.value("full", ""), "all serving: no other can join"))
      << full.dump();
  EXPECT_EQ(full.value("wait_ms", 0), 2 * o.heartbeat_timeout_ms + 1000);
  link.request({{"type", "goodbye"}, {"name", "ps0"}});  // stopped
  const json joined = link.request({{"type", "register"}, {"role", "ps"}});
  EXPECT_EQ(joined.at("name"), "ps0");
  // Restarting, it is still where the workers look for it.
  EXPECT_EQ(link.request({{"type", "spec"}}).at("spec").at("ps").at(0).at("address"),
            "tcp://10.0.0.1:5000");
  const std::string why = test::error_of<Error>([&] {
    link.request({{"type", "ready"}, {"name", "ps0"}, {"address", "tcp://10.0.0.1:6000"}});
  });
  EXPECT_TRUE(test::contains(why, "ps0 served at tcp://10.0.0.1:5000") &&
              test::contains(why, "--bind tcp://10.0.0.1:5000), not at tcp://10.0.0.1:6000"))
      << why;
  EXPECT_EQ(link.request({{"type", "register"}, {"role", "ps"}}).at("name"), "ps0");
  link.request({{"type", "ready"}, {"name", "ps0"}, {"address", "tcp://10.0.0.1:5000"}});
  EXPECT_EQ(link.request({{"type", "spec"}}).at("spec").at("ps").at(0).at("address"),
            "tcp://10.0.0.1:5000");
}

// A small store of separable data: 4 classes, 40 features; 2,000 training rows.
std::string write_small_store(const test::TempDir& dir) {
  const DataSplits splits = test::separable_splits(2000, 400, 1);
  StoreWriteOptions w;
  w.chunk_rows = 500;
  const std::string path = dir.file("small.zarr");
  write_dataset_store(splits, path, w, json{{"source", "cluster_test"}});
  return path;
}

ClusterOptions small_run(const test::TempDir& dir, const std::string& store) {
  ClusterOptions o;
  o.inproc = true;
  RunSettings& s = o.settings;
  s.data = store;
  s.model = ModelConfig::parse("40-16-4");
  s.batch = 100;
  s.score_interval_s = 0.1;
  s.checkpoint_dir = dir.file("checkpoints");
  s.best_model_path = dir.file("best.safetensors");
  o.model_out = dir.file("model.safetensors");
  o.test_threads = 1;
  return o;
}

TEST(ClusterRun, InprocRunTrainsEveryBatchOfEachEpochOnce) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.ps = 2;
  o.workers = 2;
  o.max_epochs = 3;
  o.keep_best = false;
  o.settings.checkpoint_every_steps = 7;
  bool announced = false;
  o.on_training = [&](const json& spec) {
    announced = true;
    EXPECT_EQ(spec.at("ps").size(), 2u);
    EXPECT_EQ(spec.at("worker").size(), 2u);
    EXPECT_EQ(spec.at("scorer").size(), 1u);
  };
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_TRUE(announced);
  EXPECT_EQ(s.stop_reason, "max-epochs");
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.batches, 3 * 20);
  EXPECT_EQ(s.steps, 3 * 20);  // async: one step per push, on every server
  EXPECT_EQ(s.kept, "last");
  EXPECT_GT(s.test.accuracy, 0.9);
  EXPECT_EQ(s.test.samples, 400);
  // The saved model is the one evaluated.
  const Checkpoint saved = load_checkpoint(o.model_out);
  const EvalResult again = evaluate_model(saved.model, load_store_eval_splits(o.settings.data).test.view(), 1);
  EXPECT_DOUBLE_EQ(again.loss_sum, s.test.loss_sum);
  EXPECT_EQ(saved.step, s.steps);
  // Every server wrote its final checkpoint, and kept the one before it: at a multiple of
  // checkpoint_every_steps (7; step 56 unless the final one replaced it before it was written).
  int shards = 0, periodic = 0;
  for (const auto& f : std::filesystem::directory_iterator(o.settings.checkpoint_dir)) {
    const std::string name = f.path().filename().string();
    shards += name.find("-step-60.") != std::string::npos;
    const size_t at = name.find("-step-");
    if (at == std::string::npos || name.find("-step-60.") != std::string::npos) continue;
    periodic += std::stoll(name.substr(at + 6)) % 7 == 0;
  }
  EXPECT_EQ(shards, 2);
  EXPECT_EQ(periodic, 2);
}

// The summary's samples are the rows trained, as the workers counted them: an epoch's short last
// batch (2,000 rows in batches of 150: 13 of 150 and one of 50) counts its own rows, not a
// batch's (launch --json's samples_per_s once took batches x batch: 4,200 rows here).
TEST(ClusterRun, TheSummaryCountsTheRowsOfAShortLastBatch) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.workers = 2;
  o.scorers = 0;
  o.keep_best = false;
  o.max_epochs = 2;
  o.settings.batch = 150;
  const ClusterSummary s = ClusterRun(o).run(nullptr);
  EXPECT_EQ(s.batches, 2 * 14);
  EXPECT_EQ(s.gradients_lost, 0);
  EXPECT_EQ(s.samples, 2 * 2000);
}

// Which batches a cluster trains, not only how many: one worker and one async server train the
// epochs' batches in the order a single process streams them, each once, and the server's Adam
// is the trainer's, so the parameters are the Trainer's bit for bit. (A batch trained twice and
// another never, or in another order, would keep the counts of
// InprocRunTrainsEveryBatchOfEachEpochOnce and change the bits.)
TEST(ClusterRun, OneWorkerTrainsTheBatchesTheTrainerDoesInItsOrder) {
  test::TempDir dir;
  const std::string store = write_small_store(dir);
  ClusterOptions o = small_run(dir, store);
  o.scorers = 0;
  o.keep_best = false;
  o.max_epochs = 2;
  ASSERT_EQ(o.ps, 1);
  ASSERT_EQ(o.workers, 1);
  ASSERT_EQ(o.settings.ps_mode, "async");
  ASSERT_EQ(o.settings.worker_threads, 1);
  const ClusterSummary s = ClusterRun(o).run(nullptr);
  ASSERT_EQ(s.steps, 2 * 20);
  TrainConfig c;
  c.model = o.settings.model;
  c.optimizer = o.settings.optimizer;
  c.backend = BackendKind::Cpu;
  c.batch = o.settings.batch;
  c.epochs = 2;
  c.seed = o.settings.seed;
  c.threads = 1;
  c.shuffle = o.settings.shuffle;
  c.keep_best = false;
  Trainer trainer(c);
  const DatasetStore data = DatasetStore::open(store);
  ChunkManagerOptions cm;
  cm.batch_rows = c.batch;
  cm.shuffle = c.shuffle;
  cm.seed = c.seed;
  cm.pin_for_device = -1;
  ChunkManager stream(data.train, data.num_classes, cm);
  trainer.fit(stream, {}, {});
  const Model alone = trainer.model(), cluster = load_checkpoint(o.model_out).model;
  ASSERT_EQ(alone.parameters().size(), cluster.parameters().size());
  for (size_t i = 0; i < alone.parameters().size(); ++i) {
    const std::vector<float>&x = alone.parameters()[i].values, &y = cluster.parameters()[i].values;
    ASSERT_EQ(x.size(), y.size());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0)
        << alone.parameters()[i].name;
  }
}

// The servers' checkpoints say how many epochs they hold whole, and a run resumed from them with
// the next epoch (ClusterOptions::first_epoch, as `launch --resume` sets it) trains the batches an
// uninterrupted run would have, in its order: with one worker and one server (async: a step per
// batch, in the worker's order) the parameters come out bit for bit the same. (A resumed epoch
// in another order, or the first epoch's batches again, would give other parameters.)
TEST(ClusterRun, ARunResumedAfterItsWholeEpochsEndsAsAnUninterruptedOne) {
  test::TempDir dir;
  const std::string store = write_small_store(dir);
  auto run_in = [&](const std::string& name, int64_t first_epoch, int64_t max_epochs) {
    ClusterOptions o = small_run(dir, store);
    o.settings.checkpoint_dir = dir.file(name + "-checkpoints");
    o.settings.best_model_path = dir.file(name + "-best.safetensors");
    o.model_out = dir.file(name + ".safetensors");
    o.scorers = 0;
    o.keep_best = false;
    o.first_epoch = first_epoch;
    o.max_epochs = max_epochs;
    return o;
  };
  ClusterOptions whole = run_in("whole", 0, 3);
  const ClusterSummary uninterrupted = ClusterRun(whole).run(nullptr);
  ASSERT_EQ(uninterrupted.epochs, 3);
  ClusterOptions first = run_in("first", 0, 2);
  const ClusterSummary s1 = ClusterRun(first).run(nullptr);
  ASSERT_EQ(s1.steps, 2 * 20);
  const std::string path = first.settings.checkpoint_dir + "/ps0-step-40.safetensors";
  EXPECT_EQ(decode_shard_checkpoint(read_safetensors(path), path, true).epochs_whole, 2);
  ClusterOptions resumed = run_in("first", 2, 3);  // the same checkpoint directory
  const ClusterSummary s2 = ClusterRun(resumed).run(nullptr);
  EXPECT_EQ(s2.epochs, 3);
  EXPECT_EQ(s2.batches, 20);  // this run's own
  EXPECT_EQ(s2.steps, 3 * 20);
  const Checkpoint a = load_checkpoint(whole.model_out), b = load_checkpoint(resumed.model_out);
  const auto pa = a.model.parameters(), pb = b.model.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float>&x = pa[i].values, &y = pb[i].values;
    ASSERT_EQ(x.size(), y.size());
    ASSERT_FALSE(x.empty());
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0) << pa[i].name;
  }
}

// A directory "holds server checkpoints" (a run not asked to resume is refused) exactly when a
// server would find one of its checkpoints there: the same reading of the file names. It once
// matched any name with "-step-" in it ending in .safetensors, refusing a fresh run for a file
// no server reads.
TEST(ResumeRule, CountsAsCheckpointsOnlyFilesAServerWouldRead) {
  EXPECT_EQ(shard_checkpoint_name("ps0-step-40.safetensors"),
            std::make_optional(std::make_pair(std::string("ps0"), int64_t{40})));
  EXPECT_EQ(shard_checkpoint_name("a-step-b-step-7.safetensors"),
            std::make_optional(std::make_pair(std::string("a-step-b"), int64_t{7})));
  for (const char* name : {"notes-step-one.safetensors", "ps0-step-.safetensors",
                           "-step-4.safetensors", "ps0-step-4.safetensors.tmp",
                           "ps0-step-1234567890123456789.safetensors", "ps0-step-4safetensors",
                           "ps0-step-+4.safetensors"})
    EXPECT_FALSE(shard_checkpoint_name(name)) << name;
  test::TempDir dir;
  test::write_bytes(dir.file("notes-step-one.safetensors"), "not a checkpoint");
  test::write_bytes(dir.file("ps1-step-4.safetensors.tmp"), "an unfinished write");
  EXPECT_FALSE(holds_server_checkpoint(dir.path().string()));
  EXPECT_TRUE(list_shard_checkpoints(dir.path().string(), "ps1").empty());
  test::write_bytes(dir.file("ps1-step-4.safetensors"), "a server's (read or not)");
  test::write_bytes(dir.file("ps1-step-12.safetensors"), "a newer one");
  EXPECT_TRUE(holds_server_checkpoint(dir.path().string()));
  const auto listed = list_shard_checkpoints(dir.path().string(), "ps1");
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0], std::make_pair(int64_t{12}, dir.file("ps1-step-12.safetensors")));
  EXPECT_EQ(listed[1].first, 4);
  EXPECT_TRUE(list_shard_checkpoints(dir.path().string(), "ps0").empty());
}

// What a resumed run says before it starts, in each of its cases (the CLI's --resume and the
// library's resume print it): nothing for servers that agree on a step and hold no epoch, the
// servers' steps when they differ, who starts empty or says no epochs, and where the epochs go
// on or that the limit leaves nothing to train.
TEST(ResumeNote, SaysEachCaseOfWhereAResumedRunGoesOn) {
  ResumePoint p;
  p.step = p.highest_step = 40;
  EXPECT_EQ(resume_note(p, 0, "--max-epochs", true), "");
  p.epochs = 2;
  EXPECT_EQ(resume_note(p, 0, "--max-epochs", true),
            "tandem: the servers' checkpoints come after 2 epochs: training goes on with epoch 3 "
            "(what was trained after them before the checkpoints, of that epoch or a later one, "
            "is trained again)\n");
  EXPECT_EQ(resume_note(p, 2, "--max-epochs", true),
            "tandem: the servers' checkpoints come after 2 epochs, and --max-epochs 2 counts the "
            "run's epochs in all: nothing to train, the servers' parameters are evaluated\n");
  p.epochs = 1;
  EXPECT_EQ(resume_note(p, 1, "max_epochs", false),
            "tandem: the servers' checkpoints come after 1 epoch, and max_epochs 1 counts the "
            "run's epochs in all: nothing to train\n");
  p.epochs = 0;
  p.highest_step = 50;
  p.steps = "ps0 at step 40, ps1 at step 50";
  p.epochs_unsaid = true;
  EXPECT_EQ(resume_note(p, 0, "max_epochs", false),
            "tandem: the parameter servers resume at different steps: ps0 at step 40, ps1 at "
            "step 50\ntandem: a server's checkpoint does not say which epochs it holds (an older "
            "version's): the epochs count from the first again\n");
  p.highest_step = 40;
  p.without_checkpoint = {"ps1", "ps2"};
  EXPECT_EQ(resume_note(p, 0, "max_epochs", false),
            "tandem: ps1, ps2 have no checkpoint and start empty (the first Init's parameters): "
            "the epochs count from the first again\n");
  p.without_checkpoint = {"ps1"};
  EXPECT_NE(resume_note(p, 0, "max_epochs", false).find("ps1 has no checkpoint and starts empty"),
            std::string::npos);
}

// A launcher that records the roles it is asked to start, taking a while for each as a process
// start does, and starts nothing: the run's own loop is what is tested (no role ever joins).
class RecordingLauncher : public RoleLauncher {
 public:
  std::string start(const std::string&, const std::string& name, const std::string&) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    started.push_back(name);
    return "nowhere (a test)";
  }
  void watch(Coordinator&) override {}
  void stop_all(int) override {}
  std::vector<std::string> started;
};

// A stop asked for while the roles are being started (Ctrl-C, through the caller's tick) ends
// the starting: `launch --workers 100000` once went on starting processes for minutes after
// Ctrl-C, the tick being first called once every role had been started.
TEST(ClusterRun, AStopWhileTheRolesStartEndsTheStarting) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.inproc = false;
  o.workers = 1000;  // 5 s of starts
  o.max_epochs = 1;
  const auto began = std::chrono::steady_clock::now();
  o.on_tick = [&](const Coordinator& c) {
    if (std::chrono::steady_clock::now() - began > std::chrono::milliseconds(300))
      const_cast<Coordinator&>(c).request_stop("interrupted");
  };
  RecordingLauncher launcher;
  ClusterRun run(o);
  const ClusterSummary s = run.run(&launcher);
  EXPECT_EQ(s.stop_reason, "interrupted");
  EXPECT_EQ(s.kept, "none");
  EXPECT_GE(launcher.started.size(), 1u);  // the server at least
  EXPECT_LT(launcher.started.size(), 500u) << "every role was started before the stop was seen";
}

// A worker whose backend stays in a call past the step timeout says so in its heartbeats, and
// the coordinator counts it lost, naming the call. A timeout of a microsecond and heartbeats
// every 5 ms make every step a stall that a heartbeat sees; the workers come back between steps
// (these calls end; a hung GPU's would not), but may spend most of the run lost, so the run is
// ended by time.
TEST(ClusterRun, AWorkerStuckInItsBackendPastTheStepTimeoutIsLost) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.settings.model = ModelConfig::parse("40-256-256-4");  // steps of about a millisecond
  o.settings.step_timeout_s = 1e-6;
  o.heartbeat_ms = 5;
  o.workers = 2;
  o.max_seconds = 1;
  o.keep_best = false;
  testing::internal::CaptureStderr();
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  const std::string said = testing::internal::GetCapturedStderr();
  EXPECT_EQ(s.stop_reason, "max-seconds");
  EXPECT_NE(said.find(" lost: its backend has not returned from "), std::string::npos) << said;
  EXPECT_NE(said.find("(step timeout 1e-06 s): a hung GPU?"), std::string::npos) << said;
}

TEST(RunSettings, TheStepTimeoutTravelsAndANegativeOneIsRefused) {
  RunSettings s;
  s.step_timeout_s = 42.5;
  EXPECT_EQ(run_settings_from_json(to_json(s)).step_timeout_s, 42.5);
  json older = to_json(s);
  older.erase("step_timeout_s");
  EXPECT_EQ(run_settings_from_json(older).step_timeout_s, 600.0);  // settings from before it
  json bad = to_json(s);
  bad["step_timeout_s"] = -1.0;
  EXPECT_THROW(run_settings_from_json(bad), InputError);
}

// Each worker's read-ahead budget travels in the settings; settings from before it take the
// chunk manager's default, and a budget of nothing or one that overflows in bytes is refused.
TEST(RunSettings, TheWorkersMemoryBudgetTravelsAndOneOutOfRangeIsRefused) {
  RunSettings s;
  s.memory_budget_mib = 12;
  EXPECT_EQ(run_settings_from_json(to_json(s)).memory_budget_mib, 12);
  json older = to_json(s);
  older.erase("memory_budget_mib");
  EXPECT_EQ(run_settings_from_json(older).memory_budget_mib, 256);
  EXPECT_EQ(int64_t(ChunkManagerOptions{}.memory_budget >> 20), 256);  // the same default
  s.memory_budget_mib = 0;
  EXPECT_THROW(check_role_settings(s), InputError);
  s.memory_budget_mib = int64_t{1} << 31;
  EXPECT_THROW(check_role_settings(s), InputError);
}

// The workers' spin for replies travels in the settings to every role's client; settings from
// before it spin not at all, and a spin past a second is refused.
TEST(RunSettings, TheClientsSpinTravelsAndOneTooLongIsRefused) {
  RunSettings s;
  s.ps_spin_us = 300;
  EXPECT_EQ(run_settings_from_json(to_json(s)).ps_spin_us, 300);
  EXPECT_EQ(cluster_client_options(s, nullptr).spin_us, 300);
  json older = to_json(s);
  older.erase("ps_spin_us");
  EXPECT_EQ(run_settings_from_json(older).ps_spin_us, 0);
  for (const int bad_spin : {-1, 1'000'001}) {
    json bad = to_json(s);
    bad["ps_spin_us"] = bad_spin;
    EXPECT_TRUE(test::contains(test::error_of<InputError>([&] { run_settings_from_json(bad); }),
                               "ps_spin_us must be in [0, 1000000]"));
  }
}

// Settings (from the public API's dict or JSON, or a coordinator) are read as their types:
// nlohmann's own conversions truncated 2.5 to 2, made 1e10 threads an undefined int, wrapped a
// seed of -1, and named no setting when a type was wrong.
TEST(RunSettings, ASettingOfTheWrongTypeOrRangeIsRefusedNamingIt) {
  const std::vector<std::pair<json, std::string>> bad = {
      {{{"batch", 2.5}}, "cluster settings: 'batch' is 2.5, expected an integer"},
      {{{"batch", 1e300}}, "cluster settings: 'batch' is 1e+300, expected an integer"},
      {{{"worker_threads", 1e10}}, "'worker_threads' is 10000000000.0, expected an integer within"},
      {{{"seed", -1}}, "cluster settings: 'seed' is -1, expected a non-negative integer"},
      {{{"lr", "x"}}, "cluster settings: 'lr' is \"x\", expected a number"},
      {{{"lr", 1e300}}, "'lr' is 1e+300, expected a number within float32's range"},
      {{{"shuffle", 1}}, "cluster settings: 'shuffle' is 1, expected true or false"},
      {{{"backend", 3}}, "cluster settings: 'backend' is 3, expected text"},
  };
  for (const auto& [overrides, expected] : bad) {
    const std::string why =
        test::error_of<InputError>([&] { run_settings_over_defaults(overrides); });
    EXPECT_TRUE(test::contains(why, expected)) << overrides.dump() << ": " << why;
  }
  json missing = to_json(RunSettings{});
  missing.erase("batch");
  const std::string why = test::error_of<InputError>([&] { run_settings_from_json(missing); });
  EXPECT_TRUE(test::contains(why, "'batch' is missing")) << why;
  // Integral floats (from a language without integers) and the largest seed still read.
  const RunSettings s = run_settings_over_defaults(
      json{{"batch", 250.0}, {"seed", std::numeric_limits<uint64_t>::max()}});
  EXPECT_EQ(s.batch, 250);
  EXPECT_EQ(s.seed, std::numeric_limits<uint64_t>::max());
}

TEST(ClusterRun, StopsAtTheTargetAndKeepsTheParametersThatMetIt) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.workers = 2;
  o.target = 40;  // summed over 400 validation rows: 0.1 per row, well inside reach
  o.max_seconds = 60;
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.stop_reason, "target");
  ASSERT_FALSE(s.scores.empty());
  EXPECT_LT(s.scores.back().loss, 40);
  // The kept parameters score at least as well as the ones that met the target (the scorer's
  // evaluation sums in another order: a relative 1e-3 of slack); when they are those very
  // parameters, they score the same.
  EXPECT_LE(s.validation.loss_sum, s.scores.back().loss * (1 + 1e-3));
  if (s.kept == "best") {
    EXPECT_EQ(s.kept_step, s.scores.back().step);
    EXPECT_NEAR(s.validation.loss_sum, s.scores.back().loss, 1e-3 * s.scores.back().loss);
    // The model file's epoch is that score's (the epochs done when it came), not the run's.
    EXPECT_EQ(load_checkpoint(o.model_out).epoch, s.scores.back().epochs);
  } else {
    EXPECT_EQ(s.kept, "last");
  }
}

// A run that diverges (SGD at a rate of 1e30: parameters past float's range) fails at the
// first gradient the servers refuse as not finite, saying what to try, and writes no model.
// (ClusterRun's own check of the final parameters, for a run whose last step took them out of
// range, is not reached here: the worker's next push fails first.)
TEST(ClusterRun, ADivergingRunFailsSayingWhatToTryAndWritesNoModel) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.max_epochs = 1;
  o.keep_best = false;
  o.settings.optimizer.kind = OptimizerKind::Sgd;
  o.settings.optimizer.learning_rate = 1e30f;
  ClusterRun run(o);
  const std::string why = test::error_of<Error>([&] { run.run(nullptr); });
  EXPECT_TRUE(test::contains(why, "holds a non-finite value") &&
              test::contains(why, "(training diverged? try a lower learning rate)"))
      << why;
  EXPECT_FALSE(std::filesystem::exists(o.model_out));
}

TEST(ClusterRun, SyncModeAggregatesTheWorkersGradients) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.workers = 2;
  o.max_epochs = 3;
  o.settings.ps_mode = "sync";
  o.settings.replicas_to_aggregate = 2;
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.batches, 60);
  // Two gradients per step (a partial step at a timeout, or a worker's epoch end, only adds
  // steps).
  EXPECT_GE(s.steps, 30);
  EXPECT_LT(s.steps, 60);
  // The workers step together: no gradient is dropped as stale (a drop counts as lost).
  EXPECT_EQ(s.gradients_lost, 0);
}

TEST(ClusterRun, OverlappedWorkersTrainEveryBatchOnce) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.workers = 2;
  o.max_epochs = 3;
  o.keep_best = false;
  o.settings.overlap = true;  // async (the library's default mode)
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.batches, 60);
  EXPECT_EQ(s.steps, 60);  // every gradient applied, the last ones too
  EXPECT_GT(s.test.accuracy, 0.9);
}

// A worker whose group has two CPU members: each step takes two batches (the epoch's 7 batches
// of 300 rows, the last one 200: steps of 2, 2, 2 and 1), the members' gradients are summed and
// pushed once. Every batch of each epoch is trained exactly once, and the coordinator counts
// batches, the servers steps.
TEST(ClusterRun, AWorkerGroupOfTwoTrainsEveryBatchOfEachEpochOnce) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.settings.batch = 300;
  o.settings.worker_group = 2;
  o.max_epochs = 3;
  o.keep_best = false;
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.stop_reason, "max-epochs");
  EXPECT_EQ(s.epochs, 3);
  EXPECT_EQ(s.batches, 3 * 7);
  EXPECT_EQ(s.steps, 3 * 4);  // async: one step per push, a push per group step
  EXPECT_GT(s.test.accuracy, 0.9);
  const json state = run.coordinator().state();
  ASSERT_EQ(state.at("workers").size(), 1u) << state.dump();
  EXPECT_EQ(state.at("workers")[0].at("batches_done").get<int64_t>(), 3 * 7) << state.dump();
  EXPECT_EQ(state.at("workers")[0].at("steps").get<int64_t>(), 3 * 4) << state.dump();
}

TEST(ClusterRun, AnOverlappedWorkerGroupAppliesEveryStep) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.settings.batch = 300;
  o.settings.worker_group = 3;  // 7 batches an epoch: steps of 3, 3 and 1
  o.settings.overlap = true;    // async (the library's default mode)
  o.max_epochs = 2;
  o.keep_best = false;
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.batches, 2 * 7);
  EXPECT_EQ(s.steps, 2 * 3);  // every group's push applied, the last one too
  EXPECT_GT(s.test.accuracy, 0.8);
}

TEST(ClusterRun, AWorkerGroupOfTwoReachesTheTarget) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.settings.worker_group = 2;
  o.target = 40;  // summed over 400 validation rows, as StopsAtTheTargetAndKeepsTheParametersThatMetIt
  o.max_seconds = 60;
  ClusterRun run(o);
  const ClusterSummary s = run.run(nullptr);
  EXPECT_EQ(s.stop_reason, "target");
  ASSERT_FALSE(s.scores.empty());
  EXPECT_LT(s.scores.back().loss, 40);
  EXPECT_LE(s.validation.loss_sum, s.scores.back().loss * (1 + 1e-3));
}

// The parameters the servers hold after one run of one epoch over a store of 200 training rows.
Model one_epoch_parameters(const test::TempDir& dir, const std::string& store, int64_t batch,
                           int group, const std::string& name, ClusterSummary& summary) {
  ClusterOptions o = small_run(dir, store);
  o.settings.batch = batch;
  o.settings.worker_group = group;
  o.settings.optimizer.kind = OptimizerKind::Sgd;
  o.settings.optimizer.learning_rate = 0.05f;
  o.settings.checkpoint_dir = dir.file(name + "-checkpoints");
  o.settings.best_model_path.clear();
  o.scorers = 0;
  o.max_epochs = 1;
  o.keep_best = false;
  o.model_out = dir.file(name + ".safetensors");
  ClusterRun run(o);
  summary = run.run(nullptr);
  return load_checkpoint(o.model_out).model;
}

std::vector<float> flat_parameters(const Model& model) {
  std::vector<float> flat;
  for (const auto& t : model.parameters()) flat.insert(flat.end(), t.values.begin(), t.values.end());
  return flat;
}

// One step of a group of two over batches A and B (100 rows each) gives the servers the update
// of one plain worker pushing the gradient of one batch of 200 rows, A and B together (the
// epoch's row order does not depend on the batch size). Not bit for bit: the group adds each
// member's sum and then the two sums, the single backend one running sum (worker_group_test:
// 3e-7 of the gradient's largest value); a batch lost or pushed twice would move the
// parameters by about half the update.
TEST(ClusterRun, AGroupStepGivesTheServersTheUpdateOfOneWorkerOverBothBatches) {
  test::TempDir dir;
  const DataSplits splits = test::separable_splits(200, 40, 11);
  StoreWriteOptions w;
  w.chunk_rows = 64;  // bands that do not line up with the batches
  const std::string store = dir.file("two-batches.zarr");
  write_dataset_store(splits, store, w, json{{"source", "cluster_test"}});

  ClusterSummary group_summary, single_summary;
  const std::vector<float> group = flat_parameters(
      one_epoch_parameters(dir, store, 100, 2, "group", group_summary));
  const std::vector<float> single = flat_parameters(
      one_epoch_parameters(dir, store, 200, 1, "single", single_summary));
  EXPECT_EQ(group_summary.batches, 2);
  EXPECT_EQ(group_summary.steps, 1);
  EXPECT_EQ(single_summary.batches, 1);
  EXPECT_EQ(single_summary.steps, 1);

  const std::vector<float> initial = flat_parameters(Model::initialized(ModelConfig::parse("40-16-4"), 1));
  ASSERT_EQ(single.size(), initial.size());
  double update = 0.0;  // the largest parameter change of the step
  for (size_t i = 0; i < initial.size(); ++i)
    update = std::max(update, double(std::fabs(single[i] - initial[i])));
  ASSERT_GT(update, 1e-3);
  EXPECT_TRUE(test::all_close(group, single, 1e-5 * update, 1e-6));
}

TEST(ClusterRun, RefusesSettingsThatCannotRun) {
  test::TempDir dir;
  const std::string store = write_small_store(dir);
  ClusterOptions o = small_run(dir, store);
  o.scorers = 0;
  o.target = 10;
  EXPECT_THROW(ClusterRun{o}, InputError);  // a target needs a scorer
  o.target = 0;
  EXPECT_THROW(ClusterRun{o}, InputError);  // nothing would stop it
  o = small_run(dir, dir.file("nothing-here"));
  EXPECT_THROW(ClusterRun{o}, InputError);
  o = small_run(dir, store);
  o.max_epochs = 1;
  o.settings.ps_mode = "sync";
  o.settings.overlap = true;  // every overlapped gradient would be stale
  EXPECT_THROW(ClusterRun{o}, InputError);
  o = small_run(dir, store);
  o.max_epochs = 1;
  o.settings.worker_group = 0;
  try {
    ClusterRun{o};
    ADD_FAILURE() << "a group of no members was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("worker_group"), std::string::npos) << e.what();
  }
  // Numbers no run can use, each refused by name before any role starts.
  const double nan = std::nan("");
  const std::vector<std::pair<std::string, std::function<void(ClusterOptions&)>>> bad = {
      {"target", [&](ClusterOptions& c) { c.target = nan; }},
      {"target", [](ClusterOptions& c) { c.target = -1; }},
      {"max_seconds", [&](ClusterOptions& c) { c.max_seconds = nan; }},
      {"learning rate", [&](ClusterOptions& c) { c.settings.optimizer.learning_rate = nan; }},
      {"learning rate", [](ClusterOptions& c) { c.settings.optimizer.learning_rate = 0; }},
      {"score_interval_s", [](ClusterOptions& c) { c.settings.score_interval_s = 1e10; }},
      {"score_interval_s", [](ClusterOptions& c) { c.settings.score_interval_s = 0; }},
      {"checkpoint_every_s", [&](ClusterOptions& c) { c.settings.checkpoint_every_s = nan; }},
      {"step_timeout_s", [](ClusterOptions& c) { c.settings.step_timeout_s = -1; }},
      {"checkpoint_every_steps", [](ClusterOptions& c) { c.settings.checkpoint_every_steps = -1; }},
      // (a bound only bounded_staleness reads: with sync or async it was silently ignored)
      {"staleness_bound", [](ClusterOptions& c) {
         c.settings.ps_mode = "sync";
         c.settings.staleness_bound = 3;
       }},
  };
  for (const auto& [name, spoil] : bad) {
    o = small_run(dir, store);
    o.max_epochs = 1;
    spoil(o);
    try {
      ClusterRun{o};
      ADD_FAILURE() << "a bad " << name << " was accepted";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  // "bounded", the servers' own alias of bounded_staleness, takes a bound too (it was refused
  // as a mode "with none").
  o = small_run(dir, store);
  o.max_epochs = 1;
  o.settings.ps_mode = "bounded";
  o.settings.staleness_bound = 2;
  EXPECT_NO_THROW(ClusterRun{o});
}

TEST(RunSettings, WorkerGroupTravelsAndOlderSettingsWithoutItParse) {
  RunSettings s;
  s.model = ModelConfig::parse("40-16-4");
  s.worker_group = 3;
  EXPECT_EQ(run_settings_from_json(to_json(s)).worker_group, 3);
  json older = to_json(s);
  older.erase("worker_group");
  EXPECT_EQ(run_settings_from_json(older).worker_group, 1);
  json bad = to_json(s);
  bad["worker_group"] = 0;
  try {
    run_settings_from_json(bad);
    ADD_FAILURE() << "worker_group 0 was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("worker_group"), std::string::npos) << e.what();
  }
}

TEST(ClusterRun, AWorkerThatCannotReadTheDataFailsTheRunWithItsReason) {
  test::TempDir dir;
  const std::string store = write_small_store(dir);
  ClusterOptions o = small_run(dir, store);
  o.max_epochs = 1;
  o.scorers = 0;
  ClusterRun run(o);
  // The store checked and opened, its training images' chunks go (damage under a running job):
  // the worker reading them fails, and the run with its reason.
  for (const auto& entry : std::filesystem::directory_iterator(store + "/images")) {
    const std::string name = entry.path().filename().string();
    if (name != "zarr.json" && name != ".zarray" && name != ".zattrs")
      std::filesystem::remove_all(entry.path());
  }
  try {
    run.run(nullptr);
    FAIL() << "expected the run to fail";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("worker0"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is missing"), std::string::npos) << e.what();
  }
}

// A model of another width than the store's rows: refused before anything starts (every worker
// once failed on its first batch, after the run had started).
TEST(ClusterRun, AModelOfAnotherWidthThanTheStoreIsRefusedBeforeTheRun) {
  test::TempDir dir;
  ClusterOptions o = small_run(dir, write_small_store(dir));
  o.settings.model = ModelConfig::parse("41-16-4");
  const std::string why = test::error_of<InputError>([&] { ClusterRun run(o); });
  EXPECT_NE(why.find("its rows have 40 features, the model 41-16-4 takes 41"), std::string::npos)
      << why;
}

}  // namespace
}  // namespace tandem
