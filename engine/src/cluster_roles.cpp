#include "cluster_roles.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <filesystem>
#include <optional>
#include <cstdio>
#include <set>
#include <limits>
#include <memory>
#include <thread>

#include "backend.h"
#include "chunk_manager.h"
#include "cluster_link.h"
#include "cluster_ranks.h"
#include "coordinator_replies.h"
#include "dataset_store.h"
#include "group_collective.h"
#include "json_fields.h"
#include "ps_client.h"
#include "ps_server.h"
#include "ps_shard_device.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "worker_group.h"
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
  s.init_timeout_ms = r.small_integer("init_timeout_ms");
  s.step_timeout_s = r.number("step_timeout_s", &ten_minutes);  // absent from older settings
  if (s.batch < 1) throw InputError("cluster settings: batch must be >= 1");
  try {
    s.optimizer.validate();
  } catch (const InputError& e) {
    throw InputError(std::string("cluster settings: ") + e.what());
  }
  if (!(s.step_timeout_s >= 0))
    throw InputError("cluster settings: step_timeout_s must be >= 0 (0: never)");
  check_overlap(s);
  check_worker_group(s);
  return s;
}

namespace {

// A role's context: the caller's (inproc) or its own.
struct RoleContext {
  explicit RoleContext(zmq::context_t* shared)
      : own(shared ? nullptr : std::make_unique<zmq::context_t>(1)), context(shared ? *shared : *own) {}
  std::unique_ptr<zmq::context_t> own;
  zmq::context_t& context;
};

RoleRegistration register_role(CoordinatorLink& link, const RoleOptions& o, const char* role) {
  json request{{"type", "register"}, {"role", role}, {"pid", int64_t(getpid())}, {"host", host_name()}};
  if (!o.name.empty()) request["name"] = o.name;
  RoleRegistration r = read_registration_reply(link.request(request));
  if (!o.data.empty()) r.settings.data = o.data;
  return r;
}

bool training_over(const std::string& phase) {
  return phase == "draining" || phase == "done" || phase == "failed";
}

void check_coordinator(const CoordinatorLink& link, const RoleOptions& o, const std::string& who) {
  if (link.coordinator_lost(o.coordinator_lost_ms))
    throw Error(who + ": the coordinator at " + link.endpoint() + " has not answered for " +
                std::to_string(o.coordinator_lost_ms / 1000) + " s");
}

// Waits until the coordinator says the cluster is complete; returns the parameter servers'
// addresses in index order, or an empty list when training ended meanwhile.
std::vector<std::string> wait_for_cluster(CoordinatorLink& link, const RoleOptions& o,
                                          const std::string& who) {
  for (;;) {
    const ClusterSpec spec = read_spec_reply(link.request({{"type", "spec"}}));
    if (training_over(spec.phase) || training_over(link.phase())) return {};
    if (spec.ready) {
      if (spec.ps_addresses.empty()) throw Error(who + ": the cluster has no parameter server");
      return spec.ps_addresses;
    }
    check_coordinator(link, o, who);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// Whether the chief worker (worker0) is among the live workers the coordinator lists.
bool chief_alive(CoordinatorLink& link) {
  const std::vector<std::string> workers =
      read_spec_reply(link.request({{"type", "spec"}})).worker_names;
  return std::find(workers.begin(), workers.end(), "worker0") != workers.end();
}

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

// The chief sets the parameters; the others wait until someone has. A worker whose wait finds the
// chief gone (it died before its Init, workers started by hand) sets them itself: the seeded
// initial parameters are the chief's, value for value, and a server takes only the first Init.
// Returns false when training ended while waiting.
bool init_parameters(PsClient& client, const RoleRegistration& r, CoordinatorLink& link,
                     Model& model, bool may_stand_in) {
  std::vector<NamedTensor> initial;
  if (r.chief) initial = Model::initialized(r.settings.model, r.settings.seed).parameters();
  const auto deadline = Clock::now() + std::chrono::milliseconds(r.settings.init_timeout_ms);
  auto next_chief_check = Clock::now() + std::chrono::seconds(1);
  std::string waiting_for;  // the last refusal, naming a server still not initialised
  for (;;) {
    try {
      PsResult result = client.init(initial).wait();
      model.parameters() = std::move(result.tensors);
      return true;
    } catch (const ServerError& e) {
      if (!e.not_initialised()) throw;
      waiting_for = e.what();
    }
    if (training_over(link.phase())) return false;
    if (may_stand_in && initial.empty() && Clock::now() >= next_chief_check) {
      next_chief_check = Clock::now() + std::chrono::seconds(1);
      if (!chief_alive(link)) {
        std::fprintf(stderr, "%s: the chief worker (worker0) is gone before initialising the "
                     "parameters; initialising them in its place\n", r.name.c_str());
        initial = Model::initialized(r.settings.model, r.settings.seed).parameters();
        continue;
      }
    }
    if (Clock::now() > deadline)
      throw Error(r.name + ": waited " + std::to_string(r.settings.init_timeout_ms / 1000) +
                  " s for the chief worker (worker0) to initialise the parameters on every "
                  "server; still not initialised: " + waiting_for);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace

ClientOptions cluster_client_options(const RunSettings& s, zmq::context_t* context) {
  ClientOptions c;
  c.timeout_ms = s.ps_timeout_ms;
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

// A role's parameter-server client: the settings', with the role's own CURVE pair when it was
// given one (the settings' client key file names a path on the coordinator's node).
ClientOptions client_options(const RunSettings& s, zmq::context_t& context, const RoleOptions& o) {
  ClientOptions c = cluster_client_options(s, &context);
  if (!c.curve_server_key.empty() && !o.coordinator_curve.client.secret_key.empty()) {
    c.curve_public_key = o.coordinator_curve.client.public_key;
    c.curve_secret_key = o.coordinator_curve.client.secret_key;
  }
  return c;
}

PsMode parse_mode(const std::string& text) {
  if (text == "async") return PsMode::Async;
  if (text == "sync") return PsMode::Sync;
  if (text == "bounded_staleness" || text == "bounded") return PsMode::BoundedStaleness;
  throw InputError("parameter server mode must be async, sync or bounded_staleness, not '" + text + "'");
}

// Pulls until every server answers again (false when training ended meanwhile). Throws when
// they stay silent for init_timeout_ms.
bool repull(PsClient& client, CoordinatorLink& link, const RoleOptions& o,
            const RoleRegistration& r, Model& model) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(r.settings.init_timeout_ms);
  for (;;) {
    if (training_over(link.phase())) return false;
    check_coordinator(link, o, r.name);
    try {
      model.parameters() = client.pull().wait().tensors;
      return true;
    } catch (const ServerError& e) {
      // A server restarted without a checkpoint to resume from: give it this worker's newest
      // parameters, which the caller put in `model` (the first Init wins; the servers that
      // kept theirs ignore it).
      if (!e.not_initialised()) throw;
      std::fprintf(stderr, "%s: a parameter server lost its parameters (restarted without a "
                   "checkpoint): initialising it with this worker's newest\n", r.name.c_str());
      try {
        model.parameters() = client.init(model.parameters()).wait().tensors;
        return true;
      } catch (const transport::TransportError&) {
      }
    } catch (const transport::TransportError& e) {
      if (Clock::now() > deadline)
        throw Error(r.name + ": the parameter servers have not answered for " +
                    std::to_string(r.settings.init_timeout_ms / 1000) + " s: " + e.what());
    }
  }
}

// `status`: the role's last counters (a worker's batches done), which the heartbeats may not
// have carried yet.
void say_goodbye(CoordinatorLink& link, const std::string& name, const json& status = nullptr) {
  try {
    json request{{"type", "goodbye"}, {"name", name}};
    if (!status.is_null()) request["status"] = status;
    // A role stopped from its own process may be stopping because the coordinator is gone:
    // say goodbye, but do not wait long for an answer.
    link.request(request, link.cancelled() ? 500 : -1);
  } catch (const Error&) {
    // The coordinator is gone already; nothing to tell.
  }
}

// Closes a worker's feed (when it has one) however the worker leaves: an error before or while
// training, or training over before it began. A feeder waiting for room must never wait on a
// worker that is gone, and the blocks still queued are released. The first reason given stays.
class FeedCloser {
 public:
  FeedCloser(std::shared_ptr<FeedQueue> feed, std::string who)
      : feed_(std::move(feed)), who_(std::move(who)) {}
  ~FeedCloser() {
    close(std::uncaught_exceptions() > 0 ? " stopped on an error" : " has stopped");
  }
  FeedCloser(const FeedCloser&) = delete;
  FeedCloser& operator=(const FeedCloser&) = delete;
  void name(std::string who) { who_ = std::move(who); }
  void close(const std::string& how) {
    if (feed_) feed_->close(who_ + how);
  }

 private:
  std::shared_ptr<FeedQueue> feed_;
  std::string who_;
};

// A group's members are threads of this process stepped together by WorkerGroup::step; one
// that fails aborts the others at once, so this bound only ends a member stuck in its backend.
// It runs from the first member's arrival, which may be a member with no batch (the end of a
// task) while the others compute a whole step: at least a minute, and no less than the run's
// step timeout, which already says how long a step may take.
int group_timeout_ms(const RunSettings& s) {
  return static_cast<int>(std::min(3.6e6, std::max(60.0, s.step_timeout_s) * 1000.0));
}

// The size of a worker's group: the GPUs it was given, or the settings' worker_group.
int group_members(const RoleOptions& o, const RunSettings& s, const std::string& who) {
  if (o.gpus.empty()) return s.worker_group;
  if (s.backend == "cpu")
    throw InputError(who + ": --gpus needs a run on the cuda or auto backend; this run's is cpu");
  std::set<int> seen;
  for (const int d : o.gpus)
    if (d < 0 || !seen.insert(d).second)
      throw InputError(who + ": --gpus lists GPU " + std::to_string(d) +
                       (d < 0 ? "; GPUs are numbered from 0" : " twice"));
  return int(o.gpus.size());
}

// Member m's backend: CUDA on gpus[m] when GPUs are given; otherwise the run's backend (a CUDA
// one on device m), with worker_threads threads on the CPU.
std::unique_ptr<Backend> make_member_backend(const RoleOptions& o, const RunSettings& s, int m) {
  if (!o.gpus.empty())
    return make_backend(BackendKind::Cuda, s.model, s.optimizer, s.worker_threads,
                        parse_precision(s.precision), o.gpus[size_t(m)]);
  return make_backend(parse_backend(s.backend), s.model, s.optimizer, s.worker_threads,
                      parse_precision(s.precision), m);
}

// `batch` copied into `into` (reused: reallocated only when too small or of another shape);
// returns the copy's view.
DatasetView copy_batch(const DatasetView& batch, Dataset& into) {
  if (into.rows() < batch.rows || into.features() != batch.features ||
      into.pixel_type() != batch.pixel_type || into.num_classes() != std::max(batch.num_classes, 1))
    into = Dataset(batch.pixel_type, batch.rows, batch.features, std::max(batch.num_classes, 1));
  std::memcpy(into.pixel_data(), batch.pixels,
              size_t(batch.rows) * size_t(batch.features) * batch.pixel_bytes());
  if (batch.labels != nullptr) std::memcpy(into.label_data(), batch.labels, size_t(batch.rows));
  DatasetView view = into.view().slice(0, batch.rows);
  view.num_classes = batch.num_classes;
  if (batch.labels == nullptr) view.labels = nullptr;
  return view;
}

}  // namespace

// The role itself; run_ps_role wraps it (run_cancellable).
static void ps_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  std::unique_ptr<ParameterServer> server;  // outlives the link's heartbeat thread
  CoordinatorLink link(o.coordinator, rc.context, 10000, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "ps");
  ServerOptions so;
  so.mode = parse_mode(r.settings.ps_mode);
  so.replicas_to_aggregate = r.settings.replicas_to_aggregate;
  so.staleness_bound = r.settings.staleness_bound;
  so.optimizer = r.settings.optimizer;
  so.context = o.context;
  so.bind = !o.bind.empty() ? o.bind
            : o.coordinator.rfind("inproc://", 0) == 0 ? "inproc://tandem-" + r.name
                                                       : "tcp://127.0.0.1:*";
  so.checkpoint_dir = r.settings.checkpoint_dir;
  so.checkpoint_every_seconds = r.settings.checkpoint_every_s;
  so.checkpoint_every_steps = r.settings.checkpoint_every_steps;
  so.shard_name = r.name;
  const std::string& device = r.settings.ps_device;
  if (device == "cuda") so.device = 0;
  else if (device == "auto") so.device = shard_device_count() > 0 ? 0 : -1;
  else if (device != "cpu")
    throw InputError("parameter server device must be cpu, cuda or auto, not '" + device + "'");
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
    const std::string phase = link.phase();
    if (phase == "done" || phase == "failed" || !server->serving()) break;
    check_coordinator(link, o, r.name);
    link.wait_phase_change(phase, 100);
  }
  server->stop();  // writes the final checkpoint
  say_goodbye(link, r.name);
}

// The role itself; run_worker_role wraps it (run_cancellable).
static void worker_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  FeedCloser feed_closer(o.feed, o.name.empty() ? "the worker" : o.name);
  CoordinatorLink link(o.coordinator, rc.context, 10000, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "worker");
  feed_closer.name(r.name);
  // What the heartbeats carry; written by this thread, read by the heartbeat thread.
  struct Status {
    // batches_done: batches whose gradients the servers applied; gradients_lost: batches whose
    // gradients a server never answered (it died, or restarted). `done` counts both: the task's
    // progress, batches this worker will not train again.
    std::atomic<int64_t> steps{0}, samples{0}, batches_done{0}, gradients_lost{0}, task{0}, done{0};
    std::atomic<int> queue_depth{0};
    // Since when the backend has been in a call (steady-clock ns; 0: in none), and which: the
    // heartbeats report a call older than the step timeout (RunSettings::step_timeout_s).
    std::atomic<int64_t> busy_since_ns{0};
    std::atomic<const char*> busy_in{""};
    std::atomic<bool> stall_said{false};
  };
  auto status = std::make_shared<Status>();
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
  };
  auto last = std::make_shared<std::pair<Clock::time_point, int64_t>>(Clock::now(), 0);
  const double step_timeout_s = r.settings.step_timeout_s;
  link.start_heartbeats(r.name, [status, last, now_ns, step_timeout_s, name = r.name] {
    const auto now = Clock::now();
    const int64_t samples = status->samples.load();
    const double dt = std::chrono::duration<double>(now - last->first).count();
    const double rate = dt > 0 ? double(samples - last->second) / dt : 0.0;
    *last = {now, samples};
    json beat{{"steps", status->steps.load()}, {"samples", samples},
              {"samples_per_s", rate}, {"batches_done", status->batches_done.load()},
              {"gradients_lost", status->gradients_lost.load()},
              {"task", status->task.load()}, {"done", status->done.load()},
              {"queue_depth", status->queue_depth.load()}};
    const int64_t since = status->busy_since_ns.load();
    const double busy_s = since != 0 ? double(now_ns() - since) / 1e9 : 0.0;
    if (step_timeout_s > 0 && busy_s > step_timeout_s) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "its backend has not returned from %s for %.3g s (step timeout %g s): a hung "
                    "GPU?", status->busy_in.load(), busy_s, step_timeout_s);
      beat["stalled"] = text;
      if (!status->stall_said.exchange(true)) std::fprintf(stderr, "%s: %s\n", name.c_str(), text);
    } else if (since == 0) {
      status->stall_said = false;  // returned: a later stall is said again
    }
    return beat;
  }, o.heartbeat_ms);
  // Marks the backend as in a call, for the heartbeats' stall check. A call that ends in an
  // exception leaves the mark: the role is on its way out, and what it still does (a CUDA
  // backend's destructor waits for its streams, which a hung GPU never finishes) stays under
  // the check, so the coordinator hears of the stall and hands the task to another worker
  // (the link outlives the backends) instead of taking the worker for a healthy one.
  struct InBackend {
    InBackend(Status& s, const char* what, int64_t now)
        : status(s), exceptions(std::uncaught_exceptions()) {
      status.busy_in = what;
      status.busy_since_ns = now;
    }
    ~InBackend() {
      if (std::uncaught_exceptions() == exceptions) status.busy_since_ns = 0;
    }
    InBackend(const InBackend&) = delete;
    InBackend& operator=(const InBackend&) = delete;
    Status& status;
    const int exceptions;
  };

  const std::vector<std::string> servers = wait_for_cluster(link, o, r.name);
  if (servers.empty()) {
    feed_closer.close(" has stopped: training ended before it began");
    return say_goodbye(link, r.name);
  }
  const RunSettings& s = r.settings;
  if (s.fed && !o.feed)
    throw InputError(r.name + ": this run trains on fed batches, and this worker was started "
                     "without a feed (start it from the Python package: tandem.WorkerRole)");
  std::unique_ptr<ChunkManager> stream;
  if (!s.fed) {
    const DatasetStore store = DatasetStore::open(s.data);
    ChunkManagerOptions cm;
    cm.batch_rows = s.batch;
    cm.shuffle = s.shuffle;
    cm.seed = s.seed;
    cm.readers = s.readers;
    cm.assemblers = s.assemblers;
    // Page-locked for the GPU the worker's backend uses (its first, in a group), so that no
    // context is made on GPU 0 for a worker given others; plain memory for a CPU backend.
    cm.pin_for_device = !o.gpus.empty()                              ? o.gpus[0]
                        : parse_backend(s.backend) == BackendKind::Cpu ? -1
                                                                       : 0;
    stream = std::make_unique<ChunkManager>(store.train, store.num_classes, cm);
    if (stream->features() != s.model.inputs() || store.num_classes != int(s.model.classes()))
      throw InputError(r.name + ": the store " + s.data + " has " + std::to_string(stream->features()) +
                       " features and " + std::to_string(store.num_classes) +
                       " classes, the model is " + s.model.describe());
  }
  // One backend per member of this worker's group; a plain worker is a group of one, and
  // backends[0] (the leader's) is its backend.
  const int members = group_members(o, s, r.name);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int m = 0; m < members; ++m) {
    try {
      backends.push_back(make_member_backend(o, s, m));
    } catch (const InputError& e) {
      if (members == 1) throw;
      throw InputError(r.name + ": member " + std::to_string(m) + " of its group of " +
                       std::to_string(members) + ": " + e.what());
    }
  }
  Backend* const backend = backends[0].get();
  // A group of more than one: WorkerGroup sums the members' gradients. GPU members sum them on
  // the GPUs with NCCL (one communicator per GPU of this process, the sums overlapped with the
  // backward pass); CPU members, and GPU members in a build without NCCL, through host memory
  // with the thread collective.
  std::unique_ptr<GroupCollective> collective;
  std::unique_ptr<WorkerGroup> group;
  if (members > 1) {
    std::vector<Backend*> pointers;
    std::vector<int> devices;
    for (const auto& b : backends) {
      pointers.push_back(b.get());
      devices.push_back(b->device_buffers().device);
    }
    if (*std::min_element(devices.begin(), devices.end()) >= 0) {
      // (NCCL there but failing to start is a GroupError, not caught: better an error than a
      // slower run.)
      try {
        collective = make_nccl_collective(devices, group_timeout_ms(s));
      } catch (const InputError& e) {
        std::fprintf(stderr, "%s: its group of %d GPUs sums through host memory: %s\n",
                     r.name.c_str(), members, e.what());
      }
    }
    if (!collective) collective = make_thread_collective(members, group_timeout_ms(s));
    group = std::make_unique<WorkerGroup>(s.model, pointers, *collective);
  }
  // A group call that left a member behind, hung in its backend (worker_group.h): this worker
  // cannot go on, and it must not unwind either, since destroying that member's backend, its
  // batches or the group would wait for the hung GPU or be read by the member's thread. It says
  // which rank and ends the process at once; the launcher or the missed heartbeats tell the
  // coordinator, and its batches go to the other workers.
  auto in_group = [&](const auto& call) {
    try {
      call();
    } catch (const GroupError& e) {
      if (!group->abandoned()) throw;
      std::fprintf(stderr, "%s: %s; the process ends here\n", r.name.c_str(), e.what());
      std::fflush(stderr);
      std::_Exit(EXIT_FAILURE);
    }
  };
  ClientOptions client_settings = client_options(s, rc.context, o);
  client_settings.cancel = o.cancel;
  PsClient client(servers, client_settings);
  Model model(s.model);
  if (!init_parameters(client, r, link, model, /*may_stand_in=*/true)) {
    feed_closer.close(" has stopped: training ended before it began");
    return say_goodbye(link, r.name);
  }
  // Every member gets the parameters `model` holds (a group's by the leader's broadcast).
  auto install = [&] {
    const InBackend in(*status, "installing the parameters", now_ns());
    if (group) in_group([&] { group->install(model); });
    else backend->set_parameters(model);
  };
  install();
  // A step's parameters as they arrived (wait_in_place): a plain worker's backend copies them
  // straight from the received frames; a group's leader broadcasts them from `model`.
  ReceivedParameters received;
  auto wait_and_install = [&](PsClient::Handle& handle) {
    handle.wait_in_place(received);
    const InBackend in(*status, "installing the parameters", now_ns());
    if (!group) return backend->set_parameters(received.runs());
    received.copy_into(model.parameters());
    in_group([&] { group->install(model); });
  };

  // The step's gradients, pushed zero-copy: ZeroMQ reads them in place after push_pull returns
  // (and, with overlap, while the next gradient is computed), so each step fills a buffer from a
  // pool that hands out only buffers no send holds any more.
  transport::HeldPool<std::vector<NamedTensor>> gradient_buffers;
  std::shared_ptr<PsClient::GradientBuffer> gradients;
  // With settings.overlap, the push_pull of batch k is answered while batch k+1's gradient is
  // computed (on parameters one exchange older): communication hidden behind compute.
  std::optional<PsClient::Handle> inflight;
  struct Pushed {
    int64_t batches = 0, rows = 0;
  } inflight_pushed;  // what the exchange in flight carries
  enum class Exchanged { Applied, Lost, Ended };
  // Runs one exchange, which waits for it and installs the parameters it brings
  // (wait_and_install); when a server does not answer (it died, or is restarting from its
  // checkpoint) that gradient is lost and the parameters are pulled again once the servers
  // answer, into `model`, and installed from there. Ended when training ended meanwhile.
  auto exchange = [&](const std::function<void()>& run) {
    // A server that restarted without a checkpoint may answer before the request times out
    // (a request queued while it was down reaches the new one): "not initialised" is the
    // same news as the silence, and goes the same way.
    auto recover = [&](const char* what) {
      std::fprintf(stderr, "%s: %s; waiting for the servers\n", r.name.c_str(), what);
      // `model` holds the parameters last pulled into it, not those installed since (a plain
      // worker installs each reply straight into its backend): a server that lost its
      // parameters is given the newest this worker has, not those of the run's start.
      backend->get_parameters(model);
      if (!repull(client, link, o, r, model)) return Exchanged::Ended;
      install();
      return Exchanged::Lost;
    };
    try {
      run();
    } catch (const transport::TransportError& e) {
      return recover(e.what());
    } catch (const ServerError& e) {
      if (!e.not_initialised()) throw;
      return recover(e.what());
    }
    return Exchanged::Applied;
  };
  // Counts an exchange's gradients (`batches` batches of `rows` rows) as applied or lost (an
  // exchange that training ended while the servers were away is lost too: none answered it).
  auto tally = [&](Exchanged outcome, Pushed pushed) {
    if (outcome == Exchanged::Applied) {
      status->steps += 1;
      status->samples += pushed.rows;
      status->batches_done += pushed.batches;
    } else {
      status->gradients_lost += pushed.batches;
    }
  };
  // Pushes `gradients` (this worker's, or its group's sum over `batches` batches of `rows` rows
  // in all) and counts them done; false when training ended while the servers were away. In
  // sync mode a push counts as one replica, a group's as much as a plain worker's.
  auto push_gradients = [&](int64_t batches, int64_t rows) {
    const Pushed pushed{batches, rows};
    if (s.overlap) {
      // The previous batch's exchange has been in flight while this gradient was computed, on
      // the parameters installed before it: their versions go with the push, not those of the
      // reply installed next (the servers' staleness counts would read one too low).
      const std::vector<uint64_t> computed_on = client.versions();
      if (inflight) {
        const Exchanged previous = exchange([&] { wait_and_install(*inflight); });
        inflight.reset();
        tally(previous, inflight_pushed);  // done when it was pushed
        if (previous == Exchanged::Ended) return false;
      }
      try {
        inflight = client.push_pull(gradients, &computed_on);
        inflight_pushed = pushed;  // counted once answered
      } catch (const transport::TransportError& e) {
        const Exchanged now = exchange([&] { throw e; });
        if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
        tally(now, pushed);
      }
    } else {
      const Exchanged now = exchange([&] {
        PsClient::Handle handle = client.push_pull(gradients);
        wait_and_install(handle);
      });
      if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
      tally(now, pushed);
    }
    // The task's `done` counts batches (the coordinator hands out a lost worker's batches after
    // its last report), so a group's step counts each of its batches; a batch whose gradient
    // was lost is done too (it is not trained again).
    status->done += batches;
    return true;
  };
  // One batch: its gradient, pushed; false when training ended while the servers were away.
  auto train_batch = [&](const DatasetView& batch) {
    {
      const InBackend in(*status, "a step", now_ns());
      backend->compute_gradients(batch, nullptr, batch.rows);
    }
    gradients = gradient_buffers.take();  // (after the compute: a send may still hold one)
    {
      const InBackend in(*status, "a step's gradients", now_ns());
      backend->get_gradients(gradients->value);
    }
    return push_gradients(1, batch.rows);
  };
  // A group's step: step_batches[m] to member m, the first `count` of them batches and the
  // rest empty (fewer batches than members at the end of a task or block: those members add
  // zeros). The leader pushes the sum.
  std::vector<DatasetView> step_batches(static_cast<size_t>(members));
  auto train_group_step = [&](int count) {
    for (size_t m = size_t(count); m < step_batches.size(); ++m) step_batches[m] = DatasetView{};
    gradients = gradient_buffers.take();
    {
      const InBackend in(*status, "its group's step", now_ns());
      in_group([&] { gradients->value = group->step(step_batches); });
    }
    int64_t rows = 0;
    for (int m = 0; m < count; ++m) rows += step_batches[size_t(m)].rows;
    return push_gradients(count, rows);
  };
  // A group's share of a task from the stream: steps of up to one batch per member, in the
  // stream's order. next()'s view is valid only until the next call, so every batch of a step
  // but its last is copied into its member's buffer (the last one is used in place: next() is
  // not called again before the step is done). True once the task's batches are all trained,
  // false when training ended.
  std::vector<Dataset> member_buffers(static_cast<size_t>(members));
  auto train_group_task = [&]() {
    DatasetView batch;
    for (;;) {
      if (training_over(link.phase())) return false;
      int count = 0;
      bool more = true;
      while (count < members && (more = stream->next(batch))) {
        step_batches[size_t(count)] =
            count + 1 < members ? copy_batch(batch, member_buffers[size_t(count)]) : batch;
        ++count;
      }
      if (count == 0) return true;
      status->queue_depth = int(stream->ready_batches());
      if (!train_group_step(count)) return false;
      if (!more) return true;
    }
  };

  json finished = nullptr;
  if (s.fed) {
    // Each fed block is cut into batches of s.batch rows (the last one may be shorter), in the
    // order given: whoever feeds chooses the order, as the seed's queue does.
    try {
      while (!training_over(link.phase())) {
        check_coordinator(link, o, r.name);
        status->queue_depth = int(o.feed->depth());
        std::optional<FedBlock> block = o.feed->pop(100);
        if (!block) {
          for (const auto& b : backends) b->rest();
          continue;
        }
        const DatasetView& rows = block->rows;
        if (rows.labels == nullptr) throw InputError(r.name + ": a fed block has no labels");
        for (int64_t i = 0; i < rows.rows; ++i)
          if (rows.labels[i] >= s.model.classes())
            throw InputError(r.name + ": a fed block has label " + std::to_string(int(rows.labels[i])) +
                             " at row " + std::to_string(i) + "; the model has " +
                             std::to_string(s.model.classes()) + " classes");
        try {
          check_model_data(s.model, rows, true);
        } catch (const InputError& e) {
          throw InputError(r.name + ": a fed block: " + e.what());
        }
        bool go_on = true;
        if (group) {
          // Up to one batch per member a step; the block outlives the step (no copies). A
          // block's last step may be short.
          for (int64_t begin = 0; go_on && begin < rows.rows;) {
            if (training_over(link.phase())) break;
            int count = 0;
            for (; count < members && begin < rows.rows; ++count, begin += s.batch)
              step_batches[size_t(count)] = rows.slice(begin, std::min(rows.rows, begin + s.batch));
            go_on = train_group_step(count);
          }
        } else {
          for (int64_t begin = 0; go_on && begin < rows.rows; begin += s.batch) {
            if (training_over(link.phase())) break;
            go_on = train_batch(rows.slice(begin, std::min(rows.rows, begin + s.batch)));
          }
        }
        if (!go_on) break;
      }
    } catch (...) {
      o.feed->close(r.name + " stopped on an error");
      throw;
    }
    o.feed->close(r.name + " has stopped: training is over");
  } else {
    for (bool stop = false; !stop;) {
      check_coordinator(link, o, r.name);
      json request{{"type", "work"}, {"name", r.name}};
      if (!finished.is_null()) request["finished"] = finished;
      const WorkReply reply = read_work_reply(link.request(request));
      finished = nullptr;
      if (reply.stop) break;
      if (!reply.has_task) {
        // No batch for now (the others finish the epoch): a sync step need not wait for this
        // worker's gradient, nor a bounded-staleness reply for its clock. Advisory: a server
        // that misses it waits as it would have. Said at every poll, not once: a server counts
        // an idle worker again after each sync step it applies (so that one back at work is
        // waited for), and this worker cannot see when that happens; an empty one-way message
        // per poll (50 ms) costs next to nothing.
        if (s.ps_mode != "async") {
          try {
            client.idle();
          } catch (const transport::TransportError&) {
          }
        }
        link.wait_phase_change(link.phase(), reply.wait_ms);
        continue;
      }
      const int64_t task_id = reply.task_id;
      status->done = 0;
      status->task = task_id;
      stream->start_epoch(reply.epoch, reply.batches);
      if (group) {
        if (train_group_task()) finished = task_id;
        else stop = true;
        continue;
      }
      DatasetView batch;
      for (;;) {
        if (training_over(link.phase())) {
          stop = true;
          break;
        }
        if (!stream->next(batch)) {
          finished = task_id;
          break;
        }
        status->queue_depth = int(stream->ready_batches());
        if (!train_batch(batch)) {
          stop = true;
          break;
        }
      }
    }
    stream->cancel();
  }
  // The last gradient, applied (or lost).
  if (inflight) tally(exchange([&] { wait_and_install(*inflight); }), inflight_pushed);
  if (!finished.is_null()) {
    try {
      link.request({{"type", "progress"}, {"name", r.name}, {"task", finished}, {"done", status->done.load()}},
                   link.cancelled() ? 500 : -1);
    } catch (const Error&) {
    }
  }
  say_goodbye(link, r.name, json{{"steps", status->steps.load()}, {"samples", status->samples.load()},
                                 {"batches_done", status->batches_done.load()},
                                 {"gradients_lost", status->gradients_lost.load()},
                                 {"task", status->task.load()}, {"done", status->done.load()},
                                 {"queue_depth", 0}});
}

