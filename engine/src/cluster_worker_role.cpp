// The worker role: its batches (a task at a time from the coordinator, streamed from the store,
// or blocks fed from Python), trained a step at a time by its WorkerTrainer (worker_trainer.h),
// which pulls the parameters and pushes the gradients, alone or as the leader of a group of
// members (worker_group.h).
#include <algorithm>
#include <cstring>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "backend.h"
#include "chunk_manager.h"
#include "cluster_role_support.h"
#include "dataset_store.h"
#include "pixels_finite.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "worker_status.h"
#include "worker_trainer.h"

namespace tandem {

using namespace roles;

namespace {

// Closes a worker's feed (when it has one) however the worker leaves: an error before or while
// training, or training over before it began. A feeder waiting for room must never wait on a
// worker that is gone, and the blocks still queued are released. The first reason given stays.
class FeedCloser {
 public:
  FeedCloser(std::shared_ptr<FeedQueue> feed, std::string who)
      : feed_(std::move(feed)), who_(std::move(who)) {}
  ~FeedCloser() {
    close(std::uncaught_exceptions() > 0 ? " stopped on an error" : " has stopped");
  }
  FeedCloser(const FeedCloser&) = delete;
  FeedCloser& operator=(const FeedCloser&) = delete;
  void name(std::string who) { who_ = std::move(who); }
  void close(const std::string& how) {
    if (feed_) feed_->close(who_ + how);
  }

