// One run per run directory. A second `tandem launch` (or coordinator, or rank 0) on a directory
// in use would delete the first run's checkpoints as it starts fresh, overwrite its rendezvous
// and cluster spec, and interleave both runs' metrics: it is refused instead, naming the process
// that holds the directory. The lock is flock(2) on RUN_DIR/lock, so it goes with its process,
// however that process ends: no stale lock to clean up after a crash or a SIGKILL.
#pragma once

#include <string>

namespace tandem::cli {

class RunDirLock {
 public:
  // Takes the lock on run_dir (which must exist), or throws InputError when another process
  // holds it, IoError when the lock file cannot be opened. `option` names the directory's
  // option in the message (tandem search locks its --out the same way). The lock file is
  // `lock_file`, by default RUN_DIR/lock (tandem predict's --out, which an --overwrite removes
  // and makes again, is locked by OUT.lock beside it).
  explicit RunDirLock(const std::string& run_dir, const std::string& option = "--run-dir",
                      const std::string& lock_file = "");
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace tandem::cli
