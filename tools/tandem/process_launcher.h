// `tandem launch`'s role processes: each role is this same binary run as `tandem ps|worker|scorer
// --coordinator ADDR --name NAME`. Children die with the launcher (PR_SET_PDEATHSIG), so nothing
// is left behind even when the launcher itself is killed; stop_all() reaps or kills the rest.
// A role that exits while training runs: a worker is reported lost at once (its batches go to the
// others), and one that exits before the run started fails it (the run waits for every worker);
// the scorer is restarted; a parameter server is restarted on its old address, so the
// workers' sockets reconnect, and it resumes from its newest checkpoint.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "cluster_run.h"

namespace tandem::cli {

class ProcessLauncher final : public RoleLauncher {
 public:
  // `self`: the tandem binary; `extra_args`: appended to every role's command line.
  explicit ProcessLauncher(std::string self, std::vector<std::string> extra_args = {},
                           int max_restarts = 5);
  ~ProcessLauncher() override;  // stop_all(0)

  std::string start(const std::string& kind, const std::string& name,
                    const std::string& coordinator) override;
  void watch(Coordinator& coordinator) override;
  void stop_all(int timeout_ms) override;

  // More arguments for the role named `name` alone, from its next start on (launch gives each
  // worker its GPUs: --gpus 2,3).
  void set_role_args(const std::string& name, std::vector<std::string> args);

  // Process ids by role name (tests kill them).
  std::map<std::string, pid_t> pids() const;

 private:
  struct Child {
    std::string kind, name, coordinator, bind;
    pid_t pid = 0;
    int restarts = 0;
    bool exited = false;
    // A restart waiting for its time: each after the first waits twice as long as the one
    // before (0.5 s, 1 s, 2 s, ...), so a role that dies at once (its port taken meanwhile)
    // does not use up every restart within a second.
    bool restart_pending = false;
    std::chrono::steady_clock::time_point restart_at;
  };
  pid_t spawn(const Child& child) const;

  std::string self_;
  std::vector<std::string> extra_args_;
  std::map<std::string, std::vector<std::string>> role_args_;
  int max_restarts_;
  std::vector<Child> children_;
};

}  // namespace tandem::cli
