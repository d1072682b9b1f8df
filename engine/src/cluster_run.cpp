#include "cluster_run.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "batch_count.h"
#include "checkpoint_format.h"
#include "dataset_store.h"
#include "file_io.h"
#include "model_finite.h"
#include "parameters_only.h"
#include "ps_client.h"
#include "seconds_to_ms.h"
#include "tandem/error.h"
#include "thread_pool.h"
#include "zmq_curve.h"

namespace tandem {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

std::string inproc_name(const char* what) {
  static std::atomic<int> counter{0};
  return "inproc://tandem-" + std::string(what) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(counter++);
}

}  // namespace

void complete_curve_settings(RunSettings& s) {
  if (s.curve_secret_file.empty()) {
    if (!s.curve_server_public.empty() || !s.curve_allowed_path.empty() ||
        !s.curve_client_file.empty())
      throw InputError("the CURVE settings need the servers' secret key file (curve_secret_file, "
                       "--curve-secret) as well");
    return;
  }
  const std::string secret_public =
      transport::read_curve_secret_key_file(s.curve_secret_file).public_key;
  if (s.curve_server_public.empty()) s.curve_server_public = secret_public;
  else if (s.curve_server_public != secret_public)
    throw InputError("curve_server_public is not the public key of " + s.curve_secret_file);
  if (!s.curve_allowed_path.empty() && s.curve_client_file.empty())
    throw InputError("an allowed-clients list needs the clients' key file too "
                     "(--curve-client-secret), or no client would be admitted");
}

void secure_coordinator(CoordinatorOptions& o, const RunSettings& s) {
  if (s.curve_secret_file.empty()) return;
  o.curve_secret_key = transport::read_curve_secret_key_file(s.curve_secret_file).secret_key;
  if (!s.curve_allowed_path.empty())
    o.curve_allowed_clients = transport::read_curve_allowed_clients(s.curve_allowed_path);
}

void check_run_shape(const RunSettings& s, int ps, int workers, int scorers, double target,
                     int64_t max_epochs, double max_seconds, bool driven) {
  if (ps < 1) throw InputError("a cluster needs at least one parameter server");
  if (workers < 1) throw InputError("a cluster needs at least one worker");
  if (scorers < 0 || scorers > 1) throw InputError("a cluster has 0 or 1 scorer");
  if (scorers == 0 && target > 0)
    throw InputError("a target (--target) needs a scorer: the score is the validation loss it "
                     "measures (without a scorer, --target 0 turns it off)");
  if (max_epochs < 0) throw InputError("max_epochs must be >= 0 (0: no limit)");
  if (!driven && scorers == 0 && max_epochs == 0 && max_seconds == 0)
    throw InputError("without a scorer, give a number of epochs or seconds (--max-epochs, "
                     "--max-seconds): nothing else stops training");
  // Numbers that would otherwise fail far from where they were given: a NaN learning rate as a
  // JSON type error in every role, a score interval past the clock's range as scores without
  // pause, a NaN target or time limit as one that never stops the run.
  if (!(std::isfinite(target) && target >= 0))
    throw InputError("the target must be a finite number >= 0 (0: off)");
  if (!(std::isfinite(max_seconds) && max_seconds >= 0))
    throw InputError("max_seconds must be a finite number >= 0 (0: no limit)");
  s.optimizer.validate();
  if (!(s.score_interval_s > 0 && s.score_interval_s <= kMaxIntervalSeconds))
    throw InputError("score_interval_s must be above 0 and at most 86400 (a day)");
  if (!(s.checkpoint_every_s >= 0 && s.checkpoint_every_s <= 1e7))
    throw InputError("checkpoint_every_s must be from 0 to 1e7 (0: only at the end)");
  if (s.checkpoint_every_steps < 0)
    throw InputError("checkpoint_every_steps must be >= 0 (0: by time only)");
  if (!(s.step_timeout_s >= 0 && s.step_timeout_s <= 1e7))
    throw InputError("step_timeout_s must be from 0 to 1e7 (0: never)");
  check_overlap(s);
  check_worker_group(s);
  check_role_settings(s);
}

