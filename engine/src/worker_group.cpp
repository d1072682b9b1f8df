#include "worker_group.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <utility>

namespace tandem {
namespace {

std::string error_text(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an unknown error";
  }
}

}  // namespace

WorkerGroup::WorkerGroup(const ModelConfig& model, std::vector<Backend*> members,
                         GroupCollective& collective)
    : config_(model), members_(std::move(members)), collective_(collective), layout_(model) {
  if (members_.empty()) throw InputError("worker group: needs at least one member backend");
  if (static_cast<int>(members_.size()) != collective_.size())
    throw InputError("worker group: " + std::to_string(members_.size()) +
                     " backends for a collective of " + std::to_string(collective_.size()) +
                     " members");
  for (size_t r = 0; r < members_.size(); ++r)
    if (members_[r] == nullptr)
      throw InputError("worker group: rank " + std::to_string(r) + " has no backend");
  if (collective_.memory() == GroupCollective::Memory::Device) {
    for (size_t r = 0; r < members_.size(); ++r) {
      device_.push_back(members_[r]->device_buffers());
      const Backend::DeviceBuffers& d = device_.back();
      if (d.device < 0)
        throw InputError("worker group: rank " + std::to_string(r) + "'s backend (" +
                         members_[r]->name() +
                         ") keeps its numbers in host memory, and this group's collective sums "
                         "on GPUs; use CUDA backends, or a host collective");
      if (d.count != device_[0].count)
        throw InputError("worker group: rank " + std::to_string(r) + "'s arenas hold " +
                         std::to_string(d.count) + " floats, rank 0's " +
                         std::to_string(device_[0].count) + " (the backends' models differ)");
    }
  }
  total_ = layout_.parameter_count();
  const size_t n = members_.size();
  if (device_.empty()) {  // the host way's staging; the device way stages nothing on the host
    flat_.assign(n, std::vector<float>(static_cast<size_t>(total_)));
    gradients_.resize(n);
    models_.assign(n, Model(config_));
  }
  leader_gradients_ = layout_.parameters();
  errors_.resize(n);
  busy_.assign(n, 0);
  threads_.reserve(n - 1);
  try {
    for (size_t r = 1; r < n; ++r)
      threads_.emplace_back([this, r] { member_loop(static_cast<int>(r)); });
  } catch (...) {  // a thread could not start: the destructor will not run, release those that did
    stop_members();
    throw;
  }
}

WorkerGroup::~WorkerGroup() { stop_members(); }

void WorkerGroup::stop_members() {
  {
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    // A member left behind by run_members gets a moment to come back (its wait may have ended
    // meanwhile). One still out can be neither joined (that could wait forever) nor left behind
    // (it would return into this group's freed memory): the process ends, saying why.
    if (pending_ > 0) {
      const auto grace = std::clamp<std::chrono::milliseconds>(
          std::chrono::milliseconds(collective_.timeout_ms()), kAbandonedGraceMin,
          kAbandonedGraceMax);
      if (!done_.wait_for(lock, grace, [&] { return pending_ == 0; })) {
        std::fprintf(stderr,
                     "%s; destroyed with that member still in its backend, which can neither be "
                     "waited for nor left running: the process ends\n",
                     abandoned_.c_str());
        std::fflush(stderr);
        std::abort();
      }
    }
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void WorkerGroup::throw_if_abandoned() const {
  if (!abandoned_.empty()) throw GroupError(abandoned_);
}

void WorkerGroup::member_loop(int rank) {
  uint64_t seen = 0;  // the last round this member ran
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || round_ != seen; });
      // Only between rounds: run_members returns after every member reported.
      if (stopping_) return;
      seen = round_;
    }
    std::exception_ptr error;
    try {
      job_(rank);  // not replaced before this member reports (run_members)
    } catch (...) {
      error = std::current_exception();
    }
    bool last = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      // Moved, not copied: a copy this thread dropped after the unlock would release the error
      // while the caller reads it, ordered only by the exception's reference count, which
      // ThreadSanitizer cannot see inside libstdc++ (it reported that as a race).
      errors_[static_cast<size_t>(rank)] = std::move(error);
      busy_[static_cast<size_t>(rank)] = 0;
      last = --pending_ == 0;
    }
    if (last) done_.notify_one();
  }
}

