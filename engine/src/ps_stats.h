// A parameter server's counters, as the Stats reply carries them (JSON in the extra blob).
#pragma once

#include <cstdint>
#include <map>
#include <string>

namespace tandem {

struct ServerStats {
  int64_t version = 0;   // global_step: accepted pushes so far
  int64_t pushes = 0;    // accepted Push and PushPull messages
  int64_t pulls = 0;     // served Pull requests
  int64_t rejected = 0;  // requests answered with an Error
  int64_t dropped = 0;   // messages dropped without a reply (bad one-way pushes, unreadable frames)
  std::map<std::string, int64_t> by_type;  // received messages per MessageType name
};

std::string to_json(const ServerStats& stats);
ServerStats stats_from_json(const std::string& text);  // InputError for malformed JSON

}  // namespace tandem
