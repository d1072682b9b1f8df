// tandem/cluster.h: the public cluster API over the engine's coordinator, roles and ClusterRun.
// Nothing of ZeroMQ or nlohmann::json crosses the public header: settings and documents travel
// as JSON strings, everything else through pimpl.
#include "tandem/cluster.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "cluster_link.h"
#include "cluster_ranks.h"
#include "cluster_resume.h"
#include "cluster_roles.h"
#include "cluster_run.h"
#include "coordinator.h"
#include "dataset_store.h"
#include "driven_coordinator.h"
#include "json_fields.h"
#include "ps_client.h"
#include "score_subscriber.h"
#include "seconds_to_ms.h"
#include "tandem/error.h"

namespace tandem {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// The run's settings: the user's JSON object over the defaults. An unknown key is an error
// naming the known ones. Sync mode aggregates one gradient per worker unless told otherwise.
RunSettings parse_settings(const std::string& text, int workers) {
  const json user = parse_bounded_json(text.empty() ? std::string_view("{}") : text);
  if (user.is_discarded() || !user.is_object())
    throw InputError("the cluster's settings must be a JSON object (nested at most " +
                     std::to_string(kMaxJsonDepth) + " levels deep), not '" + text + "'");
  RunSettings s = run_settings_over_defaults(user);
  if (!user.contains("replicas_to_aggregate") || s.replicas_to_aggregate == 0)
    s.replicas_to_aggregate = workers;
  return s;
}

// The internal form of a public ClusterCurveKeys, left unresolved: a role without a key file of
// its own keeps the settings' key for the parameter servers (cluster_roles.cpp).
transport::CurveClientKeys curve_client_keys(const ClusterCurveKeys& keys) {
  return transport::curve_client_keys(keys.server_public_key, keys.client_key_file,
                                      "ClusterCurveKeys");
}

ClusterScore to_public(const ScoreRecord& s) {
  ClusterScore out;
  out.seq = s.seq;
  out.t = s.t;
  out.step = s.step;
  out.loss = s.loss;
  out.loss_mean = s.loss_mean;
  out.accuracy = s.accuracy;
  out.samples = s.samples;
  return out;
}

json score_json(const ClusterScore& s) {
  return {{"seq", s.seq},       {"t", s.t},
          {"step", s.step},     {"loss", s.loss},
          {"loss_mean", s.loss_mean}, {"accuracy", s.accuracy},
          {"samples", s.samples}};
}

json eval_json(const EvalResult& e) {
  return {{"loss_sum", e.loss_sum}, {"loss_mean", e.loss_mean}, {"accuracy", e.accuracy},
          {"correct", e.correct}, {"samples", e.samples}};
}

ClusterPhase parse_phase(const std::string& text) {
  for (ClusterPhase p : {ClusterPhase::Starting, ClusterPhase::Training, ClusterPhase::Draining,
                         ClusterPhase::Done, ClusterPhase::Failed})
    if (text == to_string(p)) return p;
  throw InputError("phase must be starting, training, draining, done or failed, not '" + text + "'");
}

}  // namespace

// ---------------------------------------------------------------------------------------------

void write_cluster_store(const DataSplits& splits, const std::string& path, int64_t chunk_rows,
                         bool overwrite) {
  if (chunk_rows < 1)
    throw InputError("chunk_rows is " + std::to_string(chunk_rows) + ", expected >= 1");
  StoreWriteOptions o;
  o.chunk_rows = chunk_rows;
  o.overwrite = overwrite;
  o.overwrite_option = "overwrite = true";
  o.pixel_type = splits.train.pixel_type();
  write_dataset_store(splits, path, o, json{{"by", "tandem::write_cluster_store"}});
}

