// A count a checkpoint's metadata carries (epochs_trained, validation_rows): the whole number
// written under `key`, or nothing when it is absent or not one (a file from elsewhere).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>

#include "tandem/model.h"

namespace tandem {

inline std::optional<int64_t> checkpoint_count(const Checkpoint& ckpt, const std::string& key) {
  const auto it = ckpt.extra.find(key);
  if (it == ckpt.extra.end() || it->second.empty() || it->second.size() > 12 ||
      it->second.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  return std::stoll(it->second);
}

// How far the checkpointed run trained: its epoch, or further when it kept an earlier epoch and
// said beside it how far it went (epochs_trained). A resumed run asked for no more trains none.
inline int64_t epochs_reached(const Checkpoint& ckpt) {
  return std::max<int64_t>(ckpt.epoch, checkpoint_count(ckpt, "epochs_trained").value_or(0));
}

}  // namespace tandem
