// Batches handed to a worker in its own process (the Python package's `WorkerRole.feed`, which
// `tandem.dask.feed` calls inside a Dask worker process), instead of read from a store. A block
// is a view of rows that someone else owns; `owner` keeps that memory alive until the worker has
// trained on the block, so a NumPy array is used where it lies, without a copy.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "tandem/dataset.h"

namespace tandem {

struct FedBlock {
  DatasetView rows;              // pixels and labels (labels required for training)
  std::shared_ptr<void> owner;   // released once the block is used: drops the caller's buffers
};

class FeedQueue {
 public:
  // capacity_blocks: push() waits while this many blocks are queued; 0: no limit (the seed's
  // plain Python queue).
  explicit FeedQueue(size_t capacity_blocks = 0) : capacity_(capacity_blocks) {}

  // Queues a block. Waits for room up to timeout_ms (negative: as long as it takes); false when
  // the wait timed out. Throws Error once the queue is closed (the worker has stopped), and what
  // the check set by check_blocks_with throws (an InputError for a block that does not fit the
  // model): run before it waits, and again if the check is set while it waits, so the feeder
  // hears of a bad block at once and no block is queued without it.
  bool push(FedBlock block, int timeout_ms = -1);
  // The worker's check of a block against its run's model, once it knows the model: push() runs
  // it on every block from then on (the worker checks those queued before as it takes them).
  void check_blocks_with(std::function<void(const DatasetView&)> check);
  // The oldest block, or nothing after timeout_ms or once closed and empty.
  std::optional<FedBlock> pop(int timeout_ms);
  // No more blocks: waiting pushes and pops return; what is still queued is released.
  void close(const std::string& why);
  // The feeder has no more blocks: push() throws from now on (saying `why`), and pop() hands out
  // what is still queued, then nothing at once; closed() is true. The worker trains the rest and
  // leaves the run.
  void end_input(const std::string& why);

  size_t depth() const;
  // What push() has queued so far: counted when queued, so blocks that close() then released
  // untrained are among them (the rows trained are the worker's batches, not these).
  int64_t rows_fed() const;
  int64_t blocks_fed() const;
  bool closed() const;
  // Calls of push() and pop() waiting now (for room, for a block): a test's thread waits for one
  // to be blocked before it acts, rather than sleeping and hoping.
  size_t waiting() const;

 private:
  const size_t capacity_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<FedBlock> blocks_;
  int64_t rows_fed_ = 0, blocks_fed_ = 0;
  size_t waiting_ = 0;
  bool closed_ = false;
  std::string why_closed_;
  std::shared_ptr<const std::function<void(const DatasetView&)>> check_;
};

}  // namespace tandem
