// A worker's connection to the parameter servers: one DEALER socket per server, requests that
// return a Handle at once (so a worker overlaps communication with compute) and replies matched
// by request id. Not thread-safe: one worker thread owns one client.
//
// Placement: the chief's init() places the tensors on the servers (place_parts: small ones whole,
// large ones split into row ranges named "NAME[BEGIN:END]" so the load is even; whole only with
// ClientOptions::split_tensors off) and sends each server its parts, as copy-free views of the
// caller's tensors, plus, in the extra blob, every parameter's full name in order ('\n'-separated)
// so other workers learn the model's order; every init() (a non-chief's has no tensors) learns
// which server holds which part from the replies' names and shapes. pull(), push() and
// push_pull() need a finished init() on this client; a push slices each gradient's rows into the
// parts (views, no copy) and a pull assembles the parts into whole tensors in the model's order.
// A push carries exactly one gradient, of the parameter's shape, for every parameter.
//
// CURVE: with ClientOptions::curve_server_key set, every DEALER is a CURVE client (traffic
// encrypted, the server authenticated by its public key, this client by its own key pair). A
// server that refuses the key never answers: wait() throws the usual timeout TransportError (or a
// later request's send times out: libzmq does not retry a refused handshake; a request that
// times out makes a new connection, which tries again), saying "CURVE authentication failed"
// when the handshake events tell so.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "curve_client.h"
#include "parameter_arena.h"
#include "ps_placement.h"
#include "ps_stats.h"
#include "send_hold.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "wire_protocol.h"
#include "zmq_messaging.h"

namespace tandem {

// A server answered with an Error, or with tensors that do not fit the model; the text names the
// server and carries its reason. kind() is the server's kind of reason (transport::ErrorReason),
// empty when the client found the problem itself: the thing to test, never the text.
class ServerError : public Error {
 public:
  explicit ServerError(const std::string& what, std::string kind = {})
      : Error(what), kind_(std::move(kind)) {}
  const std::string& kind() const { return kind_; }
  // The server has no parameters yet (before the chief's Init, or restarted with no checkpoint).
  bool not_initialised() const { return kind_ == transport::kNotInitialised; }

 private:
  std::string kind_;
};

struct ClientOptions {
  int timeout_ms = 10000;  // per request, from when it was sent until its reply is in
  zmq::context_t* context = nullptr;  // share with the servers for inproc://; null: own one
  transport::DecodeLimits limits;
  // CURVE (servers with ServerOptions::curve_secret_key): the servers' public key, Z85 (40
  // chars), one for every server; empty: no CURVE (a CURVE server will not answer).
  std::string curve_server_key;
  // Per server in endpoint order, overriding curve_server_key where not empty (servers that
  // each have their own key). Empty vector: curve_server_key for all.
  std::vector<std::string> curve_server_keys;
  // This client's key pair, Z85. Both empty while a server key is set: a fresh pair is made (for
  // servers that admit any key holder). A secret alone is enough; a public key alone is not.
  std::string curve_public_key;
  std::string curve_secret_key;
  // A chief's init(): split large tensors by rows across the servers (place_parts); false: place
  // whole tensors only (place_tensors). Other clients follow whatever the servers hold.
  bool split_tensors = true;
  // When it becomes true (set by another thread), a wait gives up within about 100 ms with a
  // TransportError, as a timeout would: a role stopping from its own process does not sit out
  // timeout_ms for a server that stopped with it. Null: only the timeout.
  std::shared_ptr<const std::atomic<bool>> cancel;
  // Before blocking for a reply, look for it without sleeping for up to this many microseconds
  // (never past the request's deadline). On a virtual machine whose idle vCPUs halt, waking a
  // blocked thread on another vCPU costs tens of microseconds each way; a short spin keeps the
  // waiting thread's vCPU awake for the reply (bench/RESULTS.md: the round trip with Adam on a
  // 2-vCPU Xeon VM). It costs a core's time while the reply is on its way. 0: block at once.
  int spin_us = 0;
};

struct PsResult {
  uint64_t version = 0;              // the minimum parameter version over the servers asked
  std::vector<NamedTensor> tensors;  // in the model's order (empty for push and stats)
  bool stale = false;  // sync mode: a server dropped this push_pull's gradient as stale
};

// A reply's parameters left where ZeroMQ received them (PsClient::Handle::wait_in_place): the
// frames are kept and runs() points into them, so nothing is copied until a backend takes the
// runs (Backend::set_parameters) or copy_into() makes whole tensors. Valid until the next
// wait_in_place into this object, and while the client lives (runs().shapes is the client's).
class ReceivedParameters {
 public:
  const ParameterRuns& runs() const { return runs_; }
  // Whole tensors in the model's order; tensors of the right name and size keep their storage.
  void copy_into(std::vector<NamedTensor>& tensors) const;

