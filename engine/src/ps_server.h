// A parameter server (async mode): one ZeroMQ ROUTER socket served by one thread, holding a
// shard of the parameters and applying Adam to each accepted push as it arrives.
//
// Requests (wire_protocol.h), all answered with a Reply carrying parameter_version = global_step,
// or an Error whose extra blob says why:
//   Init      with tensors: the first sets the parameters (later ones are ignored); reply: the
//             current parameters, with the first Init's extra (the model's name order) echoed.
//             Without tensors: the same, or Error "not initialised yet" when nobody has
//             initialised (workers retry).
//   Pull      extra empty: every parameter; else extra is a '\n'-separated list of names.
//   Push      gradients for every parameter of this server (a push must carry all of them);
//             one-way: no reply; a bad one is dropped and counted.
//   PushPull  as Push, then a Reply with every parameter after the update.
//   Stats     Reply with ServerStats as JSON in extra.
//   Shutdown  Reply, then the thread stops serving (requests after it go unanswered).
//   Checkpoint and anything else: Error "unsupported".
// Every push is checked whole before anything changes. Malformed messages: an Error reply when
// the request id can be read (magic right, frame 0 at least 16 bytes) and the message is not a
// one-way Push; otherwise dropped and counted. Each kind of bad input is logged once to stderr.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "ps_shard.h"
#include "ps_stats.h"
#include "tandem/config.h"
#include "wire_protocol.h"
#include "zmq_messaging.h"

namespace tandem {

struct ServerOptions {
  std::string bind = "tcp://127.0.0.1:*";  // loopback unless told otherwise
  OptimizerConfig optimizer;
  transport::DecodeLimits limits;
  int poll_ms = 20;  // how long the thread waits for a message before looking at stop()
  // Share the context with clients to use inproc:// endpoints; null: the server owns one.
  zmq::context_t* context = nullptr;
};

class ParameterServer {
 public:
  // Binds (TransportError naming the address when that fails) and starts serving.
  explicit ParameterServer(ServerOptions options);
  ~ParameterServer();  // stop()
  ParameterServer(const ParameterServer&) = delete;
  ParameterServer& operator=(const ParameterServer&) = delete;

  // The bound endpoint: for "tcp://127.0.0.1:*" the port the system picked.
  std::string endpoint() const { return endpoint_; }
  ServerStats stats() const;
  bool serving() const { return !stopping_.load(); }
  // Stops serving and closes the socket; idempotent.
  void stop();

 private:
  void serve();
  void handle(transport::Frames& frames);
  void handle_malformed(const transport::Frames& frames, const transport::DecodeResult& r);
  // Counts a reject, logs its kind once (per request type), sends the Error.
  void reply_error(const zmq::message_t& peer, transport::MessageType type, uint64_t request_id,
                   const std::string& text, const std::string& kind);
  void reply_tensors(const zmq::message_t& peer, uint64_t request_id,
                     const std::vector<const PsShard::Entry*>& entries, std::string extra = {});
  void reply_extra(const zmq::message_t& peer, uint64_t request_id, std::string extra);
  void log_once(const std::string& kind, const std::string& text);
  void count(int64_t ServerStats::*field);

  ServerOptions options_;
  std::unique_ptr<zmq::context_t> own_context_;
  zmq::socket_t socket_;  // used by the serving thread only, once it runs
  std::string endpoint_;
  PsShard shard_;            // the serving thread's alone
  std::string model_order_;  // the first Init's extra: all parameter names, '\n'-separated
  std::set<std::string> logged_;
  mutable std::mutex stats_mutex_;
  ServerStats stats_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;
  std::thread thread_;
};

}  // namespace tandem