// The role itself; run_scorer_role wraps it (run_cancellable).
static void scorer_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  CoordinatorLink link(o.coordinator, rc.context, 10000, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "scorer");
  auto scores = std::make_shared<std::atomic<int64_t>>(0);
  link.start_heartbeats(r.name, [scores] { return json{{"scores", scores->load()}}; }, o.heartbeat_ms);
  const std::vector<std::string> servers = wait_for_cluster(link, o, r.name);
  if (servers.empty()) return say_goodbye(link, r.name);
  const RunSettings& s = r.settings;
  // The rows scored: given to this scorer (a fed run), or the store's validation split.
  DataSplits splits;
  DatasetView validation;
  if (o.validation) {
    validation = o.validation->rows;
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
  check_model_data(s.model, validation, true);
  ClientOptions client_settings = client_options(s, rc.context, o);
  client_settings.cancel = o.cancel;
  PsClient client(servers, client_settings);
  Model model(s.model);
  if (!init_parameters(client, r, link, model, /*may_stand_in=*/false)) {
    return say_goodbye(link, r.name);
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
          phase, int(std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count()) + 1);
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
      best.optimizer.kind = OptimizerKind::Sgd;  // Adam's moments stay in the servers' shards
      best.step = int64_t(result.version);
      best.seed = s.seed;
      best.batch = s.batch;
      best.extra["source"] = "tandem scorer: the parameters of the lowest validation loss";
      best.extra["trained_with"] = to_string(s.optimizer.kind);
      best.extra["validation_loss"] = std::to_string(stats.loss_sum);
      best.extra["run"] = r.run;
      save_checkpoint(s.best_model_path, best);
    }
    link.request({{"type", "score"}, {"name", r.name}, {"step", result.version},
                  {"loss", stats.loss_sum}, {"loss_mean", stats.loss_sum / n},
                  {"accuracy", double(stats.correct) / n}, {"samples", stats.samples}});
    *scores += 1;
  }
  say_goodbye(link, r.name);
}

namespace {

// A role stopped from its own process (RoleOptions::cancel) gives up on requests that would
// otherwise wait out their timeouts; those failures are the stop itself, not errors.
template <typename Role>
void run_cancellable(const RoleOptions& o, Role role) {
  try {
    role(o);
  } catch (const transport::TransportError&) {
    if (o.cancel && *o.cancel) return;
    throw;
  }
}

}  // namespace

void run_ps_role(const RoleOptions& o) { run_cancellable(o, ps_role); }
void run_worker_role(const RoleOptions& o) { run_cancellable(o, worker_role); }
void run_scorer_role(const RoleOptions& o) { run_cancellable(o, scorer_role); }

}  // namespace tandem
