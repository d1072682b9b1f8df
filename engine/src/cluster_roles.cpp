#include "cluster_roles.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>

#include "chunk_manager.h"
#include "backend.h"
#include "bind_address.h"
#include "cluster_link.h"
#include "cluster_ranks.h"
#include "cluster_role_support.h"
#include "coordinator_replies.h"
#include "dataset_store.h"
#include "json_fields.h"
#include "parameters_only.h"
#include "ps_client.h"
#include "ps_server.h"
#include "ps_shard_device.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "thread_pool.h"
#include "zmq_curve.h"

namespace tandem {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

void check_overlap(const RunSettings& s) {
  if (s.overlap && s.ps_mode == "sync")
    throw InputError("overlapping communication with compute needs --ps-mode async or "
                     "bounded_staleness: in sync mode every overlapped gradient would be one "
                     "version stale and dropped");
}

void check_worker_group(const RunSettings& s) {
  if (s.worker_group < 1)
    throw InputError("cluster settings: worker_group (members per worker) must be >= 1, not " +
                     std::to_string(s.worker_group));
}

namespace {

PsMode parse_mode(const std::string& text) {
  if (text == "async") return PsMode::Async;
  if (text == "sync") return PsMode::Sync;
  if (text == "bounded_staleness" || text == "bounded") return PsMode::BoundedStaleness;
  throw InputError("parameter server mode must be async, sync or bounded_staleness, not '" +
                   text + "'");
}

// The parameter servers' shard device by the settings' name: -1 (the CPU) or GPU 0; "auto" is
// GPU 0 when this machine has one (not looked at with check_only: the name alone is checked).
int ps_shard_device(const std::string& name, bool check_only = false) {
  if (name == "cpu") return -1;
  if (name == "cuda") return 0;
  if (name == "auto") return !check_only && shard_device_count() > 0 ? 0 : -1;
  throw InputError("parameter server device must be cpu, cuda or auto, not '" + name + "'");
}

}  // namespace

void check_role_settings(const RunSettings& s) {
  try {
    check_backend_precision(parse_backend(s.backend), parse_precision(s.precision));
    // A bound no other mode reads: given with sync or async, the run would go without it.
    const PsMode mode = parse_mode(s.ps_mode);
    if (s.staleness_bound != 0 && mode != PsMode::BoundedStaleness)
      throw InputError("a staleness bound (--staleness, staleness_bound) is for --ps-mode "
                       "bounded_staleness; the " + s.ps_mode + " mode has none");
    ps_shard_device(s.ps_device, /*check_only=*/true);
  } catch (const InputError& e) {
    throw InputError(std::string("cluster settings: ") + e.what());
  }
  // 0: every core, as a trainer's threads.
  for (const auto& [name, threads] : {std::pair<const char*, int>{"worker_threads",
                                                                   s.worker_threads},
                                      {"scorer_threads", s.scorer_threads}}) {
    try {
      if (threads != 0) ThreadPool::check_thread_count(threads);
    } catch (const InputError& e) {
      throw InputError(std::string("cluster settings: ") + name + ": " + e.what());
    }
  }
  const auto at_least = [](const char* name, int64_t value, int64_t least) {
    if (value < least)
      throw InputError(std::string("cluster settings: ") + name + " must be >= " +
                       std::to_string(least) + ", not " + std::to_string(value));
  };
  at_least("readers", s.readers, 1);
  at_least("assemblers", s.assemblers, 1);
  at_least("memory_budget_mib", s.memory_budget_mib, 1);
  if (s.memory_budget_mib > kMaxMemoryBudgetMib)
    throw InputError("cluster settings: memory_budget_mib must be <= " +
                     std::to_string(kMaxMemoryBudgetMib) + ", not " +
                     std::to_string(s.memory_budget_mib));
  at_least("replicas_to_aggregate", s.replicas_to_aggregate, 0);
  at_least("ps_timeout_ms", s.ps_timeout_ms, 1);
  at_least("init_timeout_ms", s.init_timeout_ms, 1);
}

json to_json(const RunSettings& s) {
  return {{"data", s.data},
          {"model", s.model.describe()},
          {"optimizer", to_string(s.optimizer.kind)},
          {"lr", s.optimizer.learning_rate},
          {"beta1", s.optimizer.beta1},
          {"beta2", s.optimizer.beta2},
          {"epsilon", s.optimizer.epsilon},
          {"batch", s.batch},
          {"seed", s.seed},
          {"shuffle", s.shuffle},
          {"backend", s.backend},
          {"precision", s.precision},
          {"worker_threads", s.worker_threads},
          {"worker_group", s.worker_group},
          {"scorer_threads", s.scorer_threads},
          {"readers", s.readers},
          {"assemblers", s.assemblers},
          {"memory_budget_mib", s.memory_budget_mib},
          {"score_interval_s", s.score_interval_s},
          {"ps_mode", s.ps_mode},
          {"ps_device", s.ps_device},
          {"replicas_to_aggregate", s.replicas_to_aggregate},
          {"staleness_bound", s.staleness_bound},
          {"checkpoint_dir", s.checkpoint_dir},
          {"checkpoint_every_s", s.checkpoint_every_s},
          {"checkpoint_every_steps", s.checkpoint_every_steps},
          {"best_model_path", s.best_model_path},
          {"overlap", s.overlap},
          {"curve_server_public", s.curve_server_public},
          {"curve_secret_file", s.curve_secret_file},
          {"curve_allowed_path", s.curve_allowed_path},
          {"curve_client_file", s.curve_client_file},
          {"fed", s.fed},
          {"ps_timeout_ms", s.ps_timeout_ms},
          {"ps_spin_us", s.ps_spin_us},
          {"init_timeout_ms", s.init_timeout_ms},
          {"step_timeout_s", s.step_timeout_s}};
}

RunSettings run_settings_over_defaults(const json& overrides) {
  json j = to_json(RunSettings{});
  for (const auto& [key, value] : overrides.items()) {
    if (!j.contains(key)) {
      std::string known;
      for (const auto& [k, v] : j.items()) known += (known.empty() ? "" : ", ") + k;
      throw InputError("unknown run setting '" + key + "'; the settings are: " + known);
    }
    j[key] = value;
  }
  return run_settings_from_json(j);
}

RunSettings run_settings_from_json(const json& j) {
  const JsonFields r(j, "cluster settings");
  RunSettings s;
  s.data = r.text("data");
  s.model = ModelConfig::parse(r.text("model"));
  s.optimizer.kind = parse_optimizer(r.text("optimizer"));
  s.optimizer.learning_rate = r.single("lr");
  s.optimizer.beta1 = r.single("beta1");
  s.optimizer.beta2 = r.single("beta2");
  s.optimizer.epsilon = r.single("epsilon");
  s.batch = r.integer("batch");
  s.seed = r.unsigned_integer("seed");
  s.shuffle = r.flag("shuffle");
  s.backend = r.text("backend");
  s.precision = r.text("precision");
  s.worker_threads = r.small_integer("worker_threads");
  const int64_t one = 1, zero = 0;
  const bool no = false;
  const double ten_minutes = 600.0;
  s.worker_group = r.small_integer("worker_group", &one);  // absent from older settings
  s.scorer_threads = r.small_integer("scorer_threads");
  s.readers = r.small_integer("readers");
  s.assemblers = r.small_integer("assemblers");
  const int64_t default_budget = RunSettings{}.memory_budget_mib;
  s.memory_budget_mib = r.integer("memory_budget_mib", &default_budget);  // (newer)
  s.score_interval_s = r.number("score_interval_s");
  s.ps_mode = r.text("ps_mode");
  s.ps_device = r.text("ps_device");
  s.replicas_to_aggregate = r.small_integer("replicas_to_aggregate");
  s.staleness_bound = r.integer("staleness_bound");
  s.checkpoint_dir = r.text("checkpoint_dir");
  s.checkpoint_every_s = r.number("checkpoint_every_s");
  s.checkpoint_every_steps = r.integer("checkpoint_every_steps", &zero);  // (newer)
  s.best_model_path = r.text("best_model_path");
  s.overlap = r.flag("overlap");
  s.curve_server_public = r.text("curve_server_public");
  s.curve_secret_file = r.text("curve_secret_file");
  s.curve_allowed_path = r.text("curve_allowed_path");
  s.curve_client_file = r.text("curve_client_file");
  s.fed = r.flag("fed", &no);
  s.ps_timeout_ms = r.small_integer("ps_timeout_ms");
  s.ps_spin_us = r.small_integer("ps_spin_us", &zero);  // absent from older settings
  s.init_timeout_ms = r.small_integer("init_timeout_ms");
  s.step_timeout_s = r.number("step_timeout_s", &ten_minutes);  // absent from older settings
  if (s.batch < 1) throw InputError("cluster settings: batch must be >= 1");
  try {
    s.optimizer.validate();
  } catch (const InputError& e) {
    throw InputError(std::string("cluster settings: ") + e.what());
  }
  if (s.ps_spin_us < 0 || s.ps_spin_us > 1'000'000)
    throw InputError("cluster settings: ps_spin_us must be in [0, 1000000] (microseconds)");
  if (!(s.step_timeout_s >= 0))
    throw InputError("cluster settings: step_timeout_s must be >= 0 (0: never)");
  check_overlap(s);
  check_worker_group(s);
  return s;
}

ClientOptions cluster_client_options(const RunSettings& s, zmq::context_t* context) {
  ClientOptions c;
  c.timeout_ms = s.ps_timeout_ms;
  c.spin_us = s.ps_spin_us;
  c.context = context;
  if (!s.curve_server_public.empty()) {
    c.curve_server_key = s.curve_server_public;
    if (!s.curve_client_file.empty()) {
      const transport::CurveKeyPair pair = transport::read_curve_secret_key_file(s.curve_client_file);
      c.curve_public_key = pair.public_key;
      c.curve_secret_key = pair.secret_key;
    }
  }
  return c;
}

namespace {

using namespace roles;

// Whether two sets of tensors hold the same bits (NaNs included, which == would not match).
bool same_bits(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    const std::vector<float>& x = a[i].values;
    const std::vector<float>& y = b[i].values;
    if (x.size() != y.size()) return false;
    if (!x.empty() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

// ps_role's work once registered: its server serves until the run ends.
void serve_as_registered(const RoleOptions& o, const RoleRegistration& r, CoordinatorLink& link,
                         std::unique_ptr<ParameterServer>& server) {
  ServerOptions so;
  so.mode = parse_mode(r.settings.ps_mode);
  so.replicas_to_aggregate = r.settings.replicas_to_aggregate;
  so.staleness_bound = r.settings.staleness_bound;
  // Below the clients' request timeout (their held PushPull waits for a step), by 10% or 1 s;
  // by half of a timeout of 2 s or less. It caps the step and worker timeouts too.
  so.longest_wait_ms =
      r.settings.ps_timeout_ms -
      std::max(std::min(1000, r.settings.ps_timeout_ms / 2), r.settings.ps_timeout_ms / 10);
  so.optimizer = r.settings.optimizer;
  so.context = o.context;
  so.bind = !o.bind.empty() ? o.bind
            : o.coordinator.rfind("inproc://", 0) == 0 ? "inproc://tandem-" + r.name
                                                       : "tcp://127.0.0.1:*";
  so.checkpoint_dir = r.settings.checkpoint_dir;
  so.checkpoint_every_seconds = r.settings.checkpoint_every_s;
  so.checkpoint_every_steps = r.settings.checkpoint_every_steps;
  so.shard_name = r.name;
  // What the link heard, copied here for the server's thread: the server may outlive the link.
  auto epochs_whole = std::make_shared<std::atomic<int64_t>>(-1);
  so.epochs_whole = [epochs_whole] { return epochs_whole->load(); };
  so.device = ps_shard_device(r.settings.ps_device);
  // A server on an address other machines reach, in a run without CURVE (by hand, or a rank):
  // any of them can pull or push its parameters, or shut it down.
  if (!transport::binds_this_machine_only(so.bind) && r.settings.curve_secret_file.empty())
    std::fprintf(stderr, "tandem ps %s: warning: serving %s without CURVE: any process that "
                 "reaches it can pull or push the parameters or shut this server down\n",
                 r.name.c_str(), so.bind.c_str());
  if (!r.settings.curve_secret_file.empty()) {
    const transport::CurveKeyPair pair =
        transport::read_curve_secret_key_file(r.settings.curve_secret_file);
    so.curve_secret_key = pair.secret_key;
    if (!r.settings.curve_allowed_path.empty())
      so.curve_allowed_clients = transport::read_curve_allowed_clients(r.settings.curve_allowed_path);
  }
  server = std::make_unique<ParameterServer>(so);
  ParameterServer* ps = server.get();
  link.start_heartbeats(r.name, [ps] {
    return json{{"stats", json::parse(to_json(ps->stats()))}};
  }, o.heartbeat_ms);
  link.request({{"type", "ready"}, {"name", r.name},
                {"address", advertised_endpoint(server->endpoint(), o.advertise)}});
  for (;;) {
    epochs_whole->store(link.epochs_whole());
    const std::string phase = link.phase();
    if (phase == "done" || phase == "failed" || !server->serving()) break;
    check_coordinator(link, o, r.name);
    link.wait_phase_change(phase, 100);
  }
  // Read after the phase: the reply that said "done" said the run's last count first.
  epochs_whole->store(link.epochs_whole());
  server->stop();  // writes the final checkpoint
  end_role(link, r.name);
}

// The role itself; run_ps_role wraps it (run_cancellable).
void ps_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  std::unique_ptr<ParameterServer> server;  // outlives the link's heartbeat thread
  CoordinatorLink link(o.coordinator, rc.context, o.coordinator_lost_ms, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "ps");
  reporting_failure(link, r.name, [&] { serve_as_registered(o, r, link, server); });
}

// The role itself; run_scorer_role wraps it (run_cancellable).
void scorer_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  CoordinatorLink link(o.coordinator, rc.context, o.coordinator_lost_ms, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "scorer");
  reporting_failure(link, r.name, [&] {
    auto scores = std::make_shared<std::atomic<int64_t>>(0);
    link.start_heartbeats(r.name, [scores] { return json{{"scores", scores->load()}}; },
                          o.heartbeat_ms);
    const std::vector<std::string> servers = wait_for_cluster(link, o, r.name);
    if (servers.empty()) return end_role(link, r.name);
    const RunSettings& s = r.settings;
    // The rows scored: given to this scorer (a fed run), or the store's validation split.
    DataSplits splits;
    DatasetView validation;
    if (o.validation) {
      validation = o.validation->rows;
      // Scored, none gave a loss of 0, which met any target: the run stopped at once.
      if (validation.rows == 0)
        throw InputError(r.name + ": the validation rows it was given are none: no loss can be "
                         "scored on them (a loss of 0 would meet any target)");
    } else {
      if (s.data.empty())
        throw InputError(r.name + ": this run has no store (data) and the scorer was given no "
                         "validation rows to score on");
      splits = load_store_eval_splits(s.data);
      validation = splits.validation.view();
      if (validation.rows == 0)
        throw InputError(r.name + ": the store " + s.data + " has no validation split to score on");
    }
    std::unique_ptr<Backend> backend = make_backend(parse_backend(s.backend), s.model, s.optimizer,
                                                    s.scorer_threads, parse_precision(s.precision));
    try {
      check_model_data(s.model, validation, true);
    } catch (const InputError& e) {  // which rows, and whose: the worker's errors say as much
      throw InputError(r.name + ": the validation rows it scores: " + e.what());
    }
    ClientOptions client_settings = client_options(s, rc.context, o);
    client_settings.cancel = o.cancel;
    PsClient client(servers, client_settings);
    Model model(s.model);
    if (!init_parameters(client, r, link, model, /*may_stand_in=*/false)) {
      return end_role(link, r.name);
    }
    const auto interval = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(s.score_interval_s));
    double best_loss = std::numeric_limits<double>::infinity();
    // A scorer restarted in the same run (launch restarts one that died) finds its predecessor's
    // best model: scored again on these rows, it stays until a better score replaces it, instead
    // of giving way to the new scorer's first score, however worse. One from another run (its
    // "run" is not this run's id: an embedding run that keeps the path, a scorer on another
    // host) is replaced by the first score.
    if (!s.best_model_path.empty() && std::filesystem::exists(s.best_model_path)) {
      // Only reading the file is let fail: an error of the backend (a device failure, bad data)
      // is the scorer's own and ends it, as it would at its first score.
      std::optional<Checkpoint> found;
      try {
        found = load_checkpoint(s.best_model_path, &s.model);
      } catch (const Error& e) {
        std::fprintf(stderr, "%s: %s is unreadable (%s); the next score replaces it\n",
                     r.name.c_str(), s.best_model_path.c_str(), e.what());
      }
      const bool same_run = found && !r.run.empty() && found->extra.count("run") > 0 &&
                            found->extra.at("run") == r.run;
      if (same_run) {
        backend->set_parameters(found->model);
        best_loss = backend->evaluate(validation).loss_sum;
        std::fprintf(stderr, "%s: the best model so far (%s) scores %.6g; kept until a better "
                     "score\n", r.name.c_str(), s.best_model_path.c_str(), best_loss);
      }
    }
    auto last_answer = Clock::now();
    // A server restarting (silent), or restarted with no checkpoint to resume from (no
    // parameters until a worker's repull gives it some): score again at the next interval,
    // unless this has gone on for init_timeout_ms.
    const auto try_again_later = [&](const char* problem, const std::exception& e) {
      if (Clock::now() - last_answer > std::chrono::milliseconds(s.init_timeout_ms))
        throw Error(r.name + ": " + problem + " for " + std::to_string(s.init_timeout_ms / 1000) +
                    " s: " + e.what());
      std::fprintf(stderr, "%s: %s; trying again\n", r.name.c_str(), e.what());
    };
    bool scored = false;  // model holds the parameters of the last score
    for (auto next = Clock::now();;) {
      const std::string phase = link.phase();
      if (training_over(phase)) break;
      check_coordinator(link, o, r.name);
      const auto now = Clock::now();
      if (now < next) {  // sleep until the next score is due, waking for a phase change
        link.wait_phase_change(
            phase,
            int(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()) + 1);
        continue;
      }
      // An evaluation longer than the interval delays the next one: no burst to catch up.
      next = std::max(next + interval, now);
      PsResult result;
      try {
        result = client.pull().wait();
        last_answer = Clock::now();
      } catch (const transport::TransportError& e) {
        try_again_later("the parameter servers have not answered", e);
        continue;
      } catch (const ServerError& e) {
        if (!e.not_initialised()) throw;
        try_again_later("a parameter server has had no parameters", e);
        continue;
      }
      // Parameters that have not changed since the last score (workers waiting for data, for a
      // lost worker's replacement, or done) would score the same again: a repeated point.
      if (scored && same_bits(result.tensors, model.parameters())) continue;
      scored = true;
      model.parameters() = std::move(result.tensors);
      backend->set_parameters(model);
      const BatchStats stats = backend->evaluate(validation);
      const double n = double(std::max<int64_t>(stats.samples, 1));
      if (!s.best_model_path.empty() && stats.loss_sum < best_loss) {
        // Written before the score is sent: once the coordinator sees a score, its parameters
        // are on disk.
        best_loss = stats.loss_sum;
        Checkpoint best;
        best.model = model;
        best.optimizer = s.optimizer;
        mark_parameters_only(best);  // Adam's moments stay in the servers' shards
        best.step = int64_t(result.version);
        // The epochs done by then (a resumed run's kept best may be an earlier run's, which no
        // score of its own names: its epochs are read from here).
        best.epoch = std::max<int64_t>(0, link.epochs_whole());
        best.seed = s.seed;
        best.batch = s.batch;
        best.extra["source"] = "tandem scorer: the parameters of the lowest validation loss";
        best.extra["trained_with"] = to_string(s.optimizer.kind);
        char loss_text[32];  // every digit, as tandem train writes it (to_string kept six decimals)
        std::snprintf(loss_text, sizeof loss_text, "%.17g", stats.loss_sum);
        best.extra["validation_loss"] = loss_text;
        best.extra["run"] = r.run;
        save_checkpoint(s.best_model_path, best);
      }
      link.request({{"type", "score"}, {"name", r.name}, {"step", result.version},
                    {"loss", stats.loss_sum}, {"loss_mean", stats.loss_sum / n},
                    {"accuracy", double(stats.correct) / n}, {"samples", stats.samples}});
      *scores += 1;
    }
    end_role(link, r.name);
  });
}

}  // namespace

void run_ps_role(const RoleOptions& o) { run_cancellable(o, ps_role); }
void run_scorer_role(const RoleOptions& o) { run_cancellable(o, scorer_role); }

}  // namespace tandem
