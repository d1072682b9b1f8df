// The coordinator: the one role every other role knows the address of. It registers the roles
// and tells them their peers (the cluster spec), hands workers their batches (WorkQueue), hosts
// the `scores` channel, applies the stop rule, and notices roles that stop answering.
//
// Sockets, served by one thread:
//   control  ROUTER; JSON requests from each role's CoordinatorLink, answered with "seq" echoed:
//     register  {role, name?, pid, host}  -> {name, index, config}: config is the run's settings
//               (data, model, batch, ...), the same for everyone. A name already registered is
//               a restart of that role: its old incarnation counts as lost.
//     ready     {name, address}           -> {}: the role serves at `address` (parameter servers)
//     spec      {}                        -> {ready, spec, waiting_for}: ready once every expected
//               parameter server is ready; spec lists each role's addresses
//     work      {name, finished?, done?}  -> {task: {id, epoch, batches}} | {wait_ms} | {stop}
//     progress  {name, task, done}        -> {}  (also carried by heartbeats)
//     heartbeat {name, status}            -> {phase, epochs_whole}: epochs_whole (not in a fed
//               run): every batch of epochs 0 .. N - 1 is done (WorkQueue::epochs_whole), so
//               that a parameter server records in its checkpoints the epochs they come after,
//               which `launch --resume` goes on from
//     score     {step, loss, accuracy, samples} -> {}: appended to the scores channel
//     goodbye   {name, status?}           -> {}: the role stopped on purpose (status: its last)
//     status    {}                        -> the state() document (dashboard, tests)
//     stop      {reason}                  -> {}: stop training now
//   scores   XPUB, topic "scores": one JSON message per score, {seq, t, step, loss, loss_mean,
//            accuracy, samples}, then {"end": true, reason} when training stops. Each new
//            subscription makes the coordinator send the newest `score_history` scores again
//            (subscribers drop a seq they have seen), so a late subscriber has the recent history
//            at once (the seed's channel keeps its last 10 values).
//
// CURVE (CoordinatorOptions::curve_secret_key): both sockets are CURVE servers under that key,
// admitting the keys of curve_allowed_clients (empty: any client that knows the public key), as a
// parameter server does; a role, `tandem scores` or a subscriber without an admitted key gets no
// answer and cannot register, ask for work, stop the run or read the scores.
//
// Phases: starting (until every expected role has registered and every parameter server is
// ready; past startup_timeout_ms the run fails, naming who is missing) -> training -> draining
// (the stop rule held: workers and the scorer are told to stop) -> done (set by finish(), after
// the driver has taken the final parameters: parameter servers are told to exit) or failed.
// A role silent for heartbeat_timeout_ms is lost; a lost worker's unfinished batches are handed
// out again. A lost parameter server is waited for (a restarted one resumes from its checkpoint).
// With every worker stopped on an error in training for startup_timeout_ms (none started again),
// the run fails, naming their errors.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster_work_queue.h"
#include "zmq_curve.h"

