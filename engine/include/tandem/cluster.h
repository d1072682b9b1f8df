// Parameter-server clusters from C++: the coordinator, the roles (parameter server, worker,
// scorer) and a whole local cluster in one call. The same engine as `tandem launch`,
// `tandem coordinator|ps|worker|scorer` and the Python package's tandem.Coordinator and roles.
//
// A cluster trains one model on a dataset store (a Zarr group: `tandem prepare`, or
// write_cluster_store below). One coordinator registers the roles and hands out the run's
// settings; parameter servers hold the parameters; workers pull them, compute gradients on
// batches the coordinator hands them and push them back; the scorer evaluates the validation
// split now and then and the coordinator stops the run by the stop rule (a target validation
// loss, a number of epochs or seconds, or a request).
//
// Two ways to run one:
//   train_cluster(options)  the whole run in one call: every role a thread of this process (or
//                           roles that join from other processes), the final parameters read
//                           from the servers, evaluated and saved.
//   ClusterCoordinator + ClusterRole
//                           each piece by hand: a coordinator in one process, roles in the same
//                           or other processes (each pointed at the coordinator's address()).
//
// Run settings travel as a JSON object (a string), so new settings never change this header.
// Keys, with their defaults: data (the store's path; required unless fed), model ("784-100-10"
// form), optimizer ("sgd" | "adam"), lr, beta1, beta2, epsilon, batch (1000), seed (1), shuffle,
// backend ("cpu" | "cuda" | "auto"), precision ("fp32"), worker_threads, worker_group,
// scorer_threads, readers, assemblers, score_interval_s (1.0), ps_mode ("async" | "sync" |
// "bounded_staleness"), ps_device ("auto" | "cpu" | "cuda"), replicas_to_aggregate,
// staleness_bound, checkpoint_dir (the servers write their checkpoints there and start from
// the newest there: see `resume`), checkpoint_every_s, checkpoint_every_steps (0: off; both may
// be set), best_model_path (where the scorer keeps the best parameters; train_cluster removes a
// file there when the run starts: it would pass for this run's), overlap, curve_* (CURVE key
// files, see the README), fed,
// ps_timeout_ms, ps_spin_us (0: a client blocks for each reply at once), init_timeout_ms,
// step_timeout_s (600: a worker whose backend stays that long in one call is counted lost; 0:
// never). An unknown key is an InputError naming the known ones.
// Fed runs (workers trained on blocks handed to them in their own process) need the Python
// package's WorkerRole.feed: this header's workers read the store.
//
// Every function reports failure by throwing tandem::Error (InputError for bad settings or data,
// IoError for files); messages name what failed.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tandem/dataset.h"
#include "tandem/model.h"
#include "tandem/trainer.h"
#include "tandem/export.h"

