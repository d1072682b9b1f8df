#include "trial_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "stop_signals.h"
#include "tandem/error.h"

namespace tandem::cli {

pid_t start_child_process(const std::vector<std::string>& args, const std::string& log,
                          const std::string& what, bool own_process_group,
                          const std::string& working_dir, bool stop_signals_blocked) {
  if (args.empty()) throw InputError(what + ": no command to run");
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed (other threads may hold the allocator's locks).
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string failure = "tandem: cannot run " + args[0] + ": ";
  const std::string no_dir = failure + "cannot enter " + working_dir + ": ";
  // In the child: `what`, errno's description, a newline, then exit 127 (strerrordesc_np, not
  // strerror: no locale lookup, which is not async-signal-safe, in a forked child).
  auto fail_in_child = [](const std::string& what) {
    const char* reason = strerrordesc_np(errno);
    if (reason == nullptr) reason = "unknown error";
    (void)!write(STDERR_FILENO, what.data(), what.size());
    (void)!write(STDERR_FILENO, reason, std::strlen(reason));
    (void)!write(STDERR_FILENO, "\n", 1);
    _exit(127);
  };
  // The log is opened here, not in the child: one that cannot be opened (a directory the server
  // does not share) is an error its caller can report, where the child would have run on with
  // the parent's output and left no reason anywhere.
  // Not through a symbolic link at the log's own name: a slot server checks a job's log path
  // (--root) before it opens it, and a link put there in between would send the output, which
  // the job's peer partly chooses, to a file of its choosing.
  const int log_fd =
      log.empty() ? -1
                  : open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (!log.empty() && log_fd < 0)
    throw Error(what + ": cannot open its log " + log + ": " +
                (errno == ELOOP ? std::string("it is a symbolic link (logs are not written "
                                              "through one)")
                                : std::strerror(errno)));
  const pid_t parent = getpid();
  pid_t pid;
  {
    // Blocked until the child has reset them (stop_signals.h). The child never leaves this block
    // (it execs or _exits), so only the parent restores its mask: restored in the child too, a
    // signal sent since the fork (a cancel right after the start) would run the parent's
    // handler there, and be lost.
    const StopSignalsBlocked blocked;
    pid = fork();
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // children die with their parent, however it ends
      if (getppid() != parent) _exit(1);  // the parent died before prctl took effect
      if (own_process_group) setpgid(0, 0);
      if (log_fd >= 0) {  // (dup2's copies are not close-on-exec)
        dup2(log_fd, STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
        close(log_fd);
      }
      // The parent's stop-signal handlers and blocked mask must not reach the child: a SIGTERM
      // sent since the fork (a cancel right after the start) then ends it as it would the program
      // (or waits for its handlers, stop_signals_blocked).
      reset_stop_signals_in_child(stop_signals_blocked);
      if (!working_dir.empty() && chdir(working_dir.c_str()) != 0) fail_in_child(no_dir);
      execv(argv[0], argv.data());
      fail_in_child(failure);
    }
  }
  if (log_fd >= 0) close(log_fd);  // the child has its own copy
  if (pid < 0) throw Error(what + ": fork: " + std::strerror(errno));
  // Both sides set the group (the usual shell idiom): whichever runs first, the child is in its
  // own group once either returns.
  if (own_process_group) setpgid(pid, pid);
  return pid;
}

std::vector<pid_t> reap_until(std::vector<pid_t> pids,
                              std::chrono::steady_clock::time_point deadline) {
  for (;;) {
    pids.erase(std::remove_if(pids.begin(), pids.end(),
                              [](pid_t pid) {
                                const pid_t reaped = waitpid(pid, nullptr, WNOHANG);
                                return reaped == pid || (reaped < 0 && errno == ECHILD);
                              }),
               pids.end());
    if (pids.empty() || std::chrono::steady_clock::now() >= deadline) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

bool kill_and_reap(std::vector<pid_t> pids, int timeout_ms) {
  for (const pid_t pid : pids) kill(pid, SIGKILL);
  pids = reap_until(std::move(pids), std::chrono::steady_clock::now() +
                                         std::chrono::milliseconds(timeout_ms));
  if (pids.empty()) return true;
  for (const pid_t pid : pids)
    std::fprintf(stderr, "tandem: process %d has not ended %d ms after SIGKILL (stuck in the "
                 "kernel: a hung device or file system?); going on without it\n",
                 static_cast<int>(pid), timeout_ms);
  return false;
}

void terminate_and_reap(std::vector<pid_t> pids, int grace_ms) {
  for (const pid_t pid : pids) kill(pid, SIGTERM);
  pids = reap_until(std::move(pids),
                    std::chrono::steady_clock::now() + std::chrono::milliseconds(grace_ms));
  if (!pids.empty()) kill_and_reap(std::move(pids));
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

std::string self_path() {
  std::error_code ec;
  const std::filesystem::path p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find this program's path (/proc/self/exe): " + ec.message());
  return p.string();
}

std::string log_tail(const std::string& path, size_t lines, uintmax_t from) {
  std::ifstream in(path);
  in.seekg(static_cast<std::streamoff>(from));
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

}  // namespace tandem::cli
