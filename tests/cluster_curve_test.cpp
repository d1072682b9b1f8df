// A cluster under CURVE: the coordinator's control and scores sockets admit only the run's
// client keys (as its parameter servers do), say why a refused or keyless client gets no answer,
// and a whole run of roles joining by hand (the public ClusterCoordinator and ClusterRole over
// tcp://127.0.0.1, each role with its own context, as processes would) trains under one key.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "bare_coordinator.h"
#include "cluster_link.h"
#include "coordinator.h"
#include "curve_client.h"
#include "dataset_store.h"
#include "score_subscriber.h"
#include "tandem/cluster.h"
#include "tandem/error.h"
#include "test_support.h"
#include "zmq_curve.h"

namespace tandem {
namespace {

using nlohmann::json;

using test::contains;
using test::error_of;

constexpr int kRefusedMs = 1500;  // how long a refused client waits for its answer

// A coordinator of a run with no roles, on loopback TCP under CURVE: `server`'s key, admitting
// `allowed` (empty: any key holder).
CoordinatorOptions curve_coordinator(const transport::CurveKeyPair& server,
                                     std::vector<std::string> allowed) {
  CoordinatorOptions o;
  o.expected_ps = 0;
  o.expected_workers = 0;
  o.expected_scorers = 0;
  o.batches_per_epoch = 10;
  o.curve_secret_key = server.secret_key;
  o.curve_allowed_clients = std::move(allowed);
  return o;
}

transport::CurveClientKeys keys_for(const transport::CurveKeyPair& server,
                                    const transport::CurveKeyPair& client) {
  return {server.public_key, client};
}

TEST(CoordinatorCurve, AdmittedKeysAreAnsweredOthersAreToldWhyNot) {
  const transport::CurveKeyPair server = transport::generate_curve_keypair();
  const transport::CurveKeyPair admitted = transport::generate_curve_keypair();
  const transport::CurveKeyPair stranger = transport::generate_curve_keypair();
  Coordinator c(curve_coordinator(server, {admitted.public_key}));
  zmq::context_t context(1);

  CoordinatorLink link(c.endpoint(), context, 5000, keys_for(server, admitted));
  EXPECT_TRUE(link.request({{"type", "status"}}).contains("cluster"));

  // A key not on the list: refused by ZAP, and the error says so, naming the key.
  CoordinatorLink refused(c.endpoint(), context, kRefusedMs, keys_for(server, stranger));
  std::string msg = error_of<transport::TransportError>([&] { refused.request({{"type", "stop"}}); });
  EXPECT_TRUE(contains(msg, "CURVE authentication failed") && contains(msg, stranger.public_key))
      << msg;
  // A client without any key: the handshake itself fails.
  CoordinatorLink plain(c.endpoint(), context, kRefusedMs);
  msg = error_of<transport::TransportError>([&] { plain.request({{"type", "stop"}}); });
  EXPECT_TRUE(contains(msg, "under CURVE")) << msg;
  // A client with the wrong server key: the connection closes during the handshake.
  const transport::CurveKeyPair impostor = transport::generate_curve_keypair();
  CoordinatorLink misled(c.endpoint(), context, kRefusedMs, keys_for(impostor, admitted));
  msg = error_of<transport::TransportError>([&] { misled.request({{"type", "stop"}}); });
  // Timed out, or refused to queue when libzmq has already dropped the connection.
  EXPECT_TRUE(contains(msg, "did not answer") || contains(msg, "not reachable")) << msg;

  // None of the refused "stop" requests reached the coordinator.
  EXPECT_EQ(c.phase(), ClusterPhase::Training);
  EXPECT_EQ(c.stop_reason(), "");
}

TEST(CoordinatorCurve, OnlyAnAdmittedSubscriberReadsTheScores) {
  const transport::CurveKeyPair server = transport::generate_curve_keypair();
  const transport::CurveKeyPair admitted = transport::generate_curve_keypair();
  Coordinator c(curve_coordinator(server, {admitted.public_key}));
  zmq::context_t context(1);
  CoordinatorLink link(c.endpoint(), context, 5000, keys_for(server, admitted));
  test::register_scorer(link);
  for (int i = 1; i <= 3; ++i)
    link.request(test::score_request(i, 100.0 - i, 0.5));

  // A plain SUB socket straight on the channel's address: no handshake, so no scores.
  zmq::socket_t eavesdropper(context, zmq::socket_type::sub);
  eavesdropper.set(zmq::sockopt::linger, 0);
  eavesdropper.set(zmq::sockopt::subscribe, "");
  eavesdropper.connect(c.scores_endpoint());

  ScoreSubscriber scores(c.endpoint(), context, 5000, keys_for(server, admitted));
  std::vector<int64_t> seqs;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (seqs.size() < 3 && std::chrono::steady_clock::now() < deadline)
    if (const auto m = scores.next(100)) seqs.push_back(m->at("seq").get<int64_t>());
  EXPECT_EQ(seqs, (std::vector<int64_t>{1, 2, 3}));
  link.request(test::score_request(4, 90.0, 0.6));
  std::optional<json> fourth;
  for (int i = 0; i < 50 && !fourth; ++i) fourth = scores.next(100);
  ASSERT_TRUE(fourth);
  EXPECT_EQ(fourth->at("seq").get<int64_t>(), 4);

  zmq::pollitem_t item{eavesdropper.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(300)), 0)
      << "a subscriber without a key read the scores channel";

