// The cluster subcommands: `tandem launch` (a coordinator plus every role on this machine, as
// processes or with --inproc as threads), `tandem coordinator` (the coordinator alone; roles join
// from anywhere), the roles `tandem ps|worker|scorer --coordinator ADDR`, and `tandem scores`
// (follow the scores channel).
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "json_text.h"
#include "number_checks.h"
#include "backend.h"
#include "bind_address.h"
#include "chunk_manager.h"
#include "cluster_commands.h"
#include "data_store_of.h"
#include "cluster_link.h"
#include "cluster_metrics.h"
#include "cluster_ranks.h"
#include "cluster_resume.h"
#include "cluster_run.h"
#include "dashboard_server.h"
#include "dataset_store.h"
#include "file_io.h"
#include "hidden_widths.h"
#include "json_fields.h"
#include "json_output.h"
#include "metrics_log.h"
#include "process_launcher.h"
#include "progress_line.h"
#include "run_dir_lock.h"
#include "run_records.h"
#include "score_subscriber.h"
#include "seconds_to_ms.h"
#include "stop_signals.h"
#include "tandem/tandem.h"
#include "tensorboard_writer.h"
#include "worker_gpus.h"
#include "zmq_curve.h"

namespace tandem::cli {

namespace {

using nlohmann::json;

// The validation-loss target the default run stops at: the seed's model on Fashion-MNIST
// (summed clipped cross-entropy over the 5,000 validation images). See README, "Choosing --target".
constexpr double kDefaultTarget = 1750.0;

struct ClusterCommandOptions {
  std::string data = default_data_dir();
  std::string run_dir = "tandem-run";
  std::string hidden = "100";
  std::string optimizer = "adam";
  std::string shuffle = "on";
  std::string keep = "best";
  std::string bind = "tcp://127.0.0.1:*";
  std::string scores_bind;  // empty: beside bind (scores_bind_beside)
  std::string advertise_host;
  bool inproc = false;
  bool resume = false;
  int64_t resumed_step = -1;    // with --resume: the servers' (lowest) step to resume at
  std::string resume_note;      // with --resume: said once nothing can refuse the run
  std::string rendezvous_file;  // tandem rank: where rank 0 says where it listens
  std::string rendezvous_job;
  bool json_summary = false;
  bool quiet = false;
  double checkpoint_every_s = 30;
  int dashboard_port = 8787;
  std::string dashboard_host = "127.0.0.1";
  std::string tensorboard_dir;  // default RUN_DIR/tensorboard
  std::string metrics_path;     // default RUN_DIR/metrics.jsonl
  int startup_timeout_s = 60;
  std::string worker_gpus;                // launch --worker-gpus "0,1;2,3"
  CLI::Option* group_option = nullptr;    // --group-members/--gpus-per-worker (was it given?)
  ClusterOptions cluster;
};

void add_cluster_options(CLI::App* cmd, ClusterCommandOptions& o) {
  RunSettings& s = o.cluster.settings;
  cmd->add_option("--data", o.data,
                  "Dataset store (tandem prepare), or a directory of IDX files (prepared into "
                  "RUN_DIR/data.zarr first)")->capture_default_str();
  cmd->add_option("--ps", o.cluster.ps, "Parameter servers")->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--workers", o.cluster.workers, "Workers")->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--scorer", o.cluster.scorers, "Scorers (0 or 1)")->check(CLI::Range(0, 1))
      ->capture_default_str();
  cmd->add_option("--target", o.cluster.target,
                  "Stop when the validation loss (summed over the validation split) is below this; "
                  "0: off")->check(non_negative_number())->capture_default_str();
  cmd->add_option("--max-epochs", o.cluster.max_epochs, "Stop after this many epochs (0: no limit)")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--max-seconds", o.cluster.max_seconds, "Stop after this long (0: no limit)")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--run-dir", o.run_dir,
                  "Where the final model, the servers' checkpoints and a prepared store go")
      ->capture_default_str();
  cmd->add_option("--batch", s.batch, "Batch size")->check(positive_number())->capture_default_str();
  cmd->add_option("--hidden", o.hidden, "Hidden layer widths, e.g. 100, 256,128 or 256x128")
      ->capture_default_str();
  cmd->add_option("--optimizer", o.optimizer, "adam or sgd")->check(CLI::IsMember({"adam", "sgd"}))
      ->capture_default_str();
  cmd->add_option("--lr", s.optimizer.learning_rate, "Learning rate")->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--seed", s.seed, "Seed for initialisation and shuffling")
      ->check(unsigned_integer())->capture_default_str();
  cmd->add_option("--shuffle", o.shuffle, "on, or off for store order")
      ->check(CLI::IsMember({"on", "off"}))->capture_default_str();
  cmd->add_option("--backend", s.backend, "Workers' and scorer's backend: cpu, cuda or auto")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  cmd->add_option("--precision", s.precision, "CUDA matrix products: fp32, tf32 or bf16")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))->capture_default_str();
  cmd->add_option("--worker-threads", s.worker_threads, "Threads per worker")
      ->check(positive_number())->capture_default_str();
  // One option, two names: the GPU name the issue asks for, and the general one that reads right
  // on the CPU (there each member is a backend of --worker-threads threads).
  o.group_option =
      cmd->add_option("--group-members,--gpus-per-worker", s.worker_group,
                      "Members of each worker's group: their gradients are summed and pushed as "
                      "one (with cuda each member a GPU, and under launch each worker its own: "
                      "worker i on GPUs i*N..i*N+N-1; with cpu a backend of --worker-threads "
                      "threads each)")
          ->check(positive_number())->capture_default_str();
  cmd->add_option("--memory-budget", s.memory_budget_mib,
                  "MiB of the store's chunks each worker reads ahead (two of its chunk rows at "
                  "least)")
      ->check(number_in(1, double(kMaxMemoryBudgetMib), false, "MIB"))->capture_default_str();
  cmd->add_option("--scorer-threads", s.scorer_threads, "Threads of the scorer")
      ->check(positive_number())->capture_default_str();
  cmd->add_option("--score-interval", s.score_interval_s, "Seconds between scores")
      ->check(number_in(0, kMaxIntervalSeconds, true, "SECONDS"))->capture_default_str();
  cmd->add_option("--ps-mode", s.ps_mode,
                  "sync (gradients of every worker averaged per step), async (the seed's: each "
                  "applied as it comes) or bounded_staleness")
      ->check(CLI::IsMember({"async", "sync", "bounded_staleness"}))->capture_default_str();
  cmd->add_option("--ps-device", s.ps_device,
                  "Parameter servers' shards and Adam state: on the GPU (cuda), in host memory "
                  "(cpu), or on the GPU when there is one (auto)")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))->capture_default_str();
  cmd->add_flag("--overlap", s.overlap,
                "Workers compute the next gradient while the last one's exchange travels "
                "(async and bounded_staleness modes)");
  cmd->add_option("--replicas", s.replicas_to_aggregate,
                  "Sync mode: gradients per step (0: one per worker)")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--staleness", s.staleness_bound,
                  "Bounded staleness: steps (pushes) a worker may lead the slowest by")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--checkpoint-every", o.checkpoint_every_s,
                  "Seconds between the servers' checkpoints (0: only at the end)")
      ->check(number_in(0, 1e7, false, "SECONDS"))->capture_default_str();
  cmd->add_option("--checkpoint-every-steps", s.checkpoint_every_steps,
                  "Also a checkpoint each time a server's step crosses a multiple of this (0: off)")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--keep", o.keep,
                  "Parameters to keep: best (the lowest score's, unless the last ones score lower) or "
                  "last (the servers' at the stop)")
      ->check(CLI::IsMember({"best", "last"}))->capture_default_str();
  cmd->add_option("--ps-timeout", s.ps_timeout_ms,
                  "Milliseconds a worker waits for a parameter server's answer before it retries")
      ->check(positive_number())->capture_default_str();
  cmd->add_option("--ps-spin-us", s.ps_spin_us,
                  "Microseconds a worker looks for a parameter server's answer without sleeping "
                  "before it blocks (0: blocks at once). On a VM whose idle vCPUs halt, about 300 "
                  "shortens each exchange by the wake-up (bench/RESULTS.md), at a core's time")
      ->check(number_in(0, 1e6, false, "MICROSECONDS"))->capture_default_str();
  cmd->add_option("--step-timeout", s.step_timeout_s,
                  "Seconds a worker's backend may stay in one call (a step; a hung GPU) before "
                  "the coordinator counts the worker lost and hands its batches on (0: never)")
      ->check(number_in(0, 1e7, false, "SECONDS"))->capture_default_str();
  cmd->add_option("--bind", o.bind, "The coordinator's control address")
      ->check(bind_address())->capture_default_str();
  cmd->add_option("--scores-bind", o.scores_bind,
                  "The scores channel's address (default: --bind's host, any port)")
      ->check(bind_address());
  cmd->add_option("--startup-timeout", o.startup_timeout_s,
                  "Seconds to wait for every role to register")
      ->check(number_in(0, 2e6, true, "SECONDS"))
      ->capture_default_str();
  cmd->add_option("--dashboard", o.dashboard_port,
                  "The dashboard's HTTP port (0: any free port, -1: none); a busy port falls back "
                  "to any free one")
      ->check(number_in(-1, 65535, false, "PORT"))->capture_default_str();
  cmd->add_option("--dashboard-host", o.dashboard_host, "The dashboard's address")->capture_default_str();
  cmd->add_option("--tensorboard", o.tensorboard_dir,
                  "TensorBoard event files go here (default RUN_DIR/tensorboard)");
  cmd->add_option("--metrics", o.metrics_path,
                  "JSON lines: every score and a cluster line a second (default RUN_DIR/metrics.jsonl)");
  cmd->add_option("--curve-secret", s.curve_secret_file,
                  "Secure the run with CURVE (the parameter servers and the coordinator's control "
                  "and scores channels): the secret key file (tandem keygen)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--curve-allowed", s.curve_allowed_path,
                  "Client public keys the servers and coordinator admit: a key file, a file of "
                  "keys, or a directory of *.key")
      ->check(CLI::ExistingPath);
  cmd->add_option("--curve-client-secret", s.curve_client_file,
                  "The roles' key file (default: a throwaway key each; needed with --curve-allowed)")
      ->check(CLI::ExistingFile);
  cmd->add_flag("--resume", o.resume,
                "Continue from the servers' newest checkpoints in RUN_DIR with the epoch after "
                "those they come after (default: start fresh); --max-epochs counts the run's "
                "epochs in all");
  cmd->add_flag("--json", o.json_summary, "Print a one-line JSON summary");
  cmd->add_flag("--quiet", o.quiet, "No score lines, only the summary");
}

