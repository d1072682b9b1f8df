#include "feed_queue.h"

#include <chrono>
#include <utility>

#include "tandem/error.h"

namespace tandem {

bool FeedQueue::push(FedBlock block, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(mutex_);
  // The check the block has passed: one set while it waited for room is run too, before it is
  // queued (a feeder blocked on a full queue as the worker registers is the common case).
  std::shared_ptr<const std::function<void(const DatasetView&)>> passed;
  for (;;) {
    if (closed_) throw Error("cannot feed this worker: " + why_closed_);
    if (check_ && check_ != passed) {
      const auto check = check_;
      lock.unlock();  // (it reads every label)
      (*check)(block.rows);
      lock.lock();
      passed = check;
      continue;
    }
    if (capacity_ == 0 || blocks_.size() < capacity_) break;
    auto woken = [&] {
      return closed_ || (check_ && check_ != passed) || blocks_.size() < capacity_;
    };
    ++waiting_;
    bool ready = true;
    if (timeout_ms < 0) changed_.wait(lock, woken);
    else ready = changed_.wait_until(lock, deadline, woken);
    --waiting_;
    if (!ready) return false;
  }
  rows_fed_ += block.rows.rows;
  blocks_fed_ += 1;
  blocks_.push_back(std::move(block));
  changed_.notify_all();
  return true;
}

std::optional<FedBlock> FeedQueue::pop(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  ++waiting_;
  changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms),
                    [&] { return closed_ || !blocks_.empty(); });
  --waiting_;
  if (blocks_.empty()) return std::nullopt;
  FedBlock block = std::move(blocks_.front());
  blocks_.pop_front();
  changed_.notify_all();
  return block;
}

void FeedQueue::check_blocks_with(std::function<void(const DatasetView&)> check) {
  auto shared = std::make_shared<const std::function<void(const DatasetView&)>>(std::move(check));
  std::lock_guard<std::mutex> lock(mutex_);
  check_ = std::move(shared);
  changed_.notify_all();  // a push waiting for room runs it before queueing its block
}

void FeedQueue::close(const std::string& why) {
  std::deque<FedBlock> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!closed_) why_closed_ = why;
    closed_ = true;
    dropped.swap(blocks_);
    changed_.notify_all();
  }
  // `dropped` releases its owners here, outside the lock (a Python owner takes the GIL).
}

void FeedQueue::end_input(const std::string& why) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!closed_) why_closed_ = why;
  closed_ = true;
  changed_.notify_all();
}

size_t FeedQueue::depth() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_.size();
}

int64_t FeedQueue::rows_fed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return rows_fed_;
}

int64_t FeedQueue::blocks_fed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return blocks_fed_;
}

size_t FeedQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return waiting_;
}

bool FeedQueue::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

}  // namespace tandem
