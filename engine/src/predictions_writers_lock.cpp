#include "predictions_writers_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

PredictionsWritersLock::PredictionsWritersLock(const std::string& out, Kind kind, int wait_ms) {
  const std::string path = without_trailing_slashes(out) + ".writers";
  // Close-on-exec: a share's children must not hold its lock. Not through a symbolic link, as
  // for every lock file of Tandem's.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) throw IoError("cannot open " + path + ": " + std::strerror(errno));
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
  if (err != EWOULDBLOCK && err != EINTR)
    throw IoError("cannot lock " + path + ": " + std::strerror(err));
  throw InputError(out + ": another run's share is still writing it (" +
                   std::to_string(wait_ms / 1000) + " s waited; a slot server cut off from its "
                   "client, or a process still ending?): wait for it to end, then run again");
}

PredictionsWritersLock::~PredictionsWritersLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

}  // namespace tandem
