#include "metrics_log.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>
#include <nlohmann/json.hpp>

#include "file_io.h"
#include "json_fields.h"
#include "json_text.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Whether the regular file open as `fd` ends without a newline: a line cut short (a run killed
// while a long line went out in several write(2) calls).
bool ends_mid_line(int fd) {
  struct stat st {};
  char last = '\n';
  return ::fstat(fd, &st) == 0 && st.st_size > 0 && ::pread(fd, &last, 1, st.st_size - 1) == 1 &&
         last != '\n';
}

// Refuses a regular file open as `fd` that holds something other than a metrics log (its first
// line no JSON record with a "type": data, a model, notes), which truncating or appending to
// would destroy. An empty file is taken.
void refuse_other_than_a_log(int fd, const std::string& path, bool append) {
  constexpr size_t kLooked = 65536;
  std::string first(kLooked, '\0');
  const ssize_t got = ::pread(fd, first.data(), first.size(), 0);
  if (got <= 0) return;
  first.resize(size_t(got));
  const size_t newline = first.find('\n');
  // A first line longer than this (no record is) is taken as a log when it starts as one; so is
  // a resumed run's log whose one line was cut short (the run killed as it wrote its first).
  const bool cut = newline == std::string::npos && (size_t(got) == kLooked || append);
  if (newline != std::string::npos) first.resize(newline);
  const nlohmann::json record = cut ? nlohmann::json() : parse_bounded_json(first);
  if (cut ? first[0] == '{'
          : record.is_object() && record.contains("type") && record["type"].is_string())
    return;
  throw InputError("metrics file " + path + " holds something other than a metrics log (its "
                   "first line is no JSON record with a \"type\"): refusing to write over it; "
                   "remove it, or give another path");
}

// Whether a log resumed at `step` drops `line` (its newline left out): a record of a step past
// it, or a last line cut short that is no record (`ended`: it had no newline). What the run did
// after its checkpoint is trained again; and a line cut short is the last thing a killed run
// wrote, after its checkpoint.
bool drops(const std::string& line, bool ended, int64_t step) {
  const nlohmann::json record = parse_bounded_json(line);
  if (!ended && !record.is_object()) return true;
  int64_t record_step = 0;
  return record.is_object() && record.contains("step") &&
         json_as_integer(record["step"], record_step) && record_step > step;
}

// Calls line(text, at, ended) for each line of the file open as `fd`, from its start: `at` is
// its offset, `ended` true when it had a newline (left out of `text`).
template <typename Line>
void for_each_line(int fd, const std::string& path, Line&& line) {
  std::string pending;
  off_t pending_at = 0;
  std::vector<char> buffer(size_t(1) << 16);
  for (off_t at = 0;;) {
    const ssize_t got = ::pread(fd, buffer.data(), buffer.size(), at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_error("read metrics file", path, errno);
    if (got == 0) break;
    const char* const begin = buffer.data();
    const char* const end = begin + got;
    for (const char* from = begin; from < end;) {
      const char* newline = std::find(from, end, '\n');
      pending.append(from, newline);
      if (newline == end) break;
      line(pending, pending_at, true);
      pending.clear();
      pending_at = at + (newline + 1 - begin);
      from = newline + 1;
    }
    at += got;
  }
  if (!pending.empty()) line(pending, pending_at, false);
}

// The same number of bytes as a line dropped from a log, and no record of a step: a line of
// its own however a reader splits the file.
std::string filler(size_t length) {
  static const std::string dropped = "{\"type\":\"dropped\"}";
  if (length >= dropped.size()) return dropped + std::string(length - dropped.size(), ' ');
  if (length >= 2) return "{}" + std::string(length - 2, ' ');
  return std::string(length, ' ');
}

// Drops the lines of a resumed run's log (the regular file open as `fd`, read and written)
// that `drops` says go (each record is looked at: a cluster's log is not in step order, a score
// of the step its scorer pulled coming after records of later steps); returns how many went.
// Each is overwritten where it is by a line of as many bytes, {"type":"dropped"} and spaces,
// and nothing else moves: the file keeps its inode (`tail -f` follows it on), owner, mode and
// links, nothing is made beside it (its directory may be read-only), and a crash midway leaves
// every line whole but the one being written. Through the log's own descriptor: on NFS, whose
// flock is a POSIX lock, closing any other descriptor of the file would let the lock go.
int64_t drop_records_after(int fd, const std::string& path, int64_t step) {
  std::vector<std::pair<off_t, size_t>> going;  // each line's offset and length
  for_each_line(fd, path, [&](const std::string& text, off_t at, bool ended) {
    if (drops(text, ended, step)) going.emplace_back(at, text.size());
  });
  for (const auto& [at, length] : going) {
    const std::string text = filler(length);
    for (size_t done = 0; done < text.size();) {
      const ssize_t put = ::pwrite(fd, text.data() + done, text.size() - done, at + off_t(done));
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) io_error("write metrics file", path, errno);
      done += size_t(put);
    }
  }
  return int64_t(going.size());
}

