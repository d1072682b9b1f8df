#include "coordinator.h"

#include <algorithm>
#include <cstdio>
#include <random>
#include <set>

#include "cluster_link.h"
#include "cluster_ranks.h"
#include "curve_client.h"
#include "json_fields.h"
#include "ps_placement.h"
#include "tandem/error.h"
#include "zmq_messaging.h"
#include "zmq_through_signals.h"

namespace tandem {

using transport::TransportError;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

const char* to_string(ClusterPhase phase) {
  switch (phase) {
    case ClusterPhase::Starting: return "starting";
    case ClusterPhase::Training: return "training";
    case ClusterPhase::Draining: return "draining";
    case ClusterPhase::Done: return "done";
    case ClusterPhase::Failed: return "failed";
  }
  return "?";
}

namespace {

// Which of n scores the state shows: all of the newest kStateScores / 2, and as many again
// spread evenly over the older ones (the first included), so that a long run's state, built
// every second under the coordinator's lock and drawn point by point by the dashboard, stays
// the same size however many scores there are.
constexpr size_t kStateScores = 2000;
std::vector<size_t> scores_shown(size_t n) {
  std::vector<size_t> shown;
  const size_t newest = std::min(n, kStateScores / 2), older = n - newest;
  const size_t spread = std::min(older, kStateScores - newest);
  for (size_t k = 0; k < spread; ++k) shown.push_back(k * older / spread);
  for (size_t i = older; i < n; ++i) shown.push_back(i);
  return shown;
}

std::string bind_socket(zmq::socket_t& socket, const std::string& address, const char* what) {
  return transport::bind_checked(socket, address,
                                 std::string("coordinator: cannot bind the ") + what + " socket");
}

// "worker3" -> 3 for role "worker"; -1 when the name is not the role plus a number.
int index_from_name(const std::string& name, const std::string& role) {
  if (name.size() <= role.size() || name.compare(0, role.size(), role) != 0) return -1;
  int index = 0;
  for (size_t i = role.size(); i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || index > 100000) return -1;
    index = index * 10 + (name[i] - '0');
  }
  return index;
}

bool gone(const std::string& state) { return state == "lost" || state == "stopped"; }
bool stopped_only(const std::string& state) { return state == "stopped"; }

}  // namespace

std::string Coordinator::random_run_id() {
  std::random_device device;
  char text[33];
  std::snprintf(text, sizeof text, "%08x%08x%08x%08x", device(), device(), device(), device());
  return text;
}

namespace {

// The chief's Init goes only to the servers that hold a part of the model (ps_client.cpp), so a
// server placed nothing would never be initialised and every other worker would wait on it until
// its init timeout. Placement splits large tensors by rows, so this takes a model of few rows
// and many servers; it is refused before anything starts.
void check_every_server_holds_a_part(const nlohmann::json& run_config, int servers) {
  const auto model = run_config.find("model");
  if (model == run_config.end() || !model->is_string() || servers < 1) return;
  const ModelConfig config = ModelConfig::parse(model->get<std::string>());
  std::vector<bool> holds(size_t(servers), false);
  for (const TensorPart& part : place_model_parts(config, servers))
    holds[size_t(part.server)] = true;
  const auto empty = std::find(holds.begin(), holds.end(), false);
  if (empty == holds.end()) return;
  const auto used = std::count(holds.begin(), holds.end(), true);
  throw InputError(std::to_string(servers) + " parameter servers for model " + config.describe() +
                   ": server " + std::to_string(empty - holds.begin()) + " would hold no part " +
                   "of it (its parts fill " + std::to_string(used) + "); use fewer servers");
}

}  // namespace

Coordinator::Coordinator(CoordinatorOptions options)
    : options_(std::move(options)),
      own_context_(options_.context ? nullptr : std::make_unique<zmq::context_t>(1)),
      control_(options_.context ? *options_.context : *own_context_, zmq::socket_type::router),
      scores_(options_.context ? *options_.context : *own_context_, zmq::socket_type::xpub),
      work_(options_.batches_per_epoch, options_.max_epochs, options_.first_epoch) {
  if (options_.fed && options_.max_epochs > 0)
    throw InputError("a fed run has no epochs (whoever feeds decides how often the data comes "
                     "round): stop it by target, time or request, not max epochs");
  check_every_server_holds_a_part(options_.run_config, options_.expected_ps);
  if (!options_.curve_secret_key.empty()) secure_sockets();
  else if (!options_.curve_allowed_clients.empty())
    throw InputError("coordinator: curve_allowed_clients without curve_secret_key");
  control_.set(zmq::sockopt::linger, 0);
  scores_.set(zmq::sockopt::linger, 0);
  // Its messages are small JSON objects (a run's spec, a heartbeat, a score): a peer that sends
  // more (one frame of gigabytes, on an endpoint open without CURVE) is disconnected by ZeroMQ
  // rather than buffered whole in this process's memory.
  control_.set(zmq::sockopt::maxmsgsize, kCoordinatorMaxMessageBytes);
  scores_.set(zmq::sockopt::maxmsgsize, kCoordinatorMaxMessageBytes);
  scores_.set(zmq::sockopt::xpub_verbose, 1);  // every subscription, repeated ones too
  endpoint_ = advertised_endpoint(bind_socket(control_, options_.bind, "control"),
                                  options_.advertise_host);
  control_file_ = transport::BoundIpcFile(options_.bind);
  scores_endpoint_ = advertised_endpoint(bind_socket(scores_, options_.scores_bind, "scores"),
                                         options_.advertise_host);
  scores_file_ = transport::BoundIpcFile(options_.scores_bind);
  if (options_.serve_at_once) start_serving();
}