namespace tandem {

// The largest message the coordinator's sockets take (ZMQ_MAXMSGSIZE): a larger one ends the
// connection it came on.
constexpr int64_t kCoordinatorMaxMessageBytes = int64_t{16} << 20;

enum class ClusterPhase { Starting, Training, Draining, Done, Failed };
const char* to_string(ClusterPhase phase);  // "starting", "training", ...

struct CoordinatorOptions {
  std::string bind = "tcp://127.0.0.1:*";         // control socket
  std::string scores_bind = "tcp://127.0.0.1:*";  // the scores channel
  zmq::context_t* context = nullptr;              // share it for inproc://; null: own one
  // For sockets bound to tcp://0.0.0.0: the host the spec names (empty: this machine's name).
  std::string advertise_host;
  int expected_ps = 1;
  int expected_workers = 1;
  int expected_scorers = 1;
  nlohmann::json run_config = nlohmann::json::object();  // handed to every role
  int64_t batches_per_epoch = 1;
  // Workers train on blocks fed to them (RunSettings::fed): no work is handed out, there are no
  // epochs, and batches done are the sum of what the workers report.
  bool fed = false;
  int64_t max_epochs = 0;   // 0: no limit
  // A resumed run: the epochs its servers' checkpoints hold whole (WorkQueue's first_epoch).
  int64_t first_epoch = 0;
  double max_seconds = 0;   // 0: no limit
  double target = 0;        // stop when a score's loss is below this; 0: off
  int heartbeat_timeout_ms = 3000;
  int startup_timeout_ms = 60000;
  size_t score_history = 10;
  // CURVE for both sockets (Z85; empty: off). Not for inproc:// addresses (libzmq secures only
  // tcp:// and ipc://).
  std::string curve_secret_key;
  std::vector<std::string> curve_allowed_clients;  // empty: any client with the public key
  // false: the constructor binds but nothing is answered (ZeroMQ queues the roles' requests)
  // until start_serving(), for a caller with work to do between the two (launch clearing the
  // previous run's files once the bind has succeeded, before any role can see them).
  bool serve_at_once = true;
};

struct ScoreRecord {
  int64_t seq = 0;
  double t = 0;  // seconds since training started
  int64_t step = 0;
  double loss = 0;  // summed over the validation split, as the seed's scorer
  double loss_mean = 0;
  double accuracy = 0;
  int64_t samples = 0;
  int64_t epochs = 0;  // epochs completed when the score came (the kept-best model's epoch)
};

class Coordinator {
 public:
  // Binds both sockets (TransportError naming the address when that fails) and starts serving
  // (unless options.serve_at_once is false).
  explicit Coordinator(CoordinatorOptions options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // Starts answering, once (a no-op after, and after stop_serving): the start-up timeout counts
  // from here.
  void start_serving();
  // Stops answering and waits for the serving thread (the destructor does it too): for a process
  // that exits while this object may outlive the exit's library destructors (the Python
  // package's exit hook; the object may be in use by another thread).
  void stop_serving();

  std::string endpoint() const { return endpoint_; }
  std::string scores_endpoint() const { return scores_endpoint_; }

  ClusterPhase phase() const;
  // Blocks until the phase is at least `phase` (Failed counts as past everything) or timeout.
  ClusterPhase wait_for(ClusterPhase phase, int timeout_ms) const;
  void request_stop(const std::string& reason);  // training -> draining
  void fail(const std::string& why);  // not once done or failed
  // A role someone started and where it should come from ("pid 1234 on this machine"): named so
  // in the start-up timeout's error when it has not registered.
  void expect(const std::string& name, const std::string& from);
  // A role the driver knows is gone (its process exited): lost now rather than at the timeout.
  void mark_lost(const std::string& name, const std::string& why);
  // Waits until every worker and scorer has said goodbye or is lost (true), or timeout (false).
  bool wait_workers_gone(int timeout_ms) const;
  // Draining -> done: parameter servers are told to exit; "end" goes out on the scores channel.
  void finish();
  // Waits until every parameter server has said goodbye or is lost.
  bool wait_servers_gone(int timeout_ms) const;

  std::string stop_reason() const;
  std::string failure() const;
  // Parameter servers' addresses in index order (empty until all are ready).
  std::vector<std::string> ps_endpoints() const;
  // Every expected server serving now: registered, ready with its address, not lost or gone.
  bool servers_serving() const;
  nlohmann::json spec() const;   // {coordinator, scores, ps: [...], worker: [...], scorer: [...]}
  const std::string& run_id() const { return run_id_; }  // the spec's "run"
  // The spec when training started (every expected role in it, even those gone since); null
  // before.
  nlohmann::json training_spec() const;
  // The dashboard's document (see dashboard_server.h). Without its scores (up to 2,000 points)
  // for a caller that reads the cluster's figures ten times a second.
  nlohmann::json state(bool with_scores = true) const;
  std::vector<ScoreRecord> scores() const;
  // The scores after the first `first` (scores()[first...]): what a caller that follows the run
  // has not seen, without copying the whole log, which grows for the run's life, at every tick.
  std::vector<ScoreRecord> scores_since(size_t first) const;
  double training_seconds() const;  // from the start of training to draining (or now)
  int64_t epochs_completed() const;
  // Whether the run stops without scores: max_epochs or max_seconds set (a target needs them).
  bool stops_without_scores() const { return options_.max_epochs > 0 || options_.max_seconds > 0; }
  // Batches finished: trained, or their gradients lost (gradients_lost).
  int64_t batches_done() const;
  // Batches whose gradients were lost: a server did not answer (it died or restarted), and the
  // batch is not trained again. The workers' own counts, from their heartbeats and goodbyes
  // (a restarted worker's earlier ones kept).
  int64_t gradients_lost() const;
  // Rows of the batches whose gradients the servers applied (a short last batch counts its own
  // rows), as the workers count them (from their heartbeats and goodbyes, a restarted worker's
  // earlier ones kept).
  int64_t samples_trained() const;

 private:
  struct Role {
    std::string role, name, address, host;
    // A server's address before it registered again (restarted): once training has started the
    // workers know only that one, so the restarted server must serve there.
    std::string previous_address;
    int index = 0;
    int64_t pid = 0;
    std::string state = "registered";  // registered, running, lost, stopped
    std::string error;  // the error a role that stopped on one said in its goodbye
    std::chrono::steady_clock::time_point last_seen;
    nlohmann::json status = nlohmann::json::object();
  };

  void secure_sockets();  // CURVE on both sockets (constructor)
  void serve();
  nlohmann::json handle(const nlohmann::json& request, bool& subscribe_replay);
  nlohmann::json handle_register(const nlohmann::json& r);
  // The reply that makes a registering role wait (register_role asks again): every place of its
  // kind is held, or its name is a role's still heard from.
  nlohmann::json full_reply(const std::string& why) const;
  // The lowest index of a kind of role that no role holds, but one in a state `frees` accepts
  // (none when null).
  int lowest_free_index_locked(const std::string& kind,
                               bool (*frees)(const std::string& state)) const;
  nlohmann::json handle_work(const nlohmann::json& r);
  nlohmann::json handle_score(const nlohmann::json& r);
  // A heartbeat's or score's reply: the phase, and once failed, why (with mutex_ held).
  nlohmann::json phase_reply_locked() const;
  void on_tick();
  void lose(Role& role, const std::string& why);  // with mutex_ held
  void set_phase(ClusterPhase phase);             // with mutex_ held
  void fail_locked(const std::string& why);       // fail(), with mutex_ held
  nlohmann::json end_message_locked() const;      // the scores channel's last: {end, reason}
  void publish(const nlohmann::json& message);    // serving thread only
  bool all_ready() const;                         // with mutex_ held
  int64_t batches_done_locked() const;            // with mutex_ held
  int64_t gradients_lost_locked() const;          // with mutex_ held
  // Every worker's status `field`, summed, plus `retired` (what their earlier incarnations
  // counted); with mutex_ held.
  int64_t worker_total_locked(const char* field, int64_t retired) const;
  std::vector<std::string> live_workers() const;  // with mutex_ held
  std::vector<std::string> missing_roles() const;  // with mutex_ held
  nlohmann::json spec_locked() const;
  double since_start(std::chrono::steady_clock::time_point t) const;

  // Counts of workers that registered again under their names (restarted): their new statuses
  // start from zero.
  int64_t retired_batches_done_ = 0, retired_gradients_lost_ = 0, retired_samples_ = 0;
  CoordinatorOptions options_;
  std::unique_ptr<zmq::context_t> own_context_;
  // The CURVE admissions of both sockets; released after the sockets close, before the context.
  transport::ZapAuthenticator::Registration zap_;
  transport::BoundIpcFile control_file_, scores_file_;  // removed after the sockets close
  zmq::socket_t control_;
  zmq::socket_t scores_;
  std::string endpoint_, scores_endpoint_;
  // This run's name for its roles (register replies): random, so that what a role left on disk
  // in another run (the scorer's best model) is not taken for this run's.
  const std::string run_id_ = random_run_id();
  static std::string random_run_id();

  mutable std::mutex mutex_;
  mutable std::condition_variable changed_;
  ClusterPhase phase_ = ClusterPhase::Starting;
  std::map<std::string, Role> roles_;
  // A server taken over by a restart (it was counted lost), until the newcomer says it is ready:
  // a newcomer that leaves before that (it could not bind the address) gives the place back, and
  // the old server, lost again, comes back with its next heartbeat if it was only stalled.
  std::map<std::string, Role> replaced_;
  std::map<std::string, int> next_index_;  // per role kind
  WorkQueue work_;
  std::vector<ScoreRecord> scores_log_;
  std::vector<nlohmann::json> to_publish_;  // queued by any thread, sent by the serving thread
  int64_t replays_ = 0;                      // replays of the newest scores sent (serve())
  std::string stop_reason_, failure_;
  nlohmann::json training_spec_;
  std::map<std::string, std::string> expected_;  // role name -> where it should come from
  std::chrono::steady_clock::time_point created_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point training_started_{}, training_ended_{};
  // Whether every worker that registered stopped on an error (none live, lost or left well).
  bool all_workers_failed_locked() const;
  // Since when every worker has been stopped on an error in training (epoch: not so).
  std::chrono::steady_clock::time_point no_worker_since_{};
  std::atomic<bool> stopping_{false};
  std::mutex serving_mutex_;  // start_serving and stop_serving (not mutex_: serve() takes that)
  std::thread thread_;
};

}  // namespace tandem
