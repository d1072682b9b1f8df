// The NCCL collective: a worker group whose members are GPUs of this process, one thread each.
//
// One communicator per device from ncclCommInitAll (single process, several devices) and one
// non-blocking stream per rank. Rank r's thread is the only one that uses comms_[r] and
// streams_[r] (the aborter and the destructor aside), so no NCCL call is made concurrently on one
// communicator: the aborter waits for the rank's call in progress (with_comm) before its abort.
// NCCL needs no group calls here: each rank's collective is issued by its own thread.
//
// Entering: a rank's collective is issued only once every rank has entered it on the host (a
// barrier with the timeout). Otherwise one rank's NCCL kernel could be spinning on its GPU,
// waiting for a peer, while that peer's thread still allocates device memory for its step; a
// cudaMalloc or cudaFree may synchronise every GPU it has peer access to (NVIDIA/nccl#744), and
// the two would wait for each other until the timeout broke the group. The barrier costs a
// wake-up per collective; the GPU-side overlap of all_reduce_sum_after (the sum waits on an
// event, not on the host) is kept. The connections between ranks are made by ncclCommInitAll
// (NCCL_RUNTIME_CONNECT=0, unless the user set it): with NCCL's default of connecting lazily in
// the first collective, that call itself would block on the host until every peer made it, so a
// rank that never comes would hang the others inside NCCL, out of reach of the timeout.
//
// Waiting: a rank's call enqueues its collective and then polls cudaStreamQuery (done?) and
// ncclCommGetAsyncError (a network or peer failure?) until the stream is done, the group has
// failed, or timeout_ms has passed. A timeout in enter() names the ranks that never entered the
// collective (from host-side counters); one after it says the collective hangs on the rank's GPU.
// Either marks the group failed, which every other rank's poll sees; each waiting rank throws at
// once, and one aborter thread aborts every communicator (ncclCommAbort makes NCCL kernels
// waiting for a peer exit). Not the ranks' threads, nor the caller's: the last abort of the
// communicators of one ncclCommInitAll waits for each one's internal stream, which waits behind
// the backend's kernels (the sum is gated on their event), so on a GPU that hangs it never
// returns, and a rank thread stuck there would hang the worker with nothing said. The destructor
// waits for the aborter a bounded time, then ends the process saying why, as a member left in
// its backend does (worker_group.cpp). Every NCCL and CUDA call is checked by the macros below,
// which name the call, the file and line, and the rank and GPU.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "group_collective.h"

// release() finalizes the communicators together; CMake leaves this file out for older NCCL.
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "the NCCL worker group needs NCCL 2.14 or newer (ncclCommFinalize)"
#endif

namespace tandem {

namespace {

[[noreturn]] void throw_group_error(const char* library, const char* call, const char* file,
                                    int line, const std::string& where, int code,
                                    const char* message) {
  throw GroupError("worker group: " + std::string(library) + " error " + std::to_string(code) +
                   " (" + message + ") in " + call + " at " + file + ":" + std::to_string(line) +
                   " on " + where);
}

// Asks NCCL to connect the ranks in ncclCommInitAll rather than in the first collective (see the
// top of this file), unless prepare_nccl_environment did already (the tandem binary's main, before
// any thread); warns once when the user's own setting keeps NCCL connecting in the collective.
// NCCL reads the variable once, at its first initialisation.
void connect_at_init() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("NCCL_RUNTIME_CONNECT") == nullptr) prepare_nccl_environment();
    const char* value = std::getenv("NCCL_RUNTIME_CONNECT");
    if (value != nullptr && std::string(value) != "0")
      std::fprintf(stderr, "tandem: NCCL_RUNTIME_CONNECT=%s: NCCL connects in the first collective, "
                   "where a rank that never comes hangs the others past the group's timeout\n",
                   value);
  });
}

}  // namespace

void prepare_nccl_environment() { ::setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0); }

}  // namespace tandem

// `where` is a std::string expression naming the rank and GPU ("rank 1 (GPU 3)"), evaluated
// only on failure.
#define TANDEM_GROUP_NCCL_CHECK(call, where)                                                   \
  do {                                                                                         \
    const ncclResult_t tandem_nccl_status_ = (call);                                           \
    if (tandem_nccl_status_ != ncclSuccess)                                                    \
      ::tandem::throw_group_error("NCCL", #call, __FILE__, __LINE__, (where),                  \
                                  static_cast<int>(tandem_nccl_status_),                       \
                                  ncclGetErrorString(tandem_nccl_status_));                    \
  } while (0)