 private:
  friend class PsClient;
  std::vector<transport::Frames> frames_;  // one reply per slot; slots never move once decoded
  ParameterRuns runs_;
  const std::vector<std::string>* names_ = nullptr;
};

class PsClient {
 public:
  class Handle {
   public:
    Handle() = default;
    // Move-only: a handle dropped without waiting (or whose wait failed part-way) has its
    // client forget the replies still to come, which would otherwise be kept forever.
    Handle(Handle&& other) noexcept { *this = std::move(other); }
    Handle& operator=(Handle&& other) noexcept;
    Handle(const Handle&) = delete;
    Handle& operator=(const Handle&) = delete;
    ~Handle();
    // Blocks until every server involved has answered: the parameters (for init, pull and
    // push_pull) with the version. A one-way push has nothing to wait for: it returns at once
    // with version 0. Throws TransportError naming the endpoint that did not answer in time,
    // ServerError with a server's Error text. Call once.
    PsResult wait();
    // The same, but the parameters go into `parameters` (the model's order; tensors of the
    // right name and size keep their storage, so a worker's step allocates nothing) and the
    // result's tensors stay empty. On an error `parameters` are left as they were.
    PsResult wait_into(std::vector<NamedTensor>& parameters);
    // The same with the parameters left in the received frames (ReceivedParameters): no copy.
    // Only for init, pull and push_pull (a handle that brings parameters).
    PsResult wait_in_place(ReceivedParameters& parameters);

   private:
    friend class PsClient;
    struct Part {
      size_t server;
      uint64_t request_id;
      uint64_t generation;  // the server's connection it was sent on (Server::generation)
    };
    PsClient* client_ = nullptr;
    transport::MessageType type_ = transport::MessageType::Pull;
    std::vector<Part> parts_;
    std::chrono::steady_clock::time_point deadline_;
    bool waited_ = false;
  };

  PsClient(std::vector<std::string> server_endpoints, ClientOptions options = {});
  ~PsClient();
  PsClient(const PsClient&) = delete;
  PsClient& operator=(const PsClient&) = delete;

  Handle init(const std::vector<NamedTensor>& tensors);  // chief: the parameters; others: {}
  Handle pull();
  // These copy the gradients into the messages: the caller may change them once the call returns.
  Handle push(const std::vector<NamedTensor>& gradients);
  Handle push_pull(const std::vector<NamedTensor>& gradients);
  // Zero-copy (send_hold.h): ZeroMQ reads the gradients in place, after the call returns, so
  // they must stay alive and unchanged while hold->in_use(). A worker takes its next gradient
  // buffer from a transport::HeldPool<std::vector<NamedTensor>>, which hands out only buffers
  // no send holds any more.
  using GradientBuffer = transport::Held<std::vector<NamedTensor>>;
  Handle push(const std::shared_ptr<GradientBuffer>& gradients);
  // `computed_on`: the versions (versions(), one per server) of the parameters the gradient was
  // computed on, when those are not the latest replies' (a worker that overlaps installs the
  // next parameters before it pushes the gradient of the ones before). Null: the latest replies'.
  Handle push_pull(const std::shared_ptr<GradientBuffer>& gradients,
                   const std::vector<uint64_t>* computed_on = nullptr);
  // One-way to every server: this worker has no batch to train for now, so a sync step or a
  // bounded-staleness reply need not wait for its gradient (ps_server.h, Idle). Say it each
  // time there is no batch: a step applied makes the servers wait for it again. Never waits:
  // a message that cannot be queued at once (a server gone) is dropped, and nothing is thrown.
  void idle();
  std::vector<ServerStats> stats();  // one per server, in endpoint order (synchronous)
  void shutdown_servers();           // asks every server to stop and waits for the replies

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // After init: the parameters' names and shapes in order, and their parts (in the model's
  // order, a split tensor's by row) with the server that holds each.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<std::vector<int64_t>>& shapes() const { return shapes_; }
  const std::vector<TensorPart>& layout() const { return layout_; }
  // The version the latest answered request to server `s` carried (0 before any reply).
  uint64_t last_version(size_t s) const { return servers_.at(s)->last_version; }
  std::vector<uint64_t> versions() const;  // last_version of every server, in endpoint order
  // Requests still expected and replies kept for a later wait, over all servers: what a
  // handle waited for, or dropped, no longer holds.
  size_t requests_in_flight() const;
  // This client's CURVE public key (what a server's allowed list must hold); empty without CURVE.
  const std::string& curve_public_key() const { return options_.curve_public_key; }

