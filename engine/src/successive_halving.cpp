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

std::vector<int> SuccessiveHalving::places(std::vector<bool>* final_rungs) const {
  const int top = static_cast<int>(rung_epochs_.size()) - 1;
  bool pending = false;
  int lowest_running = top + 1;  // the lowest rung a running trial is running towards
  for (const Trial& t : trials_) {
    pending = pending || t.status == TrialStatus::Pending;
    if (t.status == TrialStatus::Running) lowest_running = std::min(lowest_running, t.running_rung);
  }
  // Rung k is final once no trial can reach it any more: none pending, none running at or below
  // it, and none waiting below it that holds a place there (the rest wait only in case a trial
  // that went on fails, which needs a running trial). From the bottom up, each rung's leaders
  // once.
  std::vector<int> out(static_cast<size_t>(std::max(top, 0)));
  if (final_rungs) final_rungs->assign(out.size(), false);
  bool settled_below = true;
  for (int k = 0; k < top; ++k) {
    const bool final = !pending && lowest_running > k && settled_below;
    if (final_rungs) (*final_rungs)[size_t(k)] = final;
    out[size_t(k)] = final ? std::max(1, quota(k)) : quota(k);
    settled_below = settled_below && promotable(k, out[size_t(k)]) < 0;
  }
  return out;
}

std::vector<int> SuccessiveHalving::leaders(int k, int places) const {
  std::vector<int> ids;
  for (const Result& r : results_[k]) {
    if (static_cast<int>(ids.size()) >= places) break;
    if (trials_[r.trial].status != TrialStatus::Failed) ids.push_back(r.trial);
  }
  return ids;
}

int SuccessiveHalving::promotable(int k, int places) const {
  for (const int id : leaders(k, places))
    if (trials_[id].status == TrialStatus::Waiting && trials_[id].rung == k) return id;
  return -1;
}

std::optional<HalvingJob> SuccessiveHalving::next() {
  const std::vector<int> place_counts = places();
  for (int k = static_cast<int>(place_counts.size()) - 1; k >= 0; --k) {
    const int id = promotable(k, place_counts[size_t(k)]);
    if (id < 0) continue;
    Trial& t = trials_[id];
    t.status = TrialStatus::Running;
    t.running_rung = k + 1;
    return HalvingJob{id, k + 1, rung_epochs_[k + 1]};
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
  // Ties go to the lower trial, whatever order the trials finished in (which depends on timing):
  // diverged trials all tie at infinity. (A promotion made before a tying trial reported stands,
  // as one made before a better trial reported does: asynchronous halving.)
  const Result result{loss, trial};
  const auto before = [](const Result& a, const Result& b) {
    return a.loss < b.loss || (a.loss == b.loss && a.trial < b.trial);
  };
  const auto at = std::upper_bound(rung.begin(), rung.end(), result, before);
  rung.insert(at, result);
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

bool SuccessiveHalving::in_contention(int trial) const {
  const Trial& t = trials_.at(trial);
  if (t.status == TrialStatus::Pending) return true;
  if (t.status != TrialStatus::Waiting) return false;
  std::vector<bool> final;
  const std::vector<int> place_counts = places(&final);
  const size_t k = static_cast<size_t>(t.rung);  // (below the top: a trial there has completed)
  if (!final[k]) return true;
  const std::vector<int> ids = leaders(t.rung, place_counts[k]);
  return std::find(ids.begin(), ids.end(), trial) != ids.end();
}

bool SuccessiveHalving::done() {
  if (count(TrialStatus::Running) > 0 || count(TrialStatus::Pending) > 0) return false;
  const std::vector<int> place_counts = places();
  for (size_t k = 0; k < place_counts.size(); ++k)
    if (promotable(static_cast<int>(k), place_counts[k]) >= 0) return false;
  // The losers are stopped only now: until nothing can run, a trial that fails gives its places
  // to the next in line, who must still be waiting to take them.
  for (Trial& t : trials_)
    if (t.status == TrialStatus::Waiting) t.status = TrialStatus::Stopped;
  return true;
}

int SuccessiveHalving::count(TrialStatus status) const {
  return static_cast<int>(std::count_if(trials_.begin(), trials_.end(),
                                        [&](const Trial& t) { return t.status == status; }));
}

}  // namespace tandem
