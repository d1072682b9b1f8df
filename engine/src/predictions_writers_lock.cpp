#include "predictions_writers_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Where the lock cannot be had (a directory this user may not create files in, a file system
// without flock: NFS without its lock service, Lustre mounted noflock), writers and a replacing
// run are not kept apart, as before the lock existed; said once a process for each lock file.
void warn_unlocked(const std::string& path, int err) {
  static std::mutex mutex;
  static std::set<std::string> said;
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (!said.insert(path).second) return;
  }
  std::fprintf(stderr,
               "tandem: warning: cannot lock %s (%s): a run taking this predictions group over "
               "(resuming or replacing it) and the earlier runs' writers are not kept apart\n",
               path.c_str(), std::strerror(err));
}

}  // namespace

PredictionsWritersLock::PredictionsWritersLock(const std::string& out, Kind kind, int wait_ms) {
  const std::string path = without_trailing_slashes(out) + ".writers";
  // Opened for writing: on NFS flock is a byte-range lock of the server's, and an exclusive one
  // needs a file open for writing. A writer that may only read the file (another user made it,
  // without group write) still takes its shared lock read-only. 0666: the umask decides who
  // shares the file. Close-on-exec: a share's children must not hold its lock. Not through a
  // symbolic link, as for every lock file of Tandem's.
  const int flags = O_CREAT | O_CLOEXEC | O_NOFOLLOW;
  fd_ = ::open(path.c_str(), O_RDWR | flags, 0666);
  if (fd_ < 0 && kind == Kind::Writing && (errno == EACCES || errno == EROFS))
    fd_ = ::open(path.c_str(), O_RDONLY | flags, 0666);
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