// A file a parameter server writes in the checkpoint directory: a shard's checkpoint, or the
// temporary file of one a killed server left.
bool server_checkpoint_file(const std::string& name) {
  const std::string target = target_of_temp_name(name);
  return shard_checkpoint_name(target.empty() ? name : target).has_value();
}

bool tensorboard_events_file(const std::string& name) {
  return name.rfind("events.out.tfevents.", 0) == 0;
}

// An earlier run's files in `dir`, those `ours` names (the directory too, once empty): a file of
// the user's there (notes, a model kept by hand) stays, and its directory with it. IoError when
// one cannot be removed: a server checkpoint left would be resumed from by the fresh run.
void remove_earlier_runs_files(const std::string& dir, bool (*ours)(const std::string&)) {
  std::error_code ec;
  std::vector<std::filesystem::path> earlier;
  std::filesystem::directory_iterator it(dir, ec), end;
  for (; !ec && it != end; it.increment(ec)) {
    std::error_code kind;
    if (!it->is_directory(kind) && ours(it->path().filename().string()))
      earlier.push_back(it->path());
  }
  if (ec && ec != std::errc::no_such_file_or_directory)
    throw IoError("cannot list " + dir + " to remove the earlier run's files: " + ec.message());
  for (const std::filesystem::path& file : earlier)
    if (!std::filesystem::remove(file, ec) && ec)
      throw IoError("cannot remove the earlier run's " + file.string() + ": " + ec.message());
  std::filesystem::remove(dir, ec);  // (not when it holds anything)
}

// TensorBoard shows the event files of one directory as one run: a fresh run writing beside an
// earlier run's files would draw both as one curve, stepping back and forth. The default
// directory is cleared (it is the run's own); a directory given is the user's, so it is refused.
void refuse_other_runs_events(const std::string& dir) {
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    if (tensorboard_events_file(it->path().filename().string()))
      throw InputError("--tensorboard " + dir + " holds another run's event files (" +
                       it->path().filename().string() + "), which TensorBoard would draw as "
                       "one curve with this run's: give a new directory (TensorBoard shows each "
                       "subdirectory of its --logdir as a run), or --resume to continue that run");
}

// Resolves --data (an IDX directory is prepared into the run directory once) and fills the rest
// of the settings from the options and the store.
void resolve(ClusterCommandOptions& o) {
  RunSettings& s = o.cluster.settings;
  s.checkpoint_dir = std::filesystem::absolute(o.run_dir + "/checkpoints").string();
  // Asked to continue with nothing to continue from (a mistyped --run-dir, a first run): said
  // before anything is prepared or started, instead of quietly training from scratch.
  if (o.resume) require_server_checkpoint(s.checkpoint_dir, "--resume");
  // First too: refused, a fresh run must have removed nothing (its checkpoints) nor prepared
  // anything, so that the --resume the message offers still can continue the run.
  if (!o.resume && !o.tensorboard_dir.empty()) refuse_other_runs_events(o.tensorboard_dir);
  s.data = std::filesystem::absolute(data_store_of(o.data, o.run_dir, "tandem launch")).string();
  // Absolute: the roles may run elsewhere. (Checked, with the servers' public key derived, by
  // check_cluster_options.)
  for (std::string* path : {&s.curve_secret_file, &s.curve_allowed_path, &s.curve_client_file})
    if (!path->empty()) *path = std::filesystem::absolute(*path).string();
  const DatasetStore store = DatasetStore::open(s.data);
  s.model = model_with_hidden(store.train.features, o.hidden, store.num_classes);
  s.optimizer.kind = parse_optimizer(o.optimizer);
  if (o.resume) {
    const ResumePoint point = resume_point_of_run(s, o.cluster.ps, "--resume");
    o.resumed_step = point.step;
    o.cluster.first_epoch = point.epochs;
    o.cluster.resumed = true;
    o.resume_note = resume_note(point, o.cluster.max_epochs, "--max-epochs", true);
  }
  s.shuffle = o.shuffle == "on";
  s.checkpoint_every_s = o.checkpoint_every_s;
  if (s.replicas_to_aggregate == 0) s.replicas_to_aggregate = o.cluster.workers;
  o.cluster.model_out = o.run_dir + "/model.safetensors";
  s.best_model_path = std::filesystem::absolute(o.run_dir + "/best-score.safetensors").string();
  o.cluster.keep_best = o.keep == "best";
  o.cluster.inproc = o.inproc;
  o.cluster.bind = o.bind;
  // Beside the control socket unless told: `tandem coordinator --bind tcp://0.0.0.0:PORT` serves
  // other nodes, and a scores channel left on 127.0.0.1 sent their `tandem scores` to their own
  // loopback, where nothing answered.
  o.cluster.scores_bind = o.scores_bind.empty() ? scores_bind_beside(o.bind) : o.scores_bind;
  o.cluster.advertise_host = o.advertise_host;
  o.cluster.startup_timeout_ms = o.startup_timeout_s * 1000;
}