std::string ClusterRunSummary::to_json() const {
  json scores_j = json::array();
  for (const ClusterScore& s : scores) scores_j.push_back(score_json(s));
  json spec = parse_bounded_json(spec_json.empty() ? std::string_view("null") : spec_json);
  if (spec.is_discarded()) spec = nullptr;
  return json{{"stop_reason", stop_reason}, {"seconds", seconds},
              {"epochs", epochs},           {"resumed_epochs", resumed_epochs},
              {"batches", batches},
              {"gradients_lost", gradients_lost},
              {"steps", steps},             {"scores", scores_j},
              {"validation", eval_json(validation)},
              {"test", eval_json(test)},    {"kept", kept},
              {"kept_step", kept_step},     {"model", model_path},
              {"spec", spec}}
      .dump();
}

ClusterRunSummary train_cluster(const ClusterRunOptions& options) {
  ClusterOptions o;
  o.settings = parse_settings(options.settings, options.workers);
  o.ps = options.ps;
  o.workers = options.workers;
  o.scorers = options.scorers;
  o.target = options.target;
  o.max_epochs = options.max_epochs;
  o.max_seconds = options.max_seconds;
  o.inproc = options.roles_as_threads;
  o.bind = options.bind;
  o.scores_bind = scores_bind_beside(options.bind);
  o.advertise_host = options.advertise_host;
  o.model_out = options.model_out;
  o.keep_best = options.keep_best;
  o.startup_timeout_ms = limit_seconds_to_ms(options.startup_timeout_s, "startup_timeout_s");
  o.heartbeat_timeout_ms =
      heartbeat_timeout_to_ms(options.heartbeat_timeout_s, "heartbeat_timeout_s");
  o.test_threads = options.test_threads;
  o.resumed = options.resume;  // (before the checks: a resumed run's best model is its own)
  const DatasetStore store = check_cluster_options(o);
  // After the other checks: it reads every server's newest checkpoint.
  const RunStart start = start_of_run(o.settings, o.ps, o.max_epochs, options.resume, "resume",
                                      /*evaluated_at_the_end=*/true);
  o.first_epoch = start.first_epoch;
  int64_t newest = 0;
  if (options.on_score) {
    std::function<void(const ClusterScore&)> on_score = options.on_score;
    o.on_tick = [on_score, &newest](const Coordinator& c) {
      // A score's seq is its place in the log, counted from 1.
      for (const ScoreRecord& s : c.scores_since(static_cast<size_t>(newest))) {
        newest = s.seq;
        on_score(to_public(s));
      }
    };
  }
  const int64_t resumed_epochs = o.first_epoch;
  ClusterRun run(std::move(o), store);
  std::fputs(start.note.c_str(), stderr);  // once nothing can refuse the run
  if (options.on_listening) options.on_listening(run.coordinator().endpoint());
  const ClusterSummary s = run.run(nullptr);
  // A score that came in after the last tick (the scorer's last, while the workers drained).
  if (options.on_score)
    for (const ScoreRecord& r : s.scores)
      if (r.seq > newest) {
        newest = r.seq;
        options.on_score(to_public(r));
      }

  ClusterRunSummary out;
  out.stop_reason = s.stop_reason;
  out.seconds = s.seconds;
  out.epochs = s.epochs;
  out.resumed_epochs = resumed_epochs;
  out.batches = s.batches;
  out.gradients_lost = s.gradients_lost;
  out.steps = s.steps;
  for (const ScoreRecord& r : s.scores) out.scores.push_back(to_public(r));
  out.validation = s.validation;
  out.test = s.test;
  out.kept = s.kept;
  out.kept_step = s.kept_step;
  out.model_path = s.model_path;
  out.spec_json = s.spec.dump();
  return out;
}

// ---------------------------------------------------------------------------------------------

struct ClusterCoordinator::Impl {
  RunSettings settings;
  int64_t resumed_epochs = 0;  // the epochs a resumed run's checkpoints came after
  std::unique_ptr<Coordinator> coordinator;
};

