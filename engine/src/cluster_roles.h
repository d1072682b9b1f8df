// The long-running roles of a cluster: parameter server, worker and scorer. Each registers with
// the coordinator, gets the run's settings from it (so every role of one run agrees on the model,
// the data and the batch plan), heartbeats, and returns when the coordinator says training is
// over. The same functions run a role as a process (`tandem ps|worker|scorer`) or as a thread of
// one process (inproc:// endpoints sharing one ZeroMQ context: tests, embedding).
//
// The run's settings (RunSettings, sent as JSON by the coordinator):
//   worker  pulls the parameters (the chief, worker index 0, first initialises them from the seed;
//           the others wait for that), then asks the coordinator for work: each task is a list
//           of batches of one epoch, streamed through the worker's own chunk manager from the
//           store; for each batch it computes the gradient on its backend and pushes it with a
//           push_pull that brings back the updated parameters. Progress goes out with every
//           heartbeat so a lost worker's unfinished batches can be handed out again. With a
//           group (worker_group > 1, or RoleOptions::gpus), a step takes up to one batch per
//           member, the members' gradients are summed, one push_pull sends the sum and every
//           member gets the parameters it brings back.
//   scorer  every score_interval_s pulls the parameters, evaluates the validation split (the
//           seed's summed clipped cross-entropy, and accuracy) and sends the score to the
//           coordinator, which publishes it on the scores channel and applies the stop rule. It
//           keeps the parameters of its lowest score in best_model_path, so the run ends with
//           exactly the parameters that met the target (workers step on for a moment after).
//   ps      a ParameterServer (ps_server.h) with the run's mode and optimizer, checkpointing to
//           checkpoint_dir as shard <name>; it serves until the coordinator's phase is done.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <memory>
#include <string>
#include <vector>

#include "curve_client.h"
#include "feed_queue.h"
#include "tandem/config.h"

