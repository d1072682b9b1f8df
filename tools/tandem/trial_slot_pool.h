// tandem search --slots: the search's side of trial_slot_protocol.h. One DEALER per slot server
// (tandem trial-slots); jobs go to the server with the most free slots. Heartbeats go to each
// server every quarter of the timeout (the smaller of ours and its own); a server that answers
// nothing for timeout_ms is dropped and its running jobs are reported failed, naming it (they
// are not re-queued: a server that is merely cut off may still be running them, writing the
// trial's files on the shared filesystem; it is sent a bye, so that if it comes back it ends
// them within its kill grace). The other servers go on. A start refused because
// the server's slots are all taken (another search uses them) comes back with `retry`: the
// server takes no more of our jobs until a heartbeat answer says it has a free slot.
#pragma once

#include <zmq.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "curve_client.h"
#include "trial_slot_protocol.h"

namespace tandem::cli {

struct TrialSlotPoolOptions {
  int timeout_ms = 10000;          // silence before a server counts as gone
  // The servers' public key and this client's pair (no secret key: a throwaway pair); not
  // enabled: no CURVE.
  transport::CurveClientKeys curve;
  // Endpoints found listed in a directory (--slots DIR) rather than named: one that does not
  // answer hello is left out (skipped()) instead of failing the pool, since a server killed
  // outright leaves its entry behind. The pool still needs one server that answers.
  std::vector<std::string> optional_endpoints;
  std::string client = "search";   // the command, for what it says on stderr
};

// A job that ended: `clean` when it exited 0; `how` says how it ended otherwise. `retry`: it
// never started (the server was busy, or its start could not be sent to a server since
// dropped); start it again when there is a free slot.
struct SlotJobEnd {
  std::string job;
  bool clean = false;
  std::string how;
  bool retry = false;
  bool refused = false;  // the server refused to start it (not busy): it never ran
};

class TrialSlotPool {
 public:
  // Connects and says hello to every server; throws Error naming each one that does not answer
  // within timeout_ms (or answers with an error), optional endpoints aside (see
  // TrialSlotPoolOptions).
  TrialSlotPool(const std::vector<std::string>& endpoints, TrialSlotPoolOptions options);
  // The optional endpoints left out at the start, each with why ("did not answer within ...").
  const std::vector<std::pair<std::string, std::string>>& skipped() const { return skipped_; }
  ~TrialSlotPool();  // says bye to the servers still there
  TrialSlotPool(const TrialSlotPool&) = delete;
  TrialSlotPool& operator=(const TrialSlotPool&) = delete;

  int total_slots() const;  // of the servers still answering
  int joining() const;      // servers added (add()) that have not answered hello yet
  int free_slots() const;
  // Starts a job on the server with the most free slots; `args(threads)` gives `train ...` for
  // that server's threads per trial. Returns the server's endpoint. Needs free_slots() > 0.
  std::string start(const std::string& job, const std::function<std::vector<std::string>(int)>& args,
                    const std::string& log);
  // A server that came after the start (listed in a --slots directory since): it joins once it
  // answers hello (said on stderr), and is left out, as a stale entry, if it does not within
  // timeout_ms. At the endpoint of a server the pool dropped or left out, it is a server started
  // again there: connected afresh, it joins the same way. At that of a server still in the
  // pool (restarted within the timeout: its socket has reconnected), hello is said again, for
  // its slots and threads.
  void add(const std::string& endpoint);
  // Claims `dir`, the output directory this client has locked, on every server: each ends the
  // jobs of other clients whose log lies in it once those clients have been silent for half its
  // heartbeat timeout (a killed search's jobs, which outlive it by that timeout and would write
  // over this one's files), and answers once none is left. Returns how many were ended. Throws
  // Error naming the servers still running such jobs for a client still heard from when the
  // answers do not come in time (the longer of timeout_ms and half a server's heartbeat timeout
  // and 5 s); an older server that does not know the message is said on stderr and not waited
  // for. Before any job of this pool's is started.
  int claim(const std::string& dir);
  // Asks the job's server to end it (SIGTERM); its end comes from wait() as usual.
  void cancel(const std::string& job);
  // Waits up to timeout_ms for messages; sends heartbeats; returns the jobs that ended, those of
  // a server gone silent included.
  std::vector<SlotJobEnd> wait(long timeout_ms);
  // Why there are no servers left: each endpoint and what happened to it.
  std::string lost_servers() const;
  // Every server that answered hello, in order: those of the start, then those that joined.
  std::vector<std::string> endpoints() const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Server;
  std::unique_ptr<Server> connect_server(const std::string& endpoint, Clock::time_point now);
  // False when this message could not be sent (the server's send_error says why). A heartbeat
  // gets its seq.
  bool send(Server& server, SlotMessage m);
  // Reports the jobs `heartbeat` shows the server no longer runs as ended (see the .cpp).
  // The job ended as `exit` says (an exited, or a heartbeat's "ended" entry; once).
  void job_exited(Server& server, const SlotJobExit& exit, std::vector<SlotJobEnd>& ended);
  void lost_jobs(Server& server, const SlotMessage& heartbeat, std::vector<SlotJobEnd>& ended);
  void drop(Server& server, const std::string& reason, std::vector<SlotJobEnd>& ended);

  TrialSlotPoolOptions options_;  // its keys resolved
  std::string id_;  // this client's routing id on every server
  std::vector<std::pair<std::string, std::string>> skipped_;  // endpoint, why
  zmq::context_t context_{1};
  std::vector<std::unique_ptr<Server>> servers_;
};

}  // namespace tandem::cli
