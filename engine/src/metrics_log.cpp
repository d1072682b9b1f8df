#include "metrics_log.h"

#include <cerrno>
#include <cmath>
#include <cstring>
#include <utility>
#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem {
namespace {

// JSON has no NaN or infinity, and nlohmann writes them as null: a diverged loss would read as a
// missing one. They are written as the strings "NaN", "Infinity" and "-Infinity" (the names
// JavaScript and protobuf's JSON use), in place, anywhere in the record.
void name_non_finite_numbers(nlohmann::json& value) {
  if (value.is_number_float()) {
    const double x = value.get<double>();
    if (std::isnan(x)) value = "NaN";
    else if (std::isinf(x)) value = x > 0 ? "Infinity" : "-Infinity";
  } else if (value.is_structured()) {
    for (nlohmann::json& element : value) name_non_finite_numbers(element);
  }
}

// One line of the log. Text that is not UTF-8 (a path, a role's name) is written with U+FFFD in
// place of the bad bytes: refusing it would lose the whole record.
std::string encode(nlohmann::json record) {
  name_non_finite_numbers(record);
  return record.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path, bool append) : path_(path) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (file_ == nullptr)
    throw IoError("cannot write metrics file " + path + ": " + std::strerror(errno));
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
  nlohmann::json j{{"type", "step"},          {"step", r.step},
                   {"epoch", r.epoch},        {"loss", r.loss_sum},
                   {"samples", r.samples},    {"samples_per_s", r.samples_per_s}};
  write_line(encode(std::move(j)));
}

void MetricsLog::epoch(const EpochReport& r) {
  if (file_ == nullptr) return;
  nlohmann::json j{{"type", "epoch"},
                   {"epoch", r.epoch},
                   {"step", r.step},
                   {"train_loss_mean", r.train_loss_mean},
                   {"samples_per_s", r.samples_per_s},
                   {"seconds", r.seconds},
                   {"validation_loss", r.validation.loss_sum},
                   {"validation_loss_mean", r.validation.loss_mean},
                   {"validation_accuracy", r.validation.accuracy}};
  write_line(encode(std::move(j)));
}

void MetricsLog::write(const nlohmann::json& object) { write_line(encode(object)); }

}  // namespace tandem
