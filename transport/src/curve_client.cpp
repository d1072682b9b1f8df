#include "curve_client.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>

#include "tandem/error.h"
#include "zmq_through_signals.h"

namespace tandem::transport {

CurveClientKeys resolve_curve_client(CurveClientKeys keys, const std::string& where) {
  const std::string at = where.empty() ? std::string() : where + ": ";
  if (!keys.enabled()) {
    if (!keys.client.public_key.empty() || !keys.client.secret_key.empty())
      throw InputError(at + "a CURVE client key pair without the server's public key");
    return keys;
  }
  validate_curve_key(keys.server_public, at + "the server's CURVE public key");
  if (keys.client.secret_key.empty()) {
    if (!keys.client.public_key.empty())
      throw InputError(at + "a CURVE client public key without its secret key");
    keys.client = generate_curve_keypair();  // throwaway: admitted only where any key is
    return keys;
  }
  const std::string derived = curve_public_from_secret(keys.client.secret_key);
  if (!keys.client.public_key.empty() && keys.client.public_key != derived)
    throw InputError(at + "the CURVE client public key does not belong to its secret key");
  keys.client.public_key = derived;
  return keys;
}

CurveClientKeys curve_client_keys(const std::string& server_public,
                                  const std::string& client_key_file, const std::string& where) {
  CurveClientKeys keys;
  keys.server_public = server_public;
  if (!client_key_file.empty()) keys.client = read_curve_secret_key_file(client_key_file);
  resolve_curve_client(keys, where);  // the checks only
  return keys;
}

void set_curve_client(zmq::socket_t& socket, const CurveClientKeys& keys) {
  if (!keys.enabled()) return;
  socket.set(zmq::sockopt::curve_serverkey, keys.server_public);
  socket.set(zmq::sockopt::curve_publickey, keys.client.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.client.secret_key);
}

void set_curve_server(zmq::socket_t& socket, const std::string& secret_key,
                      const std::string& zap_domain) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, secret_key);
  socket.set(zmq::sockopt::zap_domain, zap_domain);
}

CurveHandshakeWatch::CurveHandshakeWatch(zmq::context_t& context, zmq::socket_t& socket,
                                         std::string client_public_key)
    : client_public_key_(std::move(client_public_key)) {
  static std::atomic<uint64_t> next_monitor{0};
  const std::string address = "inproc://tandem-curve-handshakes-" + std::to_string(next_monitor++);
  if (zmq_socket_monitor(socket.handle(), address.c_str(),
                         ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH |
                             ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
                             ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL) != 0)
    throw zmq::error_t();
  watched_ = socket.handle();
  try {
    monitor_ = zmq::socket_t(context, zmq::socket_type::pair);
    monitor_.set(zmq::sockopt::linger, 0);
    // No high-water mark on this side (set before connecting, it lifts the pipe's): events are
    // read only when a request times out, and a full pipe would block libzmq's I/O thread. The
    // cost is memory: a socket refused again and again between two reads queues an event (about
    // 100 bytes) per attempt (libzmq 4.3 does not retry after a refused key).
    monitor_.set(zmq::sockopt::rcvhwm, 0);
    monitor_.connect(address);
  } catch (...) {
    stop();
    throw;
  }
}

CurveHandshakeWatch::~CurveHandshakeWatch() { stop(); }

CurveHandshakeWatch::CurveHandshakeWatch(CurveHandshakeWatch&& other) noexcept
    : watched_(other.watched_), monitor_(std::move(other.monitor_)),
      client_public_key_(std::move(other.client_public_key_)),
      problem_(std::move(other.problem_)) {
  other.watched_ = nullptr;
}

CurveHandshakeWatch& CurveHandshakeWatch::operator=(CurveHandshakeWatch&& other) noexcept {
  if (this != &other) {
    stop();
    watched_ = other.watched_;
    monitor_ = std::move(other.monitor_);
    client_public_key_ = std::move(other.client_public_key_);
    problem_ = std::move(other.problem_);
    other.watched_ = nullptr;
  }
  return *this;
}

void CurveHandshakeWatch::stop() {
  // Monitoring stops first, under libzmq's monitor lock: after this no event is sent, so the
  // PAIR can close without leaving the I/O thread blocked on a send nobody will read.
  if (watched_ != nullptr) zmq_socket_monitor(watched_, nullptr, 0);
  watched_ = nullptr;
  monitor_.close();
}

const std::string& CurveHandshakeWatch::problem(int wait_ms) {
  if (!monitor_) return problem_;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
  // Events are two frames: 6 bytes (uint16 event, uint32 value), then the endpoint.
  for (;;) {
    zmq::message_t event;
    if (!recv_through_signals(monitor_, event, zmq::recv_flags::dontwait)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (!problem_.empty() || left.count() <= 0) break;
      zmq::pollitem_t item{monitor_.handle(), 0, ZMQ_POLLIN, 0};
      poll_through_signals(&item, 1, left);
      continue;
    }
    while (monitor_.get(zmq::sockopt::rcvmore)) {
      zmq::message_t rest;
      if (!recv_through_signals(monitor_, rest, zmq::recv_flags::dontwait)) break;
    }
    if (event.size() < 6) continue;
    uint16_t id = 0;
    uint32_t value = 0;
    std::memcpy(&id, event.data(), 2);
    std::memcpy(&value, static_cast<const char*>(event.data()) + 2, 4);
    if (id == ZMQ_EVENT_HANDSHAKE_SUCCEEDED)
      problem_.clear();
    else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
      problem_ = "CURVE authentication failed: the server refused this client's key " +
                 client_public_key_ + " (ZAP status " + std::to_string(value) + ")";
    else if (client_public_key_.empty() && (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL ||
                                             id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL))
      // The server closes a plain client's connection, or answers it with another mechanism,
      // depending on which greeting is read first.
      problem_ = "the ZeroMQ handshake failed (" +
                 (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL
                      ? "protocol error " + std::to_string(value)
                      : std::string("the connection closed")) +
                 "): the server may be under CURVE, and this client has no key for it";
    else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
      problem_ = "the CURVE handshake failed (ZeroMQ protocol error " + std::to_string(value) +
                 "; does the server use CURVE?)";
    else if (id == ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL)
      problem_ = "the connection closed during the CURVE handshake (the wrong server key?)";
  }
  return problem_;
}

}  // namespace tandem::transport