// Called once every check that can refuse the run has passed: a refused command leaves the
// previous run's files as they were. A restarted server resumes from the checkpoints within a
// run; a new run starts fresh unless asked (and its TensorBoard curves start afresh too, in the
// default directory).
void clear_previous_run(const ClusterCommandOptions& o) {
  // The old spec names the old run's ports (`tandem scores --coordinator RUN/cluster.json` would
  // follow them), whether or not this run resumes it: this one is written when training starts.
  std::filesystem::remove(o.run_dir + "/cluster.json");
  // Said when it removes a run's checkpoints: a rerun that meant to continue them (--resume left
  // out) loses them, and should know at once.
  const std::string& checkpoints = o.cluster.settings.checkpoint_dir;
  if (!o.resume && holds_server_checkpoint(checkpoints))
    std::fprintf(stderr, "tandem: a fresh run: the previous run's checkpoints in %s are removed "
                         "(--resume would have continued that run)\n", checkpoints.c_str());
  if (o.resume) return;
  remove_earlier_runs_files(checkpoints, server_checkpoint_file);
  if (o.tensorboard_dir.empty())
    remove_earlier_runs_files(o.run_dir + "/tensorboard", tensorboard_events_file);
  // (The earlier run's model and best-score model go when the coordinator starts serving:
  // ClusterRun::run.)
}

// Fails now where the metrics log, written in place (appended to, or created), could not be
// opened later, after the previous run's files were cleared: the file if it exists (/dev/null,
// a FIFO and a file in a read-only directory included), else its directory.
void check_writable_in_place(const std::string& path) {
  const bool exists = ::access(path.c_str(), F_OK) == 0;
  const std::string target = exists ? path : parent_directory(path);
  if (::access(target.c_str(), W_OK) != 0)
    throw IoError("cannot write metrics file " + path + ": " + std::strerror(errno));
}

// launch's GPUs for its workers (worker_gpus.h), into o.cluster.worker_gpus. Only when the
// workers run on CUDA and --gpus-per-worker (--group-members) or --worker-gpus was given: then
// worker i gets its own GPUs, refused at once when the node has too few. Otherwise nothing is
// assigned and each worker's member m takes GPU m, as before. A cuda run on a node without a
// usable CUDA device is refused here, with the backend's own error, rather than by every worker.
void assign_worker_gpus(ClusterCommandOptions& o) {
  RunSettings& s = o.cluster.settings;
  const WorkerGpus lists = parse_worker_gpus(o.worker_gpus);  // its errors come first, GPU or not
  const bool group_given = o.group_option != nullptr && o.group_option->count() > 0;
  if (!lists.empty() && !group_given) s.worker_group = int(lists[0].size());
  if (!lists.empty() && s.backend == "cpu")
    throw InputError("--worker-gpus needs --backend cuda or auto; this run's is cpu");
  const int devices = s.backend == "cpu" ? 0 : visible_cuda_devices();
  if (s.backend == "cuda" && devices == 0)  // throws "--backend cuda: no usable CUDA device ..."
    make_backend(BackendKind::Cuda, s.model, s.optimizer, 1, parse_precision(s.precision), 0);
  if (!lists.empty() && devices == 0)
    throw InputError("--worker-gpus: this node has no usable CUDA device (--backend auto would "
                     "train on the CPU)");
  if (devices == 0 || (!group_given && lists.empty())) return;
  o.cluster.worker_gpus = tandem::assign_worker_gpus(o.cluster.workers, s.worker_group, devices, lists);
}

// The kept parameters' evaluation, which only the terminal had: the metrics log's last record
// and TensorBoard scalars at the kept step (nothing for a run stopped before training).
void log_final_evaluation(const ClusterSummary& s, RunRecords& records) {
  if (s.kept == "none") return;
  records.metrics(json{{"type", "final"}, {"stop_reason", s.stop_reason}, {"kept", s.kept},
                       {"kept_step", s.kept_step}, {"validation", to_json(s.validation)},
                       {"test", to_json(s.test)}});
  if (s.validation.samples > 0) {  // none without a validation split
    records.scalar("final/validation_loss", s.kept_step, float(s.validation.loss_sum));
    records.scalar("final/validation_accuracy", s.kept_step, float(s.validation.accuracy));
  }
  if (s.test.samples > 0) {
    records.scalar("final/test_loss", s.kept_step, float(s.test.loss_sum));
    records.scalar("final/test_accuracy", s.kept_step, float(s.test.accuracy));
  }
}