  // A subscriber with a key the run does not admit is refused at its first request.
  const transport::CurveKeyPair stranger = transport::generate_curve_keypair();
  const std::string msg = error_of<transport::TransportError>(
      [&] { ScoreSubscriber s(c.endpoint(), context, kRefusedMs, keys_for(server, stranger)); });
  EXPECT_TRUE(contains(msg, "CURVE authentication failed")) << msg;
}

TEST(CoordinatorCurve, BadKeysAndInprocAreRefusedUpFront) {
  const transport::CurveKeyPair server = transport::generate_curve_keypair();
  CoordinatorOptions o = curve_coordinator(server, {"not a key"});
  std::string msg = error_of<transport::TransportError>([&] { Coordinator c(o); });
  EXPECT_TRUE(contains(msg, "curve_allowed_clients[0]")) << msg;
  o = curve_coordinator(server, {});
  zmq::context_t context(1);
  o.context = &context;
  o.bind = "inproc://curve-coordinator";
  msg = error_of<InputError>([&] { Coordinator c(o); });
  EXPECT_TRUE(contains(msg, "inproc://") && contains(msg, "CURVE")) << msg;
  o = curve_coordinator(server, {});
  o.curve_secret_key.clear();
  o.curve_allowed_clients = {server.public_key};
  msg = error_of<InputError>([&] { Coordinator c(o); });
  EXPECT_TRUE(contains(msg, "without curve_secret_key")) << msg;
  // A client: a secret key without the server's key.
  msg = error_of<InputError>([&] {
    CoordinatorLink link("tcp://127.0.0.1:1", context, 100, {"", server});
  });
  EXPECT_TRUE(contains(msg, "without the server's public key")) << msg;
}

// The public API: a run's settings name the key files; the coordinator and servers serve under
// the secret key, the roles join with the run's client key, and a stream of scores with it too.
TEST(ClusterCurve, RolesJoiningByHandTrainUnderOneKey) {
  test::TempDir dir;
  const DataSplits splits = test::separable_splits(1000, 200, 1);
  const std::string store = dir.file("small.zarr");
  write_cluster_store(splits, store, 500);
  // Refused again, in the library's terms (no command line here to pass --overwrite to).
  const std::string again = error_of<InputError>([&] { write_cluster_store(splits, store, 500); });
  EXPECT_TRUE(contains(again, "already exists; pass overwrite = true")) << again;
  const transport::CurveKeyPair server = transport::generate_curve_keypair();
  const transport::CurveKeyPair client = transport::generate_curve_keypair();
  transport::write_curve_key_files(dir.file("server"), server);
  transport::write_curve_key_files(dir.file("client"), client);

  ClusterCoordinatorOptions co;
  co.settings = json{{"data", store},
                     {"model", "40-16-4"},
                     {"batch", 100},
                     {"score_interval_s", 0.1},
                     {"curve_secret_file", dir.file("server.key_secret")},
                     {"curve_allowed_path", dir.file("client.key")},
                     {"curve_client_file", dir.file("client.key_secret")}}
                    .dump();
  // By time, not epochs: three epochs of this store can end before the scorer's first score.
  co.max_seconds = 3;
  co.startup_timeout_s = 30;
  ClusterCoordinator coordinator(co);
  ASSERT_EQ(coordinator.curve_public_key(), server.public_key);
  const std::string address = coordinator.address();

  ClusterRoleOptions ro;
  ro.curve = {coordinator.curve_public_key(), dir.file("client.key_secret")};
  ClusterRole ps = ClusterRole::parameter_server(address, "", ro);
  ClusterRole worker = ClusterRole::worker(address, "", ro);
  ClusterRole scorer = ClusterRole::scorer(address, "", ro);
  ClusterScoreStream stream(address, 5, ro.curve);

  // A role with a throwaway key is refused by the run's allowed list and fails, naming why.
  ClusterRoleOptions stranger;
  stranger.curve = {coordinator.curve_public_key(), ""};
  ClusterRole intruder = ClusterRole::worker(address, "intruder", stranger);

  ASSERT_TRUE(coordinator.wait(60)) << coordinator.failure();
  EXPECT_EQ(coordinator.stop_reason(), "max-seconds");
  EXPECT_TRUE(worker.join(10) && scorer.join(10));
  const Model model = coordinator.pull_model();  // a fresh client with the run's client key
  EXPECT_GT(evaluate_model(model, splits.validation.view(), 1).accuracy, 0.5);
  EXPECT_TRUE(coordinator.finish(10));
  EXPECT_TRUE(ps.join(10));
  // Asked after finish(), it says so at once instead of waiting out the servers' timeout.
  const auto asked = std::chrono::steady_clock::now();
  const std::string gone = error_of<Error>([&] { coordinator.pull_model(); });
  EXPECT_TRUE(contains(gone, "pull_model() before finish()")) << gone;
  EXPECT_LT(std::chrono::steady_clock::now() - asked, std::chrono::seconds(5));
  ClusterScore score;
  int streamed = 0;
  while (stream.next(score, 2.0)) ++streamed;
  EXPECT_GE(streamed, 1);
  EXPECT_TRUE(stream.ended());
  // Its register request waits out the link's 10 s timeout, then fails naming the refusal.
  const std::string msg = error_of<Error>([&] { intruder.join(30); });
  EXPECT_TRUE(contains(msg, "CURVE authentication failed")) << msg;
  EXPECT_FALSE(contains(coordinator.state_json(), "intruder")) << "the intruder registered";
}

}  // namespace
}  // namespace tandem
