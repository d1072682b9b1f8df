// How the fuzz targets of the parameter server's messages cut their input into ZeroMQ frames:
// each frame is a little-endian uint16 length and then that many bytes (the last frame takes
// what is left when the length runs past the end). tests/fuzz/make_seeds.py writes its seeds so.
// A run of messages (ps_shard_fuzz.cpp) is cut the same way twice: records, then each record's
// frames.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire_protocol.h"

namespace tandem::fuzz {

inline std::vector<transport::ByteSpan> cut_frames(const uint8_t* data, size_t size,
                                                   size_t most = 64) {
  std::vector<transport::ByteSpan> frames;
  while (size >= 2 && frames.size() < most) {
    const size_t length = std::min<size_t>(size_t(data[0]) | size_t(data[1]) << 8, size - 2);
    frames.push_back({data + 2, length});
    data += 2 + length;
    size -= 2 + length;
  }
  return frames;
}

// Decode limits small enough for the fuzzer to reach them.
inline transport::DecodeLimits small_limits() {
  transport::DecodeLimits limits;
  limits.max_tensors = 16;
  limits.max_message_bytes = 1 << 16;
  limits.max_extra_bytes = 1 << 10;
  return limits;
}

}  // namespace tandem::fuzz
