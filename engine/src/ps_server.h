// A parameter server: one ZeroMQ ROUTER socket served by one thread, holding a shard of the
// parameters and applying Adam on it. Its mode, chosen at start (ServerOptions::mode):
//   Async             each accepted push is one optimizer step, as it arrives (the seed's default).
//   Sync              SyncReplicasOptimizer: pushes computed on the current version are summed
//                     until replicas_to_aggregate have arrived, then one step on their mean (sum /
//                     count, as TensorFlow's accumulator averages); pushes computed on an older
//                     version are dropped and counted (a PushPull still gets a Reply with the
//                     current parameters and extra "stale"). A PushPull's reply is held until the
//                     step it joined is applied, so the worker's next gradient is computed on the
//                     new version and is not stale (answering at once with pre-step parameters
//                     would make nearly every next push stale). So that a worker that leaves
//                     cannot hang the others, a step not complete step_timeout_ms after its first
//                     gradient is applied on the mean of the gradients that did arrive (a partial
//                     step, counted) and the held replies are sent. When fewer workers than
//                     replicas_to_aggregate have pushed within worker_timeout_ms (one left for
//                     good), a step needs only as many gradients as there are workers pushing;
//                     both times stretch to three of a worker's push gaps when its batches take
//                     longer (ps_worker_clocks.h), so a slow worker is not left out of every step;
//                     likewise once a step timed out before all of them had ever pushed (one
//                     never came): only the first step waits for the missing worker.
//   BoundedStaleness  async steps, but a Pull or PushPull reply to a worker whose clock (its
//                     pushes: ps_worker_clocks.h) is more than staleness_bound ahead of the
//                     slowest active worker's is deferred, queued, and sent from this thread
//                     once the slowest catches up or stops counting (silent for
//                     worker_timeout_ms). Workers count from their first push.
// In every mode a push's header parameter_version is the version the gradient was computed on
// (PsClient sends the version of its latest reply from that server); staleness = server version -
// that version goes into a histogram (ServerStats::staleness). Held and deferred replies live
// only on the serving thread; a Shutdown drops them (their clients time out, naming the server).
//
// Requests (wire_protocol.h), all answered with a Reply carrying parameter_version = global_step,
// or an Error whose extra blob says why:
//   Init      with tensors: the first sets the parameters (later ones with the same names and
//             shapes are ignored, others refused: kBadInitialTensor); reply: the
//             current parameters, with the first Init's extra (the model's name order) echoed.
//             Without tensors: the same, or Error "not initialised yet" when nobody has
//             initialised (workers retry).
//   Pull      extra empty: every parameter; else extra is a '\n'-separated list of names.
//   Push      gradients for every parameter of this server (a push must carry all of them);
//             one-way: no reply; a bad one is dropped and counted.
//   PushPull  as Push, then a Reply with every parameter after the update.
//   Stats     Reply with ServerStats as JSON in extra.
//   Shutdown  Reply, then the thread stops serving (requests after it go unanswered).
//   Idle      one-way, from a worker with no batch to train for now (the end of an epoch's
//             share, waiting for the next): until its next push it holds nobody back, neither a
//             sync step (which would otherwise wait worker_timeout_ms for its gradient) nor a
//             bounded-staleness reply. A sync step applied makes it count again: a worker still
//             idle says so again (PsClient::idle, each time the coordinator has no batch for it).
//   Checkpoint writes the shard now (see below) and replies with the file's path in extra; Error
//             "checkpoints unsupported" without a checkpoint_dir, "not initialised yet" before Init.
//   Anything else: Error "unsupported".
// Checkpoints (checkpoint_dir non-empty): the shard is written as safetensors (parameters under
// their names, Adam's moments as NAME.adam_m / NAME.adam_v as the trainer's checkpoints do,
// metadata format=tandem-ps-shard, step, mode, shard, model_order) to
// checkpoint_dir/<shard_name>-step-<step>.safetensors atomically (temporary file, fsync, rename,
// fsync of the directory) when the step crosses a multiple of checkpoint_every_steps, when
// checkpoint_every_seconds have passed since the last one, on a Checkpoint request, and when the
// server stops (Shutdown or stop()) if anything changed since the last one. The newest 2 of the
// shard at or below the step written are kept, older ones deleted. The serving thread only takes
// a snapshot (a copy of the shard); a CheckpointWriter thread writes it (ps_checkpoint_writer.h),
// so serving goes on during the write. A Checkpoint request is answered once its file (or a newer
// one, which replaced it before it started) is written, serving on meanwhile; the final
// checkpoint is written before the server's thread ends. On start, the newest checkpoint of
// shard_name that reads back completely is loaded (parameters, moments, step;
// unreadable ones are skipped and logged) and the shard counts as initialised, so the chief's
// Init gets the restored values.
// Every push is checked whole before anything changes. Malformed messages: an Error reply when
// the request id can be read (magic right, frame 0 at least 16 bytes) and the message is not a
// one-way Push; otherwise dropped and counted. Each kind of bad input is logged once to stderr.
// Security: servers bind to loopback unless told otherwise (ServerOptions::bind), since anyone who
// reaches the socket can pull the model and push gradients. With curve_secret_key set the socket
// is a ZeroMQ CURVE server: traffic is encrypted, clients must know curve_public_key(), and the
// context's ZAP handler (zmq_curve.h) admits only curve_allowed_clients (any key holder when that
// is empty). A refused client gets no reply at all (its wait() times out); refusals are counted in
// ServerStats::curve_rejected. libzmq secures no inproc:// endpoint, so CURVE with an inproc bind
// is refused (InputError) rather than left silently unencrypted.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <chrono>
#include <deque>
#include <functional>
#include <set>
#include <string>
#include <thread>