namespace tandem {

// Writes `splits` (train, and validation/test when not empty) as a dataset store at `path`, the
// layout `tandem prepare` writes: the store a cluster trains on. Written under a temporary name
// and renamed into place when complete. Throws InputError when `path` exists (unless
// `overwrite`), IoError when it cannot be written.
TANDEM_API void write_cluster_store(const DataSplits& splits, const std::string& path,
                                    int64_t chunk_rows = 10000, bool overwrite = false);

// One score of the run: the scorer's evaluation of the validation split.
struct TANDEM_API ClusterScore {
  int64_t seq = 0;       // 1, 2, ... in the order the coordinator received them
  double t = 0;          // seconds since training started
  int64_t step = 0;      // the servers' global step of the parameters scored
  double loss = 0;       // summed clipped cross-entropy over the validation split (the target's)
  double loss_mean = 0;  // per sample
  double accuracy = 0;
  int64_t samples = 0;
};

// CURVE: with the settings' curve_secret_file, the run's parameter servers AND its coordinator
// (control and scores) serve under that key pair, admitting only the client keys listed in
// curve_allowed_path when it is set (else any client that knows the public key). A role or a
// score stream joining such a run from outside train_cluster needs these.
struct TANDEM_API ClusterCurveKeys {
  std::string server_public_key;  // the run's public key (Z85, 40 characters); empty: no CURVE
  // This side's key file (tandem keygen's PREFIX.key_secret); empty: a throwaway pair, admitted
  // only when the run has no allowed list. A role also uses it with the parameter servers.
  std::string client_key_file;
};

// ---------------------------------------------------------------------------------------------
// A whole run in one call.

struct TANDEM_API ClusterRunOptions {
  std::string settings = "{}";  // the run's settings (JSON object, keys above); "data" required
  int ps = 1;                   // parameter servers (>= 1)
  int workers = 1;              // workers (>= 1)
  int scorers = 1;              // 0 or 1; a target needs one
  double target = 0;            // stop once a score's loss is below it; 0: off
  int64_t max_epochs = 0;       // 0: no limit
  double max_seconds = 0;       // 0: no limit (without a scorer, one of the two is required)
  // true: every role is a thread of this call (inproc:// transport, as `tandem launch --inproc`).
  // false: only the coordinator runs here, bound to `bind`; start the roles yourself (other
  // processes: `tandem ps|worker|scorer --coordinator ADDRESS`, or ClusterRole) once
  // on_listening has told you the address.
  bool roles_as_threads = true;
  std::string bind = "tcp://127.0.0.1:*";  // the coordinator's address without roles_as_threads
  std::string advertise_host;   // the host named for sockets bound to tcp://0.0.0.0
  // Save the kept parameters here (safetensors); empty: not saved. An earlier run's file there is
  // removed as a run that is not resumed starts (one that fails or stops before training saves
  // none); a file that is no Tandem checkpoint is refused (InputError), as is one at the
  // settings' best_model_path.
  std::string model_out;
  // Keep the parameters of the lowest score rather than the servers' last ones, when they
  // evaluate lower. Needs the settings' best_model_path (where the scorer writes them); without
  // one the last parameters are kept.
  bool keep_best = true;
  double startup_timeout_s = 60;  // every role registered by then, or the run fails (above 0)
  double heartbeat_timeout_s = 3; // a role silent this long is lost (1 to 86400)
  int test_threads = 0;           // threads of the final evaluation (0: all cores)
  // Continue the run whose servers' checkpoints are in the settings' checkpoint_dir: the
  // servers start from their newest checkpoints (as a server restarted within a run does) and
  // training goes on with the epoch after those every server's checkpoint comes after, in the
  // order an uninterrupted run would have given it; max_epochs counts those epochs too. What a
  // resumed run should know is said on stderr as it starts (servers at different steps, a
  // server without a checkpoint or whose checkpoint does not say its epochs: the epochs count
  // from the first again). InputError when checkpoint_dir is not set or holds no server
  // checkpoint, a server has checkpoints and none it can resume from (damaged, or another
  // optimizer's), or the checkpoints hold another model or another number of servers' parts
  // than this run's. Not set, a
  // checkpoint_dir holding server checkpoints is refused (InputError): its servers would start
  // from them while the epochs counted from the first. The directory is read in this process
  // (a relative path from its working directory, where servers elsewhere read theirs).
  bool resume = false;
  // Called on the calling thread: with the coordinator's address once it listens (before any
  // role starts; inproc:// with roles_as_threads), and with each score once, in order, as
  // training goes (checked about every 100 ms; the last ones before train_cluster returns).
  // What they throw ends the run and comes out of train_cluster.
  std::function<void(const std::string& address)> on_listening;
  std::function<void(const ClusterScore& score)> on_score;
};

struct TANDEM_API ClusterRunSummary {
  std::string stop_reason;  // target, max-epochs, max-seconds, requested
  double seconds = 0;       // from the start of training to the stop
  int64_t epochs = 0;       // completed epochs (a resumed run's: those before it too)
  int64_t resumed_epochs = 0;  // a resumed run: the epochs its servers' checkpoints came after
  int64_t batches = 0;      // batches finished: trained, or their gradients lost
  // Of those, batches whose gradients a parameter server never answered (it died or
  // restarted); they are not trained again.
  int64_t gradients_lost = 0;
  int64_t steps = 0;        // optimizer steps on the servers (global_step) at the stop
  std::vector<ClusterScore> scores;
  EvalResult validation;    // of the kept parameters
  EvalResult test;          // of the kept parameters (zero when the store has no test split)
  // "best" (the lowest score's parameters), "last" (the servers'), or "none" (stopped before
  // training began: no model saved, validation and test zero).
  std::string kept;
  int64_t kept_step = 0;    // global step of the kept parameters
  std::string model_path;   // options.model_out when saved
  std::string spec_json;    // the cluster at the stop: {coordinator, scores, ps, worker, scorer}
  std::string to_json() const;  // all of the above as one JSON object
};

// Runs a cluster to the end: starts the coordinator (and the roles, with roles_as_threads),
// waits for the stop rule, reads the final parameters from the servers, keeps the best or the
// last ones, evaluates the validation and test splits, saves model_out, tells the servers to
// exit and joins every thread it started. Blocks the calling thread throughout. Throws
// InputError for bad options, settings or store before anything starts, and Error ("cluster run
// failed: ...", naming the role) when a role fails, the start-up times out or a role is lost
// for good.
TANDEM_API ClusterRunSummary train_cluster(const ClusterRunOptions& options);

// ---------------------------------------------------------------------------------------------
// The pieces, each by hand.

struct TANDEM_API ClusterCoordinatorOptions {
  std::string settings = "{}";  // the run's settings (JSON object, keys above)
  int ps = 1, workers = 1, scorers = 1;  // the roles the run waits for
  double target = 0;            // as ClusterRunOptions
  int64_t max_epochs = 0;
  double max_seconds = 0;
  std::string bind = "tcp://127.0.0.1:*";  // tcp:// ("*" as port: any free one)
  std::string scores_bind;      // the scores channel; empty: beside `bind`
  std::string advertise_host;   // the host named for sockets bound to tcp://0.0.0.0
  // Every role registered by then, or the run fails; and a run whose workers have all stopped on
  // errors (none lost, none left without one) fails once none has come back for this long.
  double startup_timeout_s = 60;
  double heartbeat_timeout_s = 3;
  // As ClusterRunOptions::resume (summary_json's resumed_epochs: where the epochs went on). The
  // checkpoint_dir is read in this process: the servers' directory, shared or on this machine.
  // A fed run (the settings' fed) has no epochs: its servers start from the checkpoints there
  // either way, and neither resume nor its absence is checked.
  bool resume = false;
};

// The coordinator of a run whose roles are started separately (ClusterRole, or
// `tandem ps|worker|scorer` processes). It serves on a thread of its own from construction to
// destruction; every member is safe to call from any thread.
//
// A driver's run:
//   ClusterCoordinator c(options);          // give c.address() to the roles
//   c.wait(-1);                             // training stopped, workers and scorer gone
//   Model model = c.pull_model();           // the final parameters
//   c.finish(30);                           // the servers checkpoint and exit
class TANDEM_API ClusterCoordinator {
 public:
  // Opens the store (for the batch plan; not needed when the settings say fed) and binds the
  // coordinator's sockets. Throws InputError for bad settings or store, Error naming the address
  // when it cannot bind. inproc:// addresses are refused: use train_cluster for threads.
  explicit ClusterCoordinator(const ClusterCoordinatorOptions& options);
  // Stops serving. Roles still running lose the coordinator and end with an error after their
  // coordinator_lost_s.
  ~ClusterCoordinator();
  ClusterCoordinator(const ClusterCoordinator&) = delete;
  ClusterCoordinator& operator=(const ClusterCoordinator&) = delete;