#define TANDEM_GROUP_CUDA_CHECK(call, where)                                                   \
  do {                                                                                         \
    const cudaError_t tandem_cuda_status_ = (call);                                            \
    if (tandem_cuda_status_ != cudaSuccess)                                                    \
      ::tandem::throw_group_error("CUDA", #call, __FILE__, __LINE__, (where),                  \
                                  static_cast<int>(tandem_cuda_status_),                       \
                                  cudaGetErrorString(tandem_cuda_status_));                    \
  } while (0)

namespace tandem {

namespace {

class NcclCollective final : public GroupCollective {
 public:
  NcclCollective(std::vector<int> devices, int timeout_ms)
      : devices_(std::move(devices)),
        timeout_ms_(timeout_ms),
        comms_(devices_.size(), nullptr),
        streams_(devices_.size(), nullptr),
        aborted_(devices_.size(), false),
        in_nccl_(devices_.size(), false),
        calls_(devices_.size(), 0),
        gates_(devices_.size()),
        queued_(devices_.size(), 0) {
    const int n = size();
    int available = 0;
    TANDEM_GROUP_CUDA_CHECK(cudaGetDeviceCount(&available), group_text());
    for (const int d : devices_)
      if (d >= available)
        throw InputError("worker group: GPU " + std::to_string(d) + " does not exist (" +
                         std::to_string(available) + " visible)");
    connect_at_init();
    TANDEM_GROUP_NCCL_CHECK(ncclCommInitAll(comms_.data(), n, devices_.data()), group_text());
    try {
      for (int r = 0; r < n; ++r) {
        TANDEM_GROUP_CUDA_CHECK(cudaSetDevice(device(r)), where(r));
        TANDEM_GROUP_CUDA_CHECK(cudaStreamCreateWithFlags(&streams_[static_cast<size_t>(r)],
                                                          cudaStreamNonBlocking),
                                where(r));
      }
    } catch (...) {
      release();
      throw;
    }
  }

  ~NcclCollective() override { release(); }

  NcclCollective(const NcclCollective&) = delete;
  NcclCollective& operator=(const NcclCollective&) = delete;

  int size() const override { return static_cast<int>(devices_.size()); }
  Memory memory() const override { return Memory::Device; }
  int timeout_ms() const override { return timeout_ms_; }

  void all_reduce_sum(int rank, float* data, size_t count) override {
    const int64_t number = enter(rank, "all_reduce", data, count, 0);
    const size_t r = static_cast<size_t>(rank);
    issue(rank, [&] {
      TANDEM_GROUP_NCCL_CHECK(
          ncclAllReduce(data, data, count, ncclFloat, ncclSum, comms_[r], streams_[r]), where(rank));
    });
    wait(rank, "all_reduce", number);
  }

  void all_reduce_sum_after(int rank, float* data, size_t count, void* after) override {
    const int64_t number = enter(rank, "all_reduce", data, count, 0);
    const size_t r = static_cast<size_t>(rank);
    issue(rank, [&] {
      if (after != nullptr)
        TANDEM_GROUP_CUDA_CHECK(
            cudaStreamWaitEvent(streams_[r], static_cast<cudaEvent_t>(after), 0), where(rank));
      TANDEM_GROUP_NCCL_CHECK(
          ncclAllReduce(data, data, count, ncclFloat, ncclSum, comms_[r], streams_[r]), where(rank));
    });
    queued_[r] = number;
    if (after != nullptr) {
      std::lock_guard<std::mutex> lock(mutex_);
      gates_[r].push_back(static_cast<cudaEvent_t>(after));
    }
  }

  void finish(int rank) override {
    GroupCollective::finish(rank);  // the rank check
    const size_t r = static_cast<size_t>(rank);
    if (queued_[r] == 0) return;
    const int64_t number = std::exchange(queued_[r], 0);
    wait(rank, "all_reduce", number);
    std::lock_guard<std::mutex> lock(mutex_);
    gates_[r].clear();
  }

