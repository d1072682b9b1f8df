// A subscriber to a cluster's `scores` channel (the coordinator's XPUB): the newest scores at
// once (the coordinator replays its last 10 to each new subscriber), then each new one, without
// duplicates, until the "end" message. `tandem scores` and the Python package's tandem.scores()
// read the channel through it.
#pragma once

#include <zmq.hpp>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace tandem {

class ScoreSubscriber {
 public:
  // `coordinator`: the coordinator's control address (asked for the channel's address) .
  // Throws TransportError/Error when the coordinator does not answer within timeout_ms.
  ScoreSubscriber(const std::string& coordinator, zmq::context_t& context, int timeout_ms = 5000);

  // The next score ({seq, t, step, loss, loss_mean, accuracy, samples}) or the end message
  // ({end: true, reason}); nothing when none came within timeout_ms. After the end message,
  // always nothing.
  std::optional<nlohmann::json> next(int timeout_ms);
  bool ended() const { return ended_; }
  const std::string& endpoint() const { return endpoint_; }

 private:
  zmq::socket_t socket_;
  std::string endpoint_;
  int64_t newest_ = 0;
  bool ended_ = false;
};

}  // namespace tandem