  std::string address() const;         // where roles join (tcp://host:port)
  // The public key (Z85) the coordinator and the servers serve under, for ClusterCurveKeys;
  // empty when the settings have no curve_secret_file.
  std::string curve_public_key() const;
  std::string scores_address() const;  // the scores channel (see ClusterScoreStream)
  // starting, training, draining (stopped; workers finishing), done (after finish()), failed.
  std::string phase() const;
  // Blocks until the phase is at least `phase` ("failed" counts as past everything) or
  // timeout_s passes (negative: no limit). Returns the phase then.
  std::string wait_for(const std::string& phase, double timeout_s) const;
  // Blocks until training has stopped and every worker and scorer has left: true, or false after
  // timeout_s (negative: no limit). Throws Error with the coordinator's reason when the run
  // failed (a role lost for good, start-up timed out, fail()).
  bool wait(double timeout_s) const;
  // Stops training now (training -> draining); roles leave at their next step.
  void request_stop(const std::string& reason = "requested");
  // Ends the run as failed: every role ends with an error. After finish() (or a failure) it
  // changes nothing.
  void fail(const std::string& why);
  // The parameters the servers hold now (a fresh client's pull). Throws Error when no server is
  // serving (before every server is ready, after finish(), or once the run failed).
  Model pull_model() const;
  // Draining -> done: the servers write their last checkpoint and exit, the scores channel ends.
  // Waits up to timeout_s for the servers to leave: true when they have.
  bool finish(double timeout_s = 30);

