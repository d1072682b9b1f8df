// The worker role: pulls the parameters, trains on its batches (a task at a time from the
// coordinator, streamed from the store, or blocks fed from Python) and pushes the gradients;
// alone or as the leader of a group of members (worker_group.h).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <set>

#include "backend.h"
#include "chunk_manager.h"
#include "cluster_role_support.h"
#include "dataset_store.h"
#include "group_collective.h"
#include "tandem/error.h"
#include "tandem/trainer.h"
#include "worker_group.h"

namespace tandem {

using nlohmann::json;
using Clock = std::chrono::steady_clock;
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

// A group's members are threads of this process stepped together by WorkerGroup::step; one
// that fails aborts the others at once, so this bound only ends a member stuck in its backend.
// It runs from the first member's arrival, which may be a member with no batch (the end of a
// task) while the others compute a whole step: at least a minute, and no less than the run's
// step timeout, which already says how long a step may take.
int group_timeout_ms(const RunSettings& s) {
  return static_cast<int>(std::min(3.6e6, std::max(60.0, s.step_timeout_s) * 1000.0));
}

// The size of a worker's group: the GPUs it was given, or the settings' worker_group.
int group_members(const RoleOptions& o, const RunSettings& s, const std::string& who) {
  if (o.gpus.empty()) return s.worker_group;
  if (s.backend == "cpu")
    throw InputError(who + ": --gpus needs a run on the cuda or auto backend; this run's is cpu");
  std::set<int> seen;
  for (const int d : o.gpus)
    if (d < 0 || !seen.insert(d).second)
      throw InputError(who + ": --gpus lists GPU " + std::to_string(d) +
                       (d < 0 ? "; GPUs are numbered from 0" : " twice"));
  return int(o.gpus.size());
}

// Member m's backend: CUDA on gpus[m] when GPUs are given; otherwise the run's backend (a CUDA
// one on device m), with worker_threads threads on the CPU.
std::unique_ptr<Backend> make_member_backend(const RoleOptions& o, const RunSettings& s, int m) {
  if (!o.gpus.empty())
    return make_backend(BackendKind::Cuda, s.model, s.optimizer, s.worker_threads,
                        parse_precision(s.precision), o.gpus[size_t(m)]);
  return make_backend(parse_backend(s.backend), s.model, s.optimizer, s.worker_threads,
                      parse_precision(s.precision), m);
}

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


// The role itself; run_worker_role wraps it (run_cancellable).
void worker_role(const RoleOptions& o) {
  RoleContext rc(o.context);
  FeedCloser feed_closer(o.feed, o.name.empty() ? "the worker" : o.name);
  CoordinatorLink link(o.coordinator, rc.context, 10000, o.coordinator_curve);
  link.set_cancel(o.cancel);
  const RoleRegistration r = register_role(link, o, "worker");
  feed_closer.name(r.name);
  // What the heartbeats carry; written by this thread, read by the heartbeat thread.
  struct Status {
    // batches_done: batches whose gradients the servers applied; gradients_lost: batches whose
    // gradients a server never answered (it died, or restarted). `done` counts both: the task's
    // progress, batches this worker will not train again.
    std::atomic<int64_t> steps{0}, samples{0}, batches_done{0}, gradients_lost{0}, task{0}, done{0};
    std::atomic<int> queue_depth{0};
    // Since when the backend has been in a call (steady-clock ns; 0: in none), and which: the
    // heartbeats report a call older than the step timeout (RunSettings::step_timeout_s).
    std::atomic<int64_t> busy_since_ns{0};
    std::atomic<const char*> busy_in{""};
    std::atomic<bool> stall_said{false};
  };
  auto status = std::make_shared<Status>();
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
  };
  auto last = std::make_shared<std::pair<Clock::time_point, int64_t>>(Clock::now(), 0);
  const double step_timeout_s = r.settings.step_timeout_s;
  link.start_heartbeats(r.name, [status, last, now_ns, step_timeout_s, name = r.name] {
    const auto now = Clock::now();
    const int64_t samples = status->samples.load();
    const double dt = std::chrono::duration<double>(now - last->first).count();
    const double rate = dt > 0 ? double(samples - last->second) / dt : 0.0;
    *last = {now, samples};
    json beat{{"steps", status->steps.load()}, {"samples", samples},
              {"samples_per_s", rate}, {"batches_done", status->batches_done.load()},
              {"gradients_lost", status->gradients_lost.load()},
              {"task", status->task.load()}, {"done", status->done.load()},
              {"queue_depth", status->queue_depth.load()}};
    const int64_t since = status->busy_since_ns.load();
    const double busy_s = since != 0 ? double(now_ns() - since) / 1e9 : 0.0;
    if (step_timeout_s > 0 && busy_s > step_timeout_s) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "its backend has not returned from %s for %.3g s (step timeout %g s): a hung "
                    "GPU?", status->busy_in.load(), busy_s, step_timeout_s);
      beat["stalled"] = text;
      if (!status->stall_said.exchange(true)) std::fprintf(stderr, "%s: %s\n", name.c_str(), text);
    } else if (since == 0) {
      status->stall_said = false;  // returned: a later stall is said again
    }
    return beat;
  }, o.heartbeat_ms);
  // Marks the backend as in a call, for the heartbeats' stall check. A call that ends in an
  // exception leaves the mark: the role is on its way out, and what it still does (a CUDA
  // backend's destructor waits for its streams, which a hung GPU never finishes) stays under
  // the check, so the coordinator hears of the stall and hands the task to another worker
  // (the link outlives the backends) instead of taking the worker for a healthy one.
  struct InBackend {
    InBackend(Status& s, const char* what, int64_t now)
        : status(s), exceptions(std::uncaught_exceptions()) {
      status.busy_in = what;
      status.busy_since_ns = now;
    }
    ~InBackend() {
      if (std::uncaught_exceptions() == exceptions) status.busy_since_ns = 0;
    }
    InBackend(const InBackend&) = delete;
    InBackend& operator=(const InBackend&) = delete;
    Status& status;
    const int exceptions;
  };

  const std::vector<std::string> servers = wait_for_cluster(link, o, r.name);
  if (servers.empty()) {
    feed_closer.close(" has stopped: training ended before it began");
    return say_goodbye(link, r.name);
  }
  const RunSettings& s = r.settings;
  if (s.fed && !o.feed)
    throw InputError(r.name + ": this run trains on fed batches, and this worker was started "
                     "without a feed (start it from the Python package: tandem.WorkerRole)");
  std::unique_ptr<ChunkManager> stream;
  if (!s.fed) {
    const DatasetStore store = DatasetStore::open(s.data);
    ChunkManagerOptions cm;
    cm.batch_rows = s.batch;
    cm.shuffle = s.shuffle;
    cm.seed = s.seed;
    cm.readers = s.readers;
    cm.assemblers = s.assemblers;
    // Page-locked for the GPU the worker's backend uses (its first, in a group), so that no
    // context is made on GPU 0 for a worker given others; plain memory for a CPU backend.
    cm.pin_for_device = !o.gpus.empty()                              ? o.gpus[0]
                        : parse_backend(s.backend) == BackendKind::Cpu ? -1
                                                                       : 0;
    stream = std::make_unique<ChunkManager>(store.train, store.num_classes, cm);
    if (stream->features() != s.model.inputs() || store.num_classes != int(s.model.classes()))
      throw InputError(r.name + ": the store " + s.data + " has " +
                       std::to_string(stream->features()) + " features and " +
                       std::to_string(store.num_classes) + " classes, the model is " +
                       s.model.describe());
  }
  // One backend per member of this worker's group; a plain worker is a group of one, and
  // backends[0] (the leader's) is its backend.
  const int members = group_members(o, s, r.name);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int m = 0; m < members; ++m) {
    try {
      backends.push_back(make_member_backend(o, s, m));
    } catch (const InputError& e) {
      if (members == 1) throw;
      throw InputError(r.name + ": member " + std::to_string(m) + " of its group of " +
                       std::to_string(members) + ": " + e.what());
    }
  }
  Backend* const backend = backends[0].get();
  // A group of more than one: WorkerGroup sums the members' gradients. GPU members sum them on
  // the GPUs with NCCL (one communicator per GPU of this process, the sums overlapped with the
  // backward pass); CPU members, and GPU members in a build without NCCL, through host memory
  // with the thread collective.
  std::unique_ptr<GroupCollective> collective;
  std::unique_ptr<WorkerGroup> group;
  if (members > 1) {
    std::vector<Backend*> pointers;
    std::vector<int> devices;
    for (const auto& b : backends) {
      pointers.push_back(b.get());
      devices.push_back(b->device_buffers().device);
    }
    if (*std::min_element(devices.begin(), devices.end()) >= 0) {
      // (NCCL there but failing to start is a GroupError, not caught: better an error than a
      // slower run.)
      try {
        collective = make_nccl_collective(devices, group_timeout_ms(s));
      } catch (const InputError& e) {
        std::fprintf(stderr, "%s: its group of %d GPUs sums through host memory: %s\n",
                     r.name.c_str(), members, e.what());
      }
    }
    if (!collective) collective = make_thread_collective(members, group_timeout_ms(s));
    group = std::make_unique<WorkerGroup>(s.model, pointers, *collective);
  }
  // A group call that left a member behind, hung in its backend (worker_group.h): this worker
  // cannot go on, and it must not unwind either, since destroying that member's backend, its
  // batches or the group would wait for the hung GPU or be read by the member's thread. It says
  // which rank and ends the process at once; the launcher or the missed heartbeats tell the
  // coordinator, and its batches go to the other workers.
  auto in_group = [&](const auto& call) {
    try {
      call();
    } catch (const GroupError& e) {
      if (!group->abandoned()) throw;
      std::fprintf(stderr, "%s: %s; the process ends here\n", r.name.c_str(), e.what());
      std::fflush(stderr);
      std::_Exit(EXIT_FAILURE);
    }
  };
  ClientOptions client_settings = client_options(s, rc.context, o);
  client_settings.cancel = o.cancel;
  PsClient client(servers, client_settings);
  Model model(s.model);
  if (!init_parameters(client, r, link, model, /*may_stand_in=*/true)) {
    feed_closer.close(" has stopped: training ended before it began");
    return say_goodbye(link, r.name);
  }
  // Every member gets the parameters `model` holds (a group's by the leader's broadcast).
  auto install = [&] {
    const InBackend in(*status, "installing the parameters", now_ns());
    if (group) in_group([&] { group->install(model); });
    else backend->set_parameters(model);
  };
  install();
  // A step's parameters as they arrived (wait_in_place): a plain worker's backend copies them
  // straight from the received frames; a group's leader broadcasts them from `model`.
  ReceivedParameters received;
  auto wait_and_install = [&](PsClient::Handle& handle) {
    handle.wait_in_place(received);
    const InBackend in(*status, "installing the parameters", now_ns());
    if (!group) return backend->set_parameters(received.runs());
    received.copy_into(model.parameters());
    in_group([&] { group->install(model); });
  };

  // The step's gradients, pushed zero-copy: ZeroMQ reads them in place after push_pull returns
  // (and, with overlap, while the next gradient is computed), so each step fills a buffer from a
  // pool that hands out only buffers no send holds any more.
  transport::HeldPool<std::vector<NamedTensor>> gradient_buffers;
  std::shared_ptr<PsClient::GradientBuffer> gradients;
  // With settings.overlap, the push_pull of batch k is answered while batch k+1's gradient is
  // computed (on parameters one exchange older): communication hidden behind compute.
  std::optional<PsClient::Handle> inflight;
  struct Pushed {
    int64_t batches = 0, rows = 0;
  } inflight_pushed;  // what the exchange in flight carries
  enum class Exchanged { Applied, Lost, Ended };
  // Runs one exchange, which waits for it and installs the parameters it brings
  // (wait_and_install); when a server does not answer (it died, or is restarting from its
  // checkpoint) that gradient is lost and the parameters are pulled again once the servers
  // answer, into `model`, and installed from there. Ended when training ended meanwhile.
  auto exchange = [&](const std::function<void()>& run) {
    // A server that restarted without a checkpoint may answer before the request times out
    // (a request queued while it was down reaches the new one): "not initialised" is the
    // same news as the silence, and goes the same way.
    auto recover = [&](const char* what) {
      std::fprintf(stderr, "%s: %s; waiting for the servers\n", r.name.c_str(), what);
      // `model` holds the parameters last pulled into it, not those installed since (a plain
      // worker installs each reply straight into its backend): a server that lost its
      // parameters is given the newest this worker has, not those of the run's start.
      backend->get_parameters(model);
      if (!repull(client, link, o, r, model)) return Exchanged::Ended;
      install();
      return Exchanged::Lost;
    };
    try {
      run();
    } catch (const transport::TransportError& e) {
      return recover(e.what());
    } catch (const ServerError& e) {
      if (!e.not_initialised()) throw;
      return recover(e.what());
    }
    return Exchanged::Applied;
  };
  // Counts an exchange's gradients (`batches` batches of `rows` rows) as applied or lost (an
  // exchange that training ended while the servers were away is lost too: none answered it).
  auto tally = [&](Exchanged outcome, Pushed pushed) {
    if (outcome == Exchanged::Applied) {
      status->steps += 1;
      status->samples += pushed.rows;
      status->batches_done += pushed.batches;
    } else {
      status->gradients_lost += pushed.batches;
    }
  };
  // Pushes `gradients` (this worker's, or its group's sum over `batches` batches of `rows` rows
  // in all) and counts them done; false when training ended while the servers were away. In
  // sync mode a push counts as one replica, a group's as much as a plain worker's.
  auto push_gradients = [&](int64_t batches, int64_t rows) {
    const Pushed pushed{batches, rows};
    if (s.overlap) {
      // The previous batch's exchange has been in flight while this gradient was computed, on
      // the parameters installed before it: their versions go with the push, not those of the
      // reply installed next (the servers' staleness counts would read one too low).
      const std::vector<uint64_t> computed_on = client.versions();
      if (inflight) {
        const Exchanged previous = exchange([&] { wait_and_install(*inflight); });
        inflight.reset();
        tally(previous, inflight_pushed);  // done when it was pushed
        if (previous == Exchanged::Ended) return false;
      }
      try {
        inflight = client.push_pull(gradients, &computed_on);
        inflight_pushed = pushed;  // counted once answered
      } catch (const transport::TransportError& e) {
        const Exchanged now = exchange([&] { throw e; });
        if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
        tally(now, pushed);
      }
    } else {
      const Exchanged now = exchange([&] {
        PsClient::Handle handle = client.push_pull(gradients);
        wait_and_install(handle);
      });
      if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
      tally(now, pushed);
    }
    // The task's `done` counts batches (the coordinator hands out a lost worker's batches after
    // its last report), so a group's step counts each of its batches; a batch whose gradient
    // was lost is done too (it is not trained again).
    status->done += batches;
    return true;
  };
  // One batch: its gradient, pushed; false when training ended while the servers were away.
  auto train_batch = [&](const DatasetView& batch) {
    {
      const InBackend in(*status, "a step", now_ns());
      backend->compute_gradients(batch, nullptr, batch.rows);
    }
    gradients = gradient_buffers.take();  // (after the compute: a send may still hold one)
    {
      const InBackend in(*status, "a step's gradients", now_ns());
      backend->get_gradients(gradients->value);
    }
    return push_gradients(1, batch.rows);
  };
  // A group's step: step_batches[m] to member m, the first `count` of them batches and the
  // rest empty (fewer batches than members at the end of a task or block: those members add
  // zeros). The leader pushes the sum.
  std::vector<DatasetView> step_batches(static_cast<size_t>(members));
  auto train_group_step = [&](int count) {
    for (size_t m = size_t(count); m < step_batches.size(); ++m) step_batches[m] = DatasetView{};
    gradients = gradient_buffers.take();
    {
      const InBackend in(*status, "its group's step", now_ns());
      in_group([&] { gradients->value = group->step(step_batches); });
    }
    int64_t rows = 0;
    for (int m = 0; m < count; ++m) rows += step_batches[size_t(m)].rows;
    return push_gradients(count, rows);
  };
  // A group's share of a task from the stream: steps of up to one batch per member, in the
  // stream's order. next()'s view is valid only until the next call, so every batch of a step
  // but its last is copied into its member's buffer (the last one is used in place: next() is
  // not called again before the step is done). True once the task's batches are all trained,
  // false when training ended.
  std::vector<Dataset> member_buffers(static_cast<size_t>(members));
  auto train_group_task = [&]() {
    DatasetView batch;
    for (;;) {
      if (training_over(link.phase())) return false;
      int count = 0;
      bool more = true;
      while (count < members && (more = stream->next(batch))) {
        step_batches[size_t(count)] =
            count + 1 < members ? copy_batch(batch, member_buffers[size_t(count)]) : batch;
        ++count;
      }
      if (count == 0) return true;
      status->queue_depth = int(stream->ready_batches());
      if (!train_group_step(count)) return false;
      if (!more) return true;
    }
  };

  json finished = nullptr;
  if (s.fed) {
    // Each fed block is cut into batches of s.batch rows (the last one may be shorter), in the
    // order given: whoever feeds chooses the order, as the seed's queue does.
    try {
      while (!training_over(link.phase())) {
        check_coordinator(link, o, r.name);
        status->queue_depth = int(o.feed->depth());
        std::optional<FedBlock> block = o.feed->pop(100);
        if (!block) {
          for (const auto& b : backends) b->rest();
          continue;
        }
        const DatasetView& rows = block->rows;
        if (rows.labels == nullptr) throw InputError(r.name + ": a fed block has no labels");
        for (int64_t i = 0; i < rows.rows; ++i)
          if (rows.labels[i] >= s.model.classes())
            throw InputError(r.name + ": a fed block has label " +
                             std::to_string(int(rows.labels[i])) + " at row " +
                             std::to_string(i) + "; the model has " +
                             std::to_string(s.model.classes()) + " classes");
        try {
          check_model_data(s.model, rows, true);
        } catch (const InputError& e) {
          throw InputError(r.name + ": a fed block: " + e.what());
        }
        bool go_on = true;
        if (group) {
          // Up to one batch per member a step; the block outlives the step (no copies). A
          // block's last step may be short.
          for (int64_t begin = 0; go_on && begin < rows.rows;) {
            if (training_over(link.phase())) break;
            int count = 0;
            for (; count < members && begin < rows.rows; ++count, begin += s.batch)
              step_batches[size_t(count)] = rows.slice(begin, std::min(rows.rows, begin + s.batch));
            go_on = train_group_step(count);
          }
        } else {
          for (int64_t begin = 0; go_on && begin < rows.rows; begin += s.batch) {
            if (training_over(link.phase())) break;
            go_on = train_batch(rows.slice(begin, std::min(rows.rows, begin + s.batch)));
          }
        }
        if (!go_on) break;
      }
    } catch (...) {
      o.feed->close(r.name + " stopped on an error");
      throw;
    }
    o.feed->close(r.name + " has stopped: training is over");
  } else {
    for (bool stop = false; !stop;) {
      check_coordinator(link, o, r.name);
      json request{{"type", "work"}, {"name", r.name}};
      if (!finished.is_null()) request["finished"] = finished;
      const WorkReply reply = read_work_reply(link.request(request));
      finished = nullptr;
      if (reply.stop) break;
      if (!reply.has_task) {
        // No batch for now (the others finish the epoch): a sync step need not wait for this
        // worker's gradient, nor a bounded-staleness reply for its clock. Advisory: a server
        // that misses it waits as it would have. Said at every poll, not once: a server counts
        // an idle worker again after each sync step it applies (so that one back at work is
        // waited for), and this worker cannot see when that happens; an empty one-way message
        // per poll (50 ms) costs next to nothing.
        if (s.ps_mode != "async") {
          try {
            client.idle();
          } catch (const transport::TransportError&) {
          }
        }
        link.wait_phase_change(link.phase(), reply.wait_ms);
        continue;
      }
      const int64_t task_id = reply.task_id;
      status->done = 0;
      status->task = task_id;
      stream->start_epoch(reply.epoch, reply.batches);
      if (group) {
        if (train_group_task()) finished = task_id;
        else stop = true;
        continue;
      }
      DatasetView batch;
      for (;;) {
        if (training_over(link.phase())) {
          stop = true;
          break;
        }
        if (!stream->next(batch)) {
          finished = task_id;
          break;
        }
        status->queue_depth = int(stream->ready_batches());
        if (!train_batch(batch)) {
          stop = true;
          break;
        }
      }
    }
    stream->cancel();
  }
  // The last gradient, applied (or lost).
  if (inflight) tally(exchange([&] { wait_and_install(*inflight); }), inflight_pushed);
  if (!finished.is_null()) {
    try {
      link.request({{"type", "progress"}, {"name", r.name}, {"task", finished},
                    {"done", status->done.load()}},
                   link.cancelled() ? 500 : -1);
    } catch (const Error&) {
    }
  }
  say_goodbye(link, r.name, json{{"steps", status->steps.load()},
                                 {"samples", status->samples.load()},
                                 {"batches_done", status->batches_done.load()},
                                 {"gradients_lost", status->gradients_lost.load()},
                                 {"task", status->task.load()}, {"done", status->done.load()},
                                 {"queue_depth", 0}});
}

}  // namespace

void run_worker_role(const RoleOptions& o) { run_cancellable(o, worker_role); }

}  // namespace tandem
