// One training run of a cluster, driven from the coordinator's side: start the coordinator, have
// the roles started (as threads of this process, or by a RoleLauncher: processes), wait for the
// stop rule, then take the final parameters from the servers, save them, evaluate the
// validation and test splits, tell the servers to exit, and make sure nothing is left running.
#pragma once

#include <zmq.hpp>

#include <atomic>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster_roles.h"
#include "coordinator.h"
#include "dataset_store.h"
#include "tandem/trainer.h"

namespace tandem {

// Starts and watches the role processes (tools/ implements it; the engine knows no command line).
class RoleLauncher {
 public:
  virtual ~RoleLauncher() = default;
  // Starts role `kind` ("ps", "worker", "scorer") named `name`, told to join `coordinator`.
  // Returns where the role should come from, for error messages ("pid 1234 on this machine").
  virtual std::string start(const std::string& kind, const std::string& name,
                            const std::string& coordinator) = 0;
  // Called about every 100 ms while the run lasts: report exited roles to the coordinator
  // (mark_lost), restart what should be restarted.
  virtual void watch(Coordinator& coordinator) = 0;
  // Waits up to timeout_ms for every role to exit, then kills what is left.
  virtual void stop_all(int timeout_ms) = 0;
};

struct ClusterOptions {
  RunSettings settings;
  int ps = 1;
  int workers = 1;
  int scorers = 1;
  double target = 0;        // stop when the validation loss sum is below it; 0: off
  int64_t max_epochs = 0;   // 0: no limit (a resumed run's limit counts first_epoch's too)
  // A resumed run: the epochs its servers' checkpoints hold whole (their epochs_whole, read by
  // `tandem launch --resume`); training goes on with the next.
  int64_t first_epoch = 0;
  // A resumed run keeps the best-score model of the run it continues (a fresh run removes it):
  // one resumed with nothing left to train removed it, and saved the servers' last parameters
  // over the model that was kept, however much worse.
  bool resumed = false;
  double max_seconds = 0;   // 0: no limit
  std::string bind = "tcp://127.0.0.1:*";  // the coordinator's control socket
  std::string scores_bind = "tcp://127.0.0.1:*";
  std::string advertise_host;  // for addresses bound to tcp://0.0.0.0 (empty: this machine's name)
  bool inproc = false;      // every role a thread of this process, inproc:// endpoints
  // Worker i's GPUs (RoleOptions::gpus) for the workers started as threads (inproc); empty: none
  // given. `tandem launch` fills it (worker_gpus.h) and passes the same to its processes.
  std::vector<std::vector<int>> worker_gpus;
  std::string model_out;    // the kept parameters (safetensors); empty: not saved
  // Keep the parameters of the lowest score (the scorer's settings.best_model_path) rather than
  // the servers' last ones: workers step on for a moment after the score that met the target,
  // and at the seed's learning rate the validation loss jumps by +-10% from second to second.
  bool keep_best = true;
  int startup_timeout_ms = 60000;
  int heartbeat_timeout_ms = 3000;
  int heartbeat_ms = 500;   // how often the in-process roles send one
  int test_threads = 0;     // final evaluation threads (0: all cores)
  // The coordinator binds in ClusterRun's constructor but answers only from run()
  // (CoordinatorOptions::serve_at_once false): launch clears the previous run's files in
  // between, once the bind has succeeded and before any role can see them (the previous
  // best_model_path file goes in run() then, not in the constructor).
  bool serve_from_run = false;
  std::function<void(const nlohmann::json& spec)> on_training;  // the cluster is complete
  std::function<void(const Coordinator&)> on_tick;              // about every 100 ms
};

// The run's CURVE settings checked and completed (InputError naming what is wrong): the servers'
// public key from their secret key file (a given one must belong to it), an allowed list only
// with the clients' key file (or no client would be admitted), no CURVE key without the secret.
void complete_curve_settings(RunSettings& settings);
// The coordinator serves under the parameter servers' key pair and allowed list: with CURVE
// on, one key secures the whole run. Nothing without CURVE.
void secure_coordinator(CoordinatorOptions& options, const RunSettings& settings);

// InputError naming the bad value unless a run of `ps` servers, `workers` workers and `scorers`
// (0 or 1) scorers with these settings and stop rule can start: checked before anything starts,
// by ClusterRun, the public ClusterCoordinator and Python's Coordinator alike. `driven`: a
// coordinator whose driver can stop it (request_stop), which may then have no stop rule.
void check_run_shape(const RunSettings& s, int ps, int workers, int scorers, double target,
                     int64_t max_epochs, double max_seconds, bool driven);

// The parameters a running cluster's servers hold now, read by a fresh client under these
// settings: the public ClusterCoordinator's and Python's pull_model. Throws Error once the run is
// done (its servers are leaving or gone: asking them would wait out a request timeout) or when no
// server is serving. `cancel` set (by another thread) ends the wait within about 100 ms.
Model pull_cluster_model(const Coordinator& coordinator, const RunSettings& settings,
                         std::shared_ptr<const std::atomic<bool>> cancel = nullptr);

struct ClusterSummary {
  std::string stop_reason;  // target, max-epochs, max-seconds, requested
  double seconds = 0;       // from the start of training to the stop
  int64_t epochs = 0;       // completed epochs
  int64_t batches = 0;      // batches finished: trained, or their gradients lost
  int64_t gradients_lost = 0;  // of those, batches whose gradients no server answered
  int64_t samples = 0;      // rows trained: of the batches whose gradients were applied
  int64_t steps = 0;        // optimizer steps on the servers (global_step)
  std::vector<ScoreRecord> scores;
  EvalResult validation;    // of the final parameters
  EvalResult test;
  std::string model_path;
  // "best" (the lowest score's parameters, when lower than the last ones' validation loss),
  // "last" (the servers' at the stop), or "none" (stopped before training began: no model, no
  // evaluation).
  std::string kept;
  int64_t kept_step = 0;    // the global_step of the kept parameters
  nlohmann::json spec;
};

// What ClusterRun's constructor refuses before it makes the coordinator, checked alone
// (InputError): the run's shape, the GPUs, CURVE with inproc, the store and its splits, a model
// path that cannot be written. Completes the CURVE settings and returns the store it opened.
// The coordinator can still refuse (its address in use, more servers than the model has parts,
// an allowed-keys file it cannot read): a caller that clears a previous run's files constructs
// the ClusterRun first, with serve_from_run, and clears them before run().
DatasetStore check_cluster_options(ClusterOptions& options);
// What a run needs of its store (InputError): training rows, validation rows for a scorer, and
// rows of the model's width.
void check_store_for_run(const DatasetStore& store, const RunSettings& s, int scorers);
// The settings' store opened and checked for the run (InputError for a path that is not a
// dataset store, and check_store_for_run's).
DatasetStore open_store_for_run(const RunSettings& s, int scorers);

class ClusterRun {
 public:
  // Checks the options (check_cluster_options), reads the store's evaluation splits and starts
  // the coordinator.
  explicit ClusterRun(ClusterOptions options);
  // For options check_cluster_options accepted, with the store it returned: nothing is checked
  // again (the CURVE key file read, the store opened).
  ClusterRun(ClusterOptions checked_options, const DatasetStore& store);
  ~ClusterRun();
  ClusterRun(const ClusterRun&) = delete;
  ClusterRun& operator=(const ClusterRun&) = delete;

