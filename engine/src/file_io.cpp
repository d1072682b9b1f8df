#include "file_io.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <vector>

#include "tandem/error.h"

namespace tandem {
namespace {

// Creates `tmp` for writing, as a new file; the descriptor is returned only when that worked.
// Never through what is already there: the name is predictable (temp_path), and in a shared
// directory a link planted under it would have the write land on its target. A leftover (a
// crashed process's of the same pid and thread id) is removed, not followed, and creating is
// tried again.
int create_for_writing(const std::string& tmp, const std::string& path) {
  const int flags = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), flags, 0644);
  if (fd < 0 && errno == EEXIST && ::unlink(tmp.c_str()) == 0)
    fd = ::open(tmp.c_str(), flags, 0644);
  // Said of the file asked for: the temporary name meant nothing to the user.
  if (fd < 0 && errno == ENOENT)
    throw IoError("cannot write '" + path + "': its directory '" + parent_directory(path) +
                  "' does not exist");
  if (fd < 0) io_error("create", tmp, errno);
  return fd;
}

}  // namespace

Fd::~Fd() {
  if (fd_ >= 0) ::close(fd_);
}

int Fd::close() {
  const int rc = ::close(fd_);
  fd_ = -1;
  return rc;
}

int Fd::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

TempFileGuard::~TempFileGuard() {
  if (!path_.empty()) ::unlink(path_.c_str());
}

void io_error(const std::string& action, const std::string& path, int err) {
  throw IoError("cannot " + action + " '" + path + "': " + std::strerror(err));
}

void read_exact(int fd, void* buf, size_t n, const std::string& path,
                const std::string& early_end_message) {
  auto* p = static_cast<uint8_t*>(buf);
  while (n > 0) {
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_error("read", path, errno);
    if (got == 0) throw InputError(early_end_message);
    p += got;
    n -= size_t(got);
  }
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(buf);
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) io_error("write", path, errno);
    p += put;
    n -= size_t(put);
  }
}

std::string without_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

std::string parent_directory(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

std::string resolved_path(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  std::string out = ec ? fs::path(path).lexically_normal().string() : std::string();
  if (!ec) {
    const fs::path resolved = fs::weakly_canonical(absolute, ec);
    out = ec ? absolute.lexically_normal().string() : resolved.string();
  }
  // "p.zarr/" not made yet keeps its slash through both.
  return without_trailing_slashes(out);
}

bool lies_in(const std::string& dir, const std::string& path) {
  const std::filesystem::path d(resolved_path(dir)), p(resolved_path(path));
  return std::mismatch(d.begin(), d.end(), p.begin(), p.end()).first == d.end();
}

std::string replacement_target(const std::string& path) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return path;  // nothing there yet (or unreadable: below)
  std::string target = path;
  if (S_ISLNK(st.st_mode)) {
    // Replacing the link itself would leave the file it names as it was, and the user with a
    // link turned into a copy: the write goes to the file it names, as a write through it would.
    std::error_code ec;
    target = std::filesystem::canonical(path, ec).string();
    if (ec)
      throw IoError("cannot write '" + path + "': a symbolic link to nothing that exists (" +
                    ec.message() + "); give the file's own path");
    if (::stat(target.c_str(), &st) != 0) io_error("write", path, errno);
  }
  if (S_ISDIR(st.st_mode)) io_error("write", path, EISDIR);
  // A device (/dev/null, /dev/full), FIFO or socket is not content a rename may replace:
  // `--checkpoint /dev/null` must not turn the system's /dev/null into a model file.
  if (!S_ISREG(st.st_mode))
    throw IoError("cannot write '" + path + "': it is not a regular file (a device, FIFO or " +
                  "socket) and would be replaced by one; give a file's path");
  return target;
}

namespace {

// The process that wrote `name`, a temp_path() name (NAME.tmp-PID-TID, or NAME.tmp-PID); 0 for a
// name that is not one.
pid_t writer_of_temp_name(const std::string& name) {
  const std::string marker = ".tmp-";
  const size_t at = name.rfind(marker);
  if (at == std::string::npos) return 0;
  const std::string ids = name.substr(at + marker.size());
  const size_t dash = ids.find('-');
  const auto number = [](const std::string& text) {
    return !text.empty() && text.size() <= 9 &&
           std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  const std::string pid = ids.substr(0, dash);
  if (!number(pid) || (dash != std::string::npos && !number(ids.substr(dash + 1)))) return 0;
  return static_cast<pid_t>(std::stol(pid));
}

}  // namespace

std::string target_of_temp_name(const std::string& name) {
  return writer_of_temp_name(name) == 0 ? std::string() : name.substr(0, name.rfind(".tmp-"));
}

void remove_unfinished_writes(const std::string& dir, const std::string& name_prefix,
                              const std::string& who) noexcept {
  try {
    std::error_code ec;
    std::vector<std::filesystem::path> dead;
    for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind(name_prefix, 0) != 0) continue;
      const pid_t pid = writer_of_temp_name(name);
      // Alive, or not ours to ask about (EPERM: a process runs under that PID): left.
      if (pid <= 0 || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
      if (::time(nullptr) - st.st_mtime >= 60) dead.push_back(it->path());
    }
    for (const auto& path : dead)
      if (std::filesystem::remove(path, ec))
        std::fprintf(stderr, "%s: removed %s, left by a write that did not finish (its process "
                     "has ended)\n", who.c_str(), path.c_str());
  } catch (...) {  // (an allocation failing: the files stay, as they would have)
  }
}

