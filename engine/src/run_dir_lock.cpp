#include "run_dir_lock.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// The holder's pid as it wrote it, or "" (a holder between its flock and its write).
std::string read_holder(int fd) {
  char text[32] = {};
  const ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
  std::string pid(text, n > 0 ? size_t(n) : 0);
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  return pid;
}

// Whether `fd` is the file at `path` now, not one removed (or replaced) since it was opened.
bool is_file_at(int fd, const std::string& path) {
  struct stat held {}, named {};
  return fstat(fd, &held) == 0 && lstat(path.c_str(), &named) == 0 &&
         held.st_dev == named.st_dev && held.st_ino == named.st_ino;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir, const std::string& option,
                       const std::string& lock_file) {
  const std::string path = lock_file.empty() ? run_dir + "/lock" : lock_file;
  // Close-on-exec: the role processes a launcher starts must not hold the lock after it is gone.
  // Not through a symbolic link: the pid written below would land in whatever it points to.
  // 0666: the umask decides who shares the file (a directory shared by a group). A file another
  // user made, which this one may only read, is locked read-only: on a local file system flock
  // needs no write access (on NFS it does, and the lock below fails naming the file). The pid
  // below is not written then.
  const int flags = O_CLOEXEC | O_NOFOLLOW;
  int rc;
  for (int tries = 1;; ++tries) {
    // Made here, or opened as it is: made_ says which (a file removed in between: again).
    fd_ = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | flags, 0666);
    made_ = fd_ >= 0;
    const bool there = fd_ < 0 && errno == EEXIST;
    if (there) fd_ = open(path.c_str(), O_RDWR | flags);
    if (there && fd_ < 0 && (errno == EACCES || errno == EROFS))
      fd_ = open(path.c_str(), O_RDONLY | flags);
    if (fd_ < 0 && errno == ENOENT && there && tries < 100) continue;
    if (fd_ < 0) throw IoError("cannot open " + path + ": " + std::strerror(errno));
    do rc = flock(fd_, LOCK_EX | LOCK_NB);
    while (rc != 0 && errno == EINTR);
    // A holder may have removed the file (remove_file) between this open and this flock: a lock
    // on a file no longer at the path would shut out nobody. Taken again on the path's file.
    if (rc != 0 || is_file_at(fd_, path)) break;
    close(fd_);
    fd_ = -1;
    if (tries == 100) throw IoError("cannot lock " + path + ": it keeps being removed");
  }
  if (rc != 0) {
    const int err = errno;
    std::string holder = err == EWOULDBLOCK ? read_holder(fd_) : "";
    // (A holder that locked the file read-only wrote no pid: the one there may be an earlier
    // holder's, gone since.)
    const bool a_pid = !holder.empty() && holder.size() < 10 &&
                       holder.find_first_not_of("0123456789") == std::string::npos;
    const pid_t pid = a_pid ? static_cast<pid_t>(std::stol(holder)) : 0;
    if (a_pid && (pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH))) holder.clear();
    close(fd_);
    fd_ = -1;
    if (err != EWOULDBLOCK) throw IoError("cannot lock " + path + ": " + std::strerror(err));
    throw InputError(option + " " + run_dir + " is in use by another run" +
                     (holder.empty() ? "" : " (process " + holder + ")") +
                     ": give each run its own " + option);
  }
  // A file of the user's at that path (predict's OUT.lock beside a --out OUT they chose) is not
  // replaced by a pid: only an empty file or a holder's pid line is a lock file.
  const std::string held = read_holder(fd_);
  struct stat st {};
  const bool lock_file_like =
      fstat(fd_, &st) == 0 && st.st_size <= 32 &&
      held.find_first_not_of("0123456789") == std::string::npos;
  if (!lock_file_like) {
    close(fd_);
    fd_ = -1;
    throw InputError(path + " is there and is not a lock file of Tandem's (it holds other "
                     "data): move it away, or give another " + option);
  }
  path_ = path;
  const std::string pid = std::to_string(getpid()) + "\n";
  // The pid only names the holder in the message above; the lock works without it.
  if (ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = pwrite(fd_, pid.data(), pid.size(), 0);
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ >= 0) close(fd_);  // releases the lock
}

void RunDirLock::remove_file() noexcept {
  if (fd_ >= 0 && is_file_at(fd_, path_)) ::unlink(path_.c_str());
}

LockedOutputDirectory::LockedOutputDirectory(const std::string& dir, const std::string& option,
                                             const std::vector<std::string>& replaced_files)
    : dir_(dir) {
  std::error_code ec;
  const bool there = std::filesystem::exists(dir, ec) || ec;
  create_output_directory(dir, option);
  lock_ = std::make_unique<RunDirLock>(dir, option);  // throws when another run holds it
  made_ = !there;  // (two commands making it at once: only the one holding the lock is here)
  // An earlier run killed while it replaced one of its files here left its temporary file:
  // removed, now that no other run can be writing here. (Only those: the user's own files in a
  // directory they gave may have any name.)
  if (there)
    for (const std::string& name : replaced_files)
      remove_unfinished_writes(dir, name + ".tmp-", "tandem");
}

LockedOutputDirectory::~LockedOutputDirectory() {
  if (made_) {  // removed while the lock is held: no other command can be using it
    lock_->remove_file();
    std::error_code ignored;
    std::filesystem::remove(dir_, ignored);  // only when nothing else is in it
  }
  lock_.reset();
}

std::unique_ptr<RunDirLock> lock_prediction_output(const std::string& out,
                                                   const std::string& option) {
  namespace fs = std::filesystem;
  const fs::path path = without_trailing_slashes(fs::path(out).lexically_normal().string());
  std::error_code ec;
  if (path.has_parent_path() && !fs::create_directories(path.parent_path(), ec) && ec)
    throw IoError("cannot make " + path.parent_path().string() + ", the directory of " + option +
                  " " + out + ": " + ec.message());
  return std::make_unique<RunDirLock>(out, option, resolved_path(path.string()) + ".lock");
}

}  // namespace tandem
