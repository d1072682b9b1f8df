#include "worker_trainer.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <set>
#include <utility>

#include "backend.h"
#include "group_collective.h"
#include "tandem/error.h"
#include "worker_group.h"

namespace tandem::roles {

namespace {

// A group's members are threads of this process stepped together by WorkerGroup::step; one
// that fails aborts the others at once, so this bound only ends a member stuck in its backend.
// It runs from the first member's arrival, which may be a member with no batch (the end of a
// task) while the others compute a whole step: at least a minute, and no less than the run's
// step timeout, which already says how long a step may take. A step timeout of 0 (never) is
// never here too (INT_MAX ms, 24 days): a group of large steps failed after a minute.
int group_timeout_ms(const RunSettings& s) {
  constexpr double kNever = std::numeric_limits<int>::max();
  if (s.step_timeout_s <= 0) return std::numeric_limits<int>::max();
  return static_cast<int>(std::min(kNever, std::max(60.0, s.step_timeout_s) * 1000.0));
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

std::vector<std::unique_ptr<Backend>> make_backends(const RoleOptions& o, const RunSettings& s,
                                                    const std::string& who) {
  const int members = group_members(o, s, who);
  std::vector<std::unique_ptr<Backend>> backends;
  for (int m = 0; m < members; ++m) {
    try {
      backends.push_back(make_member_backend(o, s, m));
    } catch (const InputError& e) {
      if (members == 1) throw;
      throw InputError(who + ": member " + std::to_string(m) + " of its group of " +
                       std::to_string(members) + ": " + e.what());
    }
  }
  return backends;
}

// How a group of more than one sums its members' gradients: GPU members on the GPUs with NCCL
// (one communicator per GPU of this process, the sums overlapped with the backward pass); CPU
// members, and GPU members in a build without NCCL, through host memory with the thread
// collective.
// None for a plain worker, a group of one.
std::unique_ptr<GroupCollective> make_collective(
    const std::vector<std::unique_ptr<Backend>>& backends, const RunSettings& s,
    const std::string& who) {
  if (backends.size() < 2) return nullptr;
  std::vector<int> devices;
  for (const auto& b : backends) devices.push_back(b->device_buffers().device);
  const int members = int(backends.size());
  if (*std::min_element(devices.begin(), devices.end()) >= 0) {
    // (NCCL there but failing to start is a GroupError, not caught: better an error than a
    // slower run.)
    try {
      return make_nccl_collective(devices, group_timeout_ms(s));
    } catch (const InputError& e) {
      std::fprintf(stderr, "%s: its group of %d GPUs sums through host memory: %s\n",
                   who.c_str(), members, e.what());
    }
  }
  return make_thread_collective(members, group_timeout_ms(s));
}

std::unique_ptr<WorkerGroup> make_group(const std::vector<std::unique_ptr<Backend>>& backends,
                                        const RunSettings& s, GroupCollective* collective) {
  if (!collective) return nullptr;
  std::vector<Backend*> members;
  for (const auto& b : backends) members.push_back(b.get());
  return std::make_unique<WorkerGroup>(s.model, members, *collective);
}

ClientOptions cancellable(ClientOptions options, const RoleOptions& o) {
  options.cancel = o.cancel;
  return options;
}

}  // namespace

WorkerTrainer::WorkerTrainer(const RoleOptions& o, zmq::context_t& context,
                             CoordinatorLink& link, const RoleRegistration& r,
                             WorkerStatus& status, const std::vector<std::string>& servers)
    : o_(o),
      link_(link),
      r_(r),
      s_(r.settings),
      status_(status),
      backends_(make_backends(o, r.settings, r.name)),
      collective_(make_collective(backends_, r.settings, r.name)),
      group_(make_group(backends_, r.settings, collective_.get())),
      client_(servers, cancellable(client_options(r.settings, context, o), o)),
      model_(r.settings.model) {}

WorkerTrainer::~WorkerTrainer() = default;

// A group call that left a member behind, hung in its backend (worker_group.h): this worker
// cannot go on, and it must not unwind either, since destroying that member's backend, its
// batches or the group would wait for the hung GPU or be read by the member's thread. It says
// which rank and ends the process at once; the launcher or the missed heartbeats tell the
// coordinator, and its batches go to the other workers.
template <typename Call>
void WorkerTrainer::in_group(const Call& call) {
  try {
    call();
  } catch (const GroupError& e) {
    if (!group_->abandoned()) throw;
    std::fprintf(stderr, "%s: %s; the process ends here\n", r_.name.c_str(), e.what());
    std::fflush(stderr);
    std::_Exit(EXIT_FAILURE);
  }
}

bool WorkerTrainer::start() {
  if (!init_parameters(client_, r_, link_, model_, /*may_stand_in=*/true)) return false;
  install();
  return true;
}

// Every member gets the parameters model_ holds (a group's by the leader's broadcast).
void WorkerTrainer::install() {
  const InBackend in(status_, "installing the parameters");
  if (group_) in_group([&] { group_->install(model_); });
  else backends_[0]->set_parameters(model_);
}

bool WorkerTrainer::wait_and_install(PsClient::Handle& handle) {
  const bool stale = handle.wait_in_place(received_).stale;
  const InBackend in(status_, "installing the parameters");
  if (!group_) {
    backends_[0]->set_parameters(received_.runs());
    return stale;
  }
  received_.copy_into(model_.parameters());
  in_group([&] { group_->install(model_); });
  return stale;
}

bool WorkerTrainer::refresh() {
  finish();
  return exchange([&] {
           PsClient::Handle handle = client_.pull();
           wait_and_install(handle);
           return false;
         }) != Exchanged::Ended;
}

void WorkerTrainer::rest() {
  for (const auto& b : backends_) b->rest();
}

void WorkerTrainer::idle() {
  try {
    client_.idle();
  } catch (const transport::TransportError&) {
  }
}

bool WorkerTrainer::step(std::vector<DatasetView>& batches, int count) {
  if (!group_) return train_batch(batches[0]);
  for (size_t m = size_t(count); m < batches.size(); ++m) batches[m] = DatasetView{};
  gradients_ = gradient_buffers_.take();
  {
    const InBackend in(status_, "its group's step");
    in_group([&] { gradients_->value = group_->step(batches); });
  }
  int64_t rows = 0;
  for (int m = 0; m < count; ++m) rows += batches[size_t(m)].rows;
  return push_gradients(count, rows);
}

bool WorkerTrainer::train_batch(const DatasetView& batch) {
  Backend& backend = *backends_[0];
  {
    const InBackend in(status_, "a step");
    backend.compute_gradients(batch, nullptr, batch.rows);
  }
  gradients_ = gradient_buffers_.take();  // (after the compute: a send may still hold one)
  {
    const InBackend in(status_, "a step's gradients");
    backend.get_gradients(gradients_->value);
  }
  return push_gradients(1, batch.rows);
}

// Pushes gradients_ (`batches` batches of `rows` rows in all) and counts them done; false when
// training ended while the servers were away. In sync mode a push counts as one replica, a
// group's as much as a plain worker's.
bool WorkerTrainer::push_gradients(int64_t batches, int64_t rows) {
  const Pushed pushed{batches, rows};
  if (s_.overlap) {
    // The previous batch's exchange has been in flight while this gradient was computed, on
    // the parameters installed before it: their versions go with the push, not those of the
    // reply installed next (the servers' staleness counts would read one too low).
    const std::vector<uint64_t> computed_on = client_.versions();
    if (inflight_) {
      const Exchanged previous = exchange([&] { return wait_and_install(*inflight_); });
      inflight_.reset();
      tally(previous, inflight_pushed_);
      if (previous == Exchanged::Ended) return false;
    }
    try {
      inflight_ = client_.push_pull(gradients_, &computed_on);
      inflight_pushed_ = pushed;  // counted once answered
    } catch (const transport::TransportError& e) {
      const Exchanged now = exchange([&]() -> bool { throw e; });
      if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
      tally(now, pushed);
    }
  } else {
    const Exchanged now = exchange([&] {
      PsClient::Handle handle = client_.push_pull(gradients_);
      return wait_and_install(handle);
    });
    if (now == Exchanged::Ended) return false;  // not done: neither trained nor lost
    tally(now, pushed);
  }
  return true;
}

// Runs one exchange, which waits for it and installs the parameters it brings. When a server
// does not answer (it died, or is restarting from its checkpoint) that gradient is lost and the
// parameters are pulled again once the servers answer (recover). Ended when training ended
// meanwhile.
WorkerTrainer::Exchanged WorkerTrainer::exchange(const std::function<bool()>& run) {
  try {
    if (run()) return Exchanged::Stale;
  } catch (const transport::TransportError& e) {
    return recover(e.what());
  } catch (const ServerError& e) {
    // A server that restarted without a checkpoint may answer before the request times out (a
    // request queued while it was down reaches the new one): "not initialised" is the same
    // news as the silence, and goes the same way.
    if (!e.not_initialised()) throw;
    return recover(e.what());
  }
  return Exchanged::Applied;
}

WorkerTrainer::Exchanged WorkerTrainer::recover(const char* what) {
  std::fprintf(stderr, "%s: %s; waiting for the servers\n", r_.name.c_str(), what);
  // model_ holds the parameters last pulled into it, not those installed since (a plain worker
  // installs each reply straight into its backend): a server that lost its parameters is given
  // the newest this worker has, not those of the run's start.
  backends_[0]->get_parameters(model_);
  if (!repull(client_, link_, o_, r_, model_)) return Exchanged::Ended;
  install();
  return Exchanged::Lost;
}

// Counts an exchange's gradients as applied or lost (an exchange that training ended while the
// servers were away is lost too: none answered it; so is one a sync server dropped as stale),
// and its batches done. The task's `done` counts batches once their exchange is answered, not
// when pushed: the coordinator hands out a lost worker's batches after its last report, so a
// batch whose gradient was still unsent when the worker died is trained again, never zero
// times. A group's step counts each of its batches; a batch whose gradient was lost is done too
// (it is not trained again).
void WorkerTrainer::tally(Exchanged outcome, Pushed pushed) {
  if (outcome == Exchanged::Applied) {
    status_.steps += 1;
    status_.samples += pushed.rows;
    status_.batches_done += pushed.batches;
  } else {
    status_.gradients_lost += pushed.batches;
  }
  status_.done += pushed.batches;
}

void WorkerTrainer::finish() {
  if (!inflight_) return;
  tally(exchange([&] { return wait_and_install(*inflight_); }), inflight_pushed_);
  inflight_.reset();
}

}  // namespace tandem::roles