ClusterCoordinator::ClusterCoordinator(const ClusterCoordinatorOptions& options)
    : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.settings = parse_settings(options.settings, options.workers);
  const DrivenCoordinator driven = driven_coordinator_options(d.settings, options, "resume");
  d.resumed_epochs = driven.options.first_epoch;
  d.coordinator = std::make_unique<Coordinator>(driven.options);
  std::fputs(driven.resume_note.c_str(), stderr);
}

ClusterCoordinator::~ClusterCoordinator() = default;

std::string ClusterCoordinator::address() const { return impl_->coordinator->endpoint(); }
std::string ClusterCoordinator::curve_public_key() const {
  return impl_->settings.curve_server_public;
}
std::string ClusterCoordinator::scores_address() const {
  return impl_->coordinator->scores_endpoint();
}
std::string ClusterCoordinator::phase() const { return to_string(impl_->coordinator->phase()); }

std::string ClusterCoordinator::wait_for(const std::string& phase, double timeout_s) const {
  const ClusterPhase wanted = parse_phase(phase);
  Coordinator& c = *impl_->coordinator;
  const int timeout_ms = seconds_to_ms(timeout_s);  // first: NaN is refused
  if (timeout_ms >= 0) return to_string(c.wait_for(wanted, timeout_ms));
  for (;;) {
    const ClusterPhase now = c.wait_for(wanted, 1000);
    if (now == ClusterPhase::Failed || int(now) >= int(wanted)) return to_string(now);
  }
}

bool ClusterCoordinator::wait(double timeout_s) const {
  Coordinator& c = *impl_->coordinator;
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(std::max(0, seconds_to_ms(timeout_s)));
  auto slice = [&] {
    if (timeout_s < 0) return 1000;
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    return int(std::clamp<int64_t>(left.count(), 0, 1000));
  };
  for (;;) {
    const ClusterPhase p = c.wait_for(ClusterPhase::Draining, slice());
    if (p == ClusterPhase::Failed) throw Error("cluster run failed: " + c.failure());
    if (p != ClusterPhase::Starting && p != ClusterPhase::Training) break;
    if (timeout_s >= 0 && Clock::now() >= deadline) return false;
  }
  for (;;) {
    if (c.wait_workers_gone(slice())) return true;
    if (c.phase() == ClusterPhase::Failed) throw Error("cluster run failed: " + c.failure());
    if (timeout_s >= 0 && Clock::now() >= deadline) return false;
  }
}

void ClusterCoordinator::request_stop(const std::string& reason) {
  impl_->coordinator->request_stop(reason);
}

void ClusterCoordinator::fail(const std::string& why) { impl_->coordinator->fail(why); }

Model ClusterCoordinator::pull_model() const {
  return pull_cluster_model(*impl_->coordinator, impl_->settings);
}

bool ClusterCoordinator::finish(double timeout_s) {
  const int timeout_ms = seconds_to_ms(timeout_s);  // first: NaN is refused
  Coordinator& c = *impl_->coordinator;
  c.request_stop("requested");  // no-op once draining
  c.finish();
  if (timeout_ms >= 0) return c.wait_servers_gone(timeout_ms);
  while (!c.wait_servers_gone(1000)) {
  }
  return true;
}

std::string ClusterCoordinator::stop_reason() const { return impl_->coordinator->stop_reason(); }
std::string ClusterCoordinator::failure() const { return impl_->coordinator->failure(); }

std::vector<ClusterScore> ClusterCoordinator::scores() const {
  std::vector<ClusterScore> out;
  for (const ScoreRecord& s : impl_->coordinator->scores()) out.push_back(to_public(s));
  return out;
}

std::string ClusterCoordinator::summary_json() const {
  const Coordinator& c = *impl_->coordinator;
  json scores_j = json::array();
  for (const ScoreRecord& s : c.scores()) scores_j.push_back(score_json(to_public(s)));
  return json{{"phase", to_string(c.phase())},
              {"stop_reason", c.stop_reason()},
              {"failure", c.failure()},
              {"seconds", c.training_seconds()},
              {"epochs", c.epochs_completed()},
              {"resumed_epochs", impl_->resumed_epochs},
              {"batches", c.batches_done()},
              {"gradients_lost", c.gradients_lost()},
              {"scores", scores_j},
              {"spec", c.spec()}}
      .dump();
}