  Coordinator& coordinator() { return *coordinator_; }
  // Runs to the end. With options.inproc the roles are threads; otherwise `launcher` starts them
  // (null: they are started elsewhere and join on their own: `tandem coordinator`). Throws
  // tandem::Error when the run fails (the coordinator's reason).
  ClusterSummary run(RoleLauncher* launcher);
  // What run() calls (ClusterOptions::on_training, on_tick), for a caller that makes them once
  // the run (its coordinator bound) exists.
  void set_callbacks(std::function<void(const nlohmann::json&)> on_training,
                     std::function<void(const Coordinator&)> on_tick) {
    options_.on_training = std::move(on_training);
    options_.on_tick = std::move(on_tick);
  }
  // Asks a running run to stop (a signal handler's flag is polled by on_tick instead).
  void request_stop(const std::string& reason) { coordinator_->request_stop(reason); }

 private:
  // Reads the evaluation splits and makes the coordinator (bound; serving unless
  // serve_from_run).
  void start_coordinator(const DatasetStore& store);
  void remove_previous_models();
  void start_threads();
  void join_threads();

  ClusterOptions options_;
  std::unique_ptr<zmq::context_t> context_;
  DataSplits eval_splits_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::thread> threads_;
  std::mutex errors_mutex_;
  std::vector<std::string> errors_;  // from role threads
};

}  // namespace tandem