void Coordinator::start_serving() {
  std::lock_guard<std::mutex> serving(serving_mutex_);
  if (thread_.joinable() || stopping_) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);  // state() reads it from other threads
    created_ = Clock::now();
  }
  thread_ = std::thread(&Coordinator::serve, this);
}

void Coordinator::secure_sockets() {
  for (const std::string* address : {&options_.bind, &options_.scores_bind})
    if (address->rfind("inproc://", 0) == 0)
      throw InputError("coordinator: CURVE does not apply to inproc:// endpoints (" + *address +
                       "; libzmq secures only tcp:// and ipc://)");
  transport::validate_curve_key(options_.curve_secret_key, "coordinator: curve_secret_key");
  for (size_t i = 0; i < options_.curve_allowed_clients.size(); ++i)
    transport::validate_curve_key(options_.curve_allowed_clients[i],
                                  "coordinator: curve_allowed_clients[" + std::to_string(i) + "]");
  // A domain of its own, so that servers sharing the context keep their own allowed lists.
  char domain[64];
  std::snprintf(domain, sizeof domain, "tandem-coordinator-%p", static_cast<void*>(this));
  zap_ = transport::ZapAuthenticator::allow(options_.context ? *options_.context : *own_context_,
                                            domain, options_.curve_allowed_clients);
  // Before bind: a connection accepted earlier would not be CURVE.
  transport::set_curve_server(control_, options_.curve_secret_key, zap_.domain());
  transport::set_curve_server(scores_, options_.curve_secret_key, zap_.domain());
}

Coordinator::~Coordinator() { stop_serving(); }

void Coordinator::stop_serving() {
  std::lock_guard<std::mutex> lock(serving_mutex_);
  stopping_ = true;
  if (thread_.joinable()) thread_.join();
}

double Coordinator::since_start(Clock::time_point t) const {
  if (training_started_ == Clock::time_point{}) return 0;
  return std::chrono::duration<double>(t - training_started_).count();
}

void Coordinator::serve() {
  zmq::pollitem_t items[] = {{control_.handle(), 0, ZMQ_POLLIN, 0},
                             {scores_.handle(), 0, ZMQ_POLLIN, 0}};
  while (!stopping_) {
    transport::poll_through_signals(items, 2, std::chrono::milliseconds(20));
    if (items[0].revents & ZMQ_POLLIN) {
      transport::Frames frames;
      while (transport::receive_frames(control_, frames, 0, "coordinator " + endpoint_)) {
        if (frames.size() != 2) continue;  // not a CoordinatorLink message
        const json request = parse_bounded_json(frames[1].to_string_view());
        json reply;
        bool replay = false;
        if (request.is_discarded() || !request.is_object()) {
          reply = {{"error", "a control message must be one JSON object (nested at most " +
                            std::to_string(kMaxJsonDepth) + " levels deep)"}};
        } else {
          try {
            reply = handle(request, replay);
          } catch (const std::exception& e) {
            reply = {{"error", e.what()}};
          }
          if (request.contains("seq")) reply["seq"] = request["seq"];
        }
        send_json(control_, reply, &frames[0]);
      }
    }
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t event;
      bool replay = false;
      while (transport::recv_through_signals(scores_, event, zmq::recv_flags::dontwait))
        if (event.size() > 0 && static_cast<const uint8_t*>(event.data())[0] == 1) replay = true;
      if (replay) {
        // The newest scores as replay number `id`: opened by {"replaying": id}, each score
        // marked "replay": id, closed by {"replayed": id}. A new subscriber may be sent live
        // scores before its replay (ZeroMQ attaches it before this loop reads its subscription),
        // or only the tail of a replay meant for another (attached in the middle of one): it
        // holds live scores back until it has a whole replay, then gives them after it, in order
        // (score_subscriber.h). Queued after the live scores, which it already covers.
        std::lock_guard<std::mutex> lock(mutex_);
        const int64_t id = ++replays_;
        to_publish_.push_back({{"replaying", id}});
        const size_t n = std::min(options_.score_history, scores_log_.size());
        for (size_t i = scores_log_.size() - n; i < scores_log_.size(); ++i) {
          const ScoreRecord& s = scores_log_[i];
          to_publish_.push_back({{"seq", s.seq}, {"t", s.t}, {"step", s.step}, {"loss", s.loss},
                                 {"loss_mean", s.loss_mean}, {"accuracy", s.accuracy},
                                 {"samples", s.samples}, {"replay", id}});
        }
        to_publish_.push_back({{"replayed", id}});
        if (phase_ == ClusterPhase::Done || phase_ == ClusterPhase::Failed)
          to_publish_.push_back(end_message_locked());
      }
    }
    on_tick();
    std::vector<json> out;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      out.swap(to_publish_);
    }
    for (const json& m : out) publish(m);
  }
}

