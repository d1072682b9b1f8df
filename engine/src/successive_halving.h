// The bookkeeping of asynchronous successive halving (ASHA, Li et al. 2018) over a fixed list of
// trials, as pure logic: no processes, no clocks, so tests drive it with score tables.
//
// Rungs are epoch budgets r, r*eta, r*eta^2, ... up to the maximum budget (always the last rung).
// A trial that finishes rung k with a validation loss waits there; it is promoted to rung k+1
// when it ranks in the top floor(n_k / eta) of the n_k losses seen at rung k so far. A free slot
// takes a promotion first (highest rung first), else a new trial at rung 0, so slots never idle
// while there is work. Once no trial can reach rung k any more (none pending, none running at or
// below it, none waiting below it), the rung is final: its top max(1, floor(n_k / eta)) go on
// (so at least one trial gets the full budget). A trial that fails gives up its places in every
// rung it passed, and the next in line of each takes it: a promoted trial that crashes does not
// end the search with nobody promoted. So the rest wait until nothing more can run (done()),
// and are stopped then.
#pragma once

#include <optional>
#include <vector>

namespace tandem {

struct HalvingJob {
  int trial = 0;
  int rung = 0;
  int epochs = 0;  // the trial's total epochs at the end of this job
};

enum class TrialStatus { Pending, Running, Waiting, Stopped, Completed, Failed };
const char* to_string(TrialStatus status);

class SuccessiveHalving {
 public:
  // Throws InputError for trials < 1, min_epochs < 1, max_epochs < min_epochs, eta < 2.
  SuccessiveHalving(int trials, int min_epochs, int max_epochs, int eta);

  const std::vector<int>& rung_epochs() const { return rung_epochs_; }

  // The next job for a free slot, or none (wait for a running job, or everything is done).
  std::optional<HalvingJob> next();
  // The trial's running job ended with this validation loss (lower is better; NaN ranks last).
  void report(int trial, double loss);
  // The trial's running job crashed: the trial ends as failed.
  void fail(int trial);
  // Ends the trial where it is (a time budget ran out): its last finished rung stands.
  void stop(int trial);
  // No more jobs will start: pending and waiting trials are stopped.
  void close();
  // Whether the trial could still go on: pending, or waiting at a rung that may still promote
  // it (not final yet, or final with the trial among its leaders). A waiting trial that lost a
  // final rung (it waits only in case a promoted trial fails) is not: a search that closes says
  // which trials it stopped, and not those the halving had.
  bool in_contention(int trial) const;

  // Nothing running and nothing left to start; then the trials still waiting are stopped.
  bool done();

  TrialStatus status(int trial) const { return trials_.at(trial).status; }
  // The highest rung the trial finished (-1: none) and its loss there.
  int rung(int trial) const { return trials_.at(trial).rung; }
  double loss(int trial) const { return trials_.at(trial).loss; }
  int trials() const { return static_cast<int>(trials_.size()); }
  int count(TrialStatus status) const;

 private:
  struct Trial {
    TrialStatus status = TrialStatus::Pending;
    int rung = -1;         // highest finished rung
    int running_rung = -1;
    double loss = 0;
  };
  struct Result {
    double loss;
    int trial;
  };
  // Each rung's places but the last's: quota(k) while trials may still reach rung k, and
  // max(1, quota(k)) once it is final.
  // `final`, when given, gets whether each of those rungs is final.
  std::vector<int> places(std::vector<bool>* final = nullptr) const;
  // The trials holding rung k's first `places` places, best first; failed trials hold none.
  std::vector<int> leaders(int k, int places) const;
  // The first of those waiting at rung k to be promoted, or -1.
  int promotable(int k, int places) const;
  int quota(int k) const;

  std::vector<int> rung_epochs_;
  int eta_;
  std::vector<Trial> trials_;
  std::vector<std::vector<Result>> results_;  // per rung, sorted by loss
};

}  // namespace tandem
