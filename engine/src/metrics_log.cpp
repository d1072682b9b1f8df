#include "metrics_log.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <utility>
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

// Whether `line` is a record of a step above `step`.
bool past(const std::string& line, int64_t step) {
  const nlohmann::json record = parse_bounded_json(line);
  int64_t record_step = 0;
  return record.is_object() && record.contains("step") &&
         json_as_integer(record["step"], record_step) && record_step > step;
}

// Drops the records of a regular file whose "step" is above `step`, keeping every other line
// in its order; returns how many went. Each record is looked at, not the file cut at the first:
// a cluster's log is not in step order (a score, of the step its scorer pulled, comes after
// records of later steps). The file is read twice, never held whole, and replaced atomically
// only when something goes.
int64_t drop_records_after(const std::string& path, int64_t step) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return 0;
  std::ifstream in(path, std::ios::binary);
  std::string line;
  int64_t dropped = 0;
  while (std::getline(in, line)) dropped += past(line, step) ? 1 : 0;
  if (dropped == 0) return 0;
  in.clear();
  in.seekg(0);
  AtomicFile out(path);
  while (std::getline(in, line)) {
    if (past(line, step)) continue;
    if (!in.eof()) line += '\n';  // (a last line cut short stays so: see ends_mid_line)
    out.write(line.data(), line.size());
  }
  if (in.bad()) throw IoError("cannot read metrics file " + path + " again to drop records");
  out.commit();
  fsync_parent_directory(out.target(), "rewriting");
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
