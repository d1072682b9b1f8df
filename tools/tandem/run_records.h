// A cluster run's records as the coordinator's command writes them: the metrics log and the
// TensorBoard events, each given up after its first failed write (record_write.h).
#pragma once

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "metrics_log.h"
#include "record_write.h"
#include "tensorboard_writer.h"

namespace tandem::cli {

class RunRecords {
 public:
  RunRecords(MetricsLog& metrics, TensorBoardWriter& tensorboard)
      : metrics_(metrics), tensorboard_(tensorboard) {}

  void metrics(const nlohmann::json& record) {
    guarded(metrics_failed_, kMetricsGone, [&] { metrics_.write(record); });
  }
  void scalar(const std::string& tag, int64_t step, float value,
              double wall_time = wall_clock_seconds()) {
    guarded(tensorboard_failed_, kEventsGone,
            [&] { tensorboard_.add_scalar(tag, step, value, wall_time); });
  }
  void flush_tensorboard() {
    guarded(tensorboard_failed_, kEventsGone, [&] { tensorboard_.flush(); });
  }
  void close_tensorboard() {
    guarded(tensorboard_failed_, kEventsGone, [&] { tensorboard_.close(); });
  }

 private:
  static constexpr const char* kMetricsGone = "the run goes on without more metrics records";
  static constexpr const char* kEventsGone = "the run goes on without more TensorBoard events";

  template <typename Write>
  static void guarded(bool& failed, const char* goes_on_without, Write&& write) {
    if (!failed) failed = !write_record(goes_on_without, std::forward<Write>(write));
  }

  MetricsLog& metrics_;
  TensorBoardWriter& tensorboard_;
  bool metrics_failed_ = false;
  bool tensorboard_failed_ = false;
};

}  // namespace tandem::cli