  void broadcast(int rank, float* data, size_t count, int root) override {
    if (root < 0 || root >= size())
      throw InputError("worker group: broadcast root " + std::to_string(root) +
                       " is outside the group's ranks 0.." + std::to_string(size() - 1));
    const int64_t number = enter(rank, "broadcast", data, count, root);
    const size_t r = static_cast<size_t>(rank);
    issue(rank, [&] {
      TANDEM_GROUP_NCCL_CHECK(
          ncclBroadcast(data, data, count, ncclFloat, root, comms_[r], streams_[r]), where(rank));
    });
    wait(rank, "broadcast", number);
  }

  void abort(const std::string& why) override {
    std::lock_guard<std::mutex> lock(mutex_);
    fail("worker group aborted: " + why);
  }

 private:
  struct Call {
    std::string kind;
    size_t count = 0;
    int root = 0;
    int rank = 0;
    int entered = 0;
  };

  int device(int rank) const { return devices_[static_cast<size_t>(rank)]; }

  std::string where(int rank) const {
    return "rank " + std::to_string(rank) + " (GPU " + std::to_string(device(rank)) + ")";
  }

  // NCCL's last error text for rank's communicator ("" when it has none).
  std::string last_error(int rank) const {
    const char* text = ncclGetLastError(comms_[static_cast<size_t>(rank)]);
    return text != nullptr ? text : "";
  }

  std::string group_text() const {
    std::string text = "the group of GPUs";
    for (size_t i = 0; i < devices_.size(); ++i)
      text += (i == 0 ? " " : ", ") + std::to_string(devices_[i]);
    return text;
  }

  void fail(std::string message) {  // mutex_ held
    if (failure_.empty()) failure_ = std::move(message);
    entered_.notify_all();  // ranks waiting in enter() leave with the error
  }

  std::string failure() {
    std::lock_guard<std::mutex> lock(mutex_);
    return failure_;
  }

  // Checks the rank and buffer, counts the call, checks it against the other ranks' call of the
  // same number, and waits until every rank has entered it (see the top of this file). Any
  // problem breaks the group (the others would wait for this rank); a rank that leaves with the
  // group broken aborts its communicator first, so no sum it queued earlier keeps spinning on
  // its GPU for peers that have given up.
  int64_t enter(int rank, const char* kind, const float* data, size_t count, int root) {
    if (rank < 0 || rank >= size())
      throw InputError("worker group: rank " + std::to_string(rank) +
                       " is outside the group's ranks 0.." + std::to_string(size() - 1));
    std::string problem;
    if (count > 0) {
      cudaPointerAttributes attributes{};
      const cudaError_t status = cudaPointerGetAttributes(&attributes, data);
      if (status != cudaSuccess) {
        (void)cudaGetLastError();  // not left for the next launch check to report
        problem = std::string("worker group: cudaPointerGetAttributes failed (") +
                  cudaGetErrorString(status) + ") on " + where(rank);
      } else if ((attributes.type != cudaMemoryTypeDevice &&
                  attributes.type != cudaMemoryTypeManaged) ||
                 attributes.device != device(rank)) {
        problem = "worker group: " + where(rank) + " passed a buffer that is not memory of GPU " +
                  std::to_string(device(rank)) + " to " + kind;
      }
    }
    std::unique_lock<std::mutex> lock(mutex_);
    int64_t number = 0;
    if (failure_.empty()) {
      number = ++calls_[static_cast<size_t>(rank)];
      auto it = pending_.find(number);
      if (it == pending_.end()) {
        it = pending_.emplace(number, Call{kind, count, root, rank, 0}).first;
      } else if (problem.empty() &&
                 (it->second.kind != kind || it->second.count != count ||
                  (it->second.kind == "broadcast" && it->second.root != root))) {
        problem = "worker group: " + where(rank) + " called " + kind + " of " +
                  std::to_string(count) + " floats as collective #" + std::to_string(number) +
                  " but rank " + std::to_string(it->second.rank) + " called " + it->second.kind +
                  " of " + std::to_string(it->second.count) + " floats";
      }
      if (++it->second.entered == size()) {
        pending_.erase(it);
        entered_.notify_all();
      }
      if (!problem.empty()) {
        fail(problem);
      } else {
        const auto deadline =
            std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
        const bool all_in = entered_.wait_until(lock, deadline, [&] {
          return pending_.count(number) == 0 || !failure_.empty();
        });
        if (!all_in) fail(missing_ranks(kind, number));
      }
    }
    const std::string error = failure_;
    lock.unlock();
    if (!error.empty()) {
      request_abort();
      throw GroupError(error);
    }
    return number;
  }

