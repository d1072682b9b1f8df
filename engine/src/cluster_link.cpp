#include "cluster_link.h"

#include <algorithm>
#include <chrono>

#include "json_fields.h"
#include "tandem/error.h"
#include "zmq_messaging.h"
#include "zmq_through_signals.h"

namespace tandem {

using transport::TransportError;

std::string wire_text(const nlohmann::json& message) {
  return message.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

bool send_json(zmq::socket_t& socket, const nlohmann::json& message, const zmq::message_t* peer) {
  const std::string text = wire_text(message);
  // Never block: a peer that is gone must not stall the sender (its queue may be full).
  if (peer != nullptr &&
      !transport::send_through_signals(socket, zmq::buffer(peer->data(), peer->size()),
                                       zmq::send_flags::sndmore | zmq::send_flags::dontwait))
    return false;
  return transport::send_through_signals(socket, zmq::buffer(text), zmq::send_flags::dontwait)
      .has_value();
}

zmq::socket_t connect_to_coordinator(zmq::context_t& context, const std::string& endpoint,
                                     const transport::CurveClientKeys& curve,
                                     zmq::socket_type type) {
  try {
    // (Made in the try too: out of file descriptors, ZeroMQ refuses the socket itself.)
    zmq::socket_t socket(context, type);
    socket.set(zmq::sockopt::linger, 0);
    transport::set_curve_client(socket, curve);  // before connect, as the handshake starts there
    socket.connect(endpoint);
    return socket;
  } catch (const zmq::error_t& e) {
    throw TransportError("cannot connect to the coordinator at " + endpoint + ": " + e.what());
  }
}

namespace {

// The next JSON frame within timeout_ms (false on timeout). A frame that is not JSON is dropped.
bool receive_json(zmq::socket_t& socket, nlohmann::json& out, long timeout_ms) {
  zmq::pollitem_t item{socket.handle(), 0, ZMQ_POLLIN, 0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (transport::poll_through_signals(
            &item, 1, std::chrono::milliseconds(std::max<long>(0, left.count()))) == 0)
      return false;
    zmq::message_t frame;
    if (!transport::recv_through_signals(socket, frame, zmq::recv_flags::dontwait)) continue;
    out = parse_bounded_json(frame.to_string_view());
    if (!out.is_discarded() && out.is_object()) return true;  // anything else is not a message
  }
}

}  // namespace

CoordinatorLink::CoordinatorLink(std::string endpoint, zmq::context_t& context, int timeout_ms,
                                 transport::CurveClientKeys curve)
    : endpoint_(std::move(endpoint)),
      context_(context),
      timeout_ms_(timeout_ms),
      curve_(transport::resolve_curve_client(std::move(curve), "coordinator " + endpoint_)) {
  if (curve_.enabled() && endpoint_.rfind("inproc://", 0) == 0)
    throw InputError("coordinator " + endpoint_ + ": CURVE does not apply to inproc:// endpoints");
  socket_ = zmq::socket_t(context_, zmq::socket_type::dealer);
  // Watched from before the connect, to see the first handshake (with or without CURVE: a plain
  // link to a coordinator under CURVE is told why it gets no answer).
  handshakes_ = transport::CurveHandshakeWatch(context_, socket_, curve_.client.public_key);
  socket_.set(zmq::sockopt::linger, 0);
  try {
    transport::set_curve_client(socket_, curve_);
    socket_.connect(endpoint_);
  } catch (const zmq::error_t& e) {
    throw TransportError("cannot connect to the coordinator at " + endpoint_ + ": " + e.what());
  }
}

CoordinatorLink::~CoordinatorLink() {
  stopping_ = true;
  if (heartbeats_.joinable()) heartbeats_.join();
}

nlohmann::json CoordinatorLink::request(nlohmann::json message, int timeout_ms) {
  if (timeout_ms < 0) timeout_ms = timeout_ms_;
  const uint64_t seq = next_seq_++;
  message["seq"] = seq;
  const bool registering = json_string_or(message, "type", "") == "register";
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!registering && !run_.empty() && !message.contains("run")) message["run"] = run_;
  }
  if (!send_json(socket_, message, nullptr)) {
    // libzmq drops a connection whose handshake failed for good: say why, when that is it.
    const std::string& why = handshakes_.problem(transport::CurveHandshakeWatch::kEventWaitMs);
    throw TransportError("cannot queue a '" + message.value("type", std::string("?")) +
                         "' request to the coordinator at " + endpoint_ + " (not reachable" +
                         (why.empty() ? ")" : "): " + why));
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  bool shortened = false;
  for (;;) {
    // A role stopped from its own process (set_cancel) waits at most 500 ms more for any
    // answer: the coordinator may be what has gone.
    if (!shortened && cancelled()) {
      deadline = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(500));
      shortened = true;
    }
    const long left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now()).count();
    if (left <= 0) {
      const std::string& why = handshakes_.problem();
      throw TransportError("the coordinator at " + endpoint_ + " did not answer a '" +
                           message.value("type", std::string("?")) + "' request within " +
                           std::to_string(shortened ? 500 : timeout_ms) + " ms" +
                           (why.empty() ? "" : ": " + why));
    }
    nlohmann::json reply;
    // In slices, to notice a cancel while waiting.
    if (!receive_json(socket_, reply, shortened ? left : std::min<long>(left, 100))) continue;
    const auto replied_to = reply.find("seq");
    if (replied_to == reply.end() || !replied_to->is_number_unsigned() ||
        replied_to->get<uint64_t>() != seq)
      continue;  // the late answer to an older request
    {
      // An answer, like a heartbeat's: a role that took long to start (a server loading a large
      // checkpoint) before its heartbeats began has just heard from the coordinator.
      std::lock_guard<std::mutex> lock(mutex_);
      last_reply_ = std::chrono::steady_clock::now();
      // A reply that says the run failed (a spec's, a goodbye's) is news the heartbeats may not
      // have brought yet; failure is final, so it cannot be older news than theirs.
      if (json_string_or(reply, "phase", "") == "failed" && phase_ != "failed") {
        phase_ = "failed";
        failure_ = json_string_or(reply, "failure", failure_);
        phase_changed_.notify_all();
      }
    }
    if (reply.contains("error")) {
      const nlohmann::json& error = reply["error"];
      throw Error("coordinator at " + endpoint_ + ": " +
                  (error.is_string() ? error.get<std::string>() : wire_text(error)));
    }
    if (registering) {
      std::lock_guard<std::mutex> lock(mutex_);
      run_ = json_string_or(reply, "run", run_);  // (absent from older coordinators)
    }
    return reply;
  }
}