std::string ClusterCoordinator::state_json() const {
  return wire_text(impl_->coordinator->state());  // a role name that is not UTF-8: replaced
}

// ---------------------------------------------------------------------------------------------

// Shared by the role object and its thread, so either may go first.
struct ClusterRole::State {
  std::string kind;
  RoleOptions options;
  std::mutex mutex;
  std::condition_variable changed;
  bool done = false;
  bool reported = false;  // the error has been rethrown once
  std::exception_ptr error;
  std::mutex join_mutex;  // one joiner of `thread` at a time
  std::thread thread;
};

ClusterRole::ClusterRole(std::shared_ptr<State> state) : state_(std::move(state)) {}
ClusterRole::ClusterRole(ClusterRole&&) noexcept = default;

ClusterRole& ClusterRole::operator=(ClusterRole&& other) noexcept {
  if (this != &other) {
    ClusterRole old(std::move(*this));  // ends this one's role, as the destructor would
    state_ = std::move(other.state_);
  }
  return *this;
}

ClusterRole ClusterRole::start(const std::string& kind, const std::string& coordinator,
                               const std::string& name, const ClusterRoleOptions& options) {
  void (*body)(const RoleOptions&) = kind == "ps"       ? &run_ps_role
                                     : kind == "worker" ? &run_worker_role
                                                        : &run_scorer_role;
  if (coordinator.empty()) throw InputError("a " + kind + " role needs the coordinator's address");
  if (coordinator.rfind("inproc://", 0) == 0)
    throw InputError("a ClusterRole joins a coordinator over tcp://, not " + coordinator +
                     " (train_cluster runs every role as a thread)");
  if (!options.gpus.empty() && kind != "worker")
    throw InputError("only a worker takes GPUs (ClusterRoleOptions::gpus)");
  auto state = std::make_shared<State>();
  state->kind = kind;
  RoleOptions& o = state->options;
  o.coordinator = coordinator;
  o.name = name;
  o.bind = options.bind;
  o.advertise = options.advertise;
  o.data = options.data;
  o.gpus = options.gpus;
  o.coordinator_lost_ms = lost_after_to_ms(options.coordinator_lost_s, "coordinator_lost_s");
  o.coordinator_curve = curve_client_keys(options.curve);
  o.cancel = std::make_shared<std::atomic<bool>>(false);
  // The thread holds the state, so a role object dropped while its thread still runs (stuck in
  // a request until its timeout) lets go of it safely.
  state->thread = std::thread([state, body] {
    try {
      body(state->options);
    } catch (...) {
      std::lock_guard<std::mutex> lock(state->mutex);
      state->error = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(state->mutex);
    state->done = true;
    state->changed.notify_all();
  });
  return ClusterRole(std::move(state));
}

ClusterRole ClusterRole::parameter_server(const std::string& coordinator, const std::string& name,
                                          const ClusterRoleOptions& options) {
  return start("ps", coordinator, name, options);
}
ClusterRole ClusterRole::worker(const std::string& coordinator, const std::string& name,
                                const ClusterRoleOptions& options) {
  return start("worker", coordinator, name, options);
}
ClusterRole ClusterRole::scorer(const std::string& coordinator, const std::string& name,
                                const ClusterRoleOptions& options) {
  return start("scorer", coordinator, name, options);
}

ClusterRole::~ClusterRole() {
  if (!state_) return;
  std::lock_guard<std::mutex> join_lock(state_->join_mutex);
  if (!state_->thread.joinable()) return;
  stop();
  bool done;
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    done = state_->changed.wait_for(lock, std::chrono::seconds(5), [&] { return state_->done; });
  }
  if (done) state_->thread.join();
  else state_->thread.detach();  // stuck in a request: it ends at the request's timeout
}

