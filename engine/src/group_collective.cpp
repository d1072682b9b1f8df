// The thread collective: a worker group whose members are threads of this process.
//
// Each collective is two barriers around the work. Arrival: a member publishes its buffer and
// waits until every member has published theirs (or the group fails). Work: member r sums slice
// r of the buffer across all members in rank order and writes the sum back into every member's
// buffer (a broadcast: each non-root member copies the root's buffer into its own). Departure:
// a member returns only when every member's work is done, since the others write into its buffer.
//
// Failure is decided only at arrival. Once every member has arrived, the work runs in this file's
// code and cannot block, so the collective completes for everyone (an abort() that comes in
// meanwhile breaks the next call); before that, a timeout, an abort() or a member whose call does
// not match the others' sets the group's failure, and every waiting member throws it without
// touching another member's buffer (no one has passed the arrival barrier, nor can any later).
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "group_collective.h"

namespace tandem {

void GroupCollective::all_reduce_sum_after(int rank, float* data, size_t count, void* after) {
  if (after != nullptr)
    throw InputError("worker group: a collective on host memory cannot wait for a GPU event");
  all_reduce_sum(rank, data, count);
}

void GroupCollective::finish(int rank) {
  if (rank < 0 || rank >= size())
    throw InputError("worker group: rank " + std::to_string(rank) +
                     " is outside the group's ranks 0.." + std::to_string(size() - 1));
}

namespace {

enum class Kind { AllReduce, Broadcast };

const char* kind_name(Kind kind) { return kind == Kind::AllReduce ? "all_reduce" : "broadcast"; }

// "rank 2" or "ranks 1, 3"
std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (i > 0) text += ", ";
    text += std::to_string(ranks[i]);
  }
  return text;
}

class ThreadCollective final : public GroupCollective {
 public:
  ThreadCollective(int members, int timeout_ms)
      : members_(members),
        timeout_ms_(timeout_ms),
        buffers_(static_cast<size_t>(members), nullptr),
        calls_(static_cast<size_t>(members), 0),
        arrived_(static_cast<size_t>(members), 0),
        finished_(static_cast<size_t>(members), 0) {}

  int size() const override { return members_; }
  Memory memory() const override { return Memory::Host; }
  int timeout_ms() const override { return timeout_ms_; }

  void all_reduce_sum(int rank, float* data, size_t count) override {
    run(Kind::AllReduce, rank, data, count, 0);
  }

  void broadcast(int rank, float* data, size_t count, int root) override {
    if (root < 0 || root >= members_)
      throw InputError("worker group: broadcast root " + std::to_string(root) +
                       " is outside the group's ranks 0.." + std::to_string(members_ - 1));
    run(Kind::Broadcast, rank, data, count, root);
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    fail("worker group aborted: " + why);
  }

 private:
  // What the first member to arrive at a collective called; the others must match it.
  struct Call {
    int64_t number = 0;  // the group's collective count, 1-based; 0: none yet
    Kind kind = Kind::AllReduce;
    size_t count = 0;
    int root = 0;
    int rank = 0;
  };

  void fail(std::string message) {  // mutex_ held
    if (failure_.empty()) failure_ = std::move(message);
    changed_.notify_all();
  }

  void throw_if_failed() const {  // mutex_ held
    if (!failure_.empty()) throw GroupError(failure_);
  }

  bool all_reached(const std::vector<int64_t>& marks, int64_t number) const {
    return std::all_of(marks.begin(), marks.end(), [&](int64_t m) { return m >= number; });
  }

