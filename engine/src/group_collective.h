// The collectives of one node's worker group: the workers (one per GPU, or threads on the CPU)
// sum their gradients with an all-reduce and receive the leader's parameters by a broadcast.
//
// A group has size() members, ranks 0..size()-1. Every member calls every collective, in the
// same order, from its own thread, passing its own rank and buffer; a call returns once the
// collective is complete for that member. The memory the buffers live in depends on the
// implementation (memory_space()):
//   make_thread_collective  host memory: members are threads of this process, each buffer
//                           stays the caller's until the call returns (the others read it).
//   make_nccl_collective    device memory: rank r's buffer must be on devices[r]; the call
//                           returns after the collective has finished on rank r's stream.
//
// Failures never leave a member waiting forever. A member that does not reach a collective
// within timeout_ms of the others makes every waiting member throw GroupError naming the missing
// rank(s): "worker group: rank 2 did not reach all_reduce #17 within 5000 ms" (#17: the group's
// 17th collective, all kinds counted together). A member that fails on its own (a batch it cannot
// read, a CUDA error) calls abort(why) so the others throw GroupError with `why` instead of
// waiting out the timeout. Either way the group is broken from then on: every later call throws
// the same error at once, and the caller builds a new group.
//
// What the timeout cannot cover: a GPU that hangs outside a collective, in a wait of its own
// backend (reading the step's statistics after the sum, synchronising before a broadcast). That
// member's thread stays in the CUDA call, which the CUDA runtime offers no way to abandon; the
// other members either finish the step or time out in their next collective, naming the rank.
// WorkerGroup::step() and install() wait for such a member no longer than timeout_ms() after
// the leader is done, then throw GroupError naming it and leave its thread behind
// (worker_group.h): the worker process says so, naming the rank, and ends.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "tandem/error.h"

namespace tandem {

// A collective that failed: a member missing or late, an abort, a mismatch between members'
// calls, an NCCL or CUDA error on one rank. The text names the rank(s) and the collective.
class GroupError : public Error {
 public:
  using Error::Error;
};

class GroupCollective {
 public:
  enum class Memory { Host, Device };

  virtual ~GroupCollective() = default;

  virtual int size() const = 0;
  // Where the buffers passed to the collectives must be.
  virtual Memory memory() const = 0;
  // How long a member waits for the others in a collective before it gives up on them.
  virtual int timeout_ms() const = 0;

  // In place: every member's `data` ends holding the element-wise sum of all members' `data`.
  // Every member passes the same count. Throws GroupError (see the top of this file);
  // InputError for a rank outside 0..size()-1.
  virtual void all_reduce_sum(int rank, float* data, size_t count) = 0;

  // all_reduce_sum ordered on the GPU instead of the host: the collective starts once `after`
  // (a cudaEvent_t recorded on rank's device, or null: at once) has completed, and the call
  // returns without waiting for it, so a member can queue the sum of its last layer's gradients
  // while its backward pass still computes the earlier layers'. finish(rank) waits for every
  // collective rank has queued and throws as the blocking calls do; rank must not touch those
  // buffers before it returns. A host collective has no events: all_reduce_sum_after is
  // all_reduce_sum (it throws InputError for a non-null `after`) and finish returns at once.
  virtual void all_reduce_sum_after(int rank, float* data, size_t count, void* after);
  virtual void finish(int rank);

  // Every member's `data` ends holding root's `data` (root's is left as it is). Every member
  // passes the same count and root.
  virtual void broadcast(int rank, float* data, size_t count, int root) = 0;

  // Breaks the group: every member waiting in a collective, and every later call, throws
  // GroupError whose text holds `why`. Callable from any thread, more than once (the first
  // reason is kept).
  virtual void abort(const std::string& why) = 0;
};

// Members are threads of this process and buffers are host memory. The sum is taken in rank
// order, ((d0 + d1) + d2) + ..., element by element, so every member gets the same bits whatever
// the timing, and the result equals a single thread's loop over the ranks. The work is shared:
// member r sums (and writes back to every member) the r-th contiguous slice of the buffer.
// Throws InputError unless members >= 1 and timeout_ms >= 1.
std::unique_ptr<GroupCollective> make_thread_collective(int members, int timeout_ms);

// Members are the GPUs `devices` (rank r on devices[r]), one NCCL communicator each from
// ncclCommInitAll and one stream each; the buffers are device memory. ncclAllReduce (ncclSum)
// and ncclBroadcast on float32. A rank's call waits for its stream by polling, so a collective
// that does not complete within timeout_ms (a GPU that hangs, or a member that never called)
// aborts the communicators and throws GroupError naming the rank(s). Throws InputError when this
// build has no NCCL ("this build has no NCCL"), for an empty or repeated device list, and
// GroupError naming the call and device when CUDA or NCCL refuse to start.
std::unique_ptr<GroupCollective> make_nccl_collective(std::vector<int> devices, int timeout_ms);

// Asks NCCL to connect a group's ranks when the group forms rather than in its first collective
// (NCCL_RUNTIME_CONNECT=0, unless the user set it). A program calls it before it starts any
// thread, as the tandem binary's main does: setenv is not safe against getenv in other threads.
// make_nccl_collective sets it too if nobody did, but by then threads may be running. Does
// nothing in a build without NCCL.
void prepare_nccl_environment();

}  // namespace tandem