void print_summary(const ClusterCommandOptions& o, const ClusterSummary& s) {
  const double best = s.scores.empty() ? NAN : s.scores.back().loss;
  if (o.json_summary) {
    json j{{"stop_reason", s.stop_reason}, {"seconds", s.seconds}, {"epochs", s.epochs},
           {"batches", s.batches}, {"gradients_lost", s.gradients_lost}, {"steps", s.steps},
           {"samples", s.samples},
           {"samples_per_s", s.seconds > 0 ? double(s.samples) / s.seconds : 0.0},
           {"ps", o.cluster.ps}, {"workers", o.cluster.workers}, {"scores", s.scores.size()},
           {"final_score", s.scores.empty() ? json(nullptr) : json(best)},
           {"validation", to_json(s.validation)}, {"test", to_json(s.test)},
           {"model", s.model_path}, {"kept", s.kept}, {"kept_step", s.kept_step}};
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  if (s.kept == "none") {
    std::printf("stopped (%s) before training began: no model\n", s.stop_reason.c_str());
    return;
  }
  std::printf("stopped (%s) after %.1f s: %lld epochs, %lld batches, %lld steps on the servers\n",
              s.stop_reason.c_str(), s.seconds, static_cast<long long>(s.epochs),
              static_cast<long long>(s.batches), static_cast<long long>(s.steps));
  if (s.gradients_lost > 0)
    // (Not only a restarted server: a worker frozen or restarted mid-exchange, whose push a
    // sync server dropped as stale or whose answer never came, loses its batch's gradient too.)
    std::printf("%lld of those batches lost their gradients (a parameter server did not answer "
                "their push, or dropped it as stale); they were not trained again\n",
                static_cast<long long>(s.gradients_lost));
  if (!s.scores.empty())
    std::printf("newest score: validation loss %.1f, accuracy %.4f (%zu scores)\n", best,
                s.scores.back().accuracy, s.scores.size());
  // A split the store lacks is said as missing: its zeros read as a perfect loss.
  if (s.validation.samples > 0)
    std::printf("kept parameters:  validation loss %.1f (%.4f/sample), accuracy %.4f\n",
                s.validation.loss_sum, s.validation.loss_mean, s.validation.accuracy);
  else
    std::printf("kept parameters:  no validation split\n");
  if (s.test.samples > 0)
    std::printf("                  test loss %.1f (%.4f/sample), accuracy %.4f\n",
                s.test.loss_sum, s.test.loss_mean, s.test.accuracy);
  else
    std::printf("                  no test split\n");
  if (!s.model_path.empty())
    std::printf("model saved to %s (%s)\n", s.model_path.c_str(),
                s.kept == "best" ? ("the parameters of the lowest score, step " +
                                    std::to_string(s.kept_step)).c_str()
                                 : "the servers' parameters at the stop");
}

// The dashboard binds before the run's coordinator is made, and before the previous run's files
// go (ClusterRun's constructor removes its best model): a --dashboard-host that is not this
// machine's refuses the run with them kept. Until `coordinator` is set its state is empty.
std::unique_ptr<DashboardServer> start_dashboard(
    const ClusterCommandOptions& o, const std::atomic<const Coordinator*>& coordinator) {
  if (o.dashboard_port < 0) return nullptr;
  auto state = [&coordinator] {
    const Coordinator* c = coordinator.load();
    return c ? wire_text(c->state()) : std::string("{}");  // NaN as null, bad UTF-8 replaced
  };
  auto metrics = [&coordinator] {
    const Coordinator* c = coordinator.load();
    return c ? prometheus_from_state(c->state()) : std::string();
  };
  try {
    return std::make_unique<DashboardServer>(DashboardOptions{o.dashboard_host, o.dashboard_port},
                                             state, metrics);
  } catch (const Error& e) {
    // Only a port in use is worth another: a host that is not this machine's, or does not
    // resolve, fails on any port.
    if (o.dashboard_port == 0 ||
        std::string(e.what()).find(std::strerror(EADDRINUSE)) == std::string::npos)
      throw;
    // Like Dask's :8787: a second cluster on this machine gets another port, with a word.
    std::fprintf(stderr, "%s; serving the dashboard on another port\n", e.what());
    return std::make_unique<DashboardServer>(DashboardOptions{o.dashboard_host, 0}, state, metrics);
  }
}

// Said, not refused (a cluster on a network of its own is the common case): what a process that
// reaches the run's sockets from another machine can do. Without CURVE: register as a role,
// read the settings, stop the run, pose as a parameter server before training starts, shut one
// down. Under CURVE without an allowed list: the same, for any client that knows the public key,
// which cluster.json holds. The dashboard is plain HTTP whatever the run's keys.
void warn_of_open_sockets(const ClusterCommandOptions& o) {
  const RunSettings& s = o.cluster.settings;
  std::string open;  // the run's addresses other machines reach
  for (const std::string* address : {&o.cluster.bind, &o.cluster.scores_bind})
    if (!address->empty() && !transport::binds_this_machine_only(*address))
      open += (open.empty() ? "" : ", ") + *address;
  if (!open.empty() && s.curve_secret_file.empty())
    std::fprintf(stderr, "tandem: warning: the run serves other machines (%s) without CURVE: "
                 "any process that reaches it can join it as a role, read its settings or "
                 "stop it (--curve-secret and --curve-allowed admit only known keys)\n",
                 open.c_str());
  else if (!open.empty() && s.curve_allowed_path.empty())
    std::fprintf(stderr, "tandem: warning: the run serves other machines (%s) under CURVE "
                 "without --curve-allowed: any client that knows its public key (cluster.json "
                 "holds it) is admitted\n", open.c_str());
  if (o.dashboard_port >= 0 && !transport::is_loopback_host(o.dashboard_host))
    std::fprintf(stderr, "tandem: warning: the dashboard on %s serves other machines: plain "
                 "HTTP%s, whoever reaches it reads the run's state and scores\n",
                 o.dashboard_host.c_str(), s.curve_secret_file.empty() ? "" : ", outside CURVE");
}

// The arguments that let launch's role processes reach a coordinator under CURVE.
std::vector<std::string> role_curve_args(const ClusterCommandOptions& o) {
  const RunSettings& s = o.cluster.settings;
  if (s.curve_secret_file.empty()) return {};
  // The secret file gives its public half; the processes run on this machine.
  std::vector<std::string> args{"--curve-server", s.curve_secret_file};
  if (!s.curve_client_file.empty()) {
    args.push_back("--curve-client-secret");
    args.push_back(s.curve_client_file);
  }
  return args;
}

void run_cluster(ClusterCommandOptions& o, bool launch_roles) {
  // Before anything is started: a stop signal stops the run in order, a closed pipe on stdout
  // (`tandem launch | head`) fails a write instead of killing the run before it saves its
  // model (stop_on_signals ignores SIGPIPE), and Ctrl-Z does not suspend the coordinator alone.
  stop_on_signals();
  refuse_to_suspend();
  check_data_exists(o.data);  // before --run-dir is made: a mistyped --data leaves nothing behind
  refuse_store_as_output(o.run_dir, "--run-dir");
  // Locked before the previous run's files are cleared; made, then removed again if the run
  // is refused.
  LockedOutputDirectory run_dir(o.run_dir, "--run-dir",
                                {"cluster.json", "coordinator.address", "model.safetensors",
                                 "best-score.safetensors"});
  resolve(o);
  const RunSettings& rs = o.cluster.settings;
  // launch starts all its workers: each step of one worker's gradient each, more never come (the
  // servers would wait out their step timeout at the start, then take what is there).
  if (launch_roles && rs.ps_mode == "sync" && rs.replicas_to_aggregate > o.cluster.workers)
    throw InputError("--replicas " + std::to_string(rs.replicas_to_aggregate) + " is more than " +
                     "the " + std::to_string(o.cluster.workers) + " workers this launch starts " +
                     "(a sync step takes at most one gradient from each)");
  if (launch_roles) assign_worker_gpus(o);
  // Every check that can refuse the run comes before the previous run's files are cleared, and
  // before its log is truncated or its events added to: a refused launch leaves them as they
  // were.
  const DatasetStore store = check_cluster_options(o.cluster);
  warn_of_open_sockets(o);
  const std::string tensorboard_dir =
      o.tensorboard_dir.empty() ? o.run_dir + "/tensorboard" : o.tensorboard_dir;
  const std::string metrics_path =
      o.metrics_path.empty() ? o.run_dir + "/metrics.jsonl" : o.metrics_path;
  check_writable_in_place(metrics_path);
  if (!o.tensorboard_dir.empty()) {
    create_output_directory(tensorboard_dir, "--tensorboard");
    check_replaceable(tensorboard_dir + "/events");
  }
  // The coordinator binds here (an address in use, too many servers for the model or an
  // unreadable allowed-keys file refuse the run with the files kept) and answers only from
  // run.run(): the files are cleared in between, before a role started by hand and waiting for
  // it can find the old checkpoints.
  o.cluster.serve_from_run = true;
  std::atomic<const Coordinator*> page_coordinator{nullptr};
  std::unique_ptr<DashboardServer> dashboard = start_dashboard(o, page_coordinator);
  ClusterRun run(o.cluster, store);
  page_coordinator = &run.coordinator();
  // The dashboard stops before the run (and its coordinator) goes, whichever way this ends.
  struct StopFirst {
    std::unique_ptr<DashboardServer>& dashboard;
    ~StopFirst() { dashboard.reset(); }
  } stop_first{dashboard};
  // A resumed run adds to the log of the run it continues (the records past its servers' step,
  // of what it trains again now, dropped), as it does to its TensorBoard events. Opened (its
  // lock taken: another run writing the file refuses this one) before the previous run's files
  // are cleared, after everything else that can refuse the run.
  MetricsLog metrics(metrics_path, o.resume, o.resumed_step);
  std::fputs(o.resume_note.c_str(), stderr);
  clear_previous_run(o);
  run_dir.keep();
  ProgressLine progress;
  size_t scores_shown = 0;
  TensorBoardWriter tensorboard(tensorboard_dir);
  RunRecords records(metrics, tensorboard);
  auto last_metrics = std::chrono::steady_clock::now();
  // Once a second, and once at the end (failed or not): the workers' and the servers' figures.
  const auto cluster_record = [](const json& state) {
    const json& cl = state["cluster"];
    json record{{"type", "cluster"}, {"state", cl["state"]}, {"elapsed_s", cl["elapsed_s"]},
                {"t", cl["t"]}, {"epoch", cl["epoch"]}, {"step", cl["step"]},
                {"samples_per_s", cl["samples_per_s"]}, {"workers", state["workers"]},
                {"servers", state["servers"]}};
    // A failed run's last record says why (it said only "failed").
    if (cl.value("state", std::string()) == "failed") record["failure"] = cl["failure"];
    return record;
  };
  // SIGINT, SIGTERM or SIGHUP (a closed terminal) stop training; the run ends as by its stop
  // rule (the final parameters saved and evaluated, the roles told to exit).
  const std::atomic<bool>& stop = stop_on_signals();
  double training_started_wall = 0.0;  // seconds since the epoch; 0: not announced yet
  auto on_training = [&](const json& announced) {
    training_started_wall = wall_clock_seconds();
    json spec = announced;
    // Each worker's GPUs, where launch assigned them (worker i is named "worker<i>").
    const WorkerGpus& gpus = o.cluster.worker_gpus;
    for (json& w : spec["worker"])
      for (size_t i = 0; i < gpus.size(); ++i)
        if (w.value("name", std::string()) == "worker" + std::to_string(i)) w["gpus"] = gpus[i];
    // Public: lets `tandem scores` and roles given this file find the run's key.
    if (!o.cluster.settings.curve_server_public.empty())
      spec["curve_public_key"] = o.cluster.settings.curve_server_public;
    if (dashboard) spec["dashboard"] = dashboard->url();
    if (!o.json_summary) {
      progress.clear();  // else the spec went on after "... starting" on a terminal
      std::printf("%s\n", json_text(spec).c_str());
    }
    std::fflush(stdout);
    // The spec as a file too: roles and `tandem scores` take it for --coordinator.
    write_text_atomic(o.run_dir + "/cluster.json", json_text(spec, 2) + "\n");
  };
  // Each score once, in order, to TensorBoard, the metrics log and the terminal. TensorBoard's
  // points carry the time the score was taken (training's start, as this side saw it announced,
  // plus the score's own time), not the time it was drawn here, up to a tick later.
  // The cluster's samples/s at the newest tick of training; not known until a worker's
  // heartbeat has counted samples (a score taken before that would otherwise show a throughput
  // of 0). Kept once training is over: the workers gone, the rate falls to 0, and the last
  // score, drawn while the run drains, would show that.
  double rate = 0.0;
  bool rate_known = false;
  auto show_scores = [&](const std::vector<ScoreRecord>& new_scores) {  // those after scores_shown
    for (const ScoreRecord& s : new_scores) {
      ++scores_shown;
      const double wall =
          training_started_wall > 0 ? training_started_wall + s.t : wall_clock_seconds();
      records.scalar("score/validation_loss", s.step, float(s.loss), wall);
      records.scalar("score/validation_accuracy", s.step, float(s.accuracy), wall);
      if (rate_known) records.scalar("throughput/samples_per_s", s.step, float(rate), wall);
      records.flush_tensorboard();
      json record{{"type", "score"}, {"t", s.t}, {"step", s.step}, {"loss", s.loss},
                  {"loss_mean", s.loss_mean}, {"accuracy", s.accuracy}};
      if (rate_known) record["samples_per_s"] = rate;
      records.metrics(record);
      if (!o.quiet && !o.json_summary) {
        char line[200];
        std::snprintf(line, sizeof(line), "%7.1f s  step %6lld  validation loss %8.1f  accuracy %.4f",
                      s.t, static_cast<long long>(s.step), s.loss, s.accuracy);
        progress.print_line(line);
      }
    }
  };
  auto on_tick = [&](const Coordinator& c) {
    if (stop.load()) const_cast<Coordinator&>(c).request_stop("interrupted");
    // Ten times a second, for the run's life: neither the dashboard's score points nor the
    // whole score log (a copy of each once made a days-long run's coordinator busy).
    const json state = c.state(/*with_scores=*/false);
    const json& cl = state["cluster"];
    if (cl.value("state", std::string()) == "training") rate = cl.value("samples_per_s", 0.0);
    for (const json& w : state["workers"]) rate_known |= w.value("steps", int64_t{0}) > 0;
    show_scores(c.scores_since(scores_shown));
    if (std::chrono::steady_clock::now() - last_metrics > std::chrono::seconds(1)) {
      last_metrics = std::chrono::steady_clock::now();
      records.metrics(cluster_record(state));
    }
    progress.update("epoch " + std::to_string(cl.value("epoch", int64_t{0})) + "  step " +
                    std::to_string(cl.value("step", int64_t{0})) + "  " +
                    human(cl.value("samples_per_s", 0.0)) + " samples/s  " + cl.value("state", std::string()));
  };
  run.set_callbacks(on_training, on_tick);
  // On stderr with --json too (stdout is then the summary's alone): the one place that says
  // where to reach the run before it writes cluster.json.
  std::fprintf(stderr, "coordinator at %s, scores at %s\n", run.coordinator().endpoint().c_str(),
               run.coordinator().scores_endpoint().c_str());
  if (!o.rendezvous_file.empty())
    write_rendezvous(o.rendezvous_file, run.coordinator().endpoint(), o.rendezvous_job);
  // Gone with this coordinator, however its run ends (remove_rendezvous).
  const struct RendezvousRemoval {
    std::string path, address, job;
    ~RendezvousRemoval() {
      if (!path.empty()) remove_rendezvous(path, address, job);
    }
  } rendezvous_removal{o.rendezvous_file, run.coordinator().endpoint(), o.rendezvous_job};
  // (A port of its own choosing when the one asked for was taken: said here, and in the spec.)
  if (dashboard) std::fprintf(stderr, "dashboard at %s\n", dashboard->url().c_str());
  std::unique_ptr<ProcessLauncher> launcher;
  if (launch_roles && !o.inproc) {
    char self[4096] = {};
    const ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) throw Error("cannot find the tandem binary (/proc/self/exe) to start the roles");
    launcher = std::make_unique<ProcessLauncher>(std::string(self, size_t(n)), role_curve_args(o));
    for (size_t i = 0; i < o.cluster.worker_gpus.size(); ++i)
      launcher->set_role_args("worker" + std::to_string(i),
                              {"--gpus", gpu_list(o.cluster.worker_gpus[i])});
  }
  // A dashboard open in a browser is shown how the run ended (done, or failed and why) before
  // it goes with this process.
  const auto serve_the_end = [&] {
    if (dashboard) dashboard->serve_the_end(std::chrono::seconds(3));
  };
  ClusterSummary summary;
  try {
    summary = run.run(launcher.get());
  } catch (const std::exception& e) {
    run.coordinator().fail(e.what());  // (a no-op when the run failed already) for the page
    records.metrics(cluster_record(run.coordinator().state(/*with_scores=*/false)));
    serve_the_end();
    // Roles started by hand (on other nodes) learn of the failure from the replies to their
    // heartbeats (every 0.5 s): without a dashboard's wait, serve them three before leaving, or
    // they would only find the coordinator gone 15 s later, without the reason.
    if (!dashboard) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    throw;
  }
  // A score the scorer published after the last tick: the curves hold every score the summary
  // counts.
  if (scores_shown < summary.scores.size())
    show_scores({summary.scores.begin() + static_cast<std::ptrdiff_t>(scores_shown),
                 summary.scores.end()});
  progress.finish();
  records.metrics(cluster_record(run.coordinator().state(/*with_scores=*/false)));
  log_final_evaluation(summary, records);
  records.close_tensorboard();
  print_summary(o, summary);
  std::fflush(stdout);  // the summary is out before a watching page's last look
  serve_the_end();
  // Stopped by a signal, the run did not end by its rule: a script that goes on after
  // `tandem launch` succeeds must not take an interrupted run for a finished one (train, search,
  // predict and prepare fail the same way). What was kept is saved and printed all the same.
  // (The signal itself decides, not the reason's text: a peer's stop request may say anything.)
  if (stop.load() && summary.stop_reason == "interrupted")
    throw Error(std::string("stopped by ") + stop_signal_name() + "; " +
                (summary.kept == "none" ? std::string("no model: training had not begun")
                                        : "the " + summary.kept + " parameters are saved in " +
                                              summary.model_path));
  // Ended by its rule (--max-seconds, which counts from when every role had registered, or a
  // `tandem stop`) before the chief worker initialised the parameters: no model is saved, and a
  // script going on to `tandem eval` must not take the run for one that trained.
  if (summary.kept == "none")
    throw Error("the run stopped (" + summary.stop_reason + ") before training began: no model "
                "was saved" + (summary.stop_reason == "max-seconds"
                                   ? " (--max-seconds passed before the chief worker had "
                                     "initialised the parameters)"
                                   : ""));
}