  // "worker group: ranks 1, 2 did not reach all_reduce #7 within 5000 ms", for a collective
  // still pending (some rank has not entered it, so the list is never empty). mutex_ held.
  std::string missing_ranks(const char* kind, int64_t number) const {
    std::vector<int> missing;
    for (int m = 0; m < size(); ++m)
      if (calls_[static_cast<size_t>(m)] < number) missing.push_back(m);
    std::string text = "worker group: rank";
    if (missing.size() > 1) text += "s";
    for (size_t i = 0; i < missing.size(); ++i)
      text += (i == 0 ? " " : ", ") + std::to_string(missing[i]);
    return text + " did not reach " + kind + " #" + std::to_string(number) + " within " +
           std::to_string(timeout_ms_) + " ms";
  }

  // Runs `enqueue` on rank's device; a failure breaks the group and aborts rank's communicator.
  template <typename Enqueue>
  void issue(int rank, Enqueue&& enqueue) {
    try {
      TANDEM_GROUP_CUDA_CHECK(cudaSetDevice(device(rank)), where(rank));
      with_comm(rank, enqueue);
    } catch (const GroupError& e) {
      {
        std::lock_guard<std::mutex> lock(mutex_);
        fail(e.what());
      }
      request_abort();
      throw;
    }
  }

  void wait(int rank, const char* kind, int64_t number) {
    const size_t r = static_cast<size_t>(rank);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms_);
    for (int polls = 0;; ++polls) {
      std::string problem;
      const cudaError_t status = cudaStreamQuery(streams_[r]);
      if (status == cudaSuccess) {
        // Done, unless the group failed meanwhile: the aborter's abort makes a waiting NCCL
        // kernel exit early, and its stream then reads as done with a partial sum.
        std::lock_guard<std::mutex> lock(mutex_);
        if (failure_.empty()) return;
        problem = failure_;
      } else if (status != cudaErrorNotReady) {
        problem = "worker group: " + std::string(kind) + " #" + std::to_string(number) +
                  " failed on " + where(rank) + ": CUDA error " +
                  std::to_string(static_cast<int>(status)) + " (" + cudaGetErrorString(status) +
                  ") from cudaStreamQuery";
      } else {
        ncclResult_t async = ncclSuccess;
        std::string last;
        const ncclResult_t got = with_comm(rank, [&] {
          const ncclResult_t result = ncclCommGetAsyncError(comms_[r], &async);
          if (result == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
            last = last_error(rank);
          return result;
        });
        if (got != ncclSuccess) {
          problem = "worker group: NCCL error " + std::to_string(static_cast<int>(got)) + " (" +
                    ncclGetErrorString(got) + ") in ncclCommGetAsyncError on " + where(rank);
        } else if (async != ncclSuccess && async != ncclInProgress) {
          problem = "worker group: " + std::string(kind) + " #" + std::to_string(number) +
                    " failed on " + where(rank) + ": NCCL error " +
                    std::to_string(static_cast<int>(async)) + " (" + ncclGetErrorString(async) +
                    "): " + last;
        }
      }
      if (problem.empty()) {
        std::unique_lock<std::mutex> lock(mutex_);
        if (!failure_.empty()) {
          problem = failure_;
        } else if (std::chrono::steady_clock::now() >= deadline) {
          // Every rank entered it before it was issued (enter), so it is a GPU or the link; but
          // not necessarily this rank's GPU: a collective waits for its peers, so a hung GPU
          // holds every rank's. The gates say whose backward pass has not finished; queried
          // without the lock, which every rank and the aborter need (a CUDA call may wait).
          const std::vector<std::vector<cudaEvent_t>> gates = gates_;
          lock.unlock();
          const std::string hung = ranks_behind(gates);
          lock.lock();
          problem = !failure_.empty() ? failure_ :  // (another rank's, meanwhile)
                    "worker group: " + std::string(kind) + " #" + std::to_string(number) +
                    " did not complete on " + where(rank) + " within " +
                    std::to_string(timeout_ms_) + " ms (every rank reached it: " +
                    (hung.empty() ? "a GPU or link of the group hangs, this rank's or one it "
                                    "waits for"
                                  : "the backward pass has not finished on " + hung +
                                        ", whose kernels hang; the others wait for it") +
                    ")";
          fail(problem);
        }
      } else {
        std::lock_guard<std::mutex> lock(mutex_);
        fail(problem);  // (kept only if first)
      }
      if (!problem.empty()) {
        request_abort();
        throw GroupError(problem);
      }
      // Spin briefly (a collective of a few MB takes tens of microseconds), then back off.
      if (polls < 200)
        std::this_thread::yield();
      else
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

  // Runs `call`, which uses comms_[rank], unless the group has failed (GroupError then). The
  // aborter frees a communicator with its abort: it waits for a call in progress on it first (a
  // bounded time), and once it has marked one aborted no call starts on it.
  template <typename Call>
  auto with_comm(int rank, Call&& call) -> decltype(call()) {
    const size_t r = static_cast<size_t>(rank);
    std::string failed;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!failure_.empty()) failed = failure_;
      else if (aborted_[r]) failed = "worker group: " + where(rank) + " was aborted";
      else in_nccl_[r] = true;
    }
    if (!failed.empty()) {
      request_abort();  // (started already, unless the failure came from abort(why))
      throw GroupError(failed);
    }
    struct Leave {
      NcclCollective* self;
      size_t r;
      ~Leave() {
        {
          std::lock_guard<std::mutex> lock(self->mutex_);
          self->in_nccl_[r] = false;
        }
        self->left_nccl_.notify_all();
      }
    } leave{this, r};
    return call();
  }

