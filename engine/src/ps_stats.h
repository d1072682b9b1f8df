// A parameter server's counters, as the Stats reply carries them (JSON in the extra blob).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <string>

namespace tandem {

// Staleness = the server's version when a push arrives - the version the worker computed its
// gradient on (the push header's parameter_version; 0 when the worker claims a future version).
// Buckets: 0, 1, 2, 3, 4-7, 8-15, 16+ (powers of two past 3: the tail matters less than its size).
constexpr size_t kStalenessBuckets = 7;
const char* staleness_bucket_label(size_t bucket);  // "0", ..., "4-7", "8-15", "16+"
size_t staleness_bucket(int64_t staleness);

struct ServerStats {
  std::string mode = "async";  // "async", "sync" or "bounded_staleness"
  int64_t version = 0;         // global_step: optimizer steps applied so far
  int64_t pushes = 0;          // accepted Push and PushPull messages (applied or aggregated)
  int64_t pulls = 0;           // served Pull requests
  int64_t rejected = 0;        // requests answered with an Error
  int64_t dropped = 0;         // messages dropped without a reply (bad one-way pushes, unreadable frames)
  int64_t stale_dropped = 0;   // sync mode: valid gradients computed on an older version, dropped
  // sync mode: steps applied on fewer gradients than replicas_to_aggregate (at the step timeout,
  // or with a worker gone or idle)
  int64_t partial_steps = 0;
  int64_t overflowed_steps = 0;  // sync mode: steps dropped, their summed gradients not finite
  int64_t deferred = 0;        // bounded staleness: replies held back until the slowest caught up
  int64_t curve_rejected = 0;  // CURVE: connections the ZAP handler refused (key not allowed)
  std::array<int64_t, kStalenessBuckets> staleness{};  // every valid push, by staleness bucket
  double seconds = 0;          // since the server started
  double pushes_per_s = 0;     // pushes / seconds (valid pushes, stale ones included)
  double pulls_per_s = 0;      // pulls / seconds
  std::map<std::string, int64_t> by_type;  // received messages per MessageType name
};

std::string to_json(const ServerStats& stats);
ServerStats stats_from_json(const std::string& text);  // InputError naming a malformed field

}  // namespace tandem