  void run(Kind kind, int rank, float* data, size_t count, int root) {
    if (rank < 0 || rank >= members_)
      throw InputError("worker group: rank " + std::to_string(rank) +
                       " is outside the group's ranks 0.." + std::to_string(members_ - 1));
    const size_t r = static_cast<size_t>(rank);
    std::unique_lock<std::mutex> lock(mutex_);
    throw_if_failed();
    const int64_t number = ++calls_[r];
    // In step, no member can be a collective ahead: it would have had to see this one finish.
    for (int m = 0; m < members_; ++m)
      if (calls_[static_cast<size_t>(m)] > number) {
        fail("worker group: rank " + std::to_string(rank) + " entered collective #" +
             std::to_string(number) + " (" + kind_name(kind) + ") while rank " + std::to_string(m) +
             " is at #" + std::to_string(calls_[static_cast<size_t>(m)]) +
             ": the members called different collectives");
        throw_if_failed();
      }
    if (call_.number != number) {
      call_ = Call{number, kind, count, root, rank};
    } else if (call_.kind != kind || call_.count != count ||
               (kind == Kind::Broadcast && call_.root != root)) {
      fail("worker group: rank " + std::to_string(rank) + " called " + describe(kind, count, root) +
           " as collective #" + std::to_string(number) + " but rank " + std::to_string(call_.rank) +
           " called " + describe(call_.kind, call_.count, call_.root));
      throw_if_failed();
    }
    buffers_[r] = data;
    arrived_[r] = number;
    changed_.notify_all();
    wait_for_arrivals(lock, kind, number);
    lock.unlock();

    // Every member has arrived: the buffers are fixed until everyone has finished.
    if (kind == Kind::AllReduce)
      sum_slice(rank, count);
    else if (rank != root && count > 0)
      std::memcpy(data, buffers_[static_cast<size_t>(root)], count * sizeof(float));

    lock.lock();
    finished_[r] = number;
    changed_.notify_all();
    // No timeout here: every member is in the work above, which does not block.
    changed_.wait(lock, [&] { return all_reached(finished_, number); });
  }

  static std::string describe(Kind kind, size_t count, int root) {
    std::string text = std::string(kind_name(kind)) + " of " + std::to_string(count) + " floats";
    if (kind == Kind::Broadcast) text += " from root " + std::to_string(root);
    return text;
  }

  void wait_for_arrivals(std::unique_lock<std::mutex>& lock, Kind kind, int64_t number) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (;;) {
      // Arrival first: once everyone has arrived the collective goes ahead (see the top).
      if (all_reached(arrived_, number)) return;
      throw_if_failed();
      if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
        if (all_reached(arrived_, number)) return;
        throw_if_failed();
        std::vector<int> missing;
        for (int m = 0; m < members_; ++m)
          if (arrived_[static_cast<size_t>(m)] < number) missing.push_back(m);
        fail("worker group: " + rank_list(missing) + " did not reach " + kind_name(kind) + " #" +
             std::to_string(number) + " within " + std::to_string(timeout_ms_) + " ms");
        throw_if_failed();
      }
    }
  }

  // Elements [begin, end) of slice `rank`, summed in rank order in blocks that stay in cache:
  // sum[i] = ((b0[i] + b1[i]) + b2[i]) + ..., then written to every member's buffer.
  void sum_slice(int rank, size_t count) const {
    const size_t n = static_cast<size_t>(members_);
    const size_t begin = count * static_cast<size_t>(rank) / n;
    const size_t end = count * (static_cast<size_t>(rank) + 1) / n;
    constexpr size_t kBlock = 2048;
    float sum[kBlock];
    for (size_t b = begin; b < end; b += kBlock) {
      const size_t len = std::min(kBlock, end - b);
      std::memcpy(sum, buffers_[0] + b, len * sizeof(float));
      for (size_t m = 1; m < n; ++m) {
        const float* in = buffers_[m] + b;
        for (size_t i = 0; i < len; ++i) sum[i] += in[i];
      }
      for (size_t m = 0; m < n; ++m) std::memcpy(buffers_[m] + b, sum, len * sizeof(float));
    }
  }

  const int members_;
  const int timeout_ms_;
  std::mutex mutex_;
  std::condition_variable changed_;
  // Under mutex_. buffers_ is read without it during the work, between the two barriers.
  std::vector<float*> buffers_;
  std::vector<int64_t> calls_;     // collectives each rank has entered
  std::vector<int64_t> arrived_;   // the last collective each rank has arrived at
  std::vector<int64_t> finished_;  // the last collective each rank has done its work for
  Call call_;
  std::string failure_;  // non-empty: the group is broken, every call throws this
};

}  // namespace

std::unique_ptr<GroupCollective> make_thread_collective(int members, int timeout_ms) {
  if (members < 1)
    throw InputError("worker group: needs at least one member, got " + std::to_string(members));
  if (timeout_ms < 1)
    throw InputError("worker group: timeout must be at least 1 ms, got " +
                     std::to_string(timeout_ms));
  return std::make_unique<ThreadCollective>(members, timeout_ms);
}

}  // namespace tandem