// How a command outside the run reaches its coordinator: --coordinator, --curve-server and
// --curve-client-secret.
struct CoordinatorAccess {
  std::string coordinator;  // an address, or a cluster-spec file
  std::string curve_server;  // the run's public key file (or its secret one)
  std::string curve_client;  // this side's secret key file; empty: a throwaway pair

  void add_options(CLI::App* cmd) {
    cmd->add_option("--coordinator", coordinator,
                    "The coordinator's address, or a cluster-spec file (RUN_DIR/cluster.json)")
        ->required();
    cmd->add_option("--curve-server", curve_server,
                    "For a run under CURVE: its public key file (tandem keygen's PREFIX.key; "
                    "default: the key a cluster-spec file names)")
        ->check(CLI::ExistingFile);
    cmd->add_option("--curve-client-secret", curve_client,
                    "For a run under CURVE: this side's key file (PREFIX.key_secret; default: a "
                    "throwaway key, admitted only by a run without --curve-allowed)")
        ->check(CLI::ExistingFile);
  }

  // --coordinator takes an address or a cluster-spec file (RUN_DIR/cluster.json, the JSON that
  // launch and coordinator print): its "coordinator" entry, and its "curve_public_key" when the
  // run is under CURVE and no --curve-server is given.
  std::string address(transport::CurveClientKeys& curve) const {
    std::string spec_key;
    std::string out = coordinator;
    if (coordinator.find("://") == std::string::npos &&
        std::filesystem::is_regular_file(coordinator)) {
      std::ifstream in(coordinator);
      const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      std::string problem;
      const json spec = parse_json_file_text(text, problem);
      if (!problem.empty() || !spec.is_object())
        throw InputError(coordinator + " is not a cluster spec (" +
                         (problem.empty() ? std::string("not a JSON object") : problem) +
                         "): a JSON object with a \"coordinator\" address");
      const JsonFields fields(spec, "cluster spec " + coordinator);
      const std::string none;
      out = fields.text("coordinator");
      spec_key = fields.text("curve_public_key", &none);
    } else if (coordinator.find("://") == std::string::npos) {
      // Neither an address nor a file: most often RUN_DIR/cluster.json before the run has
      // written it (it does when training starts); ZeroMQ would only say "Invalid argument".
      throw InputError(coordinator + ": no such cluster-spec file (a run writes RUN_DIR/"
                       "cluster.json when training starts), and not an address "
                       "(tcp://HOST:PORT, ipc://PATH)");
    }
    const std::string server_public =
        curve_server.empty() ? spec_key : transport::read_curve_key_file(curve_server).public_key;
    if (!curve_client.empty() && server_public.empty())
      throw InputError("--curve-client-secret needs --curve-server (the run's public key) or "
                       "a cluster-spec file that names it");
    // Completed (a throwaway pair when none is given) by the coordinator link, so a role without
    // a key of its own keeps the run's client key for the parameter servers.
    curve = transport::curve_client_keys(server_public, curve_client, "--curve-server");
    return out;
  }
};

