#include "score_subscriber.h"

#include <algorithm>
#include <chrono>
#include <cstdio>

#include "cluster_link.h"
#include "coordinator_replies.h"
#include "json_fields.h"
#include "seconds_to_ms.h"
#include "zmq_through_signals.h"

namespace tandem {

using json = nlohmann::json;

ScoreSubscriber::ScoreSubscriber(const std::string& coordinator, zmq::context_t& context,
                                 int timeout_ms, const transport::CurveClientKeys& curve)
    : context_(context), coordinator_(coordinator) {
  CoordinatorLink link(coordinator, context, timeout_ms, curve);
  const ClusterSpec spec = read_spec_reply(link.request({{"type", "spec"}}));
  endpoint_ = spec.scores;
  run_ = spec.run;
  if (endpoint_.empty())
    throw InputError("the coordinator at " + coordinator + " names no scores channel");
  curve_ = link.curve();
  socket_ = connect_to_coordinator(context, endpoint_, curve_, zmq::socket_type::sub);
  socket_.set(zmq::sockopt::subscribe, "scores");
}

ScoreSubscriber::~ScoreSubscriber() = default;

void ScoreSubscriber::fail_when_coordinator_lost(double lost_after_s) {
  lost_after_to_ms(lost_after_s, "lost_after_s");
  link_ = std::make_unique<CoordinatorLink>(coordinator_, context_, 1000, curve_);
  lost_after_s_ = lost_after_s;
  heard_ = asked_ = std::chrono::steady_clock::now();
}

void ScoreSubscriber::check_coordinator() {
  const auto now = std::chrono::steady_clock::now();
  if (now - asked_ < std::chrono::seconds(1)) return;
  asked_ = now;
  json reply;
  try {
    reply = link_->request({{"type", "spec"}}, 1000);
    heard_ = std::chrono::steady_clock::now();
  } catch (const transport::TransportError&) {
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - heard_).count() <
        lost_after_s_)
      return;
    char seconds[32];
    std::snprintf(seconds, sizeof(seconds), "%g", lost_after_s_);
    throw Error("the coordinator at " + coordinator_ + " has not answered for " + seconds +
                " s and sent no end message: the run is gone (or its node unreachable)");
  } catch (const Error&) {
    heard_ = std::chrono::steady_clock::now();  // its own error reply: it is there
    return;
  }
  // Answered by another run: the coordinator was restarted at its address. Its scores go out on
  // another channel (or start again at 1), so this stream would wait, silent, for an end that
  // never comes.
  ClusterSpec spec;
  try {
    spec = read_spec_reply(reply);
  } catch (const Error&) {
    return;
  }
  if (spec.scores != endpoint_ || (!run_.empty() && !spec.run.empty() && spec.run != run_))
    throw Error("the coordinator at " + coordinator_ + " now serves another run (restarted): " +
                "the run these scores came from ended without its end message");
}

std::optional<json> ScoreSubscriber::next(int timeout_ms) {
  std::optional<json> m = next_message(timeout_ms);
  if (m)
    heard_ = std::chrono::steady_clock::now();
  else if (link_ && !ended_)
    check_coordinator();
  return m;
}

namespace {
// How long live messages are held back for a replay that does not come (a subscription the
// coordinator never answered): then they are given as they are.
constexpr auto kReplayWait = std::chrono::seconds(2);

// The (replay or sequence) number under `key` (0 when it is not an integer; a negative one is
// given as it is, and is never a new one).
int64_t replay_id(const json& m, const char* key) { return json_integer_or(m, key, 0); }
}  // namespace

bool is_end_message(const json& message) {
  const auto end = message.find("end");
  return end != message.end() && end->is_boolean() && end->get<bool>();
}

std::string end_reason_of(const json& message) { return json_string_or(message, "reason", ""); }

std::optional<json> ScoreSubscriber::take(json m) {
  if (is_end_message(m)) {
    ended_ = true;
    return m;
  }
  // A score's seq counts from 1; a message without a proper one is not a score.
  const int64_t seq = replay_id(m, "seq");
  if (seq <= newest_) return std::nullopt;  // given already (a replay for another subscriber)
  newest_ = seq;
  m.erase("replay");
  return m;
}

std::optional<json> ScoreSubscriber::next_message(int timeout_ms) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!ended_) {
    if (replayed_ && !held_.empty()) {
      json m = std::move(held_.front());
      held_.pop_front();
      if (auto out = take(std::move(m))) return out;
      continue;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!replayed_ && !held_.empty() && now - first_held_ >= kReplayWait) {
      replayed_ = true;
      continue;
    }
    auto wait_until = until;
    if (!replayed_ && !held_.empty()) wait_until = std::min(until, first_held_ + kReplayWait);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(wait_until - now);
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    transport::poll_through_signals(&item, 1,
                                    std::chrono::milliseconds(std::max<int64_t>(0, left.count())));
    if (!(item.revents & ZMQ_POLLIN)) {
      if (std::chrono::steady_clock::now() < until) continue;  // the hold ran out: give them
      return std::nullopt;
    }
    // [topic, body], nothing else: a message of one frame or of more is passed over whole (a
    // blocking read of a body that is not there would wait for the next message, past the
    // caller's timeout, and read that message's topic as this one's body).
    zmq::message_t topic, body;
    if (!transport::recv_through_signals(socket_, topic, zmq::recv_flags::none) || !topic.more())
      continue;
    if (!transport::recv_through_signals(socket_, body, zmq::recv_flags::dontwait)) continue;
    if (body.more()) {
      zmq::message_t rest;
      do {
        if (!transport::recv_through_signals(socket_, rest, zmq::recv_flags::dontwait)) break;
      } while (rest.more());
      continue;
    }
    json m = parse_bounded_json(body.to_string_view());
    if (m.is_discarded() || !m.is_object()) continue;
    if (m.contains("replaying")) {
      if (!replayed_) open_replay_ = replay_id(m, "replaying");
      continue;
    }
    if (m.contains("replayed")) {
      if (!replayed_ && open_replay_ != 0 && replay_id(m, "replayed") == open_replay_)
        replayed_ = true;
      continue;
    }
    if (!replayed_) {
      if (m.contains("replay")) {
        // A score of the replay seen opening is given; one of a replay joined in its middle is
        // not (its earlier scores were missed: the subscriber's own replay brings them all).
        if (open_replay_ == 0 || replay_id(m, "replay") != open_replay_) continue;
      } else {  // live (or the end), before a whole replay
        if (held_.empty()) first_held_ = std::chrono::steady_clock::now();
        held_.push_back(std::move(m));
        continue;
      }
    }
    if (auto out = take(std::move(m))) return out;
  }
  return std::nullopt;
}

}  // namespace tandem
