// How many batches rows make: the one division every part of the engine must agree on (a worker's
// tasks, the coordinator's epoch, the chunk manager's shards, a progress line).
#pragma once

#include <cstdint>

namespace tandem {

// Batches of up to `batch` rows (>= 1) in `rows` rows, the last one partial: rows / batch rounded
// up, without the overflow of (rows + batch - 1) / batch for a batch size near 2^63.
inline int64_t batch_count(int64_t rows, int64_t batch) {
  return rows / batch + (rows % batch != 0 ? 1 : 0);
}

}  // namespace tandem
