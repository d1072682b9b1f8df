// A count a checkpoint's metadata carries (epochs_trained, validation_rows): the whole number
// written under `key`, or nothing when it is absent or not one (a file from elsewhere).
#pragma once

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

}  // namespace tandem
