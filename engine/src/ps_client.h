// A worker's connection to the parameter servers: one DEALER socket per server, requests that
// return a Handle at once (so a worker overlaps communication with compute) and replies matched
// by request id. Not thread-safe: one worker thread owns one client.
//
// Placement: the chief's init() places whole tensors on the servers (place_tensors: largest
// first onto the least-loaded server) and sends each server its share plus, in the extra blob,
// every parameter name in order ('\n'-separated) so other workers learn the model's order; a
// non-chief init() (no tensors) learns which server holds what from the replies. pull(), push()
// and push_pull() need a finished init() on this client; they split by that placement and
// assemble pulls in the model's order. A push carries a gradient for every parameter.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "ps_stats.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "wire_protocol.h"
#include "zmq_messaging.h"

namespace tandem {

// A server answered with an Error; the text names the server and carries its reason.
class ServerError : public Error {
 public:
  using Error::Error;
};

struct ClientOptions {
  int timeout_ms = 10000;  // per request, from when it was sent until its reply is in
  zmq::context_t* context = nullptr;  // share with the servers for inproc://; null: own one
  transport::DecodeLimits limits;
};

struct PsResult {
  uint64_t version = 0;              // the minimum parameter version over the servers asked
  std::vector<NamedTensor> tensors;  // in the model's order (empty for push and stats)
  bool stale = false;  // sync mode: a server dropped this push_pull's gradient as stale
};

class PsClient {
 public:
  class Handle {
   public:
    // Blocks until every server involved has answered: the parameters (for init, pull and
    // push_pull) with the version. A one-way push has nothing to wait for: it returns at once
    // with version 0. Throws TransportError naming the endpoint that did not answer in time,
    // ServerError with a server's Error text. Call once.
    PsResult wait();

   private:
    friend class PsClient;
    struct Part {
      size_t server;
      uint64_t request_id;
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
  Handle push(const std::vector<NamedTensor>& gradients);
  Handle push_pull(const std::vector<NamedTensor>& gradients);
  std::vector<ServerStats> stats();  // one per server, in endpoint order (synchronous)
  void shutdown_servers();           // asks every server to stop and waits for the replies

  const std::vector<std::string>& endpoints() const { return endpoints_; }
  // After init: the parameters' names in order and the server that holds each.
  const std::vector<std::string>& names() const { return names_; }
  const std::vector<int>& placement() const { return placement_; }
  // The newest version server `s` has sent this client (0 before any reply).
  uint64_t last_version(size_t s) const { return servers_.at(s)->last_version; }

 private:
  struct Server {
    std::string endpoint;
    zmq::socket_t socket;
    std::set<uint64_t> outstanding;               // request ids still expected
    std::map<uint64_t, transport::Frames> early;  // replies that came while waiting for others
    // The newest parameter version a reply from this server carried: a push says its gradient
    // was computed on it (header parameter_version), for the server's staleness accounting.
    uint64_t last_version = 0;
  };

  Handle send_each(transport::MessageType type,
                   const std::vector<std::vector<transport::FloatTensorRef>>& per_server,
                   const std::vector<std::string>& extra, const std::vector<bool>& involved);
  std::vector<bool> all_servers() const;
  Handle send_gradients(transport::MessageType type, const std::vector<NamedTensor>& gradients);
  void require_init(const char* what) const;
  transport::Frames await(size_t server, uint64_t request_id,
                          std::chrono::steady_clock::time_point deadline,
                          transport::MessageType type);
  PsResult collect(Handle& handle);

  ClientOptions options_;
  std::unique_ptr<zmq::context_t> own_context_;
  std::vector<std::string> endpoints_;
  std::vector<std::unique_ptr<Server>> servers_;
  uint64_t next_request_id_ = 1;
  std::vector<std::string> names_;
  std::vector<int> placement_;
  std::map<std::string, size_t> index_;  // name -> position in names_
};

}  // namespace tandem
