#include "process_launcher.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "tandem/error.h"
#include "trial_process.h"

namespace tandem::cli {

ProcessLauncher::ProcessLauncher(std::string self, std::vector<std::string> extra_args,
                                 int max_restarts)
    : self_(std::move(self)), extra_args_(std::move(extra_args)), max_restarts_(max_restarts) {}

ProcessLauncher::~ProcessLauncher() { stop_all(0); }

pid_t ProcessLauncher::spawn(const Child& c) const {
  // --launched-by: the stop signals are this launcher's to act on (stop_signals.h).
  std::vector<std::string> args{self_,    c.kind, "--coordinator", c.coordinator, "--name",
                                c.name,   "--launched-by", std::to_string(getpid())};
  if (!c.bind.empty()) args.insert(args.end(), {"--bind", c.bind});
  args.insert(args.end(), extra_args_.begin(), extra_args_.end());
  if (const auto it = role_args_.find(c.name); it != role_args_.end())
    args.insert(args.end(), it->second.begin(), it->second.end());
  // Dies with the launcher, whatever kills it (a SIGKILL'd launcher included). In a process group
  // of its own: a Ctrl-C or a cancel sent to the launcher's group reaches the launcher alone,
  // which stops the run in order (roles killed by it would be restarted, the model lost). With
  // the stop signals blocked until the role has its handlers (run_stoppable_role): a signal to
  // every process of the run (a service stopped) then never finds a role without them.
  return start_child_process(args, "", "cannot start " + c.name, /*own_process_group=*/true,
                             /*working_dir=*/"", /*stop_signals_blocked=*/true);
}

std::string ProcessLauncher::start(const std::string& kind, const std::string& name,
                                   const std::string& coordinator) {
  Child c;
  c.kind = kind;
  c.name = name;
  c.coordinator = coordinator;
  c.pid = spawn(c);
  children_.push_back(c);
  return "pid " + std::to_string(c.pid) + " on this machine (`" + self_ + " " + kind +
         " --coordinator " + coordinator + " --name " + name + "`)";
}

namespace {

bool is_running(ClusterPhase p) {
  return p == ClusterPhase::Starting || p == ClusterPhase::Training;
}

// Whether a role that exited is restarted in `phase`: a scorer while the run trains; a server up
// to the end, draining included (the final parameters are read from it), but not once the run is
// done (one that failed writing its final checkpoint would reload and write it again, and hold
// the end up) or has failed.
bool still_needed(const std::string& kind, ClusterPhase phase) {
  return is_running(phase) || (kind == "ps" && phase == ClusterPhase::Draining);
}

}  // namespace

void ProcessLauncher::watch(Coordinator& coordinator) {
  ClusterPhase phase = coordinator.phase();
  const auto now = std::chrono::steady_clock::now();
  for (Child& c : children_) {
    if (c.restart_pending) {
      if (now < c.restart_at) continue;
      c.restart_pending = false;
      if (!still_needed(c.kind, phase)) continue;
      c.pid = spawn(c);
      c.exited = false;
      continue;
    }
    if (c.exited) continue;
    int status = 0;
    if (waitpid(c.pid, &status, WNOHANG) != c.pid) continue;
    c.exited = true;
    const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    const std::string how = describe_exit(status);
    // The phase now, not at this pass's start: a server that left because the run was done
    // since is not restarted.
    phase = coordinator.phase();
    // A normal end: a worker or scorer once training is over, a server once the run is done. A
    // server that left cleanly while the run drains wrote its last checkpoint: restarted, it
    // serves the final parameters from there.
    if (clean && !still_needed(c.kind, phase)) continue;
    coordinator.mark_lost(c.name, "process " + std::to_string(c.pid) + " " + how);
    if (c.kind == "worker" && phase == ClusterPhase::Starting) {
      // The run waits for every worker and workers are not restarted: without this it would
      // wait out the start-up timeout, then name this worker only as not registered.
      coordinator.fail(c.name + " (process " + std::to_string(c.pid) + ") " + how +
                       " before the run started; its messages are above");
      continue;
    }
    if (c.kind == "worker" || !still_needed(c.kind, phase)) continue;
    if (c.restarts >= max_restarts_) {
      const std::string why = c.name + " (process " + std::to_string(c.pid) + ") " + how +
                              " after " + std::to_string(c.restarts) +
                              " restarts: no restart left";
      // Nothing trains without a server (the workers would wait out their timeouts, then the
      // run would fail naming them); a run goes on without its scorer to its other stop rules,
      // and fails when it has none (its target would never be met: it would train for ever).
      if (c.kind == "ps") coordinator.fail(why + "; its messages are above");
      else if (!coordinator.stops_without_scores())
        coordinator.fail(why + "; its messages are above, and without scores nothing would "
                         "stop this run (no --max-epochs or --max-seconds)");
      else std::fprintf(stderr, "tandem launch: %s; the run goes on without scores\n", why.c_str());
      continue;
    }
    if (c.kind == "ps") {
      // The same address, so the workers' sockets reconnect to the restarted server.
      const nlohmann::json spec = coordinator.spec();  // kept: the loop reads into it
      for (const auto& ps : spec.at("ps"))
        if (ps.value("name", std::string()) == c.name) c.bind = ps.value("address", std::string());
    }
    if (c.restarts == 0) {
      std::fprintf(stderr, "tandem launch: %s %s; restarting it\n", c.name.c_str(), how.c_str());
      c.pid = spawn(c);
      c.exited = false;
    } else {
      const int delay_ms = std::min(8000, 500 << std::min(c.restarts - 1, 4));
      std::fprintf(stderr, "tandem launch: %s %s; restarting it in %.1f s (restart %d of %d)\n",
                   c.name.c_str(), how.c_str(), delay_ms / 1000.0, c.restarts + 1, max_restarts_);
      c.restart_pending = true;
      c.restart_at = now + std::chrono::milliseconds(delay_ms);
    }
    ++c.restarts;
  }
  // Workers are not restarted (their batches go to the others); with none left, nothing would
  // ever train again.
  bool any_worker = false, all_workers_gone = true;
  std::string last;
  for (const Child& c : children_)
    if (c.kind == "worker") {
      any_worker = true;
      if (!c.exited) all_workers_gone = false;
      else last = c.name;
    }
  if (is_running(coordinator.phase()) && any_worker && all_workers_gone)
    coordinator.fail("every worker process has exited (the last was " + last +
                     "); their messages are above");
}

void ProcessLauncher::stop_all(int timeout_ms) {
  // timeout_ms for the roles to end on their own (told by the coordinator), then SIGTERM.
  std::vector<pid_t> running;
  for (Child& c : children_) {
    if (!c.exited) running.push_back(c.pid);
    c.exited = true;
  }
  running = reap_until(std::move(running), std::chrono::steady_clock::now() +
                                               std::chrono::milliseconds(timeout_ms));
  if (!running.empty()) terminate_and_reap(std::move(running), 2000);
}

void ProcessLauncher::set_role_args(const std::string& name, std::vector<std::string> args) {
  role_args_[name] = std::move(args);
}

std::map<std::string, pid_t> ProcessLauncher::pids() const {
  std::map<std::string, pid_t> out;
  for (const Child& c : children_)
    if (!c.exited) out[c.name] = c.pid;
  return out;
}

}  // namespace tandem::cli