void check_store_for_run(const DatasetStore& store, const RunSettings& s, int scorers) {
  if (store.train.rows == 0) throw InputError(s.data + ": the training split is empty");
  if (scorers > 0 && store.validation.rows == 0)
    throw InputError(s.data + ": no validation split for the scorer");
  // Else every worker and the scorer would fail once started, each on its first batch.
  if (store.train.features != s.model.inputs())
    throw InputError(s.data + ": its rows have " + std::to_string(store.train.features) +
                     " features, the model " + s.model.describe() + " takes " +
                     std::to_string(s.model.inputs()));
  // (Caught once the roles ran, it failed every role with the same error, after they started.)
  if (store.num_classes > s.model.classes())
    throw InputError(s.data + ": its labels have " + std::to_string(store.num_classes) +
                     " classes, the model " + s.model.describe() + " has " +
                     std::to_string(s.model.classes()) + " outputs");
}

DatasetStore open_store_for_run(const RunSettings& s, int scorers) {
  if (s.data.empty())
    throw InputError("the run needs a store (setting 'data') unless it is fed (setting 'fed' "
                     "true)");
  if (!is_dataset_store(s.data))
    throw InputError(s.data +
                     " is not a dataset store: make one with `tandem prepare --out STORE`");
  DatasetStore store = DatasetStore::open(s.data);
  check_store_for_run(store, s, scorers);
  return store;
}

DatasetStore check_cluster_options(ClusterOptions& options) {
  complete_curve_settings(options.settings);
  const RunSettings& s = options.settings;
  check_run_shape(s, options.ps, options.workers, options.scorers, options.target,
                  options.max_epochs, options.max_seconds, /*driven=*/false);
  if (!options.worker_gpus.empty() && int(options.worker_gpus.size()) != options.workers)
    throw InputError("GPUs are given for " + std::to_string(options.worker_gpus.size()) +
                     " workers, the cluster has " + std::to_string(options.workers));
  if (options.inproc && !s.curve_server_public.empty())
    throw InputError("CURVE does not apply to inproc:// endpoints: drop --inproc or the CURVE keys");
  DatasetStore store = open_store_for_run(s, options.scorers);
  // Written after the whole run: a path that cannot take it would lose the trained model. Nor is
  // anything but a checkpoint written over (or removed as a previous run's: ClusterRun::run).
  if (!options.model_out.empty()) check_replaceable(options.model_out);
  // The scorer's best model too: unwritable, the run's scores were lost with it (and a run that
  // reached its stop first ended well, the scorer's failure said only on stderr).
  if (!s.best_model_path.empty()) check_replaceable(s.best_model_path);
  refuse_to_write_over_other_than_a_checkpoint(options.model_out, "the run's model file");
  // (A resumed run's is the run's own: read, it is kept; unreadable, the first score replaces
  // it, ClusterRun::remove_previous_models.)
  if (!options.resumed)
    refuse_to_write_over_other_than_a_checkpoint(s.best_model_path, "the best-score model file");
  // Roles in other processes cannot reach an inproc:// address: no role would ever join.
  if (!options.inproc && options.bind.rfind("inproc://", 0) == 0)
    throw InputError("bind " + options.bind + ": an inproc:// address is for roles on threads of "
                     "this process (roles_as_threads, --inproc); roles in processes of their "
                     "own need tcp:// or ipc://");
  // Read after the whole run too, by the final evaluation.
  if (options.test_threads != 0) {
    try {
      ThreadPool::check_thread_count(options.test_threads);
    } catch (const InputError& e) {
      throw InputError(std::string("test_threads (0: every core): ") + e.what());
    }
  }
  return store;
}

ClusterRun::ClusterRun(ClusterOptions options) : options_(std::move(options)) {
  start_coordinator(check_cluster_options(options_));
}

ClusterRun::ClusterRun(ClusterOptions checked_options, const DatasetStore& store)
    : options_(std::move(checked_options)) {
  start_coordinator(store);
}

void ClusterRun::start_coordinator(const DatasetStore& store) {
  const RunSettings& s = options_.settings;
  eval_splits_ = read_eval_splits(store);
  eval_splits_.source = s.data;

  CoordinatorOptions co;
  if (options_.inproc) {
    context_ = std::make_unique<zmq::context_t>(1);
    co.context = context_.get();
    co.bind = inproc_name("coordinator");
    co.scores_bind = inproc_name("scores");
  } else {
    co.bind = options_.bind;
    co.scores_bind = options_.scores_bind;
    co.advertise_host = options_.advertise_host;
  }
  co.expected_ps = options_.ps;
  co.expected_workers = options_.workers;
  co.expected_scorers = options_.scorers;
  co.run_config = to_json(s);
  co.batches_per_epoch = batch_count(store.train.rows, s.batch);
  co.max_epochs = options_.max_epochs;
  co.first_epoch = options_.first_epoch;
  co.max_seconds = options_.max_seconds;
  co.target = options_.target;
  co.heartbeat_timeout_ms = options_.heartbeat_timeout_ms;
  co.startup_timeout_ms = options_.startup_timeout_ms;
  secure_coordinator(co, s);
  co.serve_at_once = !options_.serve_from_run;
  coordinator_ = std::make_unique<Coordinator>(co);
  // Removed last: a run refused above (its address in use) leaves the previous run's as it
  // was. A run served from run() removes it there, with the caller's other checks behind it.
  if (!options_.serve_from_run) remove_previous_models();
}

