// One node's worker group under the parameter servers: each member (a GPU, or a thread on the
// CPU) computes the gradient of its own batch on its own backend, the group sums the gradients
// with an all-reduce, and the leader (rank 0) alone talks to the parameter servers: it pushes the
// summed gradient, pulls the new parameters and broadcasts them to the group.
//
// Gradients are sums over rows (Backend::compute_gradients), so the group's summed gradient is the
// gradient of the union of the members' batches: one push from the node stands for all of them.
//
// Each member's thread calls the member functions with its rank, every member every call, in the
// same order (they meet in the collective's all-reduce and broadcast):
//   reduce_gradients(rank, batch)       every member; then rank 0 reads leader_gradients()
//   broadcast_parameters(rank, model)   every member; rank 0 passes the new parameters
// step() and install() do the same from one calling thread (tests, and callers that keep no
// threads of their own): rank 0 runs on the caller's thread, ranks 1..size()-1 each on a member
// thread of the group's own. Those threads are started once, by the constructor, and sleep on a
// condition variable between calls: a step wakes them, runs rank 0 on the caller's thread and
// waits until every member is done. Starting and joining a thread per member every step, as
// step() once did, cost the caller 20-40 us of CPU per step on a 2-vCPU VM, about the compute of
// a 16-row step of the 784-100-10 model (bench/group_step_bench.cpp, bench/RESULTS.md). The
// destructor stops and joins them.
//
// A member whose backend throws (bad batch, CUDA error) aborts the collective with its rank and
// reason before rethrowing, so the others throw GroupError instead of waiting for it; the group
// is then broken (group_collective.h). step() and install() rethrow that member's error; every
// later step() or install() throws the collective's GroupError ("worker group aborted: rank R:
// ...") at once, from every member, and the caller builds a new group. The member threads
// outlive the error (they are parked again, not lost), and the destructor joins them as usual.
//
// A member that hangs in its backend (a GPU stuck in a kernel or a copy, where the collective's
// timeout does not reach: group_collective.h) is not waited for forever: once rank 0 is done
// with a step or install, step() and install() wait for the others no longer than the
// collective's timeout_ms() (a second when rank 0 failed after waiting that long in the
// collective: the others, released, are back at once unless hung), then throw GroupError naming
// the ranks still out ("worker group:
// rank 2 did not finish its step within 60000 ms of rank 0 ..."), abort the collective, and
// throw that error at once from every later call (abandoned() is then true). The group's own
// state that such a member's thread may still touch (the round's job, the batches' views, its
// buffers) stays in place while the group lives, so a member that comes back late fails in the
// aborted collective and parks; the batches' bytes and the backends are the caller's to keep. A
// caller should end the process instead of destroying the group, the member's backend or its
// batches (the worker role does: cluster_roles.cpp): a call the CUDA runtime cannot abandon may
// return into them, and a hung backend's own destructor would wait for its GPU. The destructor
// gives such a member the timeout once more (1 to 5 s) to come back, and otherwise ends the
// process with std::abort, naming the rank: it can neither join that thread nor free what the
// thread would return into. A hang of rank 0 itself is on the calling thread, and nothing here
// bounds it (the worker's heartbeats report it).
//
// Two ways, chosen by the collective's memory:
//   host (make_thread_collective, CPU or CUDA backends): gradients come out with
//     Backend::get_gradients, are flattened into one host buffer per member in the model's
//     parameter order and all-reduced there; parameters are broadcast the same way and set.
//   device (make_nccl_collective, CUDA backends on the collective's GPUs): nothing leaves the
//     GPUs but the leader's summed gradient. Each member queues its forward and backward pass
//     (Backend::enqueue_gradients) and, layer by layer from the last, queues the all-reduce of
//     that layer's gradients in place in its backend's gradient arena, to start on the GPU as
//     soon as the backward pass has written them: the sums of the later layers run while the
//     earlier layers' backward still computes. The parameters are broadcast from the leader's
//     backend's parameter arena into the others' in place.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "group_collective.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/model.h"

namespace tandem {

class WorkerGroup {
 public:
  // members[r] is rank r's backend (not owned, kept alive by the caller), all built for `model`.
  // Throws InputError unless there is one backend per collective member and, for a collective on
  // device memory, every backend is a GPU backend (Backend::device_buffers) with arenas of one
  // size. Starts the member threads of ranks 1..size()-1.
  WorkerGroup(const ModelConfig& model, std::vector<Backend*> members, GroupCollective& collective);
  ~WorkerGroup();  // stops and joins the member threads (one left behind: above)
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  // A member was left behind, hung in its backend (above): the group can never step again.
  bool abandoned() const { return !abandoned_.empty(); }