  // "rank 1 (GPU 3)": the ranks whose sum still waits for one of `gates` (a copy of gates_: the
  // backend's events after each layer's gradients): their own GPU has not finished the backward
  // pass, so the hang is theirs, not the link's or a peer's. Empty when none (or the events
  // cannot say).
  std::string ranks_behind(const std::vector<std::vector<cudaEvent_t>>& gates) const {
    std::string out;
    for (int m = 0; m < size(); ++m)
      for (cudaEvent_t gate : gates[static_cast<size_t>(m)])
        if (cudaEventQuery(gate) == cudaErrorNotReady) {
          out += (out.empty() ? "" : ", ") + where(m);
          break;
        }
    cudaGetLastError();  // a query's error is not sticky; cleared so later calls start clean
    return out;
  }

  // The group failed: has the aborter thread abort every communicator not aborted yet (started
  // on the first request; one pass over them all). Returns at once.
  void request_abort() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (aborter_.joinable()) return;
    aborter_ = std::thread([this] {
      for (int r = 0; r < size(); ++r) {
        const size_t i = static_cast<size_t>(r);
        {
          std::unique_lock<std::mutex> guard(mutex_);
          if (aborted_[i] || comms_[i] == nullptr) continue;
          // Not while the rank's thread is inside an NCCL call on it (the abort frees it); one
          // that stays in longer than the timeout is stuck there, and the abort is what frees it.
          left_nccl_.wait_for(guard, std::chrono::milliseconds(timeout_ms_),
                              [&] { return !in_nccl_[i]; });
          aborted_[i] = true;
          aborting_ = r;
        }
        const ncclResult_t status = ncclCommAbort(comms_[i]);
        if (status != ncclSuccess)
          std::fprintf(stderr, "tandem: ncclCommAbort failed on %s: %s\n", where(r).c_str(),
                       ncclGetErrorString(status));
      }
      {
        std::lock_guard<std::mutex> guard(mutex_);
        aborts_done_ = true;
      }
      aborts_ended_.notify_all();
    });
  }