struct RoleCommandOptions {
  RoleOptions role;
  CoordinatorAccess access;
  long launched_by = 0;
};

// Runs a role process's role until its run ends or a stop signal (SIGINT, SIGTERM, SIGHUP) comes:
// then it ends as if the run were over, a parameter server writing its final checkpoint.
// `launched_by`: the pid of the `tandem launch` that started this role (0: none), which the
// stop signals are left to while it is this process's parent. `rank`: a task of `tandem rank`,
// whose stop signals are left to the run's coordinator (a batch system's cancel reaches every
// task at once).
void run_stoppable_role(const std::string& kind, RoleOptions role, void (*run)(const RoleOptions&),
                        pid_t launched_by = 0, bool rank = false) {
  const std::string who = "tandem " + kind + (role.name.empty() ? "" : " " + role.name);
  if (launched_by > 0 && getppid() == launched_by)
    leave_stops_to(launched_by, who,
                   "tandem launch (process " + std::to_string(launched_by) + ")");
  else if (rank)
    leave_stops_to(0, who, "the run's coordinator (rank 0)");
  role.cancel = shared_stop_flag();
  // Started by launch, the stop signals were blocked until now (ProcessLauncher::spawn): one sent
  // since the exec acts now, on the handlers above.
  unblock_stop_signals();
  run(role);
  if (role.cancel->load())
    std::fprintf(stderr, "tandem %s%s: stopped by %s\n", kind.c_str(),
                 role.name.empty() ? "" : (" " + role.name).c_str(), stop_signal_name());
}