void Coordinator::publish(const json& message) {
  const std::string text = wire_text(message);
  transport::send_through_signals(scores_, zmq::str_buffer("scores"),
                                 zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  transport::send_through_signals(scores_, zmq::buffer(text), zmq::send_flags::dontwait);
}

json Coordinator::handle(const json& r, bool& /*subscribe_replay*/) {
  const std::string type = json_string(r, "type", "");
  if (type == "register") return handle_register(r);
  // A role of another run (this address's previous coordinator's, reconnected on its own) goes
  // by the same names as this run's roles: only the run it registered with tells them apart.
  // Its heartbeats are told this coordinator does not know it (and not this run's phase), so it
  // ends; anything else it asks is refused. Requests without a run (from links that never
  // registered, roles of older versions) are taken as before.
  if (const std::string run = json_string(r, "run", ""); !run.empty() && run != run_id_) {
    if (type == "heartbeat") return json{{"unknown", true}};
    const std::string name = json_string_or(r, "name", "");
    throw InputError("'" + type + "' " + (name.empty() ? "" : "from '" + name + "' ") + "of run " +
                     run + ": this coordinator serves run " + run_id_);
  }
  if (type == "work") return handle_work(r);
  if (type == "score") return handle_score(r);
  if (type == "status") return state();
  std::unique_lock<std::mutex> lock(mutex_);
  if (type == "spec") {
    json reply{{"ready", phase_ != ClusterPhase::Starting}, {"phase", to_string(phase_)},
               {"spec", spec_locked()}};
    reply["waiting_for"] = missing_roles();
    if (phase_ == ClusterPhase::Failed) reply["failure"] = failure_;
    return reply;
  }
  if (type == "stop") {
    lock.unlock();
    request_stop(json_string(r, "reason", "requested"));
    return json::object();
  }
  const std::string name = json_string(r, "name", "");
  auto it = roles_.find(name);
  if (it == roles_.end()) {
    if (type == "heartbeat") {
      json reply = phase_reply_locked();
      reply["unknown"] = true;
      return reply;
    }
    throw InputError("'" + type + "' from '" + name + "', which has not registered");
  }
  Role& role = it->second;
  role.last_seen = Clock::now();
  if (type == "heartbeat") {
    // A worker whose backend is stuck in a call (a hung GPU) still sends heartbeats: it says so,
    // and counts as lost, its batches going to the others, until it is heard without it.
    if (role.role == "worker" && r.contains("status") && r["status"].is_object() &&
        r["status"].contains("stalled") && r["status"]["stalled"].is_string()) {
      if (!gone(role.state)) lose(role, r["status"]["stalled"].get<std::string>());
      role.status = r["status"];
      return phase_reply_locked();
    }
    if (role.state == "lost") {
      std::fprintf(stderr, "coordinator: %s is back\n", name.c_str());
      role.state = role.role == "ps" && role.address.empty() ? "registered" : "running";
    }
    if (r.contains("status") && r["status"].is_object()) {
      role.status = r["status"];
      if (role.role == "worker" && role.status.contains("task"))
        work_.progress(name, json_integer(role.status, "task", 0),
                       json_integer(role.status, "done", 0));
    }
    json reply = phase_reply_locked();
    // To the run's own roles only (an unknown one, above, may be another run's server). Every
    // batch of these epochs was counted done after its gradient's exchange was answered (or
    // given up: a gradient lost, which no run trains again), so a server's snapshot taken after
    // this reply arrives holds what the run trained of them. (Not quite: a push whose client
    // gave up waiting may still be applied by a server that was only slow.)
    if (!options_.fed) reply["epochs_whole"] = work_.epochs_whole();
    return reply;
  }
  if (type == "ready") {
    const std::string address = json_string(r, "address", "");
    if (address.empty()) throw InputError("'ready' from " + name + " without an address");
    if (role.role == "ps" && phase_ != ClusterPhase::Starting && !role.previous_address.empty() &&
        address != role.previous_address) {
      // Refused, as if it had said goodbye: a heartbeat its process sends before it ends must
      // not bring it back ("lost" would), and the next server to register takes its place.
      std::fprintf(stderr, "coordinator: %s refused: restarted at %s instead of %s\n",
                   name.c_str(), address.c_str(), role.previous_address.c_str());
      role.state = "stopped";
      changed_.notify_all();
      throw InputError(name + " served at " + role.previous_address + " and the workers know " +
                       "it there: restarted, it must serve at that address again (--bind " +
                       role.previous_address + "), not at " + address);
    }
    role.address = address;
    role.state = "running";
    replaced_.erase(name);  // the newcomer serves: the place is its own
    changed_.notify_all();
    return json::object();
  }
  if (type == "progress") {
    work_.progress(name, json_integer(r, "task", 0), json_integer(r, "done", 0));
    return json::object();
  }
  if (type == "goodbye") {
    // A restart that leaves before it serves (its address taken: the old server, only stalled,
    // still holds it) gives the place back to the server it replaced, lost, so that its next
    // heartbeat brings it back: left "stopped", a serving server was never counted again.
    if (const auto replaced = replaced_.find(name);
        replaced != replaced_.end() && role.role == "ps" && role.address.empty()) {
      const std::string error = json_string_or(r, "error", "");
      std::fprintf(stderr, "coordinator: %s's restart left before serving%s; the %s it replaced "
                   "is lost again, until it is heard from\n", name.c_str(),
                   error.empty() ? "" : (" (" + error + ")").c_str(), name.c_str());
      role = replaced->second;
      replaced_.erase(replaced);
      changed_.notify_all();
      return phase_reply_locked();
    }
    role.state = "stopped";
    // A role that stopped on an error of its own says it: the log named only a missing heartbeat
    // (3 s later) when the cause was on the role's node. Its place is free for another, as any
    // role's that has left.
    if (const std::string error = json_string_or(r, "error", ""); !error.empty()) {
      std::fprintf(stderr, "coordinator: %s stopped on an error: %s\n", name.c_str(),
                   error.c_str());
      role.error = error;
    }
    if (r.contains("status") && r["status"].is_object()) role.status = r["status"];
    // A worker stopping mid-task says how far it got: only the batches after that are
    // handed out again (from its last heartbeat, they would be trained twice).
    // (What roles report is read with the _or readers: a figure that is not a number, a role's
    // bug and not this request's, counts as 0 instead of failing the request or the state.)
    if (role.role == "worker" && role.status.is_object() && role.status.contains("task"))
      work_.progress(name, json_integer_or(role.status, "task", 0),
                     json_integer_or(role.status, "done", 0));
    if (role.role == "worker") work_.worker_lost(name);
    changed_.notify_all();
    return phase_reply_locked();  // how the run ended, for the role's own end (end_role)
  }
  throw InputError("unknown request type '" + type + "'");
}

int Coordinator::lowest_free_index_locked(const std::string& kind,
                                          bool (*frees)(const std::string& state)) const {
  std::set<int> held;
  for (const auto& [n, role] : roles_)
    if (role.role == kind && !(frees && frees(role.state))) held.insert(role.index);
  int index = 0;
  while (held.count(index) > 0) ++index;
  return index;
}

json Coordinator::full_reply(const std::string& why) const {
  // Long enough for the held place's role to be counted lost (no heartbeat for the timeout),
  // twice over, and a second.
  return {{"full", why}, {"wait_ms", 2 * int64_t{options_.heartbeat_timeout_ms} + 1000}};
}

json Coordinator::handle_register(const json& r) {
  const std::string kind = json_string(r, "role", "");
  if (kind != "ps" && kind != "worker" && kind != "scorer")
    throw InputError("register: role must be ps, worker or scorer, not '" + kind + "'");
  // Read before anything changes: a malformed request changes nothing.
  const int64_t pid = json_integer(r, "pid", 0);
  const std::string host = json_string(r, "host", "");
  const std::string address = json_string(r, "address", "");
  std::lock_guard<std::mutex> lock(mutex_);
  std::string name = json_string(r, "name", "");
  int index = name.empty() ? -1 : index_from_name(name, kind);
  if (name.empty() && kind == "ps" && phase_ != ClusterPhase::Starting) {
    // The servers are fixed once training has started (the workers split the parameters over
    // them): an unnamed server started now takes the place of one that is gone, the lowest first.
    index = lowest_free_index_locked("ps", gone);
    // Not refused at once: a server restarted straight after a crash comes before its old self
    // is counted lost (no heartbeat for heartbeat_timeout_ms). It asks again until then
    // (register_role), and takes that one's place.
    if (index >= options_.expected_ps)
      return full_reply("training has started with " + std::to_string(options_.expected_ps) +
                        " parameter server(s), all serving: no other can join (a restarted one "
                        "joins with --name psK)");
    name = "ps" + std::to_string(index);
  }
  if (kind == "scorer" && options_.expected_scorers > 0) {
    // A scorer past the run's count scored beside the others, and each wrote the best
    // parameters over the other's (the file no longer held the lowest score's): one past it is
    // refused as a server past --ps is, and an unnamed one restarted before its old self is
    // counted lost waits for that (register_role) and takes its place.
    const int scorers = options_.expected_scorers;
    if (name.empty()) {
      index = lowest_free_index_locked("scorer", gone);
      if (index >= scorers)
        return full_reply("this run has " + std::to_string(scorers) + " scorer(s), all "
                          "scoring: no other can join (a restarted one joins with --name "
                          "scorerK)");
      name = "scorer" + std::to_string(index);
    } else if (index < 0 || index >= scorers) {
      throw InputError("register: this run's scorers are scorer0" +
                       (scorers > 1 ? " to scorer" + std::to_string(scorers - 1) : std::string()) +
                       ", not '" + name + "'");
    }
  }
  if (name.empty() && kind != "ps") {
    // A worker or scorer restarted without --name takes the lowest index no role of its kind
    // holds but one that stopped (said goodbye), and so a stopped one's name (its counts kept,
    // as for a restart under its name), not a new name each time: those grew the roles, the
    // dashboard's document and the metrics log's per-second record for good (25 restarts:
    // worker0 to worker24). Not a lost one's: lost is only silent for a while, and one that
    // comes back (stopped with SIGSTOP, stalled) would run as the newcomer's name too.
    index = lowest_free_index_locked(kind, stopped_only);
    name = kind + std::to_string(index);
  }
  auto old = name.empty() ? roles_.end() : roles_.find(name);
  std::string previous_address;
  if (old != roles_.end()) {
    previous_address = old->second.address.empty() ? old->second.previous_address
                                                   : old->second.address;
    if (old->second.role != kind)
      throw InputError("register: '" + name + "' is already a " + old->second.role);
    // A server or scorer under the name of one still heard from: a restart of it comes before
    // its old self is counted lost, and waits for that (register_role); a second one started
    // under that name by mistake gives up after the wait, leaving the first as it was. (Taken
    // over at once, a server was counted lost and, the newcomer refused, left stopped though
    // serving; two scorers wrote the best-score model.) A worker's name is taken over: a
    // restarted worker must not wait.
    if (kind != "worker" && !gone(old->second.state))
      return full_reply(name + " is registered and still heard from: a restarted " + name +
                        " takes its place once it is counted lost");
    if (!gone(old->second.state)) lose(old->second, "it registered again (restarted)");
    index = old->second.index;
    // Kept until the newcomer serves: see replaced_.
    if (kind == "ps" && old->second.state == "lost") replaced_[name] = old->second;
  }
  // (An unnamed server before training starts: the place of one that stopped is free. A server
  // that failed to bind its address held it, and the run waited out its start-up timeout for
  // that one while its replacement was refused. Not for a worker named other than workerK: it
  // would share a stopped worker0's index, and be a second chief once worker0 came back.)
  if (index < 0)
    index = lowest_free_index_locked(kind, kind == "ps" ? stopped_only : nullptr);
  // The workers split the parameters over ps0 to ps(N-1), and the run waits for those names: a
  // server under any other name would be accepted, never counted, and the run would wait out
  // its start-up timeout naming the ps it lacks.
  if (kind == "ps" &&
      ((!name.empty() && name != kind + std::to_string(index)) || index >= options_.expected_ps))
    throw InputError("register: this run's parameter servers are " +
                     (options_.expected_ps == 0
                          ? std::string("none")
                          : "ps0" + (options_.expected_ps > 1
                                         ? " to ps" + std::to_string(options_.expected_ps - 1)
                                         : std::string())) +
                     ", not " + (name.empty() ? "another" : "'" + name + "'"));
  if (name.empty()) name = kind + std::to_string(index);
  Role role;
  role.role = kind;
  role.name = name;
  role.index = index;
  role.pid = pid;
  role.host = host;
  role.address = address;
  role.previous_address = previous_address;
  role.state = kind == "ps" && role.address.empty() ? "registered" : "running";
  role.last_seen = Clock::now();
  // A worker registering again under its name (restarted) starts a new status: what the old one
  // counted stays counted.
  if (const auto old = roles_.find(name); old != roles_.end() && old->second.role == "worker") {
    retired_batches_done_ += json_integer_or(old->second.status, "batches_done", 0);
    retired_gradients_lost_ += json_integer_or(old->second.status, "gradients_lost", 0);
    retired_samples_ += json_integer_or(old->second.status, "samples", 0);
  }
  roles_[name] = role;
  changed_.notify_all();
  json config = options_.run_config;
  return {{"name", name}, {"index", index}, {"chief", kind == "worker" && index == 0},
          {"config", config}, {"phase", to_string(phase_)}, {"run", run_id_}};
}

json Coordinator::handle_work(const json& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  const std::string name = json_string(r, "name", "");
  auto it = roles_.find(name);
  if (it == roles_.end() || it->second.role != "worker")
    throw InputError("'work' from '" + name + "', which is not a registered worker");
  if (options_.fed)
    throw InputError("'work' from '" + name + "': this run's workers train on fed blocks");
  it->second.last_seen = Clock::now();
  if (it->second.state == "lost") it->second.state = "running";
  if (r.contains("finished") && r["finished"].is_number_integer())
    work_.finish(name, r["finished"].get<int64_t>());
  if (phase_ == ClusterPhase::Starting) return {{"wait_ms", 100}};
  if (phase_ != ClusterPhase::Training) return {{"stop", true}};
  if (work_.exhausted()) {
    stop_reason_ = "max-epochs";
    set_phase(ClusterPhase::Draining);
    return {{"stop", true}};
  }
  const auto task = work_.next(name, live_workers());
  if (!task) return {{"wait_ms", 50}};
  return {{"task", {{"id", task->id}, {"epoch", task->epoch}, {"batches", task->batches}}}};
}

json Coordinator::phase_reply_locked() const {
  json reply{{"phase", to_string(phase_)}};
  if (phase_ == ClusterPhase::Failed) reply["failure"] = failure_;
  return reply;
}

json Coordinator::handle_score(const json& r) {
  std::lock_guard<std::mutex> lock(mutex_);
  // Only a registered scorer's scores count: a scorer left from an earlier run (its coordinator
  // restarted at this address) would otherwise stop this run on that run's parameters.
  const std::string name = json_string(r, "name", "");
  const auto it = roles_.find(name);
  if (it == roles_.end() || it->second.role != "scorer")
    throw InputError("'score' from '" + name + "', which is not a registered scorer");
  ScoreRecord s;
  s.seq = static_cast<int64_t>(scores_log_.size()) + 1;
  s.t = since_start(Clock::now());
  s.step = json_integer(r, "step", 0);
  // A diverged scorer's NaN loss arrives as null: a NaN score, not an error.
  s.loss = json_number(r, "loss", 0.0);
  s.loss_mean = json_number(r, "loss_mean", 0.0);
  s.accuracy = json_number(r, "accuracy", 0.0);
  s.samples = json_integer(r, "samples", 0);
  s.epochs = work_.epochs_completed();
  scores_log_.push_back(s);
  to_publish_.push_back({{"seq", s.seq}, {"t", s.t}, {"step", s.step}, {"loss", s.loss},
                         {"loss_mean", s.loss_mean}, {"accuracy", s.accuracy},
                         {"samples", s.samples}});
  if (phase_ == ClusterPhase::Training && options_.target > 0 && s.loss < options_.target) {
    stop_reason_ = "target";
    set_phase(ClusterPhase::Draining);
  }
  return phase_reply_locked();
}

void Coordinator::on_tick() {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  for (auto& [name, role] : roles_)
    if (!gone(role.state) && now - role.last_seen > std::chrono::milliseconds(options_.heartbeat_timeout_ms))
      lose(role, "no heartbeat for " + std::to_string(options_.heartbeat_timeout_ms) + " ms");
  if (phase_ == ClusterPhase::Starting) {
    if (missing_roles().empty()) {
      training_started_ = now;
      training_spec_ = spec_locked();
      set_phase(ClusterPhase::Training);
    } else if (now - created_ > std::chrono::milliseconds(options_.startup_timeout_ms)) {
      std::string missing;
      for (const std::string& m : missing_roles()) missing += (missing.empty() ? "" : "; ") + m;
      fail_locked("after " + std::to_string(options_.startup_timeout_ms / 1000) +
                  " s the cluster is still waiting for: " + missing);
    }
  } else if (phase_ == ClusterPhase::Training) {
    // Every worker stopped on an error (a GPU backend without a GPU) leaves a run that nothing
    // trains: it waits as long as for its roles at the start, for a worker started again, then
    // fails naming their errors (a wait(-1) waited for ever). Not while a worker is lost (it may
    // come back) or left without an error (a fed worker whose feed ended).
    if (options_.expected_workers == 0 || !all_workers_failed_locked()) {
      no_worker_since_ = {};
    } else if (no_worker_since_ == Clock::time_point{}) {
      no_worker_since_ = now;
    } else if (now - no_worker_since_ > std::chrono::milliseconds(options_.startup_timeout_ms)) {
      std::string why;
      for (const auto& [name, role] : roles_)
        if (role.role == "worker" && !role.error.empty())
          why += (why.empty() ? " (" : "; ") + name + " stopped on an error: " + role.error;
      char waited[32];
      std::snprintf(waited, sizeof waited, "%g", options_.startup_timeout_ms / 1000.0);
      fail_locked("no worker has run for " + std::string(waited) + " s" + why +
                  "): nothing trains the run");
      return;
    }
    if (options_.max_seconds > 0 && since_start(now) >= options_.max_seconds) {
      stop_reason_ = "max-seconds";
      set_phase(ClusterPhase::Draining);
    } else if (work_.exhausted()) {
      stop_reason_ = "max-epochs";
      set_phase(ClusterPhase::Draining);
    }
  }
}

void Coordinator::lose(Role& role, const std::string& why) {
  std::fprintf(stderr, "coordinator: %s lost: %s\n", role.name.c_str(), why.c_str());
  role.state = "lost";
  if (role.role == "worker") work_.worker_lost(role.name);
  changed_.notify_all();
}

void Coordinator::set_phase(ClusterPhase phase) {
  if (phase_ == phase) return;
  if (phase_ == ClusterPhase::Training && training_ended_ == Clock::time_point{})
    training_ended_ = Clock::now();
  phase_ = phase;
  changed_.notify_all();
}

std::vector<std::string> Coordinator::missing_roles() const {
  std::vector<std::string> missing;
  auto count = [&](const std::string& kind) {
    int n = 0;
    for (const auto& [name, role] : roles_)
      if (role.role == kind && !gone(role.state)) ++n;
    return n;
  };
  // "; expected from pid 1234": where a role someone started should have come from.
  auto where = [&](const std::string& name) {
    auto e = expected_.find(name);
    return e == expected_.end() ? std::string() : "; expected from " + e->second;
  };
  // The expected roles of a kind that have not registered: " (worker1 from pid 12, ...)".
  auto unregistered = [&](const std::string& kind) {
    std::string list;
    for (const auto& [name, from] : expected_)
      if (name.compare(0, kind.size(), kind) == 0 && !roles_.count(name))
        list += (list.empty() ? ": " : ", ") + name + " from " + from;
    return list;
  };
  for (int i = 0; i < options_.expected_ps; ++i) {
    const std::string name = "ps" + std::to_string(i);
    auto it = roles_.find(name);
    if (it == roles_.end()) missing.push_back(name + " (not registered" + where(name) + ")");
    else if (it->second.address.empty() || gone(it->second.state))
      missing.push_back(name + " (registered, not serving" +
                        (it->second.pid ? ", pid " + std::to_string(it->second.pid) : "") + ")");
  }
  const int workers = count("worker");
  if (phase_ == ClusterPhase::Starting && workers < options_.expected_workers)
    missing.push_back("workers (" + std::to_string(workers) + " of " +
                      std::to_string(options_.expected_workers) + " registered" +
                      unregistered("worker") + ")");
  const int scorers = count("scorer");
  if (phase_ == ClusterPhase::Starting && scorers < options_.expected_scorers)
    missing.push_back("a scorer (" + std::to_string(scorers) + " of " +
                      std::to_string(options_.expected_scorers) + " registered" +
                      unregistered("scorer") + ")");
  return missing;
}

bool Coordinator::all_workers_failed_locked() const {
  bool any = false;
  for (const auto& [name, role] : roles_) {
    if (role.role != "worker") continue;
    if (role.state != "stopped" || role.error.empty()) return false;
    any = true;
  }
  return any;
}

std::vector<std::string> Coordinator::live_workers() const {
  std::vector<std::string> live;
  for (const auto& [name, role] : roles_)
    if (role.role == "worker" && !gone(role.state)) live.push_back(name);
  return live;
}

json Coordinator::spec_locked() const {
  json spec{{"coordinator", endpoint_}, {"scores", scores_endpoint_}, {"run", run_id_}};
  spec["ps"] = json::array();
  spec["worker"] = json::array();
  spec["scorer"] = json::array();
  std::vector<const Role*> sorted;
  for (const auto& [name, role] : roles_) sorted.push_back(&role);
  std::sort(sorted.begin(), sorted.end(), [](const Role* a, const Role* b) {
    return a->role != b->role ? a->role < b->role : a->index < b->index;
  });
  for (const Role* role : sorted) {
    if (gone(role->state) && role->role != "ps") continue;
    // A server restarting (registered, not serving yet) is where it served before.
    const std::string& address = role->address.empty() ? role->previous_address : role->address;
    spec[role->role].push_back({{"name", role->name}, {"address", address},
                                {"host", role->host}, {"pid", role->pid}});
  }
  return spec;
}

void Coordinator::expect(const std::string& name, const std::string& from) {
  std::lock_guard<std::mutex> lock(mutex_);
  expected_[name] = from;
}

json Coordinator::training_spec() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return training_spec_;
}

