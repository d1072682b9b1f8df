#include "ps_stats.h"

#include <nlohmann/json.hpp>

#include "json_fields.h"
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
  // From another process: every field read as its type (json_fields.h), none cast blindly.
  const nlohmann::json j = parse_bounded_json(text);
  if (j.is_discarded()) throw InputError("server stats: not JSON, or nested too deeply");
  const JsonFields f(j, "server stats");
  const int64_t zero = 0;
  ServerStats s;
  s.mode = f.text("mode");
  s.version = f.integer("version");
  s.pushes = f.integer("pushes");
  s.pulls = f.integer("pulls");
  s.rejected = f.integer("rejected");
  s.dropped = f.integer("dropped");
  s.stale_dropped = f.integer("stale_dropped");
  s.partial_steps = f.integer("partial_steps");
  s.overflowed_steps = f.integer("overflowed_steps", &zero);  // absent before it was counted
  s.deferred = f.integer("deferred");
  s.curve_rejected = f.integer("curve_rejected", &zero);  // absent from older servers
  const JsonFields hist(f.object("staleness_histogram"), "server stats: staleness_histogram");
  for (size_t i = 0; i < kStalenessBuckets; ++i)
    s.staleness[i] = hist.integer(staleness_bucket_label(i));
  s.seconds = f.number("seconds");
  s.pushes_per_s = f.number("pushes_per_s");
  s.pulls_per_s = f.number("pulls_per_s");
  const nlohmann::json& by_type = f.object("by_type");
  const JsonFields counts(by_type, "server stats: by_type");
  for (const auto& entry : by_type.items())
    s.by_type[entry.key()] = counts.integer(entry.key().c_str());
  return s;
}

}  // namespace tandem
