#include "ps_checkpoint_writer.h"

#include <cstdio>
#include <exception>
#include <utility>

namespace tandem {

CheckpointWriter::CheckpointWriter(std::string label,
                                   std::function<void(const std::string&, int64_t)> after_write)
    : label_(std::move(label)), after_write_(std::move(after_write)), thread_([this] { run(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

uint64_t CheckpointWriter::submit(std::string path, int64_t step, SafeTensorsFile file) {
  uint64_t ticket = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ticket = ++submitted_;
    waiting_ = Job{std::move(path), step, std::move(file), ticket};
  }
  changed_.notify_all();
  return ticket;
}

std::optional<CheckpointWriter::Outcome> CheckpointWriter::outcome_since(uint64_t ticket) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const auto& [ended, outcome] : ended_)
    if (ended >= ticket) return outcome;
  return std::nullopt;
}

std::string CheckpointWriter::wait_idle() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return !waiting_ && !busy_; });
  return ended_.empty() ? std::string() : ended_.back().second.error;
}

void CheckpointWriter::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    // Stopping still writes what waits: the server's final checkpoint is submitted just before.
    changed_.wait(lock, [&] { return waiting_ || stopping_; });
    if (!waiting_) return;
    Job job = std::move(*waiting_);
    waiting_.reset();
    busy_ = true;
    lock.unlock();
    std::string error;
    try {
      write_safetensors_atomic(job.path, job.file);  // tmp file, fsync, rename, fsync of the dir
      after_write_(job.path, job.step);
    } catch (const std::exception& e) {
      error = e.what();
      std::fprintf(stderr, "tandem parameter server %s: checkpoint failed: %s\n", label_.c_str(),
                   e.what());
    }
    lock.lock();
    busy_ = false;
    ended_.push_back({job.ticket, {std::move(job.path), std::move(error)}});
    if (ended_.size() > kKeptOutcomes) ended_.pop_front();
    changed_.notify_all();
  }
}

}  // namespace tandem
