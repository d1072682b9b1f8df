#include "ps_stats.h"

#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem {

std::string to_json(const ServerStats& s) {
  nlohmann::json j{{"version", s.version}, {"pushes", s.pushes},   {"pulls", s.pulls},
                   {"rejected", s.rejected}, {"dropped", s.dropped}, {"by_type", s.by_type}};
  return j.dump();
}

ServerStats stats_from_json(const std::string& text) {
  try {
    const auto j = nlohmann::json::parse(text);
    ServerStats s;
    s.version = j.at("version").get<int64_t>();
    s.pushes = j.at("pushes").get<int64_t>();
    s.pulls = j.at("pulls").get<int64_t>();
    s.rejected = j.at("rejected").get<int64_t>();
    s.dropped = j.at("dropped").get<int64_t>();
    s.by_type = j.at("by_type").get<std::map<std::string, int64_t>>();
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw InputError(std::string("server stats: malformed JSON: ") + e.what());
  }
}

}  // namespace tandem