#include "ps_checkpoint_writer.h"
#include "ps_shard.h"
#include "ps_stats.h"
#include "ps_worker_clocks.h"
#include "tandem/config.h"
#include "wire_protocol.h"
#include "zmq_curve.h"
#include "zmq_messaging.h"

namespace tandem {

enum class PsMode { Async, Sync, BoundedStaleness };
const char* to_string(PsMode mode);  // "async", "sync", "bounded_staleness"

struct ServerOptions {
  PsMode mode = PsMode::Async;
  int replicas_to_aggregate = 1;  // Sync: gradients per step
  // Sync: apply a partial step this long after its first gradient (or longer: the slowest
  // worker's push gaps, ps_worker_clocks.h).
  int step_timeout_ms = 2000;
  int64_t staleness_bound = 0;  // BoundedStaleness: k
  // Sync and BoundedStaleness: a worker silent this long (or longer: ps_worker_clocks.h) stops
  // counting.
  int worker_timeout_ms = 2000;
  // The most those two times may stretch to, and a cap on them as given: below the clients'
  // request timeout (their held PushPull waits for the step), or a step or a pull held past it
  // would time its worker's request out, and the worker would push again a gradient the server
  // had taken (counted twice in a sync step). At least 1.
  int longest_wait_ms = 5000;
  std::string bind = "tcp://127.0.0.1:*";  // loopback unless told otherwise
  OptimizerConfig optimizer;
  transport::DecodeLimits limits;
  int poll_ms = 20;  // how long the thread waits for a message before looking at stop()
  // Share the context with clients to use inproc:// endpoints; null: the server owns one.
  zmq::context_t* context = nullptr;
  // Checkpoints: empty dir = none; 0 = that trigger is off.
  std::string checkpoint_dir;
  int64_t checkpoint_every_steps = 0;
  double checkpoint_every_seconds = 0;
  std::string shard_name = "ps0";  // file prefix; a restart loads only this shard's files
  // A cluster run's count of the epochs done (CoordinatorLink::epochs_whole; -1: not known),
  // read on the serving thread just before each snapshot: every checkpoint says the epochs it
  // comes after (the higher of this and the restored checkpoint's). Empty: not said (a server
  // outside a cluster run).
  std::function<int64_t()> epochs_whole;
  // -1: the shard and Adam's state in host memory; N >= 0: on CUDA device N, stepped by the
  // fused Adam kernel (InputError at start when the device cannot be used).
  int device = -1;
  // Makes that device: make_shard_device when empty. Tests give a device that fails on demand,
  // to reach what a server does when its GPU fails.
  std::function<std::unique_ptr<ShardDevice>(const OptimizerConfig&, int device)> make_device;
  // CURVE (see the note above the class): this server's secret key, Z85 (40 chars); empty: no
  // CURVE, anyone who can reach the endpoint may pull and push.
  std::string curve_secret_key;
  // With CURVE: the client public keys (Z85) admitted; empty: any client that knows this
  // server's public key (curve_public_key()). transport::read_curve_allowed_clients reads a list.
  std::vector<std::string> curve_allowed_clients;
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
  // The checkpoint this server loaded at start; empty when it started fresh.
  std::string restored_from() const { return restored_from_; }
  // The public key clients need (ClientOptions::curve_server_key), Z85; empty without CURVE.
  std::string curve_public_key() const { return curve_public_key_; }
  bool serving() const { return !stopping_.load(); }
  // Stops serving and closes the socket; idempotent.
  void stop();

 private:
  // A reply not sent yet: a PushPull held for its sync step, or a deferred bounded-staleness one.
  struct Pending {
    zmq::message_t peer;
    uint64_t request_id = 0;
    uint64_t clock = 0;  // bounded staleness: the worker's clock when it asked
    std::vector<std::string> names;  // for a Pull by name; empty: every parameter
    uint64_t ticket = 0;  // a Checkpoint request: its write (CheckpointWriter::submit)
  };