void ClusterRun::remove_previous_models() {
  // A previous run's best model would pass for this run's: the scorer keeps a best model it
  // finds (its predecessor's, when it is restarted within the run). A resumed run's is the run
  // it continues: made this run's (its "run"), so that the scorer keeps it until a better score
  // and the end weighs it against the last parameters. (Removed, a resume with nothing left to
  // train saved the servers' last parameters over the model kept; left as the other run's, the
  // scorer's first score replaced it, however much worse.)
  if (options_.resumed) {
    const std::string& path = options_.settings.best_model_path;
    if (path.empty() || !std::filesystem::exists(path)) return;
    try {
      Checkpoint best = load_checkpoint(path, &options_.settings.model);
      best.extra["run"] = coordinator_->run_id();
      save_checkpoint(path, best);
    } catch (const Error& e) {
      std::fprintf(stderr, "tandem: the run's best-score model %s is unreadable (%s); the "
                   "first score replaces it\n", path.c_str(), e.what());
    }
    return;
  }
  // Nor does an earlier run's model (model_out) stay: a run that fails, or stops before it
  // trains, writes none, and the old one would pass for it.
  // (Through a link, the file it names: the run's write replaces that one, the link kept.)
  for (const std::string& path : {options_.settings.best_model_path, options_.model_out}) {
    std::error_code ignored;  // none there, most often
    if (!path.empty()) std::filesystem::remove(replacement_target(path), ignored);
  }
}

ClusterRun::~ClusterRun() {
  if (!threads_.empty()) {
    coordinator_->fail("the run was abandoned");
    join_threads();
  }
}

void ClusterRun::start_threads() {
  auto spawn = [this](void (*role)(const RoleOptions&), const std::string& name,
                      std::vector<int> gpus = {}) {
    RoleOptions o;
    o.coordinator = coordinator_->endpoint();
    o.name = name;
    o.context = context_.get();
    o.gpus = std::move(gpus);
    o.heartbeat_ms = options_.heartbeat_ms;
    threads_.emplace_back([this, role, o] {
      try {
        role(o);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(errors_mutex_);
        errors_.push_back(o.name + ": " + e.what());
      }
    });
  };
  for (int i = 0; i < options_.ps; ++i) spawn(run_ps_role, "ps" + std::to_string(i));
  for (int i = 0; i < options_.workers; ++i)
    spawn(run_worker_role, "worker" + std::to_string(i),
          options_.worker_gpus.empty() ? std::vector<int>{} : options_.worker_gpus[size_t(i)]);
  for (int i = 0; i < options_.scorers; ++i) spawn(run_scorer_role, "scorer" + std::to_string(i));
}

