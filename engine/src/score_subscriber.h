// A subscriber to a cluster's `scores` channel (the coordinator's XPUB): the newest scores at
// once (the coordinator replays its last 10 to each new subscriber), then each new one, in order
// and without duplicates, until the "end" message. `tandem scores` and the Python package's
// tandem.scores() read the channel through it.
//
// A replay goes to every subscriber (a PUB socket cannot single one out): {"replaying": ID},
// the scores each marked "replay": ID, then {"replayed": ID}. A new subscriber can be sent live
// scores before its replay (ZeroMQ attaches it before the coordinator reads its subscription),
// or only the tail of a replay meant for another (attached in the middle of one). So until it
// has seen a replay whole, from its opening to its close, it holds live messages back and takes
// no partial replay; then it gives the replay's scores and, after them, the live ones. A seq
// already given is dropped (the replays meant for later subscribers).
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "curve_client.h"

namespace tandem {

class CoordinatorLink;

// Whether a message of next() is the run's end ({"end": true, "reason": ...}), and its reason
// (empty unless given as text).
bool is_end_message(const nlohmann::json& message);
std::string end_reason_of(const nlohmann::json& message);

class ScoreSubscriber {
 public:
  // `coordinator`: the coordinator's control address (asked for the channel's address).
  // `curve`: for a coordinator under CURVE, its public key and this subscriber's pair (both
  // sockets use them). Throws TransportError/Error when the coordinator does not answer within
  // timeout_ms (naming a refused key).
  ScoreSubscriber(const std::string& coordinator, zmq::context_t& context, int timeout_ms = 5000,
                  const transport::CurveClientKeys& curve = {});

  // The next score ({seq, t, step, loss, loss_mean, accuracy, samples}) or the end message
  // ({end: true, reason}); nothing when none came within timeout_ms. After the end message,
  // always nothing.
  std::optional<nlohmann::json> next(int timeout_ms);
  bool ended() const { return ended_; }
  const std::string& endpoint() const { return endpoint_; }

  // For a follower: from now on, next() throws Error when the coordinator has not answered for
  // lost_after_s while the channel is silent (it is asked at most once a second then). One that
  // died (killed, its node gone) never sends the end message, and a follower would wait forever.
  // InputError unless 0 < lost_after_s <= 86400 (lost_after_to_ms).
  void fail_when_coordinator_lost(double lost_after_s);

  ~ScoreSubscriber();

 private:
  std::optional<nlohmann::json> next_message(int timeout_ms);
  void check_coordinator();
  // The message to give for `m` (a score newer than any given, or the end), if any.
  std::optional<nlohmann::json> take(nlohmann::json m);

  zmq::socket_t socket_;
  std::string endpoint_;
  std::string run_;  // the run whose scores these are (the spec's run id)
  int64_t newest_ = 0;
  bool ended_ = false;
  bool replayed_ = false;                 // a whole replay has come
  int64_t open_replay_ = 0;               // the replay seen opening, before replayed_
  std::deque<nlohmann::json> held_;       // live messages that came before it
  std::chrono::steady_clock::time_point first_held_;
  // The liveness check (fail_when_coordinator_lost).
  zmq::context_t& context_;
  std::string coordinator_;
  transport::CurveClientKeys curve_;
  std::unique_ptr<CoordinatorLink> link_;
  double lost_after_s_ = 0;
  std::chrono::steady_clock::time_point heard_, asked_;
};

}  // namespace tandem
