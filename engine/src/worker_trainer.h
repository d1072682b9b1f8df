// A worker's training steps: the backends of its group's members (a plain worker is a group of
// one), the step's gradient pushed to the parameter servers and their parameters installed, and
// the counts of that in the worker's status. The worker role (cluster_worker_role.cpp) chooses
// the batches. Internal to the engine.
#pragma once

#include <zmq.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cluster_role_support.h"
#include "ps_client.h"
#include "tandem/dataset.h"
#include "tandem/model.h"
#include "worker_status.h"

namespace tandem {
class Backend;
class GroupCollective;
class WorkerGroup;
}  // namespace tandem

namespace tandem::roles {

class WorkerTrainer {
 public:
  // Starts the members' backends (on o.gpus when given), the group's collective when there is
  // more than one member, and the servers' client. Throws InputError naming the worker.
  WorkerTrainer(const RoleOptions& o, zmq::context_t& context, CoordinatorLink& link,
                const RoleRegistration& r, WorkerStatus& status,
                const std::vector<std::string>& servers);
  ~WorkerTrainer();
  WorkerTrainer(const WorkerTrainer&) = delete;
  WorkerTrainer& operator=(const WorkerTrainer&) = delete;

  int members() const { return int(backends_.size()); }

  // The first parameters, pulled (the chief sets them) and installed in every member; false
  // when training ended before they came.
  bool start();

  // One step: batches[m] to member m, the first `count` (1 to members()) of them batches; the
  // others are emptied (those members add zeros). The gradient, a group's sum, is pushed; false
  // when training ended while the servers were away.
  bool step(std::vector<DatasetView>& batches, int count);

  void rest();  // no batch for now: the backends may give back what they hold for steps

  // Tells the servers this worker has no batch for now. Advisory: not an error when it fails.
  void idle();

  // The exchange still in flight (settings.overlap), waited for and counted.
  void finish();

  // Back at work after idling (sync mode): the servers stepped without this worker, so a
  // gradient computed on the parameters it holds would be dropped as stale. Finishes the
  // exchange in flight, then pulls and installs the current parameters; false when training
  // ended meanwhile.
  bool refresh();

 private:
  // Stale: a sync server answered, but dropped the gradient (computed on an older version).
  enum class Exchanged { Applied, Stale, Lost, Ended };
  struct Pushed {
    int64_t batches = 0, rows = 0;
  };

  bool train_batch(const DatasetView& batch);
  bool push_gradients(int64_t batches, int64_t rows);
  // run() waits for the exchange and installs its parameters; it returns whether a server
  // dropped the gradient as stale.
  Exchanged exchange(const std::function<bool()>& run);
  Exchanged recover(const char* what);
  void tally(Exchanged outcome, Pushed pushed);
  void install();
  bool wait_and_install(PsClient::Handle& handle);  // whether a server dropped it as stale
  template <typename Call>
  void in_group(const Call& call);

  const RoleOptions& o_;
  CoordinatorLink& link_;
  const RoleRegistration& r_;
  const RunSettings& s_;
  WorkerStatus& status_;
  std::vector<std::unique_ptr<Backend>> backends_;  // backends_[0]: the leader's
  std::unique_ptr<GroupCollective> collective_;
  std::unique_ptr<WorkerGroup> group_;  // null for a plain worker
  PsClient client_;
  Model model_;  // the parameters last pulled into it (see recover)
  // A step's parameters as they arrived (wait_in_place): a plain worker's backend copies them
  // straight from the received frames; a group's leader broadcasts them from model_.
  ReceivedParameters received_;
  // The step's gradients, pushed zero-copy: ZeroMQ reads them in place after push_pull returns
  // (and, with overlap, while the next gradient is computed), so each step fills a buffer from
  // a pool that hands out only buffers no send holds any more.
  transport::HeldPool<std::vector<NamedTensor>> gradient_buffers_;
  std::shared_ptr<PsClient::GradientBuffer> gradients_;
  // With settings.overlap, the push_pull of batch k is answered while batch k+1's gradient is
  // computed (on parameters one exchange older): communication hidden behind compute.
  std::optional<PsClient::Handle> inflight_;
  Pushed inflight_pushed_;  // what the exchange in flight carries
};

}  // namespace tandem::roles
