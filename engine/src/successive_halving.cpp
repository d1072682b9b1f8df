#include "successive_halving.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "tandem/error.h"

namespace tandem {

const char* to_string(TrialStatus status) {
  switch (status) {
    case TrialStatus::Pending: return "pending";
    case TrialStatus::Running: return "running";
    case TrialStatus::Waiting: return "waiting";
    case TrialStatus::Stopped: return "stopped";
    case TrialStatus::Completed: return "completed";
    case TrialStatus::Failed: return "failed";
  }
  return "?";
}

SuccessiveHalving::SuccessiveHalving(int trials, int min_epochs, int max_epochs, int eta)
    : eta_(eta) {
  if (trials < 1) throw InputError("search: no trials");
  if (min_epochs < 1) throw InputError("--min-epochs " + std::to_string(min_epochs) + ": expected >= 1");
  if (max_epochs < min_epochs)
    throw InputError("--budget " + std::to_string(max_epochs) + ": expected >= --min-epochs (" +
                     std::to_string(min_epochs) + ")");
  if (eta < 2) throw InputError("--eta " + std::to_string(eta) + ": expected >= 2");
  for (long long r = min_epochs; r < max_epochs; r *= eta) rung_epochs_.push_back(static_cast<int>(r));
  rung_epochs_.push_back(max_epochs);
  trials_.resize(trials);
  results_.resize(rung_epochs_.size());
}

int SuccessiveHalving::quota(int k) const {
  return static_cast<int>(results_[k].size()) / eta_;
}

bool SuccessiveHalving::final_rung(int k) const {
  for (const Trial& t : trials_) {
    if (t.status == TrialStatus::Pending) return false;
    if (t.status == TrialStatus::Running && t.running_rung <= k) return false;
    if (t.status == TrialStatus::Waiting && t.rung < k) return false;
  }
  return true;
}

void SuccessiveHalving::settle() {
  const int top = static_cast<int>(rung_epochs_.size()) - 1;
  for (int k = 0; k < top; ++k) {
    if (!final_rung(k)) return;
    const int keep = std::max(1, quota(k));
    for (int i = 0; i < static_cast<int>(results_[k].size()); ++i) {
      Trial& t = trials_[results_[k][i].trial];
      if (i >= keep && t.status == TrialStatus::Waiting && t.rung == k) t.status = TrialStatus::Stopped;
    }
  }
}

std::optional<HalvingJob> SuccessiveHalving::next() {
  settle();
  const int top = static_cast<int>(rung_epochs_.size()) - 1;
  for (int k = top - 1; k >= 0; --k) {
    const int keep = final_rung(k) ? std::max(1, quota(k)) : quota(k);
    for (int i = 0; i < keep && i < static_cast<int>(results_[k].size()); ++i) {
      const int id = results_[k][i].trial;
      Trial& t = trials_[id];
      if (t.status != TrialStatus::Waiting || t.rung != k) continue;
      t.status = TrialStatus::Running;
      t.running_rung = k + 1;
      return HalvingJob{id, k + 1, rung_epochs_[k + 1]};
    }
  }
  for (int id = 0; id < trials(); ++id) {
    Trial& t = trials_[id];
    if (t.status != TrialStatus::Pending) continue;
    t.status = TrialStatus::Running;
    t.running_rung = 0;
    return HalvingJob{id, 0, rung_epochs_[0]};
  }
  return std::nullopt;
}

void SuccessiveHalving::report(int trial, double loss) {
  Trial& t = trials_.at(trial);
  if (t.status != TrialStatus::Running)
    throw Error("successive halving: trial " + std::to_string(trial) + " reported while not running");
  if (std::isnan(loss)) loss = std::numeric_limits<double>::infinity();
  t.rung = t.running_rung;
  t.running_rung = -1;
  t.loss = loss;
  const int top = static_cast<int>(rung_epochs_.size()) - 1;
  t.status = t.rung == top ? TrialStatus::Completed : TrialStatus::Waiting;
  auto& rung = results_[t.rung];
  // Ties keep the earlier trial first, so runs are reproducible.
  const auto at = std::upper_bound(rung.begin(), rung.end(), loss,
                                   [](double l, const Result& r) { return l < r.loss; });
  rung.insert(at, Result{loss, trial});
}

void SuccessiveHalving::fail(int trial) {
  Trial& t = trials_.at(trial);
  t.status = TrialStatus::Failed;
  t.running_rung = -1;
}

void SuccessiveHalving::stop(int trial) {
  Trial& t = trials_.at(trial);
  if (t.status == TrialStatus::Completed || t.status == TrialStatus::Failed) return;
  t.status = TrialStatus::Stopped;
  t.running_rung = -1;
}

void SuccessiveHalving::close() {
  for (Trial& t : trials_)
    if (t.status == TrialStatus::Pending || t.status == TrialStatus::Waiting)
      t.status = TrialStatus::Stopped;
}

bool SuccessiveHalving::done() {
  if (count(TrialStatus::Running) > 0) return false;
  settle();
  for (int k = 0; k + 1 < static_cast<int>(rung_epochs_.size()); ++k) {
    const int keep = final_rung(k) ? std::max(1, quota(k)) : quota(k);
    for (int i = 0; i < keep && i < static_cast<int>(results_[k].size()); ++i) {
      const Trial& t = trials_[results_[k][i].trial];
      if (t.status == TrialStatus::Waiting && t.rung == k) return false;
    }
  }
  return count(TrialStatus::Pending) == 0;
}

int SuccessiveHalving::count(TrialStatus status) const {
  return static_cast<int>(std::count_if(trials_.begin(), trials_.end(),
                                        [&](const Trial& t) { return t.status == status; }));
}

}  // namespace tandem
