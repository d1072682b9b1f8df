// Writers of a predictions group and a run replacing it (tandem predict --overwrite) exclude each
// other. A chunk is written (the group's output id checked, then its files renamed into place)
// under a shared lock; the group is removed and made again under an exclusive one. Without it a
// share of an earlier run that was cut off from its client (a slot server out of reach, a child
// still ending after Ctrl-C) could pass its check on the old group and then rename its chunk
// into the new one: another model's rows, counted as done.
//
// The lock is flock(2) on OUT.writers beside the group (replacing it removes the group's
// directory, and a lock inside would go with it), so it goes with its process however that ends.
// flock works across the machines of a Linux NFS mount, where slot servers write their shares.
#pragma once

#include <string>

namespace tandem {

class PredictionsWritersLock {
 public:
  enum class Kind {
    Writing,    // waits while the group is being replaced (no longer than that takes)
    Replacing,  // waits up to wait_ms for the writers' chunks in flight, then InputError
  };
  // `out` is the group's path as the caller resolved it (a symbolic link followed).
  PredictionsWritersLock(const std::string& out, Kind kind, int wait_ms = kReplaceWaitMs);
  ~PredictionsWritersLock();
  PredictionsWritersLock(const PredictionsWritersLock&) = delete;
  PredictionsWritersLock& operator=(const PredictionsWritersLock&) = delete;

  // A chunk takes seconds at most to write; a writer holding the lock longer is stuck (a frozen
  // machine's share), and the replacing run says so rather than wait for ever.
  static constexpr int kReplaceWaitMs = 30000;

 private:
  int fd_ = -1;
};

}  // namespace tandem