json Coordinator::spec() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spec_locked();
}

std::vector<std::string> Coordinator::ps_endpoints() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<std::string> out(static_cast<size_t>(options_.expected_ps));
  for (const auto& [name, role] : roles_)
    if (role.role == "ps" && role.index >= 0 && role.index < options_.expected_ps)
      out[size_t(role.index)] = role.address;
  for (const std::string& a : out)
    if (a.empty()) return {};
  return out;
}

bool Coordinator::servers_serving() const {
  std::lock_guard<std::mutex> lock(mutex_);
  int serving = 0;
  for (const auto& [name, role] : roles_)
    if (role.role == "ps" && role.index >= 0 && role.index < options_.expected_ps &&
        !role.address.empty() && !gone(role.state))
      ++serving;
  return serving == options_.expected_ps;
}

ClusterPhase Coordinator::phase() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return phase_;
}

ClusterPhase Coordinator::wait_for(ClusterPhase phase, int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    return phase_ == ClusterPhase::Failed || static_cast<int>(phase_) >= static_cast<int>(phase);
  });
  return phase_;
}

void Coordinator::request_stop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == ClusterPhase::Starting || phase_ == ClusterPhase::Training) {
    if (stop_reason_.empty()) stop_reason_ = reason;
    set_phase(ClusterPhase::Draining);
  }
}

