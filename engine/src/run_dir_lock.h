// One run per run directory. A second `tandem launch` (or coordinator, or rank 0) on a directory
// in use would delete the first run's checkpoints as it starts fresh, overwrite its rendezvous
// and cluster spec, and interleave both runs' metrics: it is refused instead, naming the process
// that holds the directory. The lock is flock(2) on RUN_DIR/lock, so it goes with its process,
// however that process ends: no stale lock to clean up after a crash or a SIGKILL.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace tandem {

class RunDirLock {
 public:
  // Takes the lock on run_dir (which must exist), or throws InputError when another process
  // holds it, IoError when the lock file cannot be opened. `option` names the directory's
  // option in the message (tandem search locks its --out the same way). The lock file is
  // `lock_file`, by default RUN_DIR/lock (tandem predict's --out, which an --overwrite removes
  // and makes again, is locked by OUT.lock beside it; tandem.dask.predict takes the same lock,
  // so one prediction at a time writes an output, from the command line or from Dask).
  explicit RunDirLock(const std::string& run_dir, const std::string& option = "--run-dir",
                      const std::string& lock_file = "");
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

  // Whether this made the lock file (it was not there before).
  bool made_file() const { return made_; }
  // Removes the lock file, still held (a command refused before it made its output leaves none
  // behind). A process that opened it before and locks it after sees that it is no longer the
  // file at the path, and takes the lock on a new one.
  void remove_file() noexcept;

 private:
  int fd_ = -1;
  std::string path_;
  bool made_ = false;
};

// A command's output directory, made if needed (create_output_directory), and its RunDirLock
// (`option` names the directory in messages). When the command is refused before it starts
// (destroyed before keep()), a directory this one made is removed again with the lock file in
// it, unlinked while the lock is still held, so a refused launch or search leaves no new
// directory behind. A directory that was there stays, and so does one holding anything else
// (and a parent directory it made). In a directory that was there, the temporary files that
// writes of `replaced_files` (names in it) left when an earlier run was killed are removed
// (remove_unfinished_writes).
class LockedOutputDirectory {
 public:
  LockedOutputDirectory(const std::string& dir, const std::string& option,
                        const std::vector<std::string>& replaced_files = {});
  ~LockedOutputDirectory();
  void keep() { made_ = false; }  // the command started: the directory is its output
  LockedOutputDirectory(const LockedOutputDirectory&) = delete;
  LockedOutputDirectory& operator=(const LockedOutputDirectory&) = delete;

 private:
  std::string dir_;
  bool made_ = false;
  std::unique_ptr<RunDirLock> lock_;
};

// One prediction at a time per output: the lock on `out` that tandem predict and
// tandem.dask.predict hold while they write it (a second would write into the same output, or
// remove it under the first with an overwrite). OUT.lock beside the output, since an overwrite
// removes the output's directory: its parent is made first, as writing the output would. By the
// output's real path: through a symbolic link to the output another run would lock another name
// and write the same output. `option` names `out` in the message ("--out", "out").
std::unique_ptr<RunDirLock> lock_prediction_output(const std::string& out,
                                                   const std::string& option);

}  // namespace tandem
