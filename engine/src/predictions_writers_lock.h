// Writers of a predictions group and a run taking it over (resuming it, or replacing it with
// tandem predict --overwrite) exclude each other. A chunk is written (the group's output id
// checked, then its files renamed into place) under a shared lock; a run taking the group over
// waits for an exclusive one, and a replacement removes and makes the group under it. Without
// it a share of an earlier run that was cut off from its client (a slot server out of reach, a
// child still ending after Ctrl-C, the tasks of an interrupted Dask run) could pass its check on
// the old group and then rename its chunk into the new one: another model's (or input's) rows,
// counted as done.
//
// A run taking the group over first changes its output id (predictor.cpp, set_output_id), so
// that earlier writers stop at their next chunk: the lock then waits only for the chunks already
// past their check, and writers taking turns with the shared lock cannot keep the run out.
//
// The lock is flock(2) on OUT.writers beside the group (replacing it removes the group's
// directory, and a lock inside would go with it), so it goes with its process however that ends.
// It is left there after the group is removed (removing a lock file others may be waiting on
// would split them between two files). On a Linux NFS mount flock is a lock of the server's
// (NFSv4, or NFSv3 with its lock service), so slot servers' shares are kept apart too. Where the
// lock cannot be had (no lock service, Lustre without flock, no right to open the file for
// writing, or for a writer to read it) a warning says so once and the group is written as
// before, unlocked. A mount with
// local_lock=flock (or =all) locks each machine on its own, silently: shares on other machines
// are then kept apart by the output id alone.
#pragma once

#include <string>

namespace tandem {

class PredictionsWritersLock {
 public:
  enum class Kind {
    Writing,    // waits while the group is being replaced (no longer than that takes)
    Replacing,  // (taking over) waits up to wait_ms for the chunks in flight, then InputError
  };
  // `out` is the group's path as the caller resolved it (a symbolic link followed).
  PredictionsWritersLock(const std::string& out, Kind kind, int wait_ms = kReplaceWaitMs);
  ~PredictionsWritersLock();
  PredictionsWritersLock(const PredictionsWritersLock&) = delete;
  PredictionsWritersLock& operator=(const PredictionsWritersLock&) = delete;

  // Once the old group is retired, only chunks already past their check hold the lock: a writer
  // holding it longer than this is stuck (a machine frozen mid-write), and the replacing run
  // says so rather than wait for ever.
  static constexpr int kReplaceWaitMs = 30000;

 private:
  int fd_ = -1;
};

}  // namespace tandem
