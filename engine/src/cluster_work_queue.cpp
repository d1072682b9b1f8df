#include "cluster_work_queue.h"

#include <algorithm>

#include "tandem/error.h"

namespace tandem {

WorkQueue::WorkQueue(int64_t batches_per_epoch, int64_t max_epochs, int64_t first_epoch)
    : batches_per_epoch_(batches_per_epoch),
      max_epochs_(max_epochs),
      opened_(first_epoch),
      completed_(first_epoch) {
  if (batches_per_epoch < 1) throw InputError("work queue: an epoch needs at least one batch");
  if (max_epochs < 0) throw InputError("work queue: max epochs must be >= 0");
  if (first_epoch < 0) throw InputError("work queue: the first epoch must be >= 0");
}

bool WorkQueue::exhausted() const {
  return max_epochs_ > 0 && completed_ >= max_epochs_;
}

WorkQueue::Epoch* WorkQueue::epoch(int64_t index) {
  for (Epoch& e : open_)
    if (e.index == index) return &e;
  return nullptr;
}

WorkTask WorkQueue::hand_out(const std::string& worker, int64_t epoch, std::vector<int64_t> batches) {
  std::sort(batches.begin(), batches.end());
  WorkTask task{next_task_id_++, epoch, std::move(batches)};
  held_[worker] = Held{task, 0};
  return task;
}

void WorkQueue::count_done(int64_t index, int64_t batches) {
  if (batches <= 0) return;
  batches_done_ += batches;
  Epoch* e = epoch(index);
  if (e == nullptr) return;
  e->remaining -= batches;
  // Completed epochs leave the queue in any order (a later one can finish first).
  open_.erase(std::remove_if(open_.begin(), open_.end(),
                             [&](const Epoch& x) {
                               if (x.remaining > 0) return false;
                               ++completed_;
                               return true;
                             }),
              open_.end());
}

std::optional<WorkTask> WorkQueue::next(const std::string& worker,
                                        const std::vector<std::string>& live) {
  if (held_.count(worker)) worker_lost(worker);
  // Orphans first, oldest epoch first: they hold up an epoch's completion.
  for (Epoch& e : open_)
    if (!e.orphans.empty()) {
      // At most one share's worth, so several workers can pick up a lost worker's batches.
      const size_t share = static_cast<size_t>(
          std::max<int64_t>(1, batches_per_epoch_ / std::max<int64_t>(1, int64_t(live.size()))));
      const size_t take = std::min(share, e.orphans.size());
      std::vector<int64_t> batches(e.orphans.begin(), e.orphans.begin() + long(take));
      e.orphans.erase(e.orphans.begin(), e.orphans.begin() + long(take));
      return hand_out(worker, e.index, std::move(batches));
    }
  for (Epoch& e : open_) {
    auto own = e.unstarted.find(worker);
    if (own != e.unstarted.end()) {
      std::vector<int64_t> batches = std::move(own->second);
      e.unstarted.erase(own);
      return hand_out(worker, e.index, std::move(batches));
    }
  }
  // Steal the back half of the largest share not started yet.
  for (Epoch& e : open_) {
    auto largest = e.unstarted.end();
    for (auto it = e.unstarted.begin(); it != e.unstarted.end(); ++it)
      if (largest == e.unstarted.end() || it->second.size() > largest->second.size()) largest = it;
    if (largest == e.unstarted.end()) continue;
    std::vector<int64_t>& share = largest->second;
    const size_t keep = share.size() / 2;
    std::vector<int64_t> batches(share.begin() + long(keep), share.end());
    share.resize(keep);
    if (share.empty()) e.unstarted.erase(largest);
    return hand_out(worker, e.index, std::move(batches));
  }
  if (max_epochs_ > 0 && opened_ >= max_epochs_) return std::nullopt;
  // A new epoch, cut among the live workers (the asking one included even if not listed).
  std::vector<std::string> workers = live;
  if (std::find(workers.begin(), workers.end(), worker) == workers.end()) workers.push_back(worker);
  std::sort(workers.begin(), workers.end());
  Epoch e;
  e.index = opened_++;
  e.remaining = batches_per_epoch_;
  const int64_t n = static_cast<int64_t>(workers.size());
  for (int64_t k = 0; k < n; ++k) {
    const int64_t begin = batches_per_epoch_ * k / n, end = batches_per_epoch_ * (k + 1) / n;
    std::vector<int64_t> share;
    for (int64_t b = begin; b < end; ++b) share.push_back(b);
    if (!share.empty()) e.unstarted[workers[size_t(k)]] = std::move(share);
  }
  open_.push_back(std::move(e));
  Epoch& added = open_.back();
  auto own = added.unstarted.find(worker);
  if (own == added.unstarted.end()) return next(worker, live);  // more workers than batches
  std::vector<int64_t> batches = std::move(own->second);
  added.unstarted.erase(own);
  return hand_out(worker, added.index, std::move(batches));
}

void WorkQueue::progress(const std::string& worker, int64_t task_id, int64_t done) {
  auto it = held_.find(worker);
  if (it == held_.end() || it->second.task.id != task_id) return;  // an old task's late report
  Held& h = it->second;
  done = std::clamp<int64_t>(done, 0, static_cast<int64_t>(h.task.batches.size()));
  if (done <= h.done) return;
  count_done(h.task.epoch, done - h.done);
  h.done = done;
}

void WorkQueue::finish(const std::string& worker, int64_t task_id) {
  auto it = held_.find(worker);
  if (it == held_.end() || it->second.task.id != task_id) return;
  progress(worker, task_id, static_cast<int64_t>(it->second.task.batches.size()));
  held_.erase(worker);
}

void WorkQueue::worker_lost(const std::string& worker) {
  auto it = held_.find(worker);
  if (it != held_.end()) {
    const Held& h = it->second;
    if (Epoch* e = epoch(h.task.epoch))
      e->orphans.insert(e->orphans.end(), h.task.batches.begin() + long(h.done),
                        h.task.batches.end());
    held_.erase(it);
  }
  for (Epoch& e : open_) {
    auto own = e.unstarted.find(worker);
    if (own == e.unstarted.end()) continue;
    e.orphans.insert(e.orphans.end(), own->second.begin(), own->second.end());
    e.unstarted.erase(own);
  }
  for (Epoch& e : open_) std::sort(e.orphans.begin(), e.orphans.end());
}

}  // namespace tandem