void WorkerGroup::flatten(int rank, const std::vector<NamedTensor>& tensors) {
  const auto& expected = layout_.parameters();
  if (tensors.size() != expected.size())
    throw InputError("worker group: rank " + std::to_string(rank) + " has " +
                     std::to_string(tensors.size()) + " tensors, the model " +
                     config_.describe() + " has " + std::to_string(expected.size()));
  float* out = flat_[static_cast<size_t>(rank)].data();
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].name != expected[t].name ||
        tensors[t].values.size() != expected[t].values.size())
      throw InputError("worker group: rank " + std::to_string(rank) + "'s tensor " +
                       std::to_string(t) + " is " + tensors[t].name + " of " +
                       std::to_string(tensors[t].values.size()) + " values, expected " +
                       expected[t].name + " of " + std::to_string(expected[t].values.size()));
    std::copy(tensors[t].values.begin(), tensors[t].values.end(), out);
    out += tensors[t].values.size();
  }
}

namespace {

void unflatten(const float* flat, std::vector<NamedTensor>& tensors) {
  for (auto& tensor : tensors) {
    std::copy(flat, flat + tensor.values.size(), tensor.values.begin());
    flat += tensor.values.size();
  }
}

}  // namespace

BatchStats WorkerGroup::reduce_gradients(int rank, const DatasetView& batch) {
  if (rank < 0 || rank >= size())
    throw InputError("worker group: rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(size() - 1));
  if (!device_.empty()) return reduce_on_device(rank, batch);
  const size_t r = static_cast<size_t>(rank);
  BatchStats stats;
  try {
    if (batch.rows == 0) {
      // No batch for this member this step (the end of a task): it adds zeros. Its backend is
      // not asked: an empty view need not fit the model, and a backend given no rows may keep
      // the last step's gradients (the CUDA backend returns at once).
      std::fill(flat_[r].begin(), flat_[r].end(), 0.0f);
    } else {
      stats = members_[r]->compute_gradients(batch, nullptr, batch.rows);
      members_[r]->get_gradients(gradients_[r]);
      flatten(rank, gradients_[r]);
    }
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
  collective_.all_reduce_sum(rank, flat_[r].data(), flat_[r].size());
  if (rank == 0) unflatten(flat_[0].data(), leader_gradients_);
  return stats;
}

void WorkerGroup::broadcast_parameters(int rank, const Model* leader_parameters) {
  if (rank < 0 || rank >= size())
    throw InputError("worker group: rank " + std::to_string(rank) + " is outside 0.." +
                     std::to_string(size() - 1));
  if (!device_.empty()) return broadcast_on_device(rank, leader_parameters);
  const size_t r = static_cast<size_t>(rank);
  try {
    if (rank == 0) {
      if (leader_parameters == nullptr)
        throw InputError("worker group: the leader (rank 0) broadcast no parameters");
      flatten(0, leader_parameters->parameters());
    }
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
  collective_.broadcast(rank, flat_[r].data(), flat_[r].size(), 0);
  try {
    Model& model = models_[r];
    unflatten(flat_[r].data(), model.parameters());
    members_[r]->set_parameters(model);
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
}

BatchStats WorkerGroup::reduce_on_device(int rank, const DatasetView& batch) {
  const size_t r = static_cast<size_t>(rank);
  Backend& backend = *members_[r];
  const std::vector<Backend::GradientPiece>* pieces = nullptr;
  try {
    // A member with no batch (rows 0) queues zero gradients in the same pieces.
    pieces = &backend.enqueue_gradients(batch, nullptr, batch.rows);
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
  // Each piece's sum waits on the GPU for the backward pass to write it, not on this thread.
  // When the collective fails (the others have been told) its error goes out as it is, and this
  // member's backward pass is not waited for: a GPU that hangs is why a collective times out,
  // and that wait would hang too. The backend's next work queues behind the unfinished pass.
  float* gradients = device_[r].gradients;
  for (const auto& piece : *pieces)
    collective_.all_reduce_sum_after(rank, gradients + piece.offset, size_t(piece.count),
                                     piece.ready);
  collective_.finish(rank);
  BatchStats stats;
  try {
    stats = backend.finish_gradients();
    // The arena now holds the group's sum: the leader reads it as the push.
    if (rank == 0) backend.get_gradients(leader_gradients_);
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
  return stats;
}

void WorkerGroup::broadcast_on_device(int rank, const Model* leader_parameters) {
  const size_t r = static_cast<size_t>(rank);
  Backend::DeviceBuffers buffers;
  try {
    if (rank == 0) {
      if (leader_parameters == nullptr)
        throw InputError("worker group: the leader (rank 0) broadcast no parameters");
      members_[0]->set_parameters(*leader_parameters);
    }
    // Waits for the backend's queued work: nothing of it reads the parameters the broadcast
    // writes.
    buffers = members_[r]->device_buffers();
  } catch (const std::exception& e) {
    collective_.abort("rank " + std::to_string(rank) + ": " + e.what());
    throw;
  }
  // Padding included: it is zero in every arena.
  collective_.broadcast(rank, buffers.parameters, size_t(buffers.count), 0);
}

void WorkerGroup::run_members(const char* what, std::function<void(int)> body) {
  throw_if_abandoned();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = std::move(body);
    pending_ = size() - 1;
    std::fill(errors_.begin(), errors_.end(), nullptr);
    std::fill(busy_.begin() + 1, busy_.end(), 1);
    ++round_;
  }
  wake_.notify_all();
  std::exception_ptr leader_error;
  const auto leader_start = std::chrono::steady_clock::now();
  try {
    job_(0);
  } catch (...) {
    // The member threads are not left waiting: a failing member aborts the collective first
    // (reduce_gradients, broadcast_parameters), which ends the others' waits in it.
    leader_error = std::current_exception();
  }
  std::vector<std::exception_ptr> errors;
  {
    // Once the leader is done, every member is past the round's last collective (or the
    // collective is broken and throws at once), so a member that has not come back by the
    // collective's own timeout hangs in its backend, where no collective's timeout reaches.
    // A leader that failed after the collective's whole timeout timed out in it, waiting for
    // the member that hangs: the others, released by the abort, come back at once, and a member
    // still out has had that timeout already. It is named after a moment instead of a second
    // timeout (a minute and more). A leader that failed sooner (its own backend's error) leaves
    // the others the whole timeout: one may be in a long step of its own.
    const bool waited_out = std::chrono::steady_clock::now() - leader_start >=
                            std::chrono::milliseconds(collective_.timeout_ms());
    std::unique_lock<std::mutex> lock(mutex_);
    const int wait_ms = leader_error && waited_out
                            ? std::min(collective_.timeout_ms(), kAfterFailureMs)
                            : collective_.timeout_ms();
    if (!done_.wait_for(lock, std::chrono::milliseconds(wait_ms),
                        [&] { return pending_ == 0; })) {
      std::string ranks;
      for (size_t r = 1; r < busy_.size(); ++r)
        if (busy_[r]) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
      abandoned_ = "worker group: rank " + ranks + " did not finish " + what + " within " +
                   std::to_string(wait_ms) + " ms of rank 0" +
                   (leader_error ? "'s failure" : "") +
                   " (its backend hangs: a GPU stuck in a kernel or a copy); the group has left "
                   "it behind and cannot step again";
      if (leader_error) abandoned_ += " (rank 0: " + error_text(leader_error) + ")";
    }
    errors = errors_;
  }
  if (!abandoned_.empty()) {
    collective_.abort(abandoned_);  // a member that comes back fails at once instead of waiting
    throw GroupError(abandoned_);
  }
  errors[0] = leader_error;
  // A member's own error first: the GroupErrors of the others are its consequence.
  for (const auto& error : errors) {
    if (!error) continue;
    try {
      std::rethrow_exception(error);
    } catch (const GroupError&) {
    }
  }
  for (const auto& error : errors)
    if (error) std::rethrow_exception(error);
}

const std::vector<NamedTensor>& WorkerGroup::step(const std::vector<DatasetView>& batches,
                                                  BatchStats* stats) {
  if (static_cast<int>(batches.size()) != size())
    throw InputError("worker group: " + std::to_string(batches.size()) + " batches for " +
                     std::to_string(size()) + " members");
  throw_if_abandoned();  // before the state that a member left behind may still touch
  member_stats_.assign(members_.size(), BatchStats{});
  round_batches_ = batches;
  run_members("its step", [this](int rank) {
    member_stats_[static_cast<size_t>(rank)] =
        reduce_gradients(rank, round_batches_[static_cast<size_t>(rank)]);
  });
  if (stats != nullptr)
    for (const auto& s : member_stats_) {
      stats->loss_sum += s.loss_sum;
      stats->correct += s.correct;
      stats->samples += s.samples;
    }
  return leader_gradients_;
}

void WorkerGroup::install(const Model& parameters) {
  run_members("the parameters' broadcast", [this, &parameters](int rank) {
    broadcast_parameters(rank, rank == 0 ? &parameters : nullptr);
  });
}

}  // namespace tandem