  std::string stop_reason() const;  // empty until training stops
  std::string failure() const;      // empty unless failed
  std::vector<ClusterScore> scores() const;
  // {phase, stop_reason, failure, seconds, epochs, resumed_epochs, batches, gradients_lost,
  //  scores: [...], spec: {...}}.
  std::string summary_json() const;
  // The dashboard's document: cluster, roles, scores, workers, servers.
  std::string state_json() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct TANDEM_API ClusterRoleOptions {
  std::string bind;         // parameter server: where to serve; empty: tcp://127.0.0.1:*
  std::string advertise;    // parameter server: the host peers reach it by (for tcp://0.0.0.0)
  std::string data;         // overrides the settings' store path (mounted elsewhere here)
  std::vector<int> gpus;    // worker: its group's GPUs (member m on gpus[m]); empty: settings'
  double coordinator_lost_s = 15;  // no answer from the coordinator this long: the role fails
                                   // (above 0, at most a day)
  ClusterCurveKeys curve;          // for a run under CURVE (see ClusterCurveKeys)
};

// One role of a cluster, running on a thread of its own from the moment it is made: it
// registers with the coordinator at `coordinator` (its address()), takes the run's settings from
// it, and runs until the coordinator ends training (servers: until finish()), stop() is called,
// or it fails. `name` empty: the coordinator names it (ps0, worker1, ...); a name already
// registered is a restart of that role. join, stop, running and kind may be called from any
// thread. Each factory throws InputError for an empty or inproc:// address (and GPUs for a
// role other than a worker); everything else the role meets comes out of join().
class TANDEM_API ClusterRole {
 public:
  static ClusterRole parameter_server(const std::string& coordinator, const std::string& name = "",
                                      const ClusterRoleOptions& options = {});
  static ClusterRole worker(const std::string& coordinator, const std::string& name = "",
                            const ClusterRoleOptions& options = {});
  static ClusterRole scorer(const std::string& coordinator, const std::string& name = "",
                            const ClusterRoleOptions& options = {});

  ClusterRole(ClusterRole&&) noexcept;
  ClusterRole& operator=(ClusterRole&&) noexcept;
  // stop(), then waits up to 5 s for the thread; one still stuck in a request is left to end on
  // its own at the request's timeout (it holds nothing of this object). Errors are dropped:
  // join() first to see them.
  ~ClusterRole();

  // Waits for the role's thread to end: true once it has (rethrowing the role's error, a
  // tandem::Error or InputError naming the role, if it failed), false after timeout_s
  // (negative: no limit). Once it has returned true (or thrown), later calls return true.
  bool join(double timeout_s = -1);
  // Ends the role from this process as if the run were over (a server writes its last
  // checkpoint), without waiting for the coordinator. join() waits for it.
  void stop();
  bool running() const;      // started and not yet ended
  std::string kind() const;  // "ps", "worker" or "scorer"

 private:
  struct State;
  explicit ClusterRole(std::shared_ptr<State> state);
  static ClusterRole start(const std::string& kind, const std::string& coordinator,
                           const std::string& name, const ClusterRoleOptions& options);
  std::shared_ptr<State> state_;
};

// The coordinator's scores channel: the newest scores at once (the last 10), then each new one,
// then the end of the run. For watching a run from anywhere (another thread or process). The
// end comes when the run is done (the coordinator's finish(), which comes after pull_model())
// or failed, not when training stops: a driver that follows the stream to its end on the thread
// that would call finish() waits for ever; follow it elsewhere, or watch the coordinator's
// wait() and the stream's scores with a timeout.
class TANDEM_API ClusterScoreStream {
 public:
  // `coordinator`: the coordinator's address(); `curve`: for a run under CURVE. Throws Error
  // when it does not answer within timeout_s (negative: a day; 0 or NaN: InputError), naming a
  // refused key. A coordinator that dies
  // (killed, its node gone) never sends the end: next() throws Error once it has not answered
  // for coordinator_lost_s (above 0, at most a day) while no message came.
  explicit ClusterScoreStream(const std::string& coordinator, double timeout_s = 5,
                              const ClusterCurveKeys& curve = {},
                              double coordinator_lost_s = 30);
  ~ClusterScoreStream();
  ClusterScoreStream(const ClusterScoreStream&) = delete;
  ClusterScoreStream& operator=(const ClusterScoreStream&) = delete;

  // The next score into `score`: true; false when none came within timeout_s (negative: no
  // limit, until the end) or the run has ended. Not to be called from several threads at once.
  bool next(ClusterScore& score, double timeout_s);
  bool ended() const;               // the end message has come
  std::string end_reason() const;   // its reason: the stop reason, or "failed: ..."

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tandem