  void serve();
  void handle(transport::Frames& frames);
  // A well-formed request (handle's decoding of it): answers it, or throws ShardDeviceFailed.
  void dispatch(const zmq::message_t& peer, const transport::DecodeResult& r);
  // A push whose gradients shard_.stage_gradients accepted.
  void handle_push(const zmq::message_t& peer, const transport::Message& m);
  // Answers a Pull or PushPull now, or (bounded staleness) queues it.
  void answer_or_defer(const zmq::message_t& peer, uint64_t request_id,
                       std::vector<std::string> names);
  void reply_pending(const Pending& p);
  void finish_sync_step();  // apply the aggregate, send the held replies
  // After the shard's GPU failed: the Error text, and that Error to every held (sync) and
  // deferred (bounded staleness) request, the failure logged once.
  std::string shard_failure_text() const;
  void fail_waiting_requests();
  // Sync: gradients a step waits for: replicas_to_aggregate, or fewer when fewer workers have
  // pushed within worker_timeout_ms.
  int replicas_needed(std::chrono::steady_clock::time_point now) const;
  void on_tick();           // after every poll: step timeout, deferred replies whose time came
  void handle_malformed(const transport::Frames& frames, const transport::DecodeResult& r);
  // Counts a reject, logs its kind once (per request type), sends the Error.
  void reply_error(const zmq::message_t& peer, transport::MessageType type, uint64_t request_id,
                   const std::string& text, const std::string& kind);
  void reply_tensors(const zmq::message_t& peer, uint64_t request_id,
                     const std::vector<const PsShard::Entry*>& entries, std::string extra = {});
  void reply_extra(const zmq::message_t& peer, uint64_t request_id, std::string extra);
  void log_once(const std::string& kind, const std::string& text);
  void log_failure(const std::exception& e);  // log_once, the kind without the text's digits
  void count(int64_t ServerStats::*field);
  // Checkpoints: snapshot the shard and hand it to the writer (returns the writer's ticket), do
  // so if a trigger fired, answer the Checkpoint requests whose write has ended, load the newest
  // complete one at start, and (on the writer's thread, after a write at `step`) delete all but
  // the newest 2 at or below it.
  uint64_t submit_checkpoint();
  // What a checkpoint taken now says of the epochs it holds (ServerOptions::epochs_whole).
  int64_t epochs_whole_now() const;
  void maybe_checkpoint(bool final_one);
  void answer_checkpoint_requests();
  void restore_newest();
  void prune_checkpoints(int64_t step) const;

  ServerOptions options_;
  std::unique_ptr<zmq::context_t> own_context_;
  // Released after the socket closes and before an owned context is destroyed (member order).
  transport::ZapAuthenticator::Registration zap_;
  std::string curve_public_key_;
  transport::BoundIpcFile bound_file_;  // removed after the socket closes (member order)
  zmq::socket_t socket_;  // used by the serving thread only, once it runs
  std::string endpoint_;
  PsShard shard_;            // the serving thread's alone
  // Why an Init's parts are not those this initialised shard holds ("" when they are).
  std::string init_mismatch(const transport::Message& m) const;
  std::string model_order_;  // the first Init's extra: all parameter names, '\n'-separated
  std::set<std::string> logged_;
  int64_t checkpointed_step_ = -1;  // the step of the last checkpoint written or loaded
  int64_t restored_epochs_whole_ = -1;  // the loaded checkpoint's
  int64_t checkpointed_epochs_whole_ = -1;  // the last checkpoint's, written or loaded
  std::chrono::steady_clock::time_point checkpointed_at_ = std::chrono::steady_clock::now();
  std::string restored_from_;
  // Checkpoint files skipped at the start as not restorable, which pruning leaves alone. Written
  // before the checkpoint writer's thread starts, read-only after.
  std::set<std::string> unrestorable_;
  std::vector<Pending> held_;       // Sync: PushPull replies waiting for the step
  std::vector<Pending> checkpoint_requests_;  // waiting for their file to be written
  std::chrono::steady_clock::time_point step_deadline_;
  // Sync: some step waited out step_timeout_ms. From then on only the workers that have pushed
  // count (replicas_needed): one that never shows up (killed while starting) must not make every
  // later step wait out the timeout too.
  bool a_step_timed_out_ = false;
  std::deque<Pending> deferred_;    // BoundedStaleness: replies waiting for the slowest worker
  WorkerClocks clocks_;
  std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  mutable std::mutex stats_mutex_;
  ServerStats stats_;
  std::atomic<bool> stopping_{false};
  std::mutex stop_mutex_;
  // With checkpoint_dir: writes the snapshots; its thread uses options_ (to prune), so it is
  // destroyed first. Null without checkpoints.
  std::unique_ptr<CheckpointWriter> writer_;
  std::thread thread_;
};

}  // namespace tandem
