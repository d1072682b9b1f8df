#include "trial_slot_server.h"

#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "file_io.h"
#include "trial_process.h"
#include "zmq_messaging.h"

namespace tandem::cli {

namespace {

// `path` (relative: to `root`) with "..", "." and symbolic links resolved as far as it exists.
std::filesystem::path resolved(const std::string& root, const std::string& path) {
  namespace fs = std::filesystem;
  return resolved_path(fs::path(path).is_absolute() ? path : (fs::path(root) / path).string());
}

// Why a job naming these is refused under `root`: "" when every path lies in it. Every
// argument (or value after --flag=) is taken for a path: plain words ("0.001", "cpu", a file
// name) resolve into the root, the job's working directory, and pass; "..", "../x" and
// "/etc/x" do not.
std::string outside_root(const std::string& root, const std::string& log,
                         const std::vector<std::string>& args) {
  std::vector<std::string> paths{log};
  for (const std::string& arg : args) {
    const size_t equals = arg.rfind("--", 0) == 0 ? arg.find('=') : std::string::npos;
    const std::string value = equals == std::string::npos ? arg : arg.substr(equals + 1);
    if (!value.empty()) paths.push_back(value);
  }
  for (const std::string& path : paths)
    if (!lies_in(root, resolved(root, path).string()))
      return path + " is outside this server's --root " + root;
  return "";
}

// Bytes as text for a log line: control characters (a newline would forge a line of its own)
// written as \xNN, and so other bytes outside ASCII unless `keep_utf8` (a path's letters).
std::string escaped(const std::string& bytes, bool keep_utf8) {
  std::string out;
  for (unsigned char c : bytes) {
    if ((c >= 0x20 && c < 0x7f) || (keep_utf8 && c >= 0x80)) {
      out += static_cast<char>(c);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    }
  }
  return out;
}

// A routing id (any bytes) as text.
std::string printable(const std::string& bytes) { return escaped(bytes, false); }

// A log a job's output may be appended to: NAME.log, or /dev/null.
bool is_log_name(const std::string& path) {
  const std::string name = std::filesystem::path(path).filename().string();
  return path == "/dev/null" || (name.size() > 4 && name.compare(name.size() - 4, 4, ".log") == 0);
}

}  // namespace

TrialSlotServer::TrialSlotServer(TrialSlotServerOptions options) : options_(std::move(options)) {
  const std::string where = "trial slots at " + options_.bind;
  if (options_.slots < 1) throw InputError(where + ": --slots must be at least 1");
  if (options_.program.empty()) throw InputError(where + ": no program to run");
  if (options_.heartbeat_timeout_ms < 100)
    throw InputError(where + ": the heartbeat timeout must be at least 0.1 s");
  if (options_.kill_grace_ms < 0) throw InputError(where + ": a negative kill grace");
  const bool curve = !options_.curve_secret_key.empty();
  if (curve) {
    if (options_.bind.rfind("inproc://", 0) == 0)
      throw InputError(where + ": CURVE does not apply to inproc:// endpoints");
    transport::validate_curve_key(options_.curve_secret_key, where + ": curve secret key");
    for (const std::string& key : options_.curve_allowed_clients)
      transport::validate_curve_key(key, where + ": allowed client key");
    curve_public_key_ = transport::curve_public_from_secret(options_.curve_secret_key);
  } else if (!options_.curve_allowed_clients.empty()) {
    throw InputError(where + ": allowed client keys without a CURVE secret key");
  }
  if (!options_.root.empty()) {
    std::error_code error;
    const std::filesystem::path root = std::filesystem::canonical(options_.root, error);
    if (error || !std::filesystem::is_directory(root))
      throw InputError(where + ": --root " + options_.root + " is not a directory" +
                       (error ? " (" + error.message() + ")" : ""));
    options_.root = root.string();
  }
  try {
    if (curve) {
      char domain[64];
      std::snprintf(domain, sizeof domain, "tandem-trial-slots-%p", static_cast<void*>(this));
      zap_ = transport::ZapAuthenticator::allow(context_, domain, options_.curve_allowed_clients);
    }
    socket_ = zmq::socket_t(context_, zmq::socket_type::router);
    if (curve) {  // before bind: a connection accepted earlier would not be CURVE
      socket_.set(zmq::sockopt::curve_server, 1);
      socket_.set(zmq::sockopt::curve_secretkey, options_.curve_secret_key);
      socket_.set(zmq::sockopt::zap_domain, zap_.domain());
    }
    socket_.set(zmq::sockopt::linger, 200);
    // A search reconnecting after its connection broke keeps its routing id; without handover
    // the ROUTER refuses it while it still holds the old connection (one it has not yet seen
    // die), and the search, unheard, takes this server for gone.
    socket_.set(zmq::sockopt::router_handover, 1);
    // Messages are small JSON objects: a peer sending more is dropped by ZeroMQ.
    socket_.set(zmq::sockopt::maxmsgsize, int64_t{1} << 20);
  } catch (const zmq::error_t& e) {
    throw transport::TransportError(where + ": cannot set up its socket: " + e.what());
  }
  endpoint_ = transport::bind_checked(socket_, options_.bind, where + ": cannot bind");
  bound_file_ = transport::BoundIpcFile(options_.bind);
}

TrialSlotServer::~TrialSlotServer() { stop_jobs(options_.kill_grace_ms); }

void TrialSlotServer::say(const std::string& line) const {
  // Lines quote what peers sent (a bad message's text, a job's id and log path).
  const std::string text = escaped(line, true);
  if (options_.log) options_.log(text);
  else std::fprintf(stderr, "tandem trial-slots: %s\n", text.c_str());
}

std::vector<pid_t> TrialSlotServer::pids() const {
  std::vector<pid_t> out;
  for (const Job& j : jobs_) out.push_back(j.pid);
  return out;
}

void TrialSlotServer::serve(const std::atomic<bool>& stop) {
  while (!stop.load()) {
    try {
      serve_once(50);
    } catch (const transport::TransportError&) {
      if (stop.load()) break;  // a signal interrupted the poll
      throw;
    }
  }
  stop_jobs(options_.kill_grace_ms);
  // Said to every client once its jobs have ended: a server stopped cleanly looked like a
  // silent one, and a search waited out its --slots-timeout before it gave the server up.
  for (const auto& [client, c] : clients_) reply(client, SlotMessage{SlotMessageType::Bye});
}

void TrialSlotServer::serve_once(long timeout_ms) {
  // Every message already waiting is read before silence is judged (expire): after a stall of
  // this thread (a job's log opened on a stalled file system), a client's heartbeats may sit
  // unread while its silence, counted from the last one read, passes the timeout, and its jobs
  // were ended though it was alive. (At most kMostPerRound, so that jobs are still reaped.)
  constexpr int kMostPerRound = 1000;
  for (int n = 0; n < kMostPerRound; ++n) {
    transport::Frames frames;
    if (!transport::receive_frames(socket_, frames, n == 0 ? timeout_ms : 0,
                                   "trial slots at " + endpoint_))
      break;
    const std::string client(static_cast<const char*>(frames[0].data()), frames[0].size());
    if (frames.size() != 2) {
      SlotMessage error{SlotMessageType::Error};
      error.error = "expected one frame (a JSON message), got " + std::to_string(frames.size() - 1);
      reply(client, error);
    } else {
      handle(client, std::string(static_cast<const char*>(frames[1].data()), frames[1].size()));
    }
  }
  reap();
  expire();
  kill_overdue();
  answer_claims();
}

void TrialSlotServer::reply(const std::string& client, const SlotMessage& m) {
  const std::string text = encode_slot_message(m);
  const zmq::message_t id(client.data(), client.size());
  // A ROUTER drops messages to peers that are gone (or whose queue is full): never blocks.
  transport::send_frames(socket_, {{reinterpret_cast<const uint8_t*>(text.data()), text.size()}},
                         &id, "trial slots at " + endpoint_);
}

void TrialSlotServer::handle(const std::string& client, const std::string& frame) {
  auto known = clients_.find(client);
  if (known == clients_.end()) {
    // The routing id is a client's secret (whoever connects with it takes its replies and may
    // cancel its jobs): the log, often on a shared filesystem, shows only its first characters.
    // A client is a search or a prediction (`tandem search|predict --slots`).
    const size_t dash = client.rfind('-');
    const size_t shown = dash == std::string::npos ? 8 : dash + 5;
    const std::string name = "client " + std::to_string(++client_count_) + " (" +
                             printable(client.substr(0, shown)) +
                             (shown < client.size() ? "...)" : ")");
    known = clients_.emplace(client, Client{Clock::now(), name, {}}).first;
  }
  known->second.last_heard = Clock::now();
  SlotMessage m;
  try {
    m = decode_slot_message(frame);
  } catch (const SlotProtocolError& e) {
    say("bad message from " + known->second.name + ": " + e.what());
    SlotMessage error{SlotMessageType::Error};
    error.error = std::string("bad message: ") + e.what();
    reply(client, error);
    return;
  }
  SlotMessage answer;
  switch (m.type) {
    case SlotMessageType::Hello:
      answer.type = SlotMessageType::Hello;
      answer.slots = options_.slots;
      answer.running = running();
      answer.threads = options_.threads;
      answer.heartbeat_timeout_ms = options_.heartbeat_timeout_ms;
      say(known->second.name + " connected");
      reply(client, answer);
      return;
    case SlotMessageType::Heartbeat:
      answer.type = SlotMessageType::Heartbeat;
      answer.running = running();
      answer.seq = m.seq;
      answer.jobs_listed = true;
      for (const Job& j : jobs_)
        if (j.client == client && !j.orphaned) answer.jobs.push_back(j.id);
      {
        // Kept for twice the heartbeat timeout: a search silent for longer is given up anyway.
        auto& ended = known->second.ended;
        const auto keep = std::chrono::milliseconds(2 * int64_t{options_.heartbeat_timeout_ms});
        while (!ended.empty() && Clock::now() - ended.front().at > keep) ended.pop_front();
        for (const Client::Ended& e : ended) answer.ended.push_back(e.exit);
      }
      reply(client, answer);
      return;
    case SlotMessageType::Start: start_job(client, m); return;
    case SlotMessageType::Claim: claim(client, m); return;
    case SlotMessageType::Cancel:
      for (Job& j : jobs_)
        if (j.client == client && j.id == m.job) {
          say("cancelling job " + j.id + " (pid " + std::to_string(j.pid) + ")");
          end_job(j);
          return;
        }
      answer.type = SlotMessageType::Error;
      answer.job = m.job;
      answer.error = "cancel: no running job " + m.job;
      reply(client, answer);
      return;
    case SlotMessageType::Bye: {
      int ended = 0;
      for (Job& j : jobs_)
        if (j.client == client && !j.orphaned) {
          end_job(j);
          j.orphaned = true;
          ++ended;
        }
      say(known->second.name + " said bye" +
          (ended ? "; ending its " + std::to_string(ended) + " job(s)" : std::string()));
      clients_.erase(known);
      return;
    }
    default:
      answer.type = SlotMessageType::Error;
      answer.job = m.job;
      answer.error = std::string("a slot server does not take \"") + to_string(m.type) + "\" messages";
      reply(client, answer);
      return;
  }
}

void TrialSlotServer::start_job(const std::string& client, const SlotMessage& m) {
  reap();  // a job that just ended frees its slot
  SlotMessage answer{SlotMessageType::Error};
  answer.job = m.job;
  if (std::find(options_.allowed_commands.begin(), options_.allowed_commands.end(), m.args[0]) ==
      options_.allowed_commands.end()) {
    std::string allowed;
    for (const std::string& c : options_.allowed_commands)
      allowed += (allowed.empty() ? "`tandem " : " or `tandem ") + c + " ...`";
    answer.error = "job " + m.job + ": this server runs only " + allowed + ", not `" + m.args[0] + "`";
  } else if (!is_log_name(m.log)) {
    // A job's output (its arguments echoed in its errors: text its peer chooses) is appended to
    // its log: only to a .log file, never to a peer's choice of ~/.bashrc or a key list.
    answer.error = "job " + m.job + " refused: its log, " + m.log + ", is not a .log file (a "
                   "slot server appends a job's output to .log files only)";
  } else if (running() >= options_.slots) {
    answer.error = "job " + m.job + " refused: all " + std::to_string(options_.slots) +
                   " slot(s) of this server are busy";
    answer.busy = true;
  } else if (const std::string why =
                 options_.root.empty() ? "" : outside_root(options_.root, m.log, m.args);
             !why.empty()) {
    answer.error = "job " + m.job + " refused: " + why;
  } else {
    for (const Job& j : jobs_)
      if (j.client == client && j.id == m.job) answer.error = "job " + m.job + " is already running";
  }
  if (answer.error.empty()) {
    std::vector<std::string> argv{options_.program};
    argv.insert(argv.end(), m.args.begin(), m.args.end());
    // Under --root the log is opened as resolved (relative: in the root), and the job runs there.
    const std::string log =
        options_.root.empty() ? m.log : resolved(options_.root, m.log).string();
    try {
      const pid_t pid = start_child_process(argv, log, "job " + m.job, false, options_.root);
      jobs_.push_back({client, m.job, pid, m.log, false});
      say("job " + m.job + " started: pid " + std::to_string(pid) + " (" +
          std::to_string(running()) + "/" + std::to_string(options_.slots) + " slots), log " + m.log);
      answer.type = SlotMessageType::Started;
      answer.pid = pid;
    } catch (const Error& e) {
      answer.error = e.what();
    }
  }
  if (answer.type == SlotMessageType::Error) say(answer.error);
  reply(client, answer);
}

namespace {

// The job's log lies in `dir` (directly: a search's trial logs are `dir`/trial-N.log).
bool log_in(const std::string& log, const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path d = fs::path(dir).lexically_normal();
  return fs::path(log).lexically_normal().parent_path() ==
         (d.has_filename() ? d : d.parent_path());  // "/out/" as "/out"
}

}  // namespace

void TrialSlotServer::claim(const std::string& client, const SlotMessage& m) {
  say(clients_.at(client).name + " claimed " + m.dir);
  claims_.push_back({client, m.dir, 0});
  answer_claims();
}

void TrialSlotServer::answer_claims() {
  const auto now = Clock::now();
  const auto silent_for = std::chrono::milliseconds(options_.heartbeat_timeout_ms / 2);
  for (auto it = claims_.begin(); it != claims_.end();) {
    Claim& c = *it;
    if (clients_.count(c.client) == 0) {  // the claimer is gone: nobody waits for the answer
      it = claims_.erase(it);
      continue;
    }
    bool left = false;
    for (Job& j : jobs_) {
      if (j.client == c.client || !log_in(j.log, c.dir)) continue;
      left = true;
      // The claimer holds the directory's lock (one search per --out): a job of another client
      // writing there is a dead search's, once that client has been silent for longer than a
      // live one ever is (it sends a heartbeat every quarter of the timeout).
      const auto owner = clients_.find(j.client);
      if (j.terminated() || j.orphaned ||
          (owner != clients_.end() && now - owner->second.last_heard < silent_for))
        continue;
      say("ending job " + j.id + " (pid " + std::to_string(j.pid) + "), writing into " + c.dir +
          ": its client is silent");
      end_job(j);
      j.orphaned = true;
      ++c.ended;
    }
    if (left) {
      ++it;
      continue;
    }
    SlotMessage answer{SlotMessageType::Claimed};
    answer.dir = c.dir;
    answer.ended_jobs = c.ended;
    reply(c.client, answer);
    it = claims_.erase(it);
  }
}

void TrialSlotServer::reap() {
  for (size_t i = 0; i < jobs_.size();) {
    int status = 0;
    if (waitpid(jobs_[i].pid, &status, WNOHANG) != jobs_[i].pid) {
      ++i;
      continue;
    }
    const Job job = jobs_[i];
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(i));
    say("job " + job.id + " (pid " + std::to_string(job.pid) + ") " + describe_exit(status));
    const auto client = clients_.find(job.client);
    if (job.orphaned || client == clients_.end()) continue;
    SlotMessage exited{SlotMessageType::Exited};
    exited.job = job.id;
    if (WIFSIGNALED(status)) exited.signal = WTERMSIG(status);
    else exited.exit_code = WEXITSTATUS(status);
    reply(job.client, exited);
    auto& ended = client->second.ended;
    ended.push_back({{exited.job, exited.exit_code, exited.signal}, Clock::now()});
    constexpr size_t kMostEndedListed = 256;  // a heartbeat answer stays small
    if (ended.size() > kMostEndedListed) ended.pop_front();
  }
}