  // Member `rank`: compute_gradients over every row of `batch` on its backend, then the group
  // all-reduce of the flattened gradients. Returns this member's own batch statistics. A batch
  // of no rows (a default DatasetView: fewer batches than members at the end of a task) adds
  // zero gradients and zero statistics; the backend is not called.
  BatchStats reduce_gradients(int rank, const DatasetView& batch);

  // The group's summed gradients after the last reduce_gradients, one tensor per parameter in the
  // model's order (what the leader pushes). Rank 0's thread only, until its next call.
  const std::vector<NamedTensor>& leader_gradients() const { return leader_gradients_; }

  // Member `rank`: rank 0 passes the parameters it pulled (`leader_parameters`, ignored on the
  // other ranks, which may pass null); every member's backend ends holding exactly those bits.
  void broadcast_parameters(int rank, const Model* leader_parameters);

  // One step from the calling thread: batches[r] to rank r (empty: none, as above), rank 0 on
  // the calling thread and the others on their member threads. Not reentrant: one step() or
  // install() at a time.
  // Returns the summed gradients (the leader's, valid until the next step); `stats` (if given)
  // gets the members' statistics added in rank order. Rethrows a member's own error in
  // preference to the GroupError it caused in the others.
  const std::vector<NamedTensor>& step(const std::vector<DatasetView>& batches,
                                       BatchStats* stats = nullptr);

  // broadcast_parameters with `parameters` as the leader's, on the member threads as step().
  void install(const Model& parameters);

 private:
  // Runs body(rank) for every rank, rank 0 on the calling thread and the others on their member
  // threads, returns when all are done, and rethrows as step() says; `what` names the round in
  // the error for a member left behind.
  void run_members(const char* what, std::function<void(int)> body);
  void throw_if_abandoned() const;  // the error of a member left behind, if any
  void member_loop(int rank);  // a member thread: wait for a round, run it, report, repeat
  void stop_members();         // wakes the member threads to exit and joins them

  void flatten(int rank, const std::vector<NamedTensor>& tensors);
  // The device way's halves of reduce_gradients and broadcast_parameters.
  BatchStats reduce_on_device(int rank, const DatasetView& batch);
  void broadcast_on_device(int rank, const Model* leader_parameters);

  ModelConfig config_;
  std::vector<Backend*> members_;
  GroupCollective& collective_;
  Model layout_;  // names and shapes, in order
  int64_t total_ = 0;
  // The device way: each member's arenas (the collective's memory is Device); empty otherwise.
  std::vector<Backend::DeviceBuffers> device_;
  // Per rank, touched only by that rank's thread.
  std::vector<std::vector<float>> flat_;
  std::vector<std::vector<NamedTensor>> gradients_;
  std::vector<Model> models_;
  std::vector<BatchStats> member_stats_;  // step()'s, one per rank
  std::vector<DatasetView> round_batches_;  // step()'s batches, for the member threads
  std::vector<NamedTensor> leader_gradients_;

  // The member threads and what they share with the caller, under mutex_. A round is one
  // run_members call: the caller sets job_ and pending_, bumps round_ and wakes them; each
  // member runs job_ once per round_ it sees, stores its error and counts pending_ down; the
  // caller waits for 0. The caller waits for every member before the next round, so no member
  // can miss one, and job_ is replaced only when no member runs it.
  std::mutex mutex_;
  std::condition_variable wake_;  // members: a new round, or stopping_
  std::condition_variable done_;  // the caller: pending_ reached 0
  std::function<void(int)> job_;
  uint64_t round_ = 0;
  int pending_ = 0;  // member threads not done with this round
  bool stopping_ = false;
  std::vector<std::exception_ptr> errors_;  // per rank, of the current round
  std::vector<char> busy_;                  // per rank: a member thread in this round's job_
  // Not empty once a member was left behind: the error every later call throws. The calling
  // thread's alone.
  std::string abandoned_;
  // The destructor's wait for a member left behind: the timeout, within these bounds.
  static constexpr std::chrono::seconds kAbandonedGraceMin{1}, kAbandonedGraceMax{5};
  // How long run_members waits for the members once rank 0 has failed after waiting out the
  // collective's timeout in it.
  static constexpr int kAfterFailureMs = 1000;
  std::vector<std::thread> threads_;        // ranks 1..size()-1
};

}  // namespace tandem
