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
// step() and install() do the same from one calling thread, with a thread per member (tests,
// and callers that keep no threads of their own).
//
// A member whose backend throws (bad batch, CUDA error) aborts the collective with its rank and
// reason before rethrowing, so the others throw GroupError instead of waiting for it; the group
// is then broken (group_collective.h).
//
// This slice stages through host memory: gradients come out with Backend::get_gradients, are
// flattened into one host buffer per member in the model's parameter order and all-reduced
// there, so it needs a collective on host memory (make_thread_collective). The GPU path will
// all-reduce the backends' device gradient buffers directly with make_nccl_collective.
#pragma once

#include <cstdint>
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
  // Throws InputError unless there is one backend per collective member and the collective works
  // on host memory.
  WorkerGroup(const ModelConfig& model, std::vector<Backend*> members, GroupCollective& collective);

  int size() const { return static_cast<int>(members_.size()); }

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

  // One step from the calling thread: batches[r] to rank r (empty: none, as above), each member
  // on its own thread.
  // Returns the summed gradients (the leader's, valid until the next step); `stats` (if given) gets the members' statistics added in rank
  // order. Rethrows a member's own error in preference to the GroupError it caused in the others.
  const std::vector<NamedTensor>& step(const std::vector<DatasetView>& batches,
                                       BatchStats* stats = nullptr);

  // broadcast_parameters with `parameters` as the leader's, a thread per member.
  void install(const Model& parameters);

 private:
  // Runs body(rank) for every rank, rank 0 on the calling thread, and rethrows as step() says.
  template <typename Body>
  void run_members(Body&& body);

  void flatten(int rank, const std::vector<NamedTensor>& tensors);

  ModelConfig config_;
  std::vector<Backend*> members_;
  GroupCollective& collective_;
  Model layout_;  // names and shapes, in order
  int64_t total_ = 0;
  // Per rank, touched only by that rank's thread.
  std::vector<std::vector<float>> flat_;
  std::vector<std::vector<NamedTensor>> gradients_;
  std::vector<Model> models_;
  std::vector<BatchStats> member_stats_;  // step()'s, one per rank
  std::vector<NamedTensor> leader_gradients_;
};

}  // namespace tandem
