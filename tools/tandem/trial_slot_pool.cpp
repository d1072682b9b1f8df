#include "trial_slot_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <thread>

#include "curve_client.h"
#include "zmq_through_signals.h"

namespace tandem::cli {

struct TrialSlotPool::Server {
  std::string endpoint;
  zmq::socket_t socket;
  // Its handshakes (after `socket`, so it closes first): why a server that never answers hello
  // refused this client (its key, or no key for a CURVE server).
  transport::CurveHandshakeWatch handshakes;
  int slots = 0;
  int threads = 1;
  int heartbeat_ms = 0;  // how often we send one
  int timeout_ms = 0;    // the server's heartbeat timeout (its hello)
  bool answered = false;
  bool busy = false;  // refused a start for want of slots; free again when a heartbeat says so
  bool alive = true;
  bool joining = false;   // added after the start (add()): its hello not answered yet
  bool claim_pending = false;  // a claim sent, not answered yet
  int claim_ended = 0;         // the jobs its answer said it ended
  std::string lost;       // why it was dropped
  std::string send_error;  // a failed send, handled by wait()
  Clock::time_point last_heard, last_sent;
  // When the oldest message still unanswered went (after last_heard): silence is counted from
  // it, not from last_heard. A client busy elsewhere (a search preparing its data after it
  // connected) sends nothing meanwhile, and its servers' silence then is its own.
  Clock::time_point asked_since;
  struct Job {
    std::string id;
    int start_sent = 0;  // the count of messages sent when its start went out
    bool unsent = false;  // its start could not be sent: it never reached the server
    bool operator==(const std::string& other) const { return id == other; }
  };
  std::vector<Job> jobs;
  int sent = 0;  // messages sent: a heartbeat carries its count
};

namespace {

std::string seconds_text(int ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f", ms / 1000.0);
  return text;
}

}  // namespace

TrialSlotPool::TrialSlotPool(const std::vector<std::string>& endpoints, TrialSlotPoolOptions options)
    : options_(std::move(options)) {
  if (endpoints.empty()) throw InputError("--slots: no slot server endpoints");
  options_.curve = transport::resolve_curve_client(options_.curve, "--slots");
  // One identity for this search on every server, kept across reconnections. Servers hand a
  // routing id over to whoever connects with it (router_handover), so it must not be guessable:
  // 128 random bits, or another client admitted by the same key could take this search's
  // replies.
  std::random_device random;
  char id[80];
  // (Named by its command, which the servers' logs show: search or predict.)
  std::snprintf(id, sizeof id, "%.16s-%d-%08x%08x%08x%08x", options_.client.c_str(),
                static_cast<int>(getpid()), random(), random(), random(), random());
  id_ = id;
  const auto now = Clock::now();
  for (const std::string& endpoint : endpoints) servers_.push_back(connect_server(endpoint, now));
  for (auto& s : servers_) send(*s, SlotMessage{SlotMessageType::Hello});
  // Every server must answer hello before the search starts.
  const auto deadline = now + std::chrono::milliseconds(options_.timeout_ms);
  while (Clock::now() < deadline &&
         std::any_of(servers_.begin(), servers_.end(), [](const auto& s) { return !s->answered; })) {
    wait(50);  // no jobs yet: only hello answers
  }
  const auto optional = [this](const std::string& endpoint) {
    const auto& o = options_.optional_endpoints;
    return std::find(o.begin(), o.end(), endpoint) != o.end();
  };
  const std::string silence = " did not answer within " + seconds_text(options_.timeout_ms) + " s";
  std::string missing;
  bool refused = false;  // a handshake failed: its reason is given instead of the hint
  for (auto it = servers_.begin(); it != servers_.end();) {
    const Server& s = **it;
    if (optional(s.endpoint) && (!s.answered || !s.lost.empty())) {
      skipped_.emplace_back(s.endpoint, s.lost.empty() ? silence.substr(1) : s.lost);
      it = servers_.erase(it);
      continue;
    }
    if (!s.lost.empty()) throw Error("slot server " + s.endpoint + ": " + s.lost);
    if (!s.answered) {
      const std::string& why = (*it)->handshakes.problem();
      missing += (missing.empty() ? "" : ", ") + s.endpoint + (why.empty() ? "" : " (" + why + ")");
      refused = refused || !why.empty();
    }
    ++it;
  }
  const std::string hint = refused ? "" : std::string(" (is tandem trial-slots running there?") +
                           (options_.curve.enabled() ? " is the CURVE key right?" : "") + ")";
  if (!missing.empty()) throw Error("slot server(s) " + missing + silence + hint);
  if (servers_.empty()) {
    std::string all;
    for (const auto& [endpoint, why] : skipped_) all += (all.empty() ? "" : "; ") + endpoint + " " + why;
    throw Error("no listed slot server answered: " + all + hint);
  }
}

TrialSlotPool::~TrialSlotPool() {
  for (auto& s : servers_)
    if (s->alive) send(*s, SlotMessage{SlotMessageType::Bye});
}

std::unique_ptr<TrialSlotPool::Server> TrialSlotPool::connect_server(const std::string& endpoint,
                                                                     Clock::time_point now) {
  auto s = std::make_unique<Server>();
  s->endpoint = endpoint;
  try {
    s->socket = zmq::socket_t(context_, zmq::socket_type::dealer);
    s->socket.set(zmq::sockopt::routing_id, id_);
    s->socket.set(zmq::sockopt::linger, 200);  // a bye still leaves; a dead server is not waited on
    s->socket.set(zmq::sockopt::sndtimeo, 1000);
    s->handshakes =
        transport::CurveHandshakeWatch(context_, s->socket, options_.curve.client.public_key);
    transport::set_curve_client(s->socket, options_.curve);
    s->socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    throw transport::TransportError("slot server " + endpoint + ": cannot connect: " + e.what());
  }
  s->last_heard = now;
  return s;
}

void TrialSlotPool::add(const std::string& endpoint) {
  const auto same = [&](const auto& s) { return s->endpoint == endpoint; };
  const auto known = std::find_if(servers_.begin(), servers_.end(), same);
  if (known != servers_.end() && (*known)->alive) {
    // Still joining: the join's timeout starts again with this hello (the server listed anew
    // may have started only now).
    if ((*known)->joining) (*known)->last_heard = Clock::now();
    send(**known, SlotMessage{SlotMessageType::Hello});
    return;
  }
  std::unique_ptr<Server> server;
  try {
    server = connect_server(endpoint, Clock::now());
  } catch (const transport::TransportError& e) {
    std::fprintf(stderr, "tandem %s: left out slot server %s: %s\n", options_.client.c_str(),
                 endpoint.c_str(), e.what());
    return;
  }
  // The one that was there is gone (its jobs were reported when it was dropped).
  if (known != servers_.end()) servers_.erase(known);
  skipped_.erase(std::remove_if(skipped_.begin(), skipped_.end(),
                                [&](const auto& entry) { return entry.first == endpoint; }),
                 skipped_.end());
  server->joining = true;
  servers_.push_back(std::move(server));
  send(*servers_.back(), SlotMessage{SlotMessageType::Hello});
}

bool TrialSlotPool::send(Server& s, SlotMessage m) {
  ++s.sent;
  if (m.type == SlotMessageType::Heartbeat) m.seq = s.sent;
  const std::string text = encode_slot_message(m);
  try {
    transport::send_frames(s.socket, {{reinterpret_cast<const uint8_t*>(text.data()), text.size()}},
                           nullptr, "slot server " + s.endpoint);
    s.last_sent = Clock::now();
    if (s.asked_since <= s.last_heard) s.asked_since = s.last_sent;
    return true;
  } catch (const transport::TransportError& e) {
    s.send_error = e.what();
    return false;
  }
}

int TrialSlotPool::total_slots() const {
  int n = 0;
  for (const auto& s : servers_)
    if (s->alive) n += s->slots;
  return n;
}

int TrialSlotPool::joining() const {
  return static_cast<int>(std::count_if(servers_.begin(), servers_.end(),
                                        [](const auto& s) { return s->alive && s->joining; }));
}

int TrialSlotPool::free_slots() const {
  int n = 0;
  for (const auto& s : servers_)
    if (s->alive && !s->busy) n += std::max(0, s->slots - static_cast<int>(s->jobs.size()));
  return n;
}

std::vector<std::string> TrialSlotPool::endpoints() const {
  std::vector<std::string> out;
  for (const auto& s : servers_)
    if (s->answered) out.push_back(s->endpoint);
  return out;
}

std::string TrialSlotPool::start(const std::string& job,
                                 const std::function<std::vector<std::string>(int)>& args,
                                 const std::string& log) {
  Server* best = nullptr;
  int best_free = 0;
  for (auto& s : servers_) {
    const int free = s->slots - static_cast<int>(s->jobs.size());
    if (s->alive && !s->busy && free > best_free) {
      best = s.get();
      best_free = free;
    }
  }
  if (best == nullptr) throw Error("search: no free trial slot (internal error)");
  SlotMessage m{SlotMessageType::Start};
  m.job = job;
  m.args = args(best->threads);
  m.log = log;
  // Unsent by this send's own outcome: after an earlier send timed out, a start that did leave
  // may run there, and must not be retried elsewhere beside it.
  const bool sent = send(*best, m);
  best->jobs.push_back({job, best->sent, !sent});
  return best->endpoint;
}

int TrialSlotPool::claim(const std::string& dir) {
  SlotMessage m{SlotMessageType::Claim};
  m.dir = dir;
  // A server ends a killed client's jobs once that client has been silent for half its
  // heartbeat timeout, then waits for them to exit (its kill grace): room for both.
  int longest_ms = options_.timeout_ms;
  for (auto& s : servers_) {
    s->claim_ended = 0;
    if (s->alive && s->answered) s->claim_pending = send(*s, m);
    if (s->claim_pending) longest_ms = std::max(longest_ms, s->timeout_ms / 2 + 5000);
  }
  const auto pending = [this] {
    return std::any_of(servers_.begin(), servers_.end(),
                       [](const auto& s) { return s->alive && s->claim_pending; });
  };
  const auto deadline = Clock::now() + std::chrono::milliseconds(longest_ms);
  while (pending() && Clock::now() < deadline) wait(50);  // (no job of ours to end yet)
  int ended = 0;
  std::string held;
  for (auto& s : servers_) {
    if (s->alive && s->claim_pending) held += (held.empty() ? "" : ", ") + s->endpoint;
    s->claim_pending = false;
    ended += s->claim_ended;
  }
  if (!held.empty())
    throw Error("slot server(s) " + held + " still run jobs writing into " + dir + " for a "
                "client still heard from (another run into the same directory, on another "
                "machine?): end it, or choose another directory");
  return ended;
}

void TrialSlotPool::cancel(const std::string& job) {
  for (auto& s : servers_)
    if (s->alive && std::find(s->jobs.begin(), s->jobs.end(), job) != s->jobs.end()) {
      SlotMessage m{SlotMessageType::Cancel};
      m.job = job;
      send(*s, m);
    }
}

void TrialSlotPool::lost_jobs(Server& s, const SlotMessage& heartbeat,
                              std::vector<SlotJobEnd>& ended) {
  // A job whose start went before this heartbeat and that the server does not list ended
  // without an exited: the server restarted (a new one knows nothing of it), or it ended this
  // search's jobs after hearing nothing from it for its heartbeat timeout. Waited for, it
  // would keep the search from ever ending.
  for (auto it = s.jobs.begin(); it != s.jobs.end();) {
    if (it->start_sent >= heartbeat.seq ||
        std::find(heartbeat.jobs.begin(), heartbeat.jobs.end(), it->id) != heartbeat.jobs.end()) {
      ++it;
      continue;
    }
    ended.push_back({it->id, false,
                     "slot server " + s.endpoint + " no longer runs it (restarted, or it ended " +
                         "this client's jobs after hearing nothing from it)"});
    it = s.jobs.erase(it);
  }
}

void TrialSlotPool::job_exited(Server& s, const SlotJobExit& exit,
                               std::vector<SlotJobEnd>& ended) {
  const auto job = std::find(s.jobs.begin(), s.jobs.end(), exit.job);
  if (job == s.jobs.end()) return;  // reported already (an exited, then a heartbeat's list)
  s.jobs.erase(job);
  ended.push_back({exit.job, exit.exit_code == 0,
                   exit.signal > 0 ? "killed by signal " + std::to_string(exit.signal)
                                   : "exited with status " + std::to_string(exit.exit_code)});
}

void TrialSlotPool::drop(Server& s, const std::string& reason, std::vector<SlotJobEnd>& ended) {
  s.alive = false;
  s.lost = reason;
  // A job whose start never left is started elsewhere (retry), not failed.
  for (const Server::Job& job : s.jobs)
    ended.push_back({job.id, false, "slot server " + s.endpoint + " " + reason, job.unsent});
  s.jobs.clear();
  // A server that is only frozen or cut off for a while reads this bye when it comes back (after
  // any start still queued to it) and ends the jobs nobody waits for any more, rather than
  // running them, or starting them, beside the rerun that finishes their work. The socket's
  // linger (200 ms) lets the bye leave without waiting on a server that is gone. It is sent after
  // a failed send too (at most one more send timeout): starts sent after that failure left.
  send(s, SlotMessage{SlotMessageType::Bye});
  s.handshakes = transport::CurveHandshakeWatch();  // (stops the socket's monitor: first)
  s.socket.close();
  const bool others = total_slots() > 0;
  std::fprintf(stderr, "tandem %s: slot server %s %s; %s\n", options_.client.c_str(),
               s.endpoint.c_str(), reason.c_str(),
               others ? "going on with the others" : "no slot server is left");
}

std::vector<SlotJobEnd> TrialSlotPool::wait(long timeout_ms) {
  std::vector<SlotJobEnd> ended;
  std::vector<zmq::pollitem_t> items;
  std::vector<Server*> polled;
  for (auto& s : servers_)
    if (s->alive) {
      items.push_back({s->socket.handle(), 0, ZMQ_POLLIN, 0});
      polled.push_back(s.get());
    }
  if (items.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    return ended;
  }
  try {
    zmq::poll(items.data(), items.size(), std::chrono::milliseconds(timeout_ms));
  } catch (const zmq::error_t& e) {
    if (e.num() != EINTR) throw transport::TransportError(std::string("slot servers: poll: ") + e.what());
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if ((items[i].revents & ZMQ_POLLIN) == 0) continue;
    Server& s = *polled[i];
    for (;;) {
      zmq::message_t frame;
      if (!transport::recv_through_signals(s.socket, frame, zmq::recv_flags::dontwait)) break;
      s.last_heard = Clock::now();
      if (frame.more()) continue;  // not ours: a server sends one frame; skip to its last
      SlotMessage m;
      try {
        m = decode_slot_message(frame.to_string());
      } catch (const SlotProtocolError& e) {
        std::fprintf(stderr, "tandem %s: bad message from slot server %s: %s\n",
                     options_.client.c_str(), s.endpoint.c_str(), e.what());
        continue;
      }
      const auto job = std::find(s.jobs.begin(), s.jobs.end(), m.job);
      switch (m.type) {
        case SlotMessageType::Hello:
          if (m.slots < 1) {
            s.lost = "answered hello without slots";
            break;
          }
          s.answered = true;
          if (s.joining) {
            s.joining = false;
            std::fprintf(stderr, "tandem %s: slot server %s joined with %d slot(s)\n",
                         options_.client.c_str(), s.endpoint.c_str(), m.slots);
          }
          s.busy = m.running >= m.slots;  // another search's trials fill it
          s.slots = m.slots;
          s.threads = std::max(1, m.threads);
          s.timeout_ms = m.heartbeat_timeout_ms;
          s.heartbeat_ms = std::max(
              50, std::min(options_.timeout_ms, m.heartbeat_timeout_ms > 0 ? m.heartbeat_timeout_ms
                                                                         : options_.timeout_ms) / 4);
          break;
        case SlotMessageType::Exited: job_exited(s, {m.job, m.exit_code, m.signal}, ended); break;
        case SlotMessageType::Claimed:
          s.claim_pending = false;
          s.claim_ended += m.ended_jobs;
          break;
        case SlotMessageType::Error:
          if (job != s.jobs.end()) {
            s.jobs.erase(job);
            if (m.busy) s.busy = true;
            ended.push_back(
                {m.job, false, "slot server " + s.endpoint + " refused it: " + m.error, m.busy,
                 !m.busy});
          } else {
            // (A server older than claims refuses one as a bad message: said, not waited on.)
            s.claim_pending = false;
            std::fprintf(stderr, "tandem %s: slot server %s: %s\n", options_.client.c_str(),
                         s.endpoint.c_str(), m.error.c_str());
          }
          break;
        case SlotMessageType::Heartbeat:
          if (m.running < s.slots) s.busy = false;
          // Before the list is compared: a job whose exited was lost ended as it says here.
          for (const SlotJobExit& e : m.ended) job_exited(s, e, ended);
          if (m.jobs_listed && m.seq > 0) lost_jobs(s, m, ended);
          break;
        case SlotMessageType::Bye:  // the server is stopping; its jobs have ended
          drop(s, "shut down (it said so)", ended);
          break;
        default: break;  // started: being heard is what counts
      }
      if (!s.alive) break;  // dropped: its socket is closed
    }
  }
  const auto now = Clock::now();
  for (auto& s : servers_) {
    if (!s->alive) continue;
    if (s->joining && now - s->last_heard > std::chrono::milliseconds(options_.timeout_ms)) {
      // Listed but silent (a server killed outright leaves its entry): left out, as at the start.
      s->alive = false;
      s->joining = false;
      if (s->lost.empty()) {
        const std::string& why = s->handshakes.problem();
        s->lost = "did not answer within " + seconds_text(options_.timeout_ms) + " s" +
                  (why.empty() ? "" : " (" + why + ")");
      }
      s->socket.set(zmq::sockopt::linger, 0);
      s->handshakes = transport::CurveHandshakeWatch();  // (stops the socket's monitor: first)
      s->socket.close();
      std::fprintf(stderr, "tandem %s: left out slot server %s, listed in a --slots directory: %s\n",
                   options_.client.c_str(), s->endpoint.c_str(), s->lost.c_str());
      continue;
    }
    if (s->answered && now - s->last_sent >= std::chrono::milliseconds(s->heartbeat_ms))
      send(*s, SlotMessage{SlotMessageType::Heartbeat});
    if (!s->send_error.empty()) {
      drop(*s, "failed: " + s->send_error, ended);
    } else if (s->answered && s->asked_since > s->last_heard &&
               now - s->asked_since > std::chrono::milliseconds(options_.timeout_ms)) {
      drop(*s, "stopped answering (nothing for " + seconds_text(options_.timeout_ms) + " s)", ended);
    }
  }
  return ended;
}

std::string TrialSlotPool::lost_servers() const {
  std::string out;
  for (const auto& s : servers_)
    out += (out.empty() ? "" : "; ") + s->endpoint + (s->alive ? " still there" : " " + s->lost);
  return out;
}

}  // namespace tandem::cli