void check_replaceable(const std::string& path_given) {
  const std::string path = replacement_target(path_given);
  // Each run that was killed mid-write would otherwise add a file as big as this one beside it.
  remove_unfinished_writes(parent_directory(path),
                           std::filesystem::path(path).filename().string() + ".tmp-",
                           "tandem");
  const std::string probe = temp_path(path);
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    if (errno == EEXIST) return;  // a leftover by that name: the directory takes files
    io_error("write", path, errno);
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

void create_output_directory(const std::string& dir, const std::string& what) {
  if (dir.empty()) throw IoError("cannot create " + what + " '': an empty path names no directory");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  // (create_directories reports a file in the way as "File exists" or "Not a directory")
  if (ec || !std::filesystem::is_directory(dir))
    throw IoError("cannot create " + what + " '" + dir + "': " +
                  (ec ? ec.message() : std::string("a file is in the way")));
}

int fsync_directory(const std::string& dir) {
  Fd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd.get() < 0 || ::fsync(fd.get()) != 0) return errno;  // read before ~Fd's close
  return 0;
}

void fsync_parent_directory(const std::string& path, const std::string& doing) {
  const std::string dir = parent_directory(path);
  if (const int err = fsync_directory(dir)) {
    throw IoError("cannot fsync directory '" + dir + "' after " + doing + " '" + path +
                  "' (the new file may not survive a crash): " + std::strerror(err));
  }
}

std::string temp_path(const std::string& path) {
  return path + ".tmp-" + std::to_string(::getpid()) + "-" + std::to_string(::gettid());
}

void write_text_atomic(const std::string& path, const std::string& text) {
  AtomicFile out(path);
  out.write(text.data(), text.size());
  out.commit();
  fsync_parent_directory(out.target(), "writing");
}

void remove_if_it_holds(const std::string& path, const std::string& text) noexcept {
  try {
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        off_t(text.size()) != st.st_size)
      return;
    std::ifstream in(path, std::ios::binary);
    std::string held(text.size(), '\0');
    if (in.read(held.data(), std::streamsize(held.size())) && held == text)
      std::remove(path.c_str());
  } catch (...) {  // (no memory for the comparison: the file stays)
  }
}

AtomicFile::AtomicFile(const std::string& path)
    : path_(replacement_target(path)),
      tmp_(temp_path(path_)),
      fd_(create_for_writing(tmp_, path_)),
      guard_(tmp_) {
  // The file replaced keeps its permissions: a checkpoint made private (0600) stays private.
  struct stat st {};
  if (::stat(path_.c_str(), &st) == 0 && ::fchmod(fd_.get(), st.st_mode & 07777) != 0)
    io_error("set the permissions of", tmp_, errno);
}

void AtomicFile::commit() {
  // The data must be on disk before the rename publishes it, or a crash can leave an empty or
  // torn file under the final name.
  if (::fsync(fd_.get()) != 0) io_error("fsync", tmp_, errno);
  // close() is checked, not left to the destructor: some filesystems (NFS, quotas) report a
  // failed write only here, and the rename must not publish a file that was not written.
  if (fd_.close() != 0) io_error("close", tmp_, errno);
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    io_error("rename '" + tmp_ + "' over", path_, errno);
  }
  guard_.dismiss();
}

MappedFile MappedFile::map_if_exists(const std::string& path) {
  MappedFile mapped;
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));  // a FIFO: refused below
  if (fd.get() < 0) {
    if (errno == ENOENT) return mapped;
    io_error("open", path, errno);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io_error("stat", path, errno);
  if (!S_ISREG(st.st_mode)) io_error("map", path, EINVAL);
  return map_open(fd.get(), static_cast<size_t>(st.st_size), path);
}

MappedFile MappedFile::map_open(int fd, size_t size, const std::string& path) {
  MappedFile mapped;
  mapped.size_ = size;
  mapped.path_ = path;
  if (size == 0) {
    static const uint8_t empty = 0;
    mapped.data_ = &empty;  // nothing to map; a non-null pointer still says "the file exists"
    return mapped;
  }
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) io_error("map", path, errno);
  mapped.data_ = static_cast<const uint8_t*>(p);
  mapped.fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 0);
  if (mapped.fd_ < 0) io_error("duplicate the descriptor of", path, errno);
  return mapped;
}

bool MappedFile::shrunk() const {
  struct stat st {};
  return fd_ >= 0 && ::fstat(fd_, &st) == 0 && uint64_t(st.st_size) < uint64_t(size_);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ != 0) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  std::swap(data_, other.data_);
  std::swap(size_, other.size_);
  std::swap(path_, other.path_);
  std::swap(fd_, other.fd_);
  return *this;
}

}  // namespace tandem