void CoordinatorLink::start_heartbeats(std::string name, std::function<nlohmann::json()> status,
                                       int interval_ms) {
  if (heartbeats_.joinable()) return;
  // Connected here, on the caller's thread: a socket ZeroMQ refuses (no file descriptor left)
  // is the role's error, not an exception on a thread of its own, which ended the process.
  zmq::socket_t socket = connect_to_coordinator(context_, endpoint_, curve_);
  heartbeats_ = std::thread(&CoordinatorLink::heartbeat_loop, this, std::move(socket),
                            std::move(name), std::move(status), interval_ms);
}

void CoordinatorLink::heartbeat_loop(zmq::socket_t socket, std::string name,
                                     std::function<nlohmann::json()> status, int interval_ms) {
  try {
    beat_until_stopped(socket, name, status, interval_ms);
  } catch (const std::exception& e) {  // (a status() that throws, a ZeroMQ error)
    std::lock_guard<std::mutex> lock(mutex_);
    heartbeat_failure_ = e.what();
    phase_changed_.notify_all();
  }
}

void CoordinatorLink::beat_until_stopped(zmq::socket_t& socket, const std::string& name,
                                         const std::function<nlohmann::json()>& status,
                                         int interval_ms) {
  uint64_t seq = 0;
  while (!stopping_) {
    nlohmann::json beat{{"type", "heartbeat"}, {"name", name}, {"seq", ++seq}};
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!run_.empty()) beat["run"] = run_;
    }
    if (status) beat["status"] = status();
    // Not sent when the coordinator's queue is full (it is gone): coordinator_lost() says so.
    send_json(socket, beat, nullptr);
    // Read replies until the next beat is due; each one refreshes the phase.
    const auto next_beat = std::chrono::steady_clock::now() + std::chrono::milliseconds(interval_ms);
    while (!stopping_) {
      const long left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            next_beat - std::chrono::steady_clock::now()).count();
      if (left <= 0) break;
      nlohmann::json reply;
      const bool answered = receive_json(socket, reply, std::min<long>(left, 50));
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancel_ && *cancel_) {
        if (phase_ != "done") {
          phase_ = "done";
          phase_changed_.notify_all();
        }
        continue;
      }
      if (!answered) continue;
      last_reply_ = std::chrono::steady_clock::now();
      if (reply.value("unknown", false)) forgotten_ = true;
      epochs_whole_ = std::max(epochs_whole_, json_integer_or(reply, "epochs_whole", -1));
      failure_ = json_string_or(reply, "failure", failure_);
      // Failed is final: a heartbeat reply sent before the failure and read after a request's
      // reply said so must not put an earlier phase back.
      const std::string phase =
          phase_ == "failed" ? phase_ : json_string_or(reply, "phase", phase_);
      if (phase != phase_) {
        phase_ = phase;
        phase_changed_.notify_all();
      }
    }
  }
}

std::string CoordinatorLink::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (cancel_ && *cancel_) return "done";
  return phase_;
}

std::string CoordinatorLink::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

int64_t CoordinatorLink::epochs_whole() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return epochs_whole_;
}

std::string CoordinatorLink::heartbeat_failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return heartbeat_failure_;
}

bool CoordinatorLink::forgotten() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return forgotten_;
}

bool CoordinatorLink::cancelled() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return cancel_ && *cancel_;
}

void CoordinatorLink::set_cancel(std::shared_ptr<const std::atomic<bool>> cancel) {
  std::lock_guard<std::mutex> lock(mutex_);
  cancel_ = std::move(cancel);
}

bool CoordinatorLink::coordinator_lost(int lost_after_ms) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::chrono::steady_clock::now() - last_reply_ > std::chrono::milliseconds(lost_after_ms);
}

void CoordinatorLink::wait_phase_change(const std::string& from, int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  phase_changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                          [&] { return phase_ != from; });
}

}  // namespace tandem
