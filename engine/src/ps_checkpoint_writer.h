// A parameter server's checkpoint writer: a thread of its own that serialises, writes, fsyncs,
// renames and prunes, so the serving thread pauses only to take a snapshot of its shard (a copy
// into the SafeTensorsFile) instead of for the whole write. One write at a time; a snapshot
// submitted while another still waits its turn replaces it (the newer one holds everything the
// older did), so a slow disk makes checkpoints rarer instead of queueing them without bound.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <deque>
#include <optional>
#include <string>
#include <thread>

#include "safetensors.h"

namespace tandem {

class CheckpointWriter {
 public:
  // After each successful write, on the writer thread: after_write(path, step) (the server prunes
  // older files there). `label` names the server in log lines.
  CheckpointWriter(std::string label, std::function<void(const std::string&, int64_t)> after_write);
  ~CheckpointWriter();  // writes what was submitted, then stops
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `file` for `path` (written atomically: write_safetensors_atomic), replacing a
  // submission that has not started. Returns at once, with the submission's ticket: 1, 2, ... in
  // submission order.
  uint64_t submit(std::string path, int64_t step, SafeTensorsFile file);
  // Waits until every submission so far is written or has failed. Returns the error of the last
  // job written ("" when it succeeded: the newest submission's outcome, since a submission that
  // never started was replaced). Failures are also logged to stderr.
  std::string wait_idle();

  // Without waiting: the outcome of the first write that ended with a ticket of `ticket` or
  // later (a submission replaced before it started is answered by the one that replaced it,
  // which holds everything it did); until one has, nothing. The newest kKeptOutcomes are kept.
  struct Outcome {
    std::string path;
    std::string error;  // "" when written
  };
  std::optional<Outcome> outcome_since(uint64_t ticket);
  static constexpr size_t kKeptOutcomes = 16;

 private:
  struct Job {
    std::string path;
    int64_t step = 0;
    SafeTensorsFile file;
    uint64_t ticket = 0;
  };
  void run();

  std::string label_;
  std::function<void(const std::string&, int64_t)> after_write_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::optional<Job> waiting_;  // the next job, not started
  bool busy_ = false;           // a job is being written
  bool stopping_ = false;
  uint64_t submitted_ = 0;  // the newest submission's ticket
  std::deque<std::pair<uint64_t, Outcome>> ended_;  // by ticket, the newest kKeptOutcomes
  std::thread thread_;  // last: starts once everything above exists
};

}  // namespace tandem