void add_role_command(CLI::App& app, const char* name, const char* help,
                      void (*run)(const RoleOptions&)) {
  auto o = std::make_shared<RoleCommandOptions>();
  CLI::App* cmd = app.add_subcommand(name, help);
  o->access.add_options(cmd);
  cmd->add_option("--name", o->role.name, "This role's name (default: the coordinator picks)");
  // (Not for a server: it reads no data, and took the option without a word.)
  if (std::string(name) != "ps")
    cmd->add_option("--data", o->role.data,
                    "The store's path on this node, if not the coordinator's");
  // Given by tandem launch to the roles it starts (hidden: not for users).
  cmd->add_option("--launched-by", o->launched_by, "")->group("");
  if (std::string(name) == "worker")
    cmd->add_option("--gpus", o->role.gpus,
                    "This worker's group on these GPUs, e.g. 0,1 (one member each; default: the "
                    "run's --group-members, on GPUs from 0)")
        ->delimiter(',')
        // (CLI11 reads an empty item, from --gpus "$UNSET", as GPU 0.)
        ->check(CLI::Validator(
            [](std::string& item) {
              return item.empty() ? std::string("an empty item: give GPU numbers, e.g. 0,1")
                                  : std::string();
            },
            "LIST"));
  if (std::string(name) == "ps") {
    cmd->add_option("--bind", o->role.bind, "Where to serve (default tcp://127.0.0.1:*)")
        ->check(bind_address());
    cmd->add_option("--advertise", o->role.advertise,
                    "For --bind tcp://0.0.0.0:...: the host peers reach this node by (default: "
                    "its name)");
  }
  cmd->callback([o, run, name] {
    const std::string problem = advertise_problem(
        o->role.bind.empty() ? "tcp://127.0.0.1:*" : o->role.bind, o->role.advertise, "a server");
    if (!problem.empty()) throw InputError(problem);
    o->role.coordinator = o->access.address(o->role.coordinator_curve);
    run_stoppable_role(name, o->role, run, pid_t(o->launched_by));
  });
}

// tandem rank: one command per task of a SLURM or MPI job; the rank picks the role.
struct RankCommandOptions {
  std::shared_ptr<ClusterCommandOptions> cluster;
  std::string host;  // bind and advertise here; empty: bind 0.0.0.0, advertise the host's name
  int port = 0;      // the coordinator's control port (0: any)
};

void run_rank(RankCommandOptions& r) {
  const auto start = std::chrono::system_clock::now();
  const std::optional<LauncherRank> rank = launcher_rank_from_environment();
  if (!rank)
    throw InputError("tandem rank runs under srun or an MPI launcher: none of SLURM_PROCID, "
                     "OMPI_COMM_WORLD_RANK or PMI_RANK is set (use tandem launch on one machine)");
  ClusterCommandOptions& o = *r.cluster;
  // Every rank is given the same options: each checks the CURVE settings (and derives the servers'
  // public key) as the coordinator does, so a bad setup fails at once on every rank instead of
  // after the rendezvous.
  complete_curve_settings(o.cluster.settings);
  const RankRole role = role_for_rank(rank->rank, rank->size, o.cluster.ps, o.cluster.scorers);
  const std::string rendezvous = o.run_dir + "/coordinator.address";
  const std::string host = r.host.empty() ? "0.0.0.0" : r.host;
  std::fprintf(stderr, "%s rank %d of %d: %s %d\n", rank->launcher.c_str(), rank->rank,
               rank->size, role.kind.c_str(), role.index);
  if (role.kind == "coordinator") {
    o.cluster.workers = role.workers;
    o.bind = "tcp://" + host + ":" + (r.port ? std::to_string(r.port) : std::string("*"));
    o.scores_bind = "tcp://" + host + ":*";
    o.advertise_host = r.host;
    o.rendezvous_file = rendezvous;
    o.rendezvous_job = rank->job;
    return run_cluster(o, false);
  }
  RoleOptions role_options;
  const double not_before =
      std::chrono::duration<double>(start.time_since_epoch()).count() - 60.0;
  role_options.coordinator =
      wait_for_rendezvous(rendezvous, rank->job, not_before, o.startup_timeout_s * 1000);
  role_options.name = role.kind + std::to_string(role.index);
  const RunSettings& s = o.cluster.settings;
  if (!s.curve_server_public.empty())
    role_options.coordinator_curve = transport::curve_client_keys(
        s.curve_server_public, s.curve_client_file, "--curve-client-secret");
  role_options.bind = "tcp://" + host + ":*";
  role_options.advertise = r.host;
  run_stoppable_role(role.kind, role_options,
                     role.kind == "ps"       ? run_ps_role
                     : role.kind == "scorer" ? run_scorer_role
                                             : run_worker_role,
                     0, /*rank=*/true);
}

void run_scores(const CoordinatorAccess& access, bool follow, double wait_s, double lost_after_s) {
  using clock = std::chrono::steady_clock;
  zmq::context_t context(1);
  transport::CurveClientKeys curve;
  const std::string coordinator = access.address(curve);
  ScoreSubscriber scores(coordinator, context, 5000, curve);
  const auto until = clock::now() + std::chrono::milliseconds(static_cast<long>(wait_s * 1000));
  if (follow) scores.fail_when_coordinator_lost(lost_after_s);
  for (;;) {
    if (!follow && clock::now() > until) return;
    const std::optional<json> m = scores.next(100);
    if (!m) continue;
    // One JSON object a line, the end too ({"end":true,"reason":...}): a script reading the
    // lines as JSON reads them all.
    std::printf("%s\n", json_text(*m).c_str());
    std::fflush(stdout);
    if (is_end_message(*m)) return;
  }
}

// tandem stop: the coordinator's "stop" request, as --max-seconds would end the run.
void run_stop(const CoordinatorAccess& access, const std::string& reason) {
  zmq::context_t context(1);
  transport::CurveClientKeys curve;
  const std::string coordinator = access.address(curve);
  CoordinatorLink link(coordinator, context, 5000, curve);
  const std::string phase = json_string_or(link.request({{"type", "spec"}}), "phase", "");
  if (phase == "done" || phase == "failed") {
    std::printf("the run at %s has already ended (%s)\n", coordinator.c_str(), phase.c_str());
    return;
  }
  link.request({{"type", "stop"}, {"reason", reason}});
  std::printf("asked the run at %s to stop (%s): its roles stop and the coordinator saves the "
              "kept parameters\n", coordinator.c_str(), reason.c_str());
}

// launch's and coordinator's defaults.
std::shared_ptr<ClusterCommandOptions> default_cluster_options() {
  auto o = std::make_shared<ClusterCommandOptions>();
  o->cluster.workers = 2;
  o->cluster.target = kDefaultTarget;
  // A bound for a run that never meets its target, not the usual stop: on the default data (one
  // copy of Fashion-MNIST) the default run met the target after 9 to 17 epochs, and a limit of 15
  // cut some runs off just before it (bench/RESULTS.md).
  o->cluster.max_epochs = 30;
  // Sync by default: on the seed's model at its learning rate, async updates from two or more
  // workers raise the lowest validation loss from about 1,650 to about 1,900 (bench/RESULTS.md).
  o->cluster.settings.ps_mode = "sync";
  o->cluster.settings.replicas_to_aggregate = 0;  // one per worker
  return o;
}