// Opens the log for writing, one writer at a time: two runs given the same file once
// interleaved their records and cut each other's lines. A regular file (or a new one) is opened
// to be read too (a resumed log's records are looked at through this descriptor), locked
// (flock, released with the descriptor however the process ends) before it is truncated or its
// records dropped, and written at its end. Anything else (/dev/null, a FIFO) is written as it
// is, unlocked: shared by design. Sets `regular`.
int open_locked(const std::string& path, bool append, bool& regular) {
  struct stat st {};
  regular = ::stat(path.c_str(), &st) != 0 || S_ISREG(st.st_mode);
  const int flags = regular ? O_RDWR | O_CREAT : O_WRONLY | (append ? O_APPEND : O_TRUNC);
  const int fd = ::open(path.c_str(), flags | O_CLOEXEC, 0666);  // the umask decides
  if (fd < 0) throw IoError("cannot write metrics file " + path + ": " + std::strerror(errno));
  if (!regular) return fd;
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      ::close(fd);
      throw IoError("metrics file " + path + " is open for writing already (another run's "
                    "log, or another in this process: give each run a file of its own)");
    }
    // A filesystem without locks (NFS without its lock service, Lustre without flock): written
    // unlocked, as before there were locks, and said.
    std::fprintf(stderr, "tandem: warning: cannot lock metrics file %s (%s): another run "
                 "writing it would not be refused\n", path.c_str(), std::strerror(error));
  }
  try {
    refuse_other_than_a_log(fd, path, append);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (!append && ::ftruncate(fd, 0) != 0) {
    const int error = errno;
    ::close(fd);
    throw IoError("cannot write metrics file " + path + ": " + std::strerror(error));
  }
  return fd;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append, int64_t resumed_step)
    : path_(path) {
  bool regular = false;
  fd_ = open_locked(path, append, regular);
  try {
    const int64_t dropped =
        regular && append && resumed_step >= 0 ? drop_records_after(fd_, path, resumed_step) : 0;
    // Appended to from here (O_APPEND only now: Linux's pwrite ignores the offset under it),
    // so that writers sharing a file that could not be locked interleave whole records.
    if (regular && (::lseek(fd_, 0, SEEK_END) < 0 ||
                    ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_APPEND) != 0))
      io_error("seek metrics file", path, errno);
    // Checked before the first record: the resumed run's first record starts a line of its
    // own, or the two would be one line that no JSON reader takes.
    if (regular && append && ends_mid_line(fd_)) write_bytes("\n");
    if (append && resumed_step >= 0)
      write({{"type", "resume"}, {"step", resumed_step}, {"dropped_records", dropped}});
  } catch (...) {  // no destructor runs for a constructor that throws
    ::close(fd_);
    fd_ = -1;
    throw;
  }
}

MetricsLog::~MetricsLog() {
  if (fd_ >= 0) ::close(fd_);
}

// One write(2) for a whole record where the kernel takes it so (a regular file does): a reader
// following the file (`tail -f`) never sees half a line, however long the line.
void MetricsLog::write_bytes(const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {
    const ssize_t put = ::write(fd_, bytes.data() + done, bytes.size() - done);
    if (put < 0 && errno == EINTR) continue;
    if (put < 0) throw IoError("writing metrics file " + path_ + ": " + std::strerror(errno));
    done += size_t(put);
  }
}

void MetricsLog::write_line(std::string line) {
  if (fd_ < 0) return;
  line += '\n';  // in place, not in a copy; still one write, so appenders' lines never interleave
  write_bytes(line);
}

void MetricsLog::step(const StepReport& r) {
  if (fd_ < 0) return;
  // Epochs counted from 1, as the epoch lines count them (StepReport's is 0-based).
  nlohmann::json j{{"type", "step"},          {"step", r.step},
                   {"epoch", r.epoch + 1},    {"loss", r.loss_sum},
                   {"samples", r.samples},    {"samples_per_s", r.samples_per_s}};
  write_line(json_text(std::move(j)));
}

void MetricsLog::epoch(const EpochReport& r) {
  if (fd_ < 0) return;
  nlohmann::json j{{"type", "epoch"},
                   {"epoch", r.epoch},
                   {"step", r.step},
                   {"train_loss_mean", r.train_loss_mean},
                   {"samples_per_s", r.samples_per_s},
                   {"seconds", r.seconds}};
  // Only a scored epoch has validation figures: a run without a validation split wrote a loss
  // and an accuracy of 0, which read as a perfect model.
  if (r.validation.samples > 0) {
    j["validation_loss"] = r.validation.loss_sum;
    j["validation_loss_mean"] = r.validation.loss_mean;
    j["validation_accuracy"] = r.validation.accuracy;
  }
  write_line(json_text(std::move(j)));
}

void MetricsLog::write(const nlohmann::json& object) { write_line(json_text(object)); }

}  // namespace tandem
