// The coordinator's bookkeeping of who trains on which batches: the seed's per-worker queues,
// epoch after epoch, kept so that no batch is lost when a worker is.
//
// An epoch is opened when a worker asks for work and nothing of the open epochs is left to hand
// out; it is cut into contiguous shares of its batch sequence, one per live worker (the sequence
// is already shuffled by the chunk manager, so a contiguous share is a random sample that reads
// only its own chunks). A worker gets, in order of preference: batches orphaned by a lost worker,
// its own share of an open epoch, half of the largest share another worker has not started (so a
// fast worker never idles while a slow one has work queued), or a share of a newly opened epoch.
// Workers report progress as a count of their task's batches done, in the task's (ascending)
// order; when a worker is lost, the batches after its last report are orphaned and handed out
// again (a batch done after the last report is then trained twice: at least once, never zero).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace tandem {

struct WorkTask {
  int64_t id = 0;
  int64_t epoch = 0;              // 0-based
  std::vector<int64_t> batches;  // ascending
};

class WorkQueue {
 public:
  // max_epochs 0: no limit (the stop rule ends training). first_epoch: epochs a resumed run
  // trained before (0 .. first_epoch - 1): counted as completed, the first opened is first_epoch
  // (its batch order the one the run would have had), and max_epochs counts them.
  WorkQueue(int64_t batches_per_epoch, int64_t max_epochs, int64_t first_epoch = 0);

  // The next task for `worker`, given the workers alive now (for cutting a new epoch); nullopt
  // when there is nothing to hand out at the moment (others hold the rest) or ever (exhausted()).
  // A worker still holding a task is treated as having lost it (it restarted).
  std::optional<WorkTask> next(const std::string& worker, const std::vector<std::string>& live);
  // `done` batches of the worker's task (a prefix, in order) are trained.
  void progress(const std::string& worker, int64_t task_id, int64_t done);
  // The whole task is trained.
  void finish(const std::string& worker, int64_t task_id);
  // The worker is gone: the batches of its task after its last report are handed out again, and
  // its unstarted shares go back to the pool.
  void worker_lost(const std::string& worker);

  int64_t batches_per_epoch() const { return batches_per_epoch_; }
  int64_t epochs_opened() const { return opened_; }
  int64_t epochs_completed() const { return completed_; }
  // Epochs 0 .. N - 1 are all complete (a later one may be too: epochs complete out of order):
  // the epochs a checkpoint of the servers' parameters taken now comes after.
  int64_t epochs_whole() const { return open_.empty() ? opened_ : open_.front().index; }
  int64_t batches_done() const { return batches_done_; }
  // Every epoch up to max_epochs is trained (never true without a limit).
  bool exhausted() const;

 private:
  struct Epoch {
    int64_t index = 0;
    int64_t remaining = 0;                                   // batches not yet trained
    std::map<std::string, std::vector<int64_t>> unstarted;  // shares not handed out yet
    std::vector<int64_t> orphans;                           // from lost workers
  };
  struct Held {
    WorkTask task;
    int64_t done = 0;
  };

  Epoch* epoch(int64_t index);
  WorkTask hand_out(const std::string& worker, int64_t epoch, std::vector<int64_t> batches);
  void count_done(int64_t epoch, int64_t batches);

  int64_t batches_per_epoch_;
  int64_t max_epochs_;
  int64_t opened_ = 0;
  int64_t completed_ = 0;
  int64_t batches_done_ = 0;
  int64_t next_task_id_ = 1;
  std::deque<Epoch> open_;  // epochs not complete, oldest first
  std::map<std::string, Held> held_;
};

}  // namespace tandem