// launch's and coordinator's --advertise (rank's --host is both its bind and its advertised
// host), refused as a server's is where it would be dropped.
void add_advertise_option(CLI::App* cmd, ClusterCommandOptions& o) {
  cmd->add_option("--advertise", o.advertise_host,
                  "For --bind tcp://0.0.0.0:...: the host other nodes reach the coordinator by, "
                  "in the cluster spec and the roles' addresses (default: this machine's name)");
}

void run_cluster_command(ClusterCommandOptions& o, bool launch_roles) {
  const std::string problem = advertise_problem(o.bind, o.advertise_host, "a coordinator");
  if (!problem.empty()) throw InputError(problem);
  // Every role a process (or thread) of this machine: a mistyped count (--workers 100000 for
  // 10) would start processes for minutes, tens of thousands of them, and take the machine.
  constexpr int64_t kMaxLaunchedRoles = 1024;
  const int64_t roles = int64_t{o.cluster.ps} + o.cluster.workers + o.cluster.scorers;
  if (launch_roles && roles > kMaxLaunchedRoles)
    throw InputError("--ps " + std::to_string(o.cluster.ps) + ", --workers " +
                     std::to_string(o.cluster.workers) + " and --scorer " +
                     std::to_string(o.cluster.scorers) + " make " + std::to_string(roles) +
                     " roles, and launch starts them all on this machine: at most " +
                     std::to_string(kMaxLaunchedRoles) + " (roles on other machines join "
                     "`tandem coordinator` with `tandem ps|worker|scorer`)");
  run_cluster(o, launch_roles);
}

}  // namespace

void add_cluster_commands(CLI::App& app) {
  {
    auto o = default_cluster_options();
    CLI::App* cmd = app.add_subcommand(
        "launch", "Train with a coordinator, parameter servers, workers and a scorer on this machine");
    add_cluster_options(cmd, *o);
    cmd->add_flag("--inproc", o->inproc, "Every role a thread of this process (inproc transport)");
    cmd->add_option("--worker-gpus", o->worker_gpus,
                    "With cuda: each worker's GPUs, one list per worker, e.g. \"0,1;2,3\" (default "
                    "with --gpus-per-worker N: worker i on GPUs i*N..i*N+N-1)");
    add_advertise_option(cmd, *o);
    cmd->callback([o] { run_cluster_command(*o, true); });
  }
  {
    auto o = default_cluster_options();
    CLI::App* cmd = app.add_subcommand(
        "coordinator", "Run the coordinator alone; roles join with tandem ps|worker|scorer");
    add_cluster_options(cmd, *o);
    add_advertise_option(cmd, *o);
    cmd->callback([o] { run_cluster_command(*o, false); });
  }
  {
    auto r = std::make_shared<RankCommandOptions>();
    r->cluster = default_cluster_options();
    CLI::App* cmd = app.add_subcommand(
        "rank", "One task of a SLURM or MPI job: rank 0 coordinates, then --ps servers, --scorer "
                "scorers, the rest workers (srun -n N tandem rank --data STORE --run-dir SHARED)");
    add_cluster_options(cmd, *r->cluster);
    cmd->add_option("--host", r->host,
                    "This node's address to bind and give peers (default: every interface, "
                    "advertised by host name)");
    cmd->add_option("--port", r->port, "The coordinator's port (default: any)")
        ->check(CLI::Range(0, 65535));
    // Launch's options the job decides for rank: refused when given (they were once taken and
    // silently overridden), and said so in the help.
    using Decided = std::pair<const char*, const char*>;
    const std::vector<Decided> decided = {
        {"--workers", "the job's tasks after the coordinator, --ps and --scorer are the workers"},
        {"--bind", "--host and --port set the coordinator's address"},
        {"--scores-bind", "--host sets the scores channel's address (any port)"}};
    for (const auto& [name, why] : decided)  // (launch's defaults not shown: they do not apply)
      cmd->get_option(name)
          ->description(std::string("Not taken by rank: ") + why)
          ->default_str("");
    cmd->callback([r, cmd, decided] {
      for (const auto& [name, why] : decided)
        if (cmd->count(name) > 0)
          throw InputError(std::string("tandem rank does not take ") + name + ": " + why);
      run_rank(*r);
    });
  }
  add_role_command(app, "ps", "Run a parameter server of a cluster", run_ps_role);
  add_role_command(app, "worker", "Run a worker of a cluster", run_worker_role);
  add_role_command(app, "scorer", "Run the scorer of a cluster", run_scorer_role);
  {
    auto prefix = std::make_shared<std::string>();
    CLI::App* cmd = app.add_subcommand(
        "keygen", "Write a CURVE key pair: PREFIX.key (public) and PREFIX.key_secret (mode 0600)");
    auto overwrite = std::make_shared<bool>(false);
    cmd->add_option("--out", *prefix, "Path prefix of the two files")->required();
    cmd->add_flag("--overwrite", *overwrite, "Replace an existing key pair");
    cmd->callback([prefix, overwrite] {
      // An empty prefix or one ending in a slash names no file: it wrote the hidden files .key
      // and .key_secret into the directory.
      if (prefix->empty() || prefix->back() == '/')
        throw InputError("--out '" + *prefix + "': a path prefix ends in a file name (keys/run "
                         "writes keys/run.key and keys/run.key_secret)");
      const transport::CurveKeyPair pair = transport::generate_curve_keypair();
      transport::write_curve_key_files(*prefix, pair, *overwrite);
      std::printf("public key %s\nwrote %s.key and %s.key_secret\n", pair.public_key.c_str(),
                  prefix->c_str(), prefix->c_str());
    });
  }
  {
    auto access = std::make_shared<CoordinatorAccess>();
    auto follow = std::make_shared<bool>(false);
    auto wait_s = std::make_shared<double>(1.5);
    CLI::App* cmd = app.add_subcommand("scores", "Print a cluster's scores (the last 10 at once)");
    access->add_options(cmd);
    cmd->add_flag("--follow", *follow, "Keep printing until training ends");
    cmd->add_option("--wait", *wait_s, "Without --follow: seconds to listen")
        ->check(number_in(0, kMaxIntervalSeconds, false, "SECONDS"))->capture_default_str();
    auto lost_after_s = std::make_shared<double>(30);
    cmd->add_option("--lost-after", *lost_after_s,
                    "With --follow: fail when the coordinator has not answered for this long")
        ->check(number_in(0, kMaxIntervalSeconds, true, "SECONDS"))->capture_default_str();
    cmd->callback([=] { run_scores(*access, *follow, *wait_s, *lost_after_s); });
  }
  {
    auto access = std::make_shared<CoordinatorAccess>();
    auto reason = std::make_shared<std::string>("tandem stop");
    CLI::App* cmd = app.add_subcommand(
        "stop", "Stop a running cluster as its rule would: the roles stop and the coordinator "
                "saves the kept parameters");
    access->add_options(cmd);
    cmd->add_option("--reason", *reason, "Why, for the coordinator's summary and the scores "
                    "channel's end")->capture_default_str();
    cmd->callback([=] { run_stop(*access, *reason); });
  }
}

}  // namespace tandem::cli