void Coordinator::fail(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  fail_locked(why);
}

void Coordinator::fail_locked(const std::string& why) {
  if (phase_ == ClusterPhase::Failed) return;  // failed already: one end message, one reason
  if (phase_ == ClusterPhase::Done) {  // the run ended well, and said so: this is said here
    std::fprintf(stderr, "coordinator: after the run finished: %s\n", why.c_str());
    return;
  }
  if (failure_.empty()) failure_ = why;
  set_phase(ClusterPhase::Failed);
  to_publish_.push_back(end_message_locked());
}

json Coordinator::end_message_locked() const {
  // A run that failed after its stop rule fired (reading the final parameters, say) ended
  // failed: its reason says so, to a late subscriber's replay as to the live ones.
  return {{"end", true},
          {"reason", phase_ == ClusterPhase::Failed ? "failed: " + failure_ : stop_reason_}};
}

void Coordinator::mark_lost(const std::string& name, const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = roles_.find(name);
  if (it != roles_.end() && !gone(it->second.state)) lose(it->second, why);
}

bool Coordinator::wait_workers_gone(int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    for (const auto& [name, role] : roles_)
      if ((role.role == "worker" || role.role == "scorer") && !gone(role.state)) return false;
    return true;
  });
}

void Coordinator::finish() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (phase_ == ClusterPhase::Failed) return;
  set_phase(ClusterPhase::Done);
  to_publish_.push_back(end_message_locked());
}