void TrialSlotServer::expire() {
  const auto now = Clock::now();
  const auto timeout = std::chrono::milliseconds(options_.heartbeat_timeout_ms);
  for (auto it = clients_.begin(); it != clients_.end();) {
    if (now - it->second.last_heard < timeout) {
      ++it;
      continue;
    }
    int ended = 0;
    for (Job& j : jobs_)
      if (j.client == it->first && !j.orphaned) {
        end_job(j);  // nobody waits for its results any more
        j.orphaned = true;
        ++ended;
      }
    if (ended > 0) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.1f", options_.heartbeat_timeout_ms / 1000.0);
      say(it->second.name + " silent for " + seconds + " s: ending its " + std::to_string(ended) +
          " job(s)");
    }
    it = clients_.erase(it);
  }
}

void TrialSlotServer::end_job(Job& job) {
  // Once: a second request neither extends the grace nor sends a second SIGTERM, which the job
  // would take as "stop at once" (stop_signals.h).
  if (job.terminated()) return;
  kill(job.pid, SIGTERM);
  job.kill_at = Clock::now() + std::chrono::milliseconds(options_.kill_grace_ms);
}

void TrialSlotServer::kill_overdue() {
  const auto now = Clock::now();
  for (Job& j : jobs_)
    if (j.kill_at <= now) {
      say("job " + j.id + " (pid " + std::to_string(j.pid) + ") still there " +
          std::to_string(options_.kill_grace_ms) + " ms after SIGTERM: SIGKILL");
      kill(j.pid, SIGKILL);  // reaped by the next reap()
      j.kill_at = Clock::time_point::max();
    }
}

void TrialSlotServer::stop_jobs(int grace_ms) {
  if (jobs_.empty()) return;
  // SIGTERM through end_job: a job cancelled or orphaned earlier has had it, and a second would
  // stop it at once, without its result (stop_signals.h).
  std::vector<pid_t> pids;
  for (Job& j : jobs_) {
    end_job(j);
    pids.push_back(j.pid);
  }
  jobs_.clear();
  pids = reap_until(std::move(pids), Clock::now() + std::chrono::milliseconds(grace_ms));
  if (!pids.empty()) kill_and_reap(std::move(pids));
}

}  // namespace tandem::cli
