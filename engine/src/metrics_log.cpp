#include "metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
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

// Whether `path` is a regular file whose last byte is not a newline: a line cut short (a run
// killed while a long line went out in several write(2) calls). Pipes, FIFOs and devices: no.
bool ends_mid_line(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return false;
  struct stat st {};
  char last = '\n';
  const bool cut = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
                   ::pread(fd, &last, 1, st.st_size - 1) == 1 && last != '\n';
  ::close(fd);
  return cut;
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

// Calls line(text, ended) for each line of the file open as `fd`, from its start, with
// `ended` true when it had a newline (left out of `text`).
template <typename Line>
void for_each_line(int fd, const std::string& path, Line&& line) {
  std::string pending;
  std::vector<char> buffer(size_t(1) << 16);
  for (off_t at = 0;;) {
    const ssize_t got = ::pread(fd, buffer.data(), buffer.size(), at);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) io_error("read metrics file", path, errno);
    if (got == 0) break;
    at += got;
    const char* const end = buffer.data() + got;
    for (const char* from = buffer.data(); from < end;) {
      const char* newline = std::find(from, end, '\n');
      pending.append(from, newline);
      if (newline == end) break;
      line(pending, true);
      pending.clear();
      from = newline + 1;
    }
  }
  if (!pending.empty()) line(pending, false);
}

// Drops the lines of a resumed run's log that `drops` says go, keeping every other in its order
// (each record is looked at: a cluster's log is not in step order, a score of the step its
// scorer pulled coming after records of later steps); returns how many went. In place, each
// line kept written behind where it is read, then the file cut: it keeps its inode (`tail -f`
// follows it on), owner, mode and links, and nothing is made beside it (its directory may be
// read-only). A crash in the milliseconds this takes may leave a line twice. A log that cannot
// be written is an IoError before anything goes.
int64_t drop_records_after(const std::string& path, int64_t step) {
  Fd fd(::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NONBLOCK));  // (a FIFO: left alone below)
  if (fd.get() < 0 && errno == ENOENT) return 0;  // a log begun by this run
  if (fd.get() < 0) io_error("open metrics file", path, errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) io_error("stat metrics file", path, errno);
  if (!S_ISREG(st.st_mode)) return 0;
  int64_t dropped = 0;
  for_each_line(fd.get(), path, [&](const std::string& text, bool ended) {
    dropped += drops(text, ended, step) ? 1 : 0;
  });
  if (dropped == 0) return 0;
  off_t written = 0;
  for_each_line(fd.get(), path, [&](std::string& text, bool ended) {
    if (drops(text, ended, step)) return;
    if (ended) text += '\n';
    for (size_t done = 0; done < text.size();) {
      const ssize_t put = ::pwrite(fd.get(), text.data() + done, text.size() - done, written);
      if (put < 0 && errno == EINTR) continue;
      if (put < 0) io_error("write metrics file", path, errno);
      done += size_t(put);
      written += put;
    }
  });
  if (::ftruncate(fd.get(), written) != 0) io_error("truncate metrics file", path, errno);
  return dropped;
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append, int64_t resumed_step)
    : path_(path) {
  const int64_t dropped =
      append && resumed_step >= 0 ? drop_records_after(path, resumed_step) : 0;
  // Checked before the file is opened for appending: the resumed run's first record starts a
  // line of its own, or the two would be one line that no JSON reader takes.
  const bool cut = append && ends_mid_line(path);
  file_ = std::fopen(path.c_str(), append ? "ae" : "we");
  if (file_ == nullptr)
    throw IoError("cannot write metrics file " + path + ": " + std::strerror(errno));
  if (cut && (std::fputc('\n', file_) == EOF || std::fflush(file_) != 0)) {
    const int error = errno;
    std::fclose(file_);
    file_ = nullptr;
    throw IoError("writing metrics file " + path_ + ": " + std::strerror(error));
  }
  if (append && resumed_step >= 0) {
    try {
      write({{"type", "resume"}, {"step", resumed_step}, {"dropped_records", dropped}});
    } catch (...) {  // no destructor runs for a constructor that throws
      std::fclose(file_);
      file_ = nullptr;
      throw;
    }
  }
}

MetricsLog::~MetricsLog() {
  if (file_) std::fclose(file_);
}

void MetricsLog::write_line(const std::string& line) {
  if (file_ == nullptr) return;
  if (std::fputs(line.c_str(), file_) < 0 || std::fputc('\n', file_) == EOF ||
      std::fflush(file_) != 0)
    throw IoError("writing metrics file " + path_ + ": " + std::strerror(errno));
}

void MetricsLog::step(const StepReport& r) {
  if (file_ == nullptr) return;
  // Epochs counted from 1, as the epoch lines count them (StepReport's is 0-based).
  nlohmann::json j{{"type", "step"},          {"step", r.step},
                   {"epoch", r.epoch + 1},    {"loss", r.loss_sum},
                   {"samples", r.samples},    {"samples_per_s", r.samples_per_s}};
  write_line(json_text(std::move(j)));
}

void MetricsLog::epoch(const EpochReport& r) {
  if (file_ == nullptr) return;
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
