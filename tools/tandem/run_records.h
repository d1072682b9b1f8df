// A cluster run's records as the coordinator's command writes them: the metrics log and the
// TensorBoard events. They are a view of the run, not the run: a write that fails (a full disk,
// a quota) is said once on stderr and that output stops, while the run goes on to its stop rule
// and saves its model. A failed write once ended the whole run, every role with it, and no model
// was saved.
#pragma once

#include <cstdio>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "metrics_log.h"
#include "tandem/error.h"
#include "tensorboard_writer.h"

namespace tandem::cli {

class RunRecords {
 public:
  RunRecords(MetricsLog& metrics, TensorBoardWriter& tensorboard)
      : metrics_(metrics), tensorboard_(tensorboard) {}

  void metrics(const nlohmann::json& record) {
    guarded(metrics_failed_, "metrics records", [&] { metrics_.write(record); });
  }
  void scalar(const std::string& tag, int64_t step, float value,
              double wall_time = wall_clock_seconds()) {
    guarded(tensorboard_failed_, "TensorBoard events",
            [&] { tensorboard_.add_scalar(tag, step, value, wall_time); });
  }
  void flush_tensorboard() {
    guarded(tensorboard_failed_, "TensorBoard events", [&] { tensorboard_.flush(); });
  }
  void close_tensorboard() {
    guarded(tensorboard_failed_, "TensorBoard events", [&] { tensorboard_.close(); });
  }

 private:
  template <typename Write>
  static void guarded(bool& failed, const char* what, Write&& write) {
    if (failed) return;
    try {
      std::forward<Write>(write)();
    } catch (const IoError& e) {
      failed = true;
      std::fprintf(stderr, "tandem: warning: %s; the run goes on without more %s\n", e.what(),
                   what);
    }
  }

  MetricsLog& metrics_;
  TensorBoardWriter& tensorboard_;
  bool metrics_failed_ = false;
  bool tensorboard_failed_ = false;
};

}  // namespace tandem::cli