bool Coordinator::wait_servers_gone(int timeout_ms) const {
  std::unique_lock<std::mutex> lock(mutex_);
  return changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), [&] {
    for (const auto& [name, role] : roles_)
      if (role.role == "ps" && !gone(role.state)) return false;
    return true;
  });
}

std::string Coordinator::stop_reason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_reason_;
}

std::string Coordinator::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::vector<ScoreRecord> Coordinator::scores() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return scores_log_;
}

std::vector<ScoreRecord> Coordinator::scores_since(size_t first) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (first >= scores_log_.size()) return {};
  return {scores_log_.begin() + static_cast<std::ptrdiff_t>(first), scores_log_.end()};
}

double Coordinator::training_seconds() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (training_started_ == Clock::time_point{}) return 0;
  const auto end = training_ended_ == Clock::time_point{} ? Clock::now() : training_ended_;
  return std::chrono::duration<double>(end - training_started_).count();
}

int64_t Coordinator::epochs_completed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return work_.epochs_completed();
}

int64_t Coordinator::batches_done() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return batches_done_locked();
}

int64_t Coordinator::batches_done_locked() const {
  // The queue counts the batches its tasks report done, those whose gradients were lost among
  // them (they are not handed out again); a fed run has no queue, only the workers' counts.
  if (!options_.fed) return work_.batches_done();
  return worker_total_locked("batches_done", retired_batches_done_) + gradients_lost_locked();
}