bool ClusterRole::join(double timeout_s) {
  if (!state_) throw Error("this role has been moved from");
  {
    std::unique_lock<std::mutex> lock(state_->mutex);
    auto done = [&] { return state_->done; };
    if (timeout_s < 0) state_->changed.wait(lock, done);
    else if (!state_->changed.wait_for(lock, std::chrono::milliseconds(seconds_to_ms(timeout_s)),
                                       done))
      return false;
  }
  {
    std::lock_guard<std::mutex> lock(state_->join_mutex);
    if (state_->thread.joinable()) state_->thread.join();
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (!state_->reported) error = state_->error;
    state_->reported = true;
  }
  if (error) std::rethrow_exception(error);
  return true;
}

void ClusterRole::stop() {
  if (state_) *state_->options.cancel = true;
}

bool ClusterRole::running() const {
  if (!state_) return false;
  std::lock_guard<std::mutex> lock(state_->mutex);
  return !state_->done;
}

std::string ClusterRole::kind() const { return state_ ? state_->kind : std::string(); }

// ---------------------------------------------------------------------------------------------

struct ClusterScoreStream::Impl {
  zmq::context_t context{1};
  std::unique_ptr<ScoreSubscriber> subscriber;  // before the context goes
  std::string end_reason;
};

ClusterScoreStream::ClusterScoreStream(const std::string& coordinator, double timeout_s,
                                       const ClusterCurveKeys& curve, double coordinator_lost_s)
    : impl_(std::make_unique<Impl>()) {
  // (Its own ZeroMQ context reaches no inproc:// socket: it waited out its timeout.)
  if (coordinator.rfind("inproc://", 0) == 0)
    throw InputError("a ClusterScoreStream follows a coordinator over tcp:// or ipc://, not " +
                     coordinator + " (train_cluster's on_score gives the scores of a run on "
                     "threads)");
  lost_after_to_ms(coordinator_lost_s, "coordinator_lost_s");
  // Negative means no limit elsewhere in this API (a day here); 0 used to become a 1 ms wait.
  const int answer_ms = timeout_s < 0 ? seconds_to_ms(kMaxIntervalSeconds)
                                      : limit_seconds_to_ms(timeout_s, "timeout_s");
  impl_->subscriber = std::make_unique<ScoreSubscriber>(coordinator, impl_->context, answer_ms,
                                                        curve_client_keys(curve));
  impl_->subscriber->fail_when_coordinator_lost(coordinator_lost_s);
}

ClusterScoreStream::~ClusterScoreStream() {
  if (impl_) impl_->subscriber.reset();
}

bool ClusterScoreStream::next(ClusterScore& score, double timeout_s) {
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(std::max(0, seconds_to_ms(timeout_s)));
  for (;;) {
    if (impl_->subscriber->ended()) return false;
    int wait_ms = 1000;
    if (timeout_s >= 0)
      wait_ms = int(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count(),
          0, 1000));
    const std::optional<json> m = impl_->subscriber->next(wait_ms);
    if (m) {
      if (is_end_message(*m)) {
        impl_->end_reason = end_reason_of(*m);
        return false;
      }
      // A field of the wrong type is an InputError naming it (json_number, json_integer).
      score.seq = json_integer(*m, "seq", 0);
      score.t = json_number(*m, "t", 0.0);
      score.step = json_integer(*m, "step", 0);
      score.loss = json_number(*m, "loss", 0.0);  // NaN comes as null
      score.loss_mean = json_number(*m, "loss_mean", 0.0);
      score.accuracy = json_number(*m, "accuracy", 0.0);
      score.samples = json_integer(*m, "samples", 0);
      return true;
    }
    if (timeout_s >= 0 && Clock::now() >= deadline) return false;
  }
}

bool ClusterScoreStream::ended() const { return impl_->subscriber->ended(); }
std::string ClusterScoreStream::end_reason() const { return impl_->end_reason; }

}  // namespace tandem
