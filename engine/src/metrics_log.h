// The --metrics file: one JSON object per line, flushed as it goes so a crashed or running job
// can be followed with `tail -f`.
#pragma once

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/trainer.h"

namespace tandem {

class MetricsLog {
 public:
  MetricsLog() = default;
  // Truncates the file, or appends to it (a resumed run's); throws IoError naming the path, and
  // when another log has the same file open (a regular file is locked, flock, while the log is
  // open; on a filesystem without locks only a warning is said).
  // A run resumed from step `resumed_step` (>= 0) first drops the records past that step and a
  // last line cut short (what the run did after its checkpoint, trained again now: kept, each
  // step would be there twice with two losses), each overwritten in place by a line of as many
  // bytes, {"type":"dropped"} and spaces, every other line as it was; then it writes a record
  // {"type":"resume","step":S,"dropped_records":N}.
  explicit MetricsLog(const std::string& path, bool append = false, int64_t resumed_step = -1);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  void step(const StepReport& report);
  void epoch(const EpochReport& report);
  void write(const nlohmann::json& object);  // any other record, as one line

 private:
  void write_line(std::string line);  // taken whole: its newline is added in place
  void write_bytes(const std::string& bytes);
  int fd_ = -1;  // -1: a default-constructed log, which writes nothing
  std::string path_;
};

}  // namespace tandem