void ClusterRun::join_threads() {
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

ClusterSummary ClusterRun::run(RoleLauncher* launcher) {
  Coordinator& c = *coordinator_;
  if (options_.serve_from_run) remove_previous_models();  // before any role can read it
  c.start_serving();
  // One pass of watching: role threads' errors, the caller's tick, exited processes. The tick
  // first: a stop it asks for (a stop signal came) is in force when the exits seen in the same
  // pass are judged, so a role that ended with that stop is the end of a stopped run, not a role
  // lost while training.
  auto watch = [&] {
    {
      std::lock_guard<std::mutex> lock(errors_mutex_);
      for (const std::string& e : errors_) c.fail(e);
      errors_.clear();
    }
    if (options_.on_tick) {
      try {
        options_.on_tick(c);
      } catch (const std::exception& e) {
        // Failed, so that roles started elsewhere end too rather than serve a run nobody runs.
        c.fail(std::string("the run's caller failed: ") + e.what());
        throw;
      }
    }
    if (launcher != nullptr) launcher->watch(c);
  };
  if (options_.inproc) {
    start_threads();
  } else if (launcher != nullptr) {
    // Watched between starts too: starting hundreds of processes takes seconds, and a stop asked
    // for meanwhile (Ctrl-C, through the tick) or a role failing ends the starting, not only the
    // run after every process has been started.
    auto watched = Clock::now();
    auto start = [&](const char* kind, int count) {
      for (int i = 0; i < count && c.phase() == ClusterPhase::Starting; ++i) {
        if (Clock::now() - watched >= std::chrono::milliseconds(100)) {
          watch();
          watched = Clock::now();
          if (c.phase() != ClusterPhase::Starting) break;
        }
        const std::string name = kind + std::to_string(i);
        c.expect(name, launcher->start(kind, name, c.endpoint()));
      }
    };
    start("ps", options_.ps);
    start("worker", options_.workers);
    start("scorer", options_.scorers);
  }
  auto cleanup = [&] {
    if (launcher != nullptr) launcher->stop_all(10000);
    join_threads();
  };
  bool announced = false;
  for (;;) {
    const ClusterPhase phase = c.wait_for(ClusterPhase::Draining, 100);
    // (A run stopped while starting goes on to draining with no training spec: nothing to
    // announce.)
    if (!announced && phase != ClusterPhase::Starting && phase != ClusterPhase::Failed &&
        !c.training_spec().is_null()) {
      announced = true;
      if (options_.on_training) options_.on_training(c.training_spec());
    }
    watch();
    if (c.phase() != ClusterPhase::Starting && c.phase() != ClusterPhase::Training) break;
  }
  auto fail_now = [&](const std::string& why) {
    c.fail(why);
    cleanup();
    throw Error("cluster run failed: " + why);
  };
  if (c.phase() == ClusterPhase::Failed) fail_now(c.failure());

  // Draining: workers and the scorer finish their step and leave.
  for (const auto deadline = Clock::now() + std::chrono::seconds(30);;) {
    if (c.wait_workers_gone(100)) break;
    watch();
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "coordinator: workers still running 30 s after the stop; going on\n");
      break;
    }
  }
  // A role thread's error while draining failed the run (watch; once more for one that came as
  // the last role left): said as it is, not as the failure to read the final parameters from
  // servers that have left since.
  watch();
  if (c.phase() == ClusterPhase::Failed) fail_now(c.failure());
  // Done: the servers write their last checkpoint and exit.
  auto stop_servers = [&] {
    c.finish();
    for (const auto deadline = Clock::now() + std::chrono::seconds(30);;) {
      if (c.wait_servers_gone(100)) break;
      watch();
      if (Clock::now() > deadline) break;
    }
    cleanup();
  };
  ClusterSummary summary;
  summary.stop_reason = c.stop_reason();
  summary.seconds = c.training_seconds();
  summary.epochs = c.epochs_completed();
  summary.batches = c.batches_done();
  summary.gradients_lost = c.gradients_lost();
  summary.samples = c.samples_trained();
  summary.scores = c.scores();
  summary.spec = c.spec();

  // Nothing to read, keep or evaluate; not a failure.
  auto stopped_before_training = [&] {
    summary.kept = "none";
    stop_servers();
    return summary;
  };
  // Stopped while the roles were starting (a signal): no worker has trained, and the servers
  // may hold no parameters yet.
  if (c.training_spec().is_null()) return stopped_before_training();
  // The final parameters, straight from the servers. A server that died while the workers left
  // is restarted by the launcher (lost, then registered without an address until it has loaded
  // its checkpoint): waited for, as a worker waits for the servers (init_timeout_ms), not read
  // at its old address or taken for gone.
  const int wait_ms = options_.settings.init_timeout_ms;
  for (const auto deadline = Clock::now() + std::chrono::milliseconds(wait_ms);
       !c.servers_serving() && Clock::now() < deadline;) {
    watch();
    if (c.phase() == ClusterPhase::Failed) fail_now(c.failure());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const std::vector<std::string> servers = c.ps_endpoints();
  if (!c.servers_serving() || servers.empty())
    fail_now("not every parameter server was serving within " + std::to_string(wait_ms) +
             " ms of the workers leaving (lost, or restarting); the final parameters cannot be "
             "read");
  Model model(options_.settings.model);
  try {
    PsClient client(servers, cluster_client_options(options_.settings, context_.get()));
    PsResult result = client.init({}).wait();
    model.parameters() = std::move(result.tensors);
    summary.steps = int64_t(result.version);
  } catch (const ServerError& e) {
    // Stopped (a signal, --max-seconds) after every role had registered but before the chief's
    // Init: the servers hold no parameters, no worker reported a batch and nothing was scored.
    // Stopped before training began, as above, not a failure. (Parameters gone after training, a
    // server restarted without its checkpoint, are one.)
    if (!e.not_initialised() || c.batches_done() > 0 || !c.scores().empty())
      fail_now(std::string("reading the final parameters: ") + e.what());
    return stopped_before_training();
  } catch (const Error& e) {
    fail_now(std::string("reading the final parameters: ") + e.what());
  }
  // From here on a failure (a diverged run, a full disk, a damaged best file, no memory) still
  // lets the servers write their last checkpoints and exit, and stops the launched roles,
  // before it is thrown.
  int64_t kept_epochs = summary.epochs;
  try {
    summary.kept = "last";
    summary.kept_step = summary.steps;
    const std::string& best_path = options_.settings.best_model_path;
    const bool has_validation = eval_splits_.validation.rows() > 0;
    if (has_validation)
      summary.validation =
          evaluate_model(model, eval_splits_.validation.view(), options_.test_threads);
    if (options_.keep_best && has_validation && options_.scorers > 0 && !best_path.empty() &&
        std::filesystem::exists(best_path)) {
      // The lowest score's parameters against the last ones, measured the same way: the last
      // ones win a tie, and win outright when training ran on well past the newest score.
      const Checkpoint best = load_checkpoint(best_path, &options_.settings.model);
      const EvalResult best_validation =
          evaluate_model(best.model, eval_splits_.validation.view(), options_.test_threads);
      // (A NaN last loss, a run that diverged after its best score, keeps the best.)
      if (!(best_validation.loss_sum >= summary.validation.loss_sum)) {
        model = best.model;
        summary.kept = "best";
        summary.kept_step = best.step;
        summary.validation = best_validation;
        // Its epoch: the epochs done when its score came, not the run's at the stop (tandem
        // train --resume of the model would count the epochs after it as done). One no score
        // of this run matches is the earlier run's this one resumed: the epochs its scorer
        // wrote into it.
        kept_epochs = best.epoch;
        for (const ScoreRecord& score : summary.scores)
          if (score.step == best.step) {
            kept_epochs = score.epochs;
            break;
          }
      }
    }
    // Diverged, with no finite best to keep: the run fails saying so. No model file: no reader
    // would take it.
    if (!parameters_finite(model)) {
      const std::string not_written =
          options_.model_out.empty() ? "" : "; " + options_.model_out + " was not written";
      throw InputError("training diverged: the final parameters are not finite (try a lower "
                       "learning rate)" + not_written);
    }
    if (!options_.model_out.empty()) {
      Checkpoint checkpoint;
      checkpoint.model = model;
      // Adam's moments live in the servers' shard checkpoints (checkpoint_dir); this file holds
      // the parameters, for `tandem eval`, `--init` and prediction.
      checkpoint.optimizer = options_.settings.optimizer;
      mark_parameters_only(checkpoint);
      checkpoint.step = summary.kept_step;
      checkpoint.epoch = kept_epochs;
      checkpoint.seed = options_.settings.seed;
      checkpoint.batch = options_.settings.batch;
      checkpoint.extra["source"] = "tandem cluster run (" + std::to_string(options_.workers) +
                                   " workers, " + std::to_string(options_.ps) +
                                   " parameter servers)";
      checkpoint.extra["trained_with"] = to_string(options_.settings.optimizer.kind);
      checkpoint.extra["stop_reason"] = summary.stop_reason;
      save_checkpoint(options_.model_out, checkpoint);
      summary.model_path = options_.model_out;
    }
    if (eval_splits_.test.rows() > 0)
      summary.test = evaluate_model(model, eval_splits_.test.view(), options_.test_threads);
  } catch (...) {
    stop_servers();
    throw;
  }

  stop_servers();
  return summary;
}

Model pull_cluster_model(const Coordinator& coordinator, const RunSettings& settings,
                         std::shared_ptr<const std::atomic<bool>> cancel) {
  if (coordinator.phase() == ClusterPhase::Done)
    throw Error("the run is finished and its servers have exited: pull_model() before finish()");
  if (coordinator.phase() == ClusterPhase::Failed)
    throw Error("the run failed (" + coordinator.failure() + ") and its servers have been told to "
                "exit: nothing to pull");
  const std::vector<std::string> endpoints = coordinator.ps_endpoints();
  if (endpoints.empty()) throw Error("no parameter server is serving: nothing to pull");
  ClientOptions options = cluster_client_options(settings, nullptr);
  options.cancel = std::move(cancel);
  PsClient client(endpoints, options);
  Model model(settings.model);
  // An empty init is a pull that also learns the servers' layout (a fresh client must).
  model.parameters() = client.init({}).wait().tensors;
  return model;
}

}  // namespace tandem
