#include "score_subscriber.h"

#include <algorithm>
#include <chrono>

#include "cluster_link.h"

namespace tandem {

using json = nlohmann::json;

ScoreSubscriber::ScoreSubscriber(const std::string& coordinator, zmq::context_t& context,
                                 int timeout_ms)
    : socket_(context, zmq::socket_type::sub) {
  {
    CoordinatorLink link(coordinator, context, timeout_ms);
    endpoint_ = link.request({{"type", "spec"}}).at("spec").at("scores").get<std::string>();
  }
  socket_.set(zmq::sockopt::linger, 0);
  socket_.set(zmq::sockopt::subscribe, "scores");
  socket_.connect(endpoint_);
}

std::optional<json> ScoreSubscriber::next(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!ended_) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    zmq::poll(&item, 1, std::chrono::milliseconds(std::max<int64_t>(0, left.count())));
    if (!(item.revents & ZMQ_POLLIN)) return std::nullopt;
    zmq::message_t topic, body;
    if (!socket_.recv(topic) || !socket_.recv(body)) continue;
    json m = json::parse(body.to_string_view(), nullptr, false);
    if (m.is_discarded()) continue;
    if (m.value("end", false)) {
      ended_ = true;
      return m;
    }
    const int64_t seq = m.value("seq", int64_t{0});
    if (seq <= newest_) continue;  // replayed for another subscriber
    newest_ = seq;
    return m;
  }
  return std::nullopt;
}

}  // namespace tandem