int64_t Coordinator::gradients_lost() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return gradients_lost_locked();
}

int64_t Coordinator::samples_trained() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return worker_total_locked("samples", retired_samples_);
}

int64_t Coordinator::gradients_lost_locked() const {
  return worker_total_locked("gradients_lost", retired_gradients_lost_);
}

int64_t Coordinator::worker_total_locked(const char* field, int64_t retired) const {
  int64_t sum = retired;
  for (const auto& [name, role] : roles_)
    if (role.role == "worker") sum += json_integer_or(role.status, field, 0);
  return sum;
}

json Coordinator::state(bool with_scores) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const auto now = Clock::now();
  json cluster{{"run", run_id_},  // the spec's "run": which run this is, for a page left open
               {"state", to_string(phase_)},
               {"elapsed_s", std::chrono::duration<double>(now - created_).count()},
               // The scores' clock (0 until training starts): elapsed_s includes the wait for
               // the roles, minutes when they are started by hand.
               {"t", since_start(now)},
               {"epoch", work_.epochs_completed()},
               {"batches_done", batches_done_locked()},
               {"gradients_lost", gradients_lost_locked()},
               {"target", options_.target > 0 ? json(options_.target) : json(nullptr)},
               {"scores_total", int64_t(scores_log_.size())},
               {"stop_reason", stop_reason_},
               {"failure", failure_}};
  json roles = json::array({{{"role", "coordinator"}, {"name", "coordinator"},
                             {"address", endpoint_}, {"state", "running"}, {"pid", 0},
                             {"host", ""}, {"last_seen_s", 0.0}}});
  json workers = json::array(), servers = json::array();
  double samples_per_s = 0;
  int64_t step = 0;
  for (const auto& [name, role] : roles_) {
    roles.push_back({{"role", role.role}, {"name", name}, {"address", role.address},
                     {"state", role.state}, {"pid", role.pid}, {"host", role.host},
                     {"last_seen_s", std::chrono::duration<double>(now - role.last_seen).count()}});
    if (!role.error.empty()) roles.back()["error"] = role.error;
    const json& st = role.status;
    if (role.role == "worker") {
      const double rate = gone(role.state) ? 0.0 : json_number_or(st, "samples_per_s", 0);
      samples_per_s += rate;
      workers.push_back({{"name", name}, {"state", role.state}, {"samples_per_s", rate},
                         {"queue_depth", json_integer_or(st, "queue_depth", 0)},
                         {"steps", json_integer_or(st, "steps", 0)},
                         {"batches_done", json_integer_or(st, "batches_done", 0)},
                         {"gradients_lost", json_integer_or(st, "gradients_lost", 0)},
                         {"idle", !gone(role.state) && st.contains("idle") &&
                                      st["idle"].is_boolean() && st["idle"].get<bool>()}});
    } else if (role.role == "ps" && st.contains("stats")) {
      const json& s = st["stats"];
      step = std::max<int64_t>(step, json_integer_or(s, "version", 0));
      json staleness = json::object();
      if (s.contains("staleness_histogram") && s["staleness_histogram"].is_object())
        staleness = s["staleness_histogram"];
      // A server gone (lost, stopped) serves nothing: its last rates were shown as its own
      // long after it was killed.
      const bool serving = !gone(role.state);
      servers.push_back({{"name", name}, {"state", role.state},
                         {"pushes_per_s", serving ? json_number_or(s, "pushes_per_s", 0) : 0.0},
                         {"pulls_per_s", serving ? json_number_or(s, "pulls_per_s", 0) : 0.0},
                         {"version", json_integer_or(s, "version", 0)}, {"staleness", staleness},
                         {"mode", json_string_or(s, "mode", "")},
                         {"deferred", json_integer_or(s, "deferred", 0)}});
    }
  }
  cluster["step"] = step;
  cluster["samples_per_s"] = samples_per_s;
  json scores = json::array();
  for (const size_t i : scores_shown(with_scores ? scores_log_.size() : 0))
    scores.push_back({{"t", scores_log_[i].t}, {"step", scores_log_[i].step},
                      {"loss", scores_log_[i].loss}, {"accuracy", scores_log_[i].accuracy}});
  return {{"cluster", cluster}, {"roles", roles}, {"scores", scores}, {"workers", workers},
          {"servers", servers}};
}

}  // namespace tandem
