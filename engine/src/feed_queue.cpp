#include "feed_queue.h"

#include <chrono>
#include <utility>

#include "tandem/error.h"

namespace tandem {

bool FeedQueue::push(FedBlock block, int timeout_ms) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (const auto check = check_) {  // (a copy: run outside the lock, it reads every label)
    lock.unlock();
    (*check)(block.rows);
    lock.lock();
  }
  auto room = [&] { return closed_ || capacity_ == 0 || blocks_.size() < capacity_; };
  ++waiting_;
  bool has_room = true;
  if (timeout_ms < 0)
    changed_.wait(lock, room);
  else
    has_room = changed_.wait_for(lock, std::chrono::milliseconds(timeout_ms), room);
  --waiting_;
  if (!has_room) return false;
  if (closed_) throw Error("cannot feed this worker: " + why_closed_);
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