 private:
  std::shared_ptr<FeedQueue> feed_;
  std::string who_;
};

// `batch` copied into `into` (reused: reallocated only when too small or of another shape);
// returns the copy's view.
DatasetView copy_batch(const DatasetView& batch, Dataset& into) {
  if (into.rows() < batch.rows || into.features() != batch.features ||
      into.pixel_type() != batch.pixel_type || into.num_classes() != std::max(batch.num_classes, 1))
    into = Dataset(batch.pixel_type, batch.rows, batch.features, std::max(batch.num_classes, 1));
  std::memcpy(into.pixel_data(), batch.pixels,
              size_t(batch.rows) * size_t(batch.features) * batch.pixel_bytes());
  if (batch.labels != nullptr) std::memcpy(into.label_data(), batch.labels, size_t(batch.rows));
  DatasetView view = into.view().slice(0, batch.rows);
  view.num_classes = batch.num_classes;
  if (batch.labels == nullptr) view.labels = nullptr;
  return view;
}

// The stream of the store's training batches, checked against the model.
std::unique_ptr<ChunkManager> open_stream(const RoleOptions& o, const RoleRegistration& r) {
  const RunSettings& s = r.settings;
  const DatasetStore store = DatasetStore::open(s.data);
  ChunkManagerOptions cm;
  cm.batch_rows = s.batch;
  cm.shuffle = s.shuffle;
  cm.seed = s.seed;
  cm.readers = s.readers;
  cm.assemblers = s.assemblers;
  cm.memory_budget = static_cast<size_t>(s.memory_budget_mib) << 20;
  // Page-locked for the GPU the worker's backend uses (its first, in a group), so that no
  // context is made on GPU 0 for a worker given others; plain memory for a CPU backend.
  cm.pin_for_device = !o.gpus.empty()                              ? o.gpus[0]
                      : parse_backend(s.backend) == BackendKind::Cpu ? -1
                                                                     : 0;
  auto stream = std::make_unique<ChunkManager>(store.train, store.num_classes, cm);
  if (stream->features() != s.model.inputs() || store.num_classes != int(s.model.classes()))
    throw InputError(r.name + ": the store " + s.data + " has " +
                     std::to_string(stream->features()) + " features and " +
                     std::to_string(store.num_classes) + " classes, the model is " +
                     s.model.describe());
  return stream;
}

// A fed block's rows fit the model and their labels name its classes.
void check_fed_block(const std::string& worker, const ModelConfig& model, const DatasetView& rows) {
  if (rows.labels == nullptr) throw InputError(worker + ": a fed block has no labels");
  for (int64_t i = 0; i < rows.rows; ++i)
    if (rows.labels[i] >= model.classes())
      throw InputError(worker + ": a fed block has label " + std::to_string(int(rows.labels[i])) +
                       " at row " + std::to_string(i) + "; the model has " +
                       std::to_string(model.classes()) + " classes");
  try {
    check_model_data(model, rows, true);
  } catch (const InputError& e) {
    throw InputError(worker + ": a fed block: " + e.what());
  }
  // A NaN or infinite float32 pixel: trained on, it made the gradient NaN, and the server's
  // refusal of that gradient ("training diverged?") failed the worker and the run.
  check_pixels_finite(rows, 0, worker + ": a fed block",
                      "training on it would make the parameters NaN");
}

// What the training loops share.
struct Worker {
  const RoleOptions& o;
  CoordinatorLink& link;
  const RoleRegistration& r;
  WorkerStatus& status;
  WorkerTrainer& trainer;
};

// A fed block cut into batches of settings.batch rows, up to one per member a step (the block
// outlives the step: no copies); its last batch and its last step may be short. False when
// training ended.
bool train_block(const Worker& w, const DatasetView& rows, std::vector<DatasetView>& batches) {
  const int64_t batch = w.r.settings.batch;
  for (int64_t begin = 0; begin < rows.rows;) {
    if (training_over(w.link.phase())) return false;
    int count = 0;
    for (; count < w.trainer.members() && begin < rows.rows; ++count, begin += batch)
      batches[size_t(count)] = rows.slice(begin, std::min(rows.rows, begin + batch));
    if (!w.trainer.step(batches, count)) return false;
  }
  return true;
}

// Fed blocks, in the order given: whoever feeds chooses the order, as the seed's queue does.
void train_fed(const Worker& w) {
  FeedQueue& feed = *w.o.feed;
  // From now on a block that does not fit the model is refused to its feeder, not taken: taken,
  // it failed the whole run (and tandem.dask.stop returned no model).
  feed.check_blocks_with(
      [worker = w.r.name, model = w.r.settings.model](const DatasetView& rows) {
        check_fed_block(worker, model, rows);
      });
  std::vector<DatasetView> batches(size_t(w.trainer.members()));
  try {
    while (!training_over(w.link.phase())) {
      check_coordinator(w.link, w.o, w.r.name);
      w.status.queue_depth = int(feed.depth());
      const std::optional<FedBlock> block = feed.pop(100);
      if (!block) {
        // Closed and empty: the feeder said it has no more (end_input), and what it queued is
        // trained. The worker leaves (it would otherwise poll an empty, closed queue at full
        // speed until the run ended).
        if (feed.closed() && feed.depth() == 0) break;  // (no push after the close: truly empty)
        w.trainer.rest();
        continue;
      }
      // (Again for a block that passed it when pushed: one queued before it was set did not.)
      check_fed_block(w.r.name, w.r.settings.model, block->rows);
      if (!train_block(w, block->rows, batches)) break;
    }
  } catch (...) {
    // Now, not once the role has unwound: a feeder waiting for room must not wait for the
    // backends' teardown.
    feed.close(w.r.name + " stopped on an error");
    throw;
  }
  feed.close(w.r.name + " has stopped: training is over");
}

// One task's batches from the stream, up to one per member a step, in the stream's order.
// next()'s view is valid only until the next call, so every batch of a step but its last is
// copied into its member's buffer (the last one is used in place: next() is not called again
// before the step is done). True once they are all trained, false when training ended.
bool train_task(const Worker& w, ChunkManager& stream, std::vector<DatasetView>& batches,
                std::vector<Dataset>& copies) {
  const int members = w.trainer.members();
  DatasetView batch;
  for (;;) {
    if (training_over(w.link.phase())) return false;
    int count = 0;
    bool more = true;
    while (count < members && (more = stream.next(batch))) {
      batches[size_t(count)] =
          count + 1 < members ? copy_batch(batch, copies[size_t(count)]) : batch;
      ++count;
    }
    if (count == 0) return true;
    w.status.queue_depth = int(stream.ready_batches());
    if (!w.trainer.step(batches, count)) return false;
    if (!more) return true;
  }
}

// Tasks from the coordinator (a run of an epoch's batches each), each reported finished with
// the next request, until it says stop or training ends.
void train_tasks(const Worker& w, ChunkManager& stream) {
  std::vector<DatasetView> batches(size_t(w.trainer.members()));
  std::vector<Dataset> copies(batches.size());
  nlohmann::json finished = nullptr;
  bool idled = false;
  for (;;) {
    check_coordinator(w.link, w.o, w.r.name);
    nlohmann::json request{{"type", "work"}, {"name", w.r.name}};
    if (!finished.is_null()) request["finished"] = finished;
    const WorkReply reply = read_work_reply(w.link.request(request));
    finished = nullptr;
    if (reply.stop) break;
    if (!reply.has_task) {
      // No batch for now (the others finish the epoch): a sync step need not wait for this
      // worker's gradient, nor a bounded-staleness reply for its clock. Advisory: a server that
      // misses it waits as it would have. Said at every poll, not once: a server counts an idle
      // worker again after each sync step it applies (so that one back at work is waited for),
      // and this worker cannot see when that happens; an empty one-way message per poll (50
      // ms) costs next to nothing.
      if (w.r.settings.ps_mode != "async") w.trainer.idle();
      idled = true;
      w.status.idle = true;
      w.link.wait_phase_change(w.link.phase(), reply.wait_ms);
      continue;
    }
    // Sync servers stepped without this worker while it idled: its first gradient, computed on
    // the parameters it holds, would be dropped as stale (a batch not trained).
    if (idled && w.r.settings.ps_mode == "sync" && !w.trainer.refresh()) break;
    idled = false;
    w.status.idle = false;
    w.status.done = 0;
    w.status.task = reply.task_id;
    stream.start_epoch(reply.epoch, reply.batches);
    if (!train_task(w, stream, batches, copies)) break;
    // The last batch's exchange answered (settings.overlap) before the task is reported
    // finished: a batch the coordinator counts as done has its gradient at the servers.
    w.trainer.finish();
    finished = reply.task_id;
  }
  stream.cancel();
}

// The role itself; run_worker_role wraps it (run_cancellable).
void worker_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  FeedCloser feed_closer(o.feed, o.name.empty() ? "the worker" : o.name);
  CoordinatorLink link(o.coordinator, rc.context, o.coordinator_lost_ms, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "worker");
  feed_closer.name(r.name);
  reporting_failure(link, r.name, [&] {
    auto status = std::make_shared<WorkerStatus>();
    link.start_heartbeats(r.name, WorkerHeartbeat(status, r.settings.step_timeout_s, r.name),
                          o.heartbeat_ms);
    const std::vector<std::string> servers = wait_for_cluster(link, o, r.name);
    if (servers.empty()) {
      feed_closer.close(" has stopped: training ended before it began");
      return end_role(link, r.name);
    }
    const RunSettings& s = r.settings;
    if (s.fed && !o.feed)
      throw InputError(r.name + ": this run trains on fed batches, and this worker was started "
                       "without a feed (start it from the Python package: tandem.WorkerRole)");
    // A feed to a worker of a run that trains on its store would be taken and never trained on:
    // closed at once, so that feeding it says why.
    if (!s.fed)
      feed_closer.close(" trains on the run's data store (" + s.data + "), not on fed blocks: "
                        "start the run with the setting 'fed': True to train on what is fed");
    // The stream first: no backend is started for a store that does not fit the model.
    const std::unique_ptr<ChunkManager> stream = s.fed ? nullptr : open_stream(o, r);
    WorkerTrainer trainer(o, rc.context, link, r, *status, servers);
    if (!trainer.start()) {
      feed_closer.close(" has stopped: training ended before it began");
      return end_role(link, r.name);
    }
    const Worker w{o, link, r, *status, trainer};
    if (s.fed) train_fed(w);
    else train_tasks(w, *stream);
    trainer.finish();  // the last gradient, applied (or lost)
    nlohmann::json counters = status->counters();
    counters["queue_depth"] = 0;
    counters["idle"] = false;  // (it has left: no longer waiting for a batch)
    end_role(link, r.name, counters);
  });
}

}  // namespace

void run_worker_role(const RoleOptions& o) { run_cancellable(o, worker_role); }

}  // namespace tandem
