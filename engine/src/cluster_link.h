// A role's line to the coordinator. Control traffic is rare and small, so it is JSON, one
// ZeroMQ frame per message: every request carries a "type" and a "seq" that the reply echoes
// (a reply to a request that already timed out is recognised and dropped, never taken for the
// answer to a later one).
//
// Two sockets, two threads: requests (register, work, score, goodbye) go from the role's own
// thread; heartbeats go from a thread of their own every interval, carrying the role's status and
// bringing back the cluster's phase. So a role that is busy (a long evaluation, a slow disk) is
// still seen alive, and a role whose coordinator is gone notices and stops.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "curve_client.h"

namespace tandem {

// One JSON frame, preceded by a routing id when `peer` is given (a ROUTER replying). Never
// blocks: false when the message cannot be queued now. Text that is not UTF-8 (a role's name
// from a command line) is sent with U+FFFD in its place rather than throwing; a NaN or infinite
// number travels as null (JSON has none), which json_number reads back as NaN.
bool send_json(zmq::socket_t& socket, const nlohmann::json& message, const zmq::message_t* peer);
std::string wire_text(const nlohmann::json& message);  // the frame send_json sends

// A DEALER connected to the coordinator at `endpoint` (a CURVE client with `curve` when enabled).
// TransportError naming the address when it cannot connect.
zmq::socket_t connect_to_coordinator(zmq::context_t& context, const std::string& endpoint,
                                     const transport::CurveClientKeys& curve,
                                     zmq::socket_type type = zmq::socket_type::dealer);

class CoordinatorLink {
 public:
  // Connects to the coordinator's control endpoint. `context`: share one for inproc://.
  // `curve`: the coordinator's public key and this role's pair, for a coordinator that serves
  // under CURVE (resolved here: a throwaway pair when none is given).
  CoordinatorLink(std::string endpoint, zmq::context_t& context, int timeout_ms = 10000,
                  transport::CurveClientKeys curve = {});
  ~CoordinatorLink();  // stops heartbeats
  CoordinatorLink(const CoordinatorLink&) = delete;
  CoordinatorLink& operator=(const CoordinatorLink&) = delete;

  // Sends `message` and waits for its reply. Throws TransportError naming the coordinator when
  // none comes within the timeout, tandem::Error with the coordinator's text for {"error": ...}.
  // timeout_ms < 0: the link's own.
  nlohmann::json request(nlohmann::json message, int timeout_ms = -1);

  // Heartbeats every interval_ms as {"type": "heartbeat", "name": name, "status": status()}.
  void start_heartbeats(std::string name, std::function<nlohmann::json()> status,
                        int interval_ms = 500);
  // The phase the newest heartbeat reply named ("starting", "training", "draining", "done",
  // "failed"); "" before the first. "done" once `cancel` (set_cancel) is true: a role told to
  // stop from its own process ends as if the run were over.
  std::string phase() const;
  // Why the run failed, as the coordinator's replies said once its phase was "failed"; "" before.
  std::string failure() const;
  // The highest epochs_whole a heartbeat reply named (-1 before one did): every batch of epochs
  // 0 .. N - 1 of the run was done before that reply was sent (Coordinator's heartbeat, for
  // what done means). Set before the phase the same reply names, so a role that has seen
  // "done" has the run's last count.
  int64_t epochs_whole() const;
  // A heartbeat reply said the coordinator does not know this role's name: it is not the
  // coordinator this role registered with (restarted at the address, or another run's).
  bool forgotten() const;
  // Why the heartbeat thread stopped beating ("" while it beats): the role's error then.
  std::string heartbeat_failure() const;
  void set_cancel(std::shared_ptr<const std::atomic<bool>> cancel);
  bool cancelled() const;
  // No reply (a heartbeat's or a request's) for lost_after_ms: the coordinator is gone.
  bool coordinator_lost(int lost_after_ms) const;
  // Wakes when a heartbeat reply changes the phase (or after timeout_ms).
  void wait_phase_change(const std::string& from, int timeout_ms) const;

  const std::string& endpoint() const { return endpoint_; }
  // The keys this link uses (resolved), for further sockets to the same coordinator.
  const transport::CurveClientKeys& curve() const { return curve_; }

 private:
  // The heartbeat thread: beat_until_stopped(), its error kept for heartbeat_failure().
  void heartbeat_loop(zmq::socket_t socket, std::string name,
                      std::function<nlohmann::json()> status, int interval_ms);
  void beat_until_stopped(zmq::socket_t& socket, const std::string& name,
                          const std::function<nlohmann::json()>& status, int interval_ms);

  std::string endpoint_;
  zmq::context_t& context_;
  int timeout_ms_;
  transport::CurveClientKeys curve_;
  zmq::socket_t socket_;
  transport::CurveHandshakeWatch handshakes_;  // socket_'s
  uint64_t next_seq_ = 1;

  mutable std::mutex mutex_;
  mutable std::condition_variable phase_changed_;
  std::string phase_;
  std::string failure_;
  bool forgotten_ = false;
  int64_t epochs_whole_ = -1;
  std::string heartbeat_failure_;
  // The run this link's role registered with (the register reply's "run"), sent with every later
  // request and heartbeat: a coordinator serving another run at the same address refuses them
  // rather than take this role for its own role of the same name.
  std::string run_;
  std::shared_ptr<const std::atomic<bool>> cancel_;
  std::chrono::steady_clock::time_point last_reply_ = std::chrono::steady_clock::now();
  std::atomic<bool> stopping_{false};
  std::thread heartbeats_;
};

}  // namespace tandem
