#include "ps_stats.h"

#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem {

const char* staleness_bucket_label(size_t bucket) {
  static const char* const kLabels[kStalenessBuckets] = {"0", "1", "2", "3", "4-7", "8-15", "16+"};
  return bucket < kStalenessBuckets ? kLabels[bucket] : "?";
}

size_t staleness_bucket(int64_t s) {
  if (s <= 3) return s < 0 ? 0 : size_t(s);
  if (s <= 7) return 4;
  if (s <= 15) return 5;
  return 6;
}

std::string to_json(const ServerStats& s) {
  nlohmann::json hist = nlohmann::json::object();
  for (size_t i = 0; i < kStalenessBuckets; ++i) hist[staleness_bucket_label(i)] = s.staleness[i];
  nlohmann::json j{{"mode", s.mode},
                   {"version", s.version},
                   {"pushes", s.pushes},
                   {"pulls", s.pulls},
                   {"rejected", s.rejected},
                   {"dropped", s.dropped},
                   {"stale_dropped", s.stale_dropped},
                   {"partial_steps", s.partial_steps},
                   {"overflowed_steps", s.overflowed_steps},
                   {"deferred", s.deferred},
                   {"curve_rejected", s.curve_rejected},
                   {"staleness_histogram", hist},
                   {"seconds", s.seconds},
                   {"pushes_per_s", s.pushes_per_s},
                   {"pulls_per_s", s.pulls_per_s},
                   {"by_type", s.by_type}};
  return j.dump();
}

ServerStats stats_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    ServerStats s;
    s.mode = j.at("mode").get<std::string>();
    s.version = j.at("version").get<int64_t>();
    s.pushes = j.at("pushes").get<int64_t>();
    s.pulls = j.at("pulls").get<int64_t>();
    s.rejected = j.at("rejected").get<int64_t>();
    s.dropped = j.at("dropped").get<int64_t>();
    s.stale_dropped = j.at("stale_dropped").get<int64_t>();
    s.partial_steps = j.at("partial_steps").get<int64_t>();
    s.overflowed_steps = j.value("overflowed_steps", int64_t{0});  // absent before it was counted
    s.deferred = j.at("deferred").get<int64_t>();
    s.curve_rejected = j.value("curve_rejected", int64_t(0));  // absent from older servers
    const auto& hist = j.at("staleness_histogram");
    for (size_t i = 0; i < kStalenessBuckets; ++i)
      s.staleness[i] = hist.at(staleness_bucket_label(i)).get<int64_t>();
    s.seconds = j.at("seconds").get<double>();
    s.pushes_per_s = j.at("pushes_per_s").get<double>();
    s.pulls_per_s = j.at("pulls_per_s").get<double>();
    s.by_type = j.at("by_type").get<std::map<std::string, int64_t>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("server stats: malformed JSON: ") + e.what());
  }
}

}  // namespace tandem
