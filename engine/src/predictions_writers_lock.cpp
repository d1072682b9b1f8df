#include "predictions_writers_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Where the lock cannot be had (a directory this user may not create files in, a file system
// without flock: NFS without its lock service, Lustre mounted noflock), writers and a replacing
// run are not kept apart, as before the lock existed; said once a process.
void warn_unlocked(const std::string& path, int err) {
  static std::atomic<bool> said{false};
  if (said.exchange(true)) return;
  std::fprintf(stderr,
               "tandem: warning: cannot lock %s (%s): a run replacing this predictions group "
               "(--overwrite) and the writers of the group it replaces are not kept apart\n",
               path.c_str(), std::strerror(err));
}

}  // namespace

PredictionsWritersLock::PredictionsWritersLock(const std::string& out, Kind kind, int wait_ms) {
  const std::string path = without_trailing_slashes(out) + ".writers";
  // Read-only is enough for flock, so users sharing the output's directory (by group) can lock a
  // file another made; 0666 lets the umask decide who that is. Close-on-exec: a share's children
  // must not hold its lock. Not through a symbolic link, as for every lock file of Tandem's.
  fd_ = ::open(path.c_str(), O_RDONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd_ < 0) {
    warn_unlocked(path, errno);
    return;
  }
  int rc;
  if (kind == Kind::Writing) {
    do rc = ::flock(fd_, LOCK_SH);
    while (rc != 0 && errno == EINTR);
  } else {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 &&
           (errno == EINTR || errno == EWOULDBLOCK) &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (rc == 0) return;
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  if (err != EWOULDBLOCK && err != EINTR) {
    warn_unlocked(path, err);
    return;
  }
  throw InputError(out + ": another run's share is still writing a chunk of it (" +
                   std::to_string(wait_ms) + " ms waited; a machine that froze in the middle of "
                   "a write?): wait for it to end, then run again");
}

PredictionsWritersLock::~PredictionsWritersLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tandem
