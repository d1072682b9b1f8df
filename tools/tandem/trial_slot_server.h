// tandem trial-slots: runs a search's trials on this machine for tandem search --slots. A ZeroMQ
// ROUTER serves the messages of trial_slot_protocol.h; each started job is this program run as
// `tandem train ...` (a search's trial) or `tandem predict ...` (a share of a prediction's
// chunks, tandem predict --slots) (trial_process.h), at most `slots` at once across every client.
//
// A search sends a heartbeat at least every quarter of the timeout and the server answers each
// one. A search silent for heartbeat_timeout_ms (killed, its machine gone) has its jobs ended,
// so nothing it started outlives it by more than the timeout and the grace below; the server
// keeps serving others. A search that says bye (it ended, or gave this server up as silent: a
// server frozen for a while reads that bye when it comes back, after any start still queued to
// it) has its jobs ended at once. Ending a job is SIGTERM, then SIGKILL after kill_grace_ms if it
// is still there, so a job can finish what it is writing (tandem predict ends between two
// chunks). Stopping the server (stop flag, destructor) ends every job the same way; a server
// killed outright takes its jobs with it (PR_SET_PDEATHSIG). A search's claim of its output
// directory ends the same way the other clients' jobs whose log lies there once their client has
// been silent for half the heartbeat timeout (a live search is heard from every quarter): a
// killed search's, which would otherwise write over the new search's files until the timeout.
// It is answered once none is left there; a live client's jobs are never ended by it.
//
// Only `program` is ever run, with args[0] one of allowed_commands: a peer cannot make the
// server run anything else. Paths in a job (data, checkpoints, metrics, the log) are the
// search's, so the search and the servers share a filesystem; with `root`, a job naming a path
// outside that directory is refused (a peer cannot have files written anywhere the server's
// user may write).
#pragma once

#include <sys/types.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "trial_slot_protocol.h"
#include "zmq_curve.h"

namespace tandem::cli {

struct TrialSlotServerOptions {
  std::string bind = "tcp://127.0.0.1:*";
  int slots = 1;
  int threads = 1;                   // threads per trial the server suggests (hello)
  std::string program;               // the binary each job runs (this tandem)
  std::vector<std::string> allowed_commands{"train", "predict"};
  int heartbeat_timeout_ms = 10000;  // a search silent this long has its jobs ended
  int kill_grace_ms = 2000;          // a job sent SIGTERM is sent SIGKILL this long after
  std::string curve_secret_key;      // Z85; empty: no CURVE
  std::vector<std::string> curve_allowed_clients;  // Z85 public keys; empty: any key holder
  // Non-empty: an existing directory every path a job names must lie in (its log, and each
  // argument, or value of --flag=value, taken for a path), checked after resolving "..",
  // symbolic links and relative paths (against it); jobs run there. Empty: any path.
  std::string root;
  std::function<void(const std::string&)> log;     // event lines (default: stderr)
};

class TrialSlotServer {
 public:
  // Binds; throws TransportError when it cannot, InputError for bad options.
  explicit TrialSlotServer(TrialSlotServerOptions options);
  ~TrialSlotServer();  // ends every job (stop_jobs)
  TrialSlotServer(const TrialSlotServer&) = delete;
  TrialSlotServer& operator=(const TrialSlotServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }
  const std::string& curve_public_key() const { return curve_public_key_; }

  // Serves until `stop` is true, then ends every job. Call from one thread only (the one that
  // lives as long as the jobs should: their PR_SET_PDEATHSIG follows it).
  void serve(const std::atomic<bool>& stop);
  // One round: a message if one arrives within timeout_ms, then reaps jobs, expires silent
  // searches and kills the jobs whose grace after SIGTERM is over.
  void serve_once(long timeout_ms);
  // SIGTERM to every job, SIGKILL after grace_ms, every one reaped.
  void stop_jobs(int grace_ms);

  int running() const { return static_cast<int>(jobs_.size()); }
  // The pids of the running jobs (tests).
  std::vector<pid_t> pids() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Job {
    std::string client;  // routing id
    std::string id;
    pid_t pid = 0;
    std::string log;  // as the client sent it
    bool orphaned = false;  // its search went silent or said bye; ended, not reported
    // Set when it is sent its SIGTERM (only one: a second means "stop at once"): SIGKILL then.
    Clock::time_point kill_at = Clock::time_point::max();
    bool terminated() const { return kill_at != Clock::time_point::max(); }
  };
  struct Client {
    Clock::time_point last_heard;
    std::string name;  // for log lines
    // Its jobs that ended lately, listed in each heartbeat answer: an exited sent while its
    // connection was down (it reconnects with the same routing id) is dropped by the ROUTER,
    // and the search would have taken the job, missing from the heartbeat's list, for lost.
    struct Ended {
      SlotJobExit exit;
      Clock::time_point at;
    };
    std::deque<Ended> ended;
  };
  // A claim still waiting for the jobs of others in its directory to end.
  struct Claim {
    std::string client;
    std::string dir;
    int ended = 0;  // the jobs it ended
  };
  void handle(const std::string& client, const std::string& frame);
  void claim(const std::string& client, const SlotMessage& m);
  // Ends the jobs in a claimed directory whose client has been silent for half the heartbeat
  // timeout, and answers the claims with none of others left there (a claimer gone: dropped).
  void answer_claims();
  void start_job(const std::string& client, const SlotMessage& m);
  void reply(const std::string& client, const SlotMessage& m);
  void reap();
  void expire();
  // SIGTERM now, SIGKILL at kill_at (kill_overdue) if the job has not ended by then.
  void end_job(Job& job);
  void kill_overdue();
  void say(const std::string& line) const;

  TrialSlotServerOptions options_;
  zmq::context_t context_{1};
  transport::ZapAuthenticator::Registration zap_;
  transport::BoundIpcFile bound_file_;  // removed after the socket closes (member order)
  zmq::socket_t socket_;
  std::string endpoint_;
  std::string curve_public_key_;
  std::map<std::string, Client> clients_;
  std::vector<Job> jobs_;
  std::vector<Claim> claims_;
  int client_count_ = 0;
};

}  // namespace tandem::cli