  // Waits for the aborter thread (when one was started); ends the process, saying why, when it
  // does not come back within the grace: NCCL's abort waits for a GPU that hangs.
  void join_aborter() noexcept {
    std::unique_lock<std::mutex> lock(mutex_);
    if (!aborter_.joinable()) return;
    const auto grace = std::chrono::milliseconds(std::max(timeout_ms_, 10'000));
    if (!aborts_ended_.wait_for(lock, grace, [&] { return aborts_done_; })) {
      std::fprintf(stderr,
                   "tandem: the worker group failed (%s), and NCCL's abort of its communicator on "
                   "%s did not return within %lld ms: a GPU of the group hangs, and its kernels "
                   "can neither be waited for nor left running; the process ends\n",
                   failure_.c_str(), where(aborting_).c_str(),
                   static_cast<long long>(grace.count()));
      std::fflush(stderr);
      std::abort();
    }
    lock.unlock();
    aborter_.join();
  }

  // Destroys the communicators (aborting them if the group failed: a destroy could wait for
  // a collective that never completes) and the streams; logs failures.
  void release() noexcept {
    bool failed = !failure().empty();
    if (!failed) {
      // One thread holds every rank's communicator, and destroying one may wait in a barrier for
      // the others' destroys: finalize them all in one group first (as NCCL's own example for
      // several devices in one process does), then each destroy finds the others done.
      ncclResult_t status = ncclGroupStart();
      for (size_t i = 0; i < comms_.size(); ++i)
        if (status == ncclSuccess && comms_[i] != nullptr && !aborted_[i])
          status = ncclCommFinalize(comms_[i]);
      const ncclResult_t ended = ncclGroupEnd();
      if (status == ncclSuccess) status = ended;
      if (status != ncclSuccess) {
        std::fprintf(stderr, "tandem: ncclCommFinalize failed on the worker group: %s; aborting "
                     "its communicators instead\n", ncclGetErrorString(status));
        failed = true;
      }
    }
    if (failed) {
      request_abort();  // every communicator not aborted yet (those of ranks that never came)
      join_aborter();
    }
    for (int r = 0; r < size(); ++r) {
      const size_t i = static_cast<size_t>(r);
      if (comms_[i] != nullptr) {
        if (!failed && !aborted_[i]) {
          const ncclResult_t status = ncclCommDestroy(comms_[i]);
          if (status != ncclSuccess)
            std::fprintf(stderr, "tandem: ncclCommDestroy failed on %s: %s\n",
                         where(r).c_str(), ncclGetErrorString(status));
        }
        comms_[i] = nullptr;
      }
      if (streams_[i] != nullptr) {
        cudaSetDevice(device(r));
        const cudaError_t status = cudaStreamDestroy(streams_[i]);
        if (status != cudaSuccess)
          std::fprintf(stderr, "tandem: cudaStreamDestroy failed on %s: %s\n", where(r).c_str(),
                       cudaGetErrorString(status));
        streams_[i] = nullptr;
      }
    }
  }

  const std::vector<int> devices_;
  const int timeout_ms_;
  std::vector<ncclComm_t> comms_;
  std::vector<cudaStream_t> streams_;
  std::mutex mutex_;
  std::condition_variable entered_;  // a collective's last rank entered, or the group failed
  // Under mutex_.
  std::vector<bool> aborted_;
  std::vector<bool> in_nccl_;              // the rank's thread is in an NCCL call (with_comm)
  std::condition_variable left_nccl_;      // ... and has left it
  std::thread aborter_;                    // started by the first request_abort
  std::condition_variable aborts_ended_;   // ... and its pass over the communicators ended
  bool aborts_done_ = false;
  int aborting_ = 0;                       // the rank whose communicator it aborts
  std::vector<int64_t> calls_;       // collectives each rank has entered
  // Per rank, the events its queued sums wait on (all_reduce_sum_after), until finish().
  std::vector<std::vector<cudaEvent_t>> gates_;
  std::map<int64_t, Call> pending_;  // collectives some but not all ranks have entered
  std::string failure_;              // non-empty: the group is broken, every call throws this
  // Per rank, touched only by its own thread: the number of the last collective queued by
  // all_reduce_sum_after that finish() has not waited for yet (0: none).
  std::vector<int64_t> queued_;
};

}  // namespace

std::unique_ptr<GroupCollective> make_nccl_collective(std::vector<int> devices, int timeout_ms) {
  if (devices.empty()) throw InputError("worker group: needs at least one GPU");
  if (timeout_ms < 1)
    throw InputError("worker group: timeout must be at least 1 ms, got " +
                     std::to_string(timeout_ms));
  const std::set<int> unique(devices.begin(), devices.end());
  if (unique.size() != devices.size() || *unique.begin() < 0)
    throw InputError("worker group: the GPUs must be distinct device numbers >= 0");
  return std::make_unique<NcclCollective>(std::move(devices), timeout_ms);
}

}  // namespace tandem