 private:
  struct Server {
    std::string endpoint;
    std::string where;  // "parameter server ENDPOINT", how errors name it
    zmq::socket_t socket;
    std::set<uint64_t> outstanding;               // request ids still expected
    std::map<uint64_t, transport::Frames> early;  // replies that came while waiting for others
    // The parameter version the reply to the latest request answered so far carried: a push
    // says its gradient was computed on it (header parameter_version), for the server's
    // staleness accounting. The latest request's, not the largest ever seen: a server restarted
    // from an older checkpoint counts from there again.
    uint64_t last_version = 0;
    uint64_t last_version_request = 0;  // the request id it came with
    std::string curve_key;  // the server's public key (empty: no CURVE)
    uint64_t generation = 0;  // connections reset so far (reset_connection)
    // CURVE only: the DEALER's handshake events, so that a timeout can say "authentication
    // failed" when that is why. Declared after `socket`, so it closes first.
    transport::CurveHandshakeWatch handshakes;
  };

  // (Re)creates the server's DEALER and connects it; a socket it replaces is closed with what
  // it still queued. TransportError naming the server when it cannot connect (the server is
  // then left as it was).
  void open_socket(Server& server);
  // A new connection to the server after a request to it timed out: what the old one queued is
  // dropped, and the requests sent on it, awaited, say they were dropped.
  void reset_connection(Server& server);
  // After one of the handle's requests timed out: reset_connection for every server whose part
  // of it is still unanswered.
  void reset_unanswered(const Handle& handle) noexcept;
  // Reads the replies already waiting in the server's socket (not waiting for any), keeping
  // those of requests still expected (`early`).
  void keep_waiting_replies(Server& server) noexcept;
  // Drops what is still expected for the handle's requests: their ids, and replies that came
  // early (a late reply is then dropped when it comes).
  void forget(const Handle& handle) noexcept;
  // `hold`: send the tensors zero-copy, held by it (null: copied).
  Handle send_each(transport::MessageType type,
                   const std::vector<std::vector<transport::FloatTensorRef>>& per_server,
                   const std::vector<std::string>& extra, const std::vector<bool>& involved,
                   const std::shared_ptr<transport::SendHold>& hold = nullptr,
                   const std::vector<uint64_t>* versions = nullptr);
  std::vector<bool> all_servers() const;
  void refuse_servers_left_empty(
      const std::vector<std::vector<transport::FloatTensorRef>>& parts,
      const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes) const;
  Handle send_gradients(transport::MessageType type, const std::vector<NamedTensor>& gradients,
                        const std::shared_ptr<transport::SendHold>& hold,
                        const std::vector<uint64_t>* versions = nullptr);
  void require_init(const char* what) const;
  transport::Frames await(const Handle::Part& part,
                          std::chrono::steady_clock::time_point deadline,
                          transport::MessageType type);
  // A message from `server` looked for without sleeping, for up to options_.spin_us (not past
  // `deadline`); false when none came (or spinning is off).
  bool spin_for_reply(Server& server, transport::Frames& frames,
                      std::chrono::steady_clock::time_point deadline);
  // Waits for the handle's replies, kept in `into` with their parameters' runs (none when the
  // handle brings no parameters).
  PsResult collect(Handle& handle, ReceivedParameters& into);  // forgets the rest on failure
  PsResult collect_replies(Handle& handle, ReceivedParameters& into);
  // collect, then the parameters copied into `out` (result.tensors when null).
  PsResult collect_copy(Handle& handle, std::vector<NamedTensor>* out);
  // Validates the CURVE options, completes the client's pair; the server key per endpoint ("" =
  // no CURVE for that server).
  std::vector<std::string> curve_setup();
  // From an Init's replies: the model's order (`order`, or the names seen) and the parts each
  // server holds (name, shape). Throws ServerError when they do not make whole tensors.
  void learn_layout(const std::string& order,
                    const std::vector<std::pair<transport::TensorInfo, size_t>>& held);

  ClientOptions options_;
  std::unique_ptr<zmq::context_t> own_context_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Server>> servers_;
  uint64_t next_request_id_ = 1;
  std::vector<std::string> names_;
  std::vector<std::vector<int64_t>> shapes_;
  std::vector<TensorPart> layout_;
  std::map<std::string, size_t> index_;       // name -> position in names_
  std::map<std::string, size_t> part_index_;  // part name -> position in layout_
  ReceivedParameters scratch_;  // wait() and wait_into() receive here, then copy
};

}  // namespace tandem