namespace tandem {

struct RunSettings {
  std::string data;  // a dataset store (Zarr group): train streamed, validation for the scorer
  ModelConfig model;
  OptimizerConfig optimizer;
  int64_t batch = 1000;
  uint64_t seed = 1;
  bool shuffle = true;
  std::string backend = "cpu";  // for workers and the scorer: cpu, cuda or auto
  std::string precision = "fp32";
  int worker_threads = 1;
  // Members of each worker's group (worker_group.h): each computes the gradient of its own batch
  // on its own backend (worker_threads threads each on the CPU, one GPU each with CUDA), the
  // group sums them, and the leader pushes the sum with one push_pull. 1: a plain worker.
  int worker_group = 1;
  int scorer_threads = 1;
  int readers = 1;     // chunk manager threads per worker
  int assemblers = 1;
  // Each worker's chunk manager: MiB of chunks read ahead (ChunkManagerOptions::memory_budget;
  // at least two chunk rows are read whatever it says).
  int64_t memory_budget_mib = 256;
  double score_interval_s = 1.0;
  std::string ps_mode = "async";  // async, sync, bounded_staleness
  // Workers send batch k's gradient and compute batch k+1's while the answer travels (on
  // parameters one exchange older). Not with sync (those gradients would all be stale).
  bool overlap = false;
  std::string ps_device = "auto";  // parameter servers' shards: cpu, cuda (GPU 0), or auto
  int replicas_to_aggregate = 1;
  int64_t staleness_bound = 0;
  std::string checkpoint_dir;        // parameter servers' shards; empty: none
  double checkpoint_every_s = 0;     // 0: only at the end
  int64_t checkpoint_every_steps = 0;  // also when a server's step crosses a multiple (0: off)
  // The scorer writes the parameters of the lowest score so far here (safetensors, atomically):
  // the run keeps them, as `tandem train` keeps its best epoch. Empty: not written.
  std::string best_model_path;
  // ZeroMQ CURVE between the roles and the parameter servers (empty: off). Keys are files on
  // each node (zcert format, tandem keygen): only paths and the servers' PUBLIC key travel.
  std::string curve_server_public;   // the servers' public key (Z85), for every client
  std::string curve_secret_file;     // the servers' secret key file
  std::string curve_allowed_path;    // admitted client keys: a file of keys or a dir of *.key
  std::string curve_client_file;     // the clients' key file (secret); empty: a throwaway pair
  // Workers train on the blocks fed to them in their own process (RoleOptions::feed: the Python
  // package, tandem.dask.feed) rather than on work handed out by the coordinator; `data` may
  // then be empty (the scorer is given its validation rows instead). No epochs: the run stops by
  // target, time or request.
  bool fed = false;
  int ps_timeout_ms = 10000;         // a parameter server request's deadline
  int ps_spin_us = 0;                // ClientOptions::spin_us for every role's client
  int init_timeout_ms = 60000;       // how long non-chief workers wait for the chief's init
  // A worker whose backend has not returned from a call (a step, its group's step, installing
  // parameters) for this long says so in its heartbeats, and the coordinator counts it lost and
  // hands its batches to the others: a GPU hung in its own work, outside any timeout, would
  // otherwise hold them while its heartbeats go on. 0: never.
  double step_timeout_s = 600;
};

nlohmann::json to_json(const RunSettings& s);
void check_overlap(const RunSettings& s);  // InputError for overlap with sync mode
void check_worker_group(const RunSettings& s);  // InputError unless worker_group >= 1
// InputError for what a role would refuse only once started: the backend, precision, servers'
// mode and device by name, thread counts, readers, assemblers and timeouts out of range.
void check_role_settings(const RunSettings& s);
RunSettings run_settings_from_json(const nlohmann::json& j);  // InputError naming a bad field
// The defaults with `overrides`' keys (a JSON object) put over them: the settings a user gives
// by name. InputError for an unknown key, listing the known ones.
RunSettings run_settings_over_defaults(const nlohmann::json& overrides);

struct RoleOptions {
  std::string coordinator;  // the coordinator's control endpoint
  std::string name;         // empty: the coordinator names the role (ps0, worker3, ...)
  zmq::context_t* context = nullptr;  // share the coordinator's for inproc://; null: own one
  std::string bind;  // ps: where to serve; empty: tcp://127.0.0.1:* (inproc://tandem-NAME when
                     // the coordinator is inproc)
  std::string data;  // overrides the settings' data path (a node that mounts it elsewhere)
  // ps: the host peers reach this node by, for a server bound to tcp://0.0.0.0:* (empty: this
  // machine's name).
  std::string advertise;
  // worker, in a fed run: where its blocks come from (closed by the worker when it stops).
  std::shared_ptr<FeedQueue> feed;
  // Set from another thread of this process: the role ends as if the run were over (a server
  // writes its final checkpoint), without waiting for the coordinator. Null: only the
  // coordinator ends it.
  std::shared_ptr<std::atomic<bool>> cancel;
  // worker: the GPUs of this worker's group (a worker started by hand, `tandem worker --gpus
  // 0,1`): member m on gpus[m], CUDA whatever the run's backend (not with --backend cpu); the
  // group has gpus.size() members, whatever the settings' worker_group. Empty: the settings'.
  std::vector<int> gpus;
  // scorer: score on these rows rather than the store's validation split.
  std::shared_ptr<const FedBlock> validation;
  int heartbeat_ms = 500;
  int coordinator_lost_ms = 15000;  // no heartbeat reply this long: give up
  // A coordinator under CURVE (the run's --curve-secret): its public key and this role's pair
  // (empty secret: a throwaway pair, admitted only without an allowed list). The pair, when
  // given, is also the role's key with the parameter servers.
  transport::CurveClientKeys coordinator_curve;
};

// Each returns once the coordinator says training is over (workers and the scorer when the phase
// leaves training, servers when it is done). Throws tandem::Error (with the role's name) when the
// role cannot go on: bad settings or data, a server or coordinator that stopped answering.
void run_ps_role(const RoleOptions& options);
void run_worker_role(const RoleOptions& options);
void run_scorer_role(const RoleOptions& options);

// A parameter-server client's options under these settings (timeout, CURVE keys).
struct ClientOptions;
ClientOptions cluster_client_options(const RunSettings& settings, zmq::context_t* context);

}  // namespace tandem
