// The search's pure parts: the grid and trial-list parser, and the successive-halving
// bookkeeping driven by known score tables (which trials stop at which rung).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <vector>

#include "search_space.h"
#include "successive_halving.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

TEST(SearchSpace, GridIsTheCartesianProductFirstTermSlowest) {
  const auto trials = parse_grid({"lr=0.001,0.003,0.01", "hidden=100,256x128", "batch=100,1000"});
  ASSERT_EQ(trials.size(), 12u);
  EXPECT_DOUBLE_EQ(trials[0].lr, 0.001);
  EXPECT_EQ(trials[0].hidden, "100");
  EXPECT_EQ(trials[0].batch, 100);
  EXPECT_EQ(trials[1].batch, 1000);
  EXPECT_EQ(trials[2].hidden, "256,128");
  EXPECT_DOUBLE_EQ(trials[11].lr, 0.01);
  EXPECT_EQ(trials[11].describe(), "lr=0.01 hidden=256x128 batch=1000 optimizer=adam seed=1");
  const std::vector<std::string> args = trials[2].train_args();
  EXPECT_EQ(args[2], "--hidden");
  EXPECT_EQ(args[3], "256,128");
}

TEST(SearchSpace, BadTermsNameTheKeyAndValue) {
  auto message = [](const std::vector<std::string>& terms) {
    try {
      parse_grid(terms);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"momentum=0.9"}).find("unknown key 'momentum'"), std::string::npos);
  EXPECT_NE(message({"lr=0.1,-1"}).find("lr=-1"), std::string::npos);
  EXPECT_NE(message({"batch=10,x"}).find("batch=x"), std::string::npos);
  EXPECT_NE(message({"optimizer=rmsprop"}).find("adam or sgd"), std::string::npos);
  // A bad width is shown in its whole value (the width alone once read "hidden=0").
  EXPECT_NE(message({"hidden=100x0"}).find("hidden=100x0: expected layer widths"),
            std::string::npos);
  EXPECT_NE(message({"lr"}).find("key=v1,v2"), std::string::npos);
  // Empty fields are errors, a trailing one too (not dropped as std::getline would).
  EXPECT_NE(message({"lr=0.1,"}).find("lr=: expected a positive number"), std::string::npos);
  EXPECT_NE(message({"batch=,10"}).find("batch=: expected a whole number"), std::string::npos);
  EXPECT_NE(message({"hidden=100x"}).find("hidden=100x: expected layer widths such as 100 or "
                                           "256x128 (whole numbers >= 1)"),
            std::string::npos);
  EXPECT_NE(message({"hidden=100,"}).find("hidden=: expected"), std::string::npos);
  EXPECT_NE(message({"lr="}).find("no values"), std::string::npos);
  EXPECT_NE(message({"lr=0.1", "lr=0.2"}).find("given twice"), std::string::npos);
  // A rate float32 rounds to 0 (or to infinity): tandem train refuses it, every such trial failed.
  EXPECT_NE(message({"lr=0.1,1e-50"}).find("lr=1e-50: expected a positive number float32 can "
                                           "hold"),
            std::string::npos);
  EXPECT_NE(message({"lr=1e39"}).find("float32 can hold"), std::string::npos);
  EXPECT_EQ(parse_grid({"lr=1e-45"}).size(), 1u);  // (a denormal: kept, as tandem train keeps it)
  // A value given twice, in any spelling that trains alike: two trials of one model.
  for (const auto& terms : std::vector<std::vector<std::string>>{
           {"lr=0.1,0.1"}, {"lr=0.1,1e-1"}, {"lr=0.1,0.1000000001"}, {"hidden=8,08", "lr=0.1"},
           {"hidden=8x4,8x04"}})
    EXPECT_NE(message(terms).find("--grid: trials 0 and 1 are the same configuration"),
              std::string::npos)
        << terms[0] << ": " << message(terms);
  EXPECT_EQ(parse_grid({"lr=0.1,0.2", "seed=1,2"}).size(), 4u);
  EXPECT_NE(message({}).find("no terms"), std::string::npos);
  // A seed is any uint64, as tandem train --seed takes (not only up to 2^63 - 1).
  EXPECT_EQ(parse_grid({"seed=18446744073709551615"})[0].seed,
            std::numeric_limits<uint64_t>::max());
  EXPECT_NE(message({"seed=-1"}).find("seed=-1: expected a whole number"), std::string::npos);
  EXPECT_NE(message({"seed=\n-1"}).find("expected a whole number"), std::string::npos);
  EXPECT_NE(message({"seed=18446744073709551616"}).find("expected a whole number"),
            std::string::npos);
}

TEST(SearchSpace, ATrialFileIsReadWholeAndContentAfterTheListIsRefused) {
  const test::TempDir dir;
  const auto load = [&](const std::string& text) {
    std::ofstream(dir.file("trials.json")) << text;
    return load_trial_file(dir.file("trials.json"));
  };
  EXPECT_EQ(load("[{\"lr\": 0.1}, {\"lr\": 0.2}]\n").size(), 2u);
  // A typo that closed the list early: before, the first list was taken and the rest ignored.
  const std::string why =
      test::error_of<InputError>([&] { load("[{\"lr\": 0.1}], {\"lr\": 0.2}]"); });
  EXPECT_TRUE(test::contains(why, "trials.json: not valid JSON")) << why;
  EXPECT_THROW(load("[{\"lr\": 0.1}] [{\"lr\": 0.2}]"), InputError);
  // A key given twice in a trial: JSON parsers keep the last, silently; refused as in the grid.
  const std::string twice = test::error_of<InputError>(
      [&] { load("[{\"lr\": 0.1}, 5, {\"hidden\": {\"a\": 1}, \"lr\": 0.1, \"lr\": 0.2}]"); });
  EXPECT_TRUE(test::contains(twice, "trials.json: trial 2: key 'lr' given twice")) << twice;
  // Not a list: said so, whatever the object holds.
  const std::string object =
      test::error_of<InputError>([&] { load("{\"lr\": 0.1, \"lr\": 0.2}"); });
  EXPECT_TRUE(test::contains(object, "expected a non-empty JSON list of objects")) << object;
  // The same key in two trials is no repetition.
  EXPECT_EQ(load("[{\"lr\": 0.1}, {\"lr\": 0.2, \"seed\": 3}]").size(), 2u);
  const std::string same = test::error_of<InputError>(
      [&] { load("[{\"lr\": 0.1}, {\"lr\": 0.2}, {\"lr\": \"1e-1\"}]"); });
  EXPECT_TRUE(test::contains(same, "trial list: trials 0 and 2 are the same configuration"))
      << same;
}

TEST(SearchSpace, TrialListFromJson) {
  const auto trials = parse_trial_list(nlohmann::json::parse(
      R"([{"lr": 0.003, "hidden": [256, 128], "batch": 100},
          {"lr": "1e-4", "hidden": "300", "optimizer": "sgd", "seed": 7}])"));
  ASSERT_EQ(trials.size(), 2u);
  EXPECT_DOUBLE_EQ(trials[0].lr, 0.003);
  EXPECT_EQ(trials[0].hidden, "256,128");
  EXPECT_EQ(trials[0].optimizer, "adam");
  EXPECT_DOUBLE_EQ(trials[1].lr, 1e-4);
  EXPECT_EQ(trials[1].optimizer, "sgd");
  EXPECT_EQ(trials[1].seed, 7u);
  EXPECT_THROW(parse_trial_list(nlohmann::json::parse(R"([{"dropout": 0.5}])")), InputError);
  EXPECT_THROW(parse_trial_list(nlohmann::json::parse(R"({"lr": 0.1})")), InputError);
  EXPECT_THROW(parse_trial_list(nlohmann::json::parse(R"([{"lr": true}])")), InputError);
}

// Runs the halving with `slots` jobs at once; each job ends with loss[trial][rung], the oldest
// running job first. Returns the jobs in the order they started.
std::vector<HalvingJob> drive(SuccessiveHalving& h, int slots,
                              const std::map<int, std::vector<double>>& loss,
                              const std::map<int, int>& crash_at_rung = {}) {
  std::vector<HalvingJob> started, running;
  for (int guard = 0; guard < 1000; ++guard) {
    while (static_cast<int>(running.size()) < slots) {
      const auto job = h.next();
      if (!job) break;
      started.push_back(*job);
      running.push_back(*job);
    }
    if (running.empty()) break;
    const HalvingJob job = running.front();
    running.erase(running.begin());
    const auto crash = crash_at_rung.find(job.trial);
    if (crash != crash_at_rung.end() && crash->second == job.rung) h.fail(job.trial);
    else h.report(job.trial, loss.at(job.trial).at(job.rung));
  }
  EXPECT_TRUE(h.done());
  return started;
}

TEST(SuccessiveHalving, RungsGrowByEtaUpToTheBudget) {
  EXPECT_EQ(SuccessiveHalving(1, 1, 9, 3).rung_epochs(), (std::vector<int>{1, 3, 9}));
  EXPECT_EQ(SuccessiveHalving(1, 1, 5, 3).rung_epochs(), (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(SuccessiveHalving(1, 2, 16, 2).rung_epochs(), (std::vector<int>{2, 4, 8, 16}));
  EXPECT_EQ(SuccessiveHalving(1, 4, 4, 3).rung_epochs(), (std::vector<int>{4}));
  EXPECT_THROW(SuccessiveHalving(0, 1, 9, 3), InputError);
  EXPECT_THROW(SuccessiveHalving(3, 1, 9, 1), InputError);
  EXPECT_THROW(SuccessiveHalving(3, 5, 4, 3), InputError);
}

TEST(SuccessiveHalving, NineTrialsEtaThreeStopSixThenTwo) {
  // The rung-0 top three are trials 1, 4, 7 (ranked so that each third of the arrivals already
  // holds its share of them: ASHA's early promotions agree with synchronous halving here). At
  // rung 1 (3 epochs) trial 4 is best; it alone trains the full 9 epochs.
  std::map<int, std::vector<double>> loss;
  for (int t = 0; t < 9; ++t) loss[t] = {10.0 + t, 9.0, 9.0};
  loss[1] = {1, 0.5, 0.5};
  loss[4] = {2, 0.3, 0.2};
  loss[7] = {3, 0.4, 0.4};
  SuccessiveHalving h(9, 1, 9, 3);
  const auto jobs = drive(h, 1, loss);
  for (int t : {0, 2, 3, 5, 6, 8}) {
    EXPECT_EQ(h.status(t), TrialStatus::Stopped) << "trial " << t;
    EXPECT_EQ(h.rung(t), 0) << "trial " << t;
  }
  for (int t : {1, 7}) {
    EXPECT_EQ(h.status(t), TrialStatus::Stopped) << "trial " << t;
    EXPECT_EQ(h.rung(t), 1) << "trial " << t;
  }
  EXPECT_EQ(h.status(4), TrialStatus::Completed);
  EXPECT_EQ(h.rung(4), 2);
  EXPECT_DOUBLE_EQ(h.loss(4), 0.2);
  EXPECT_EQ(jobs.size(), 9u + 3u + 1u);
}

TEST(SuccessiveHalving, PromotesAsynchronouslyBeforeTheRungIsFull) {
  // Trial 0 is best. With one slot, once three rung-0 losses are in, the top third (trial 0)
  // is promoted at once, before trials 3..8 have started: ASHA's asynchronous promotion.
  std::map<int, std::vector<double>> loss;
  for (int t = 0; t < 9; ++t) loss[t] = {1.0 + t, 1.0 + t, 1.0 + t};
  SuccessiveHalving h(9, 1, 9, 3);
  const auto jobs = drive(h, 1, loss);
  ASSERT_GE(jobs.size(), 4u);
  EXPECT_EQ(jobs[3].trial, 0);
  EXPECT_EQ(jobs[3].rung, 1);
  EXPECT_EQ(jobs[3].epochs, 3);
  EXPECT_EQ(h.status(0), TrialStatus::Completed);
  // Rung 0 keeps 3 of 9 (trials 0, 1, 2); rung 1 keeps 1 of 3.
  EXPECT_EQ(h.rung(1), 1);
  EXPECT_EQ(h.rung(2), 1);
  for (int t = 3; t < 9; ++t) EXPECT_EQ(h.rung(t), 0) << "trial " << t;
  EXPECT_EQ(h.count(TrialStatus::Stopped), 8);
  // 9 rung-0 jobs, 3 rung-1 jobs, 1 rung-2 job.
  EXPECT_EQ(jobs.size(), 13u);
}

TEST(SuccessiveHalving, FewTrialsStillGiveOneTheFullBudget) {
  // 2 trials, eta 3: floor(2/3) = 0, but a final rung always keeps its best.
  SuccessiveHalving h(2, 1, 9, 3);
  drive(h, 2, {{0, {0.5, 0.4, 0.3}}, {1, {0.2, 0.1, 0.05}}});
  EXPECT_EQ(h.status(1), TrialStatus::Completed);
  EXPECT_EQ(h.rung(1), 2);
  EXPECT_EQ(h.status(0), TrialStatus::Stopped);
  EXPECT_EQ(h.rung(0), 0);
}

TEST(SuccessiveHalving, ParallelSlotsEtaTwo) {
  // 4 trials, eta 2, rungs 1, 2, 4, two slots. Rung 0 keeps 2 (trials 1, 3), rung 1 keeps 1.
  SuccessiveHalving h(4, 1, 4, 2);
  drive(h, 2, {{0, {4, 4, 4}}, {1, {2, 1.5, 1}}, {2, {3, 3, 3}}, {3, {1, 2, 2}}});
  EXPECT_EQ(h.rung(0), 0);
  EXPECT_EQ(h.rung(2), 0);
  EXPECT_EQ(h.status(1), TrialStatus::Completed);
  EXPECT_EQ(h.rung(3), 1);
  EXPECT_EQ(h.status(3), TrialStatus::Stopped);
}

TEST(SuccessiveHalving, ACrashedTrialDoesNotStopTheOthers) {
  // Trial 4 would be the best but crashes at rung 0; trial 3 crashes after its promotion.
  std::map<int, std::vector<double>> loss;
  for (int t = 0; t < 6; ++t) loss[t] = {6.0 - t, 6.0 - t, 6.0 - t};
  SuccessiveHalving h(6, 1, 9, 3);
  drive(h, 2, loss, {{4, 0}, {3, 1}});
  EXPECT_EQ(h.status(4), TrialStatus::Failed);
  EXPECT_EQ(h.status(3), TrialStatus::Failed);
  EXPECT_EQ(h.count(TrialStatus::Failed), 2);
  EXPECT_EQ(h.count(TrialStatus::Completed), 1);
  // Five rung-0 losses keep one by ASHA's quota (trial 5) and the final rung keeps at least one.
  EXPECT_EQ(h.status(5), TrialStatus::Completed);
  EXPECT_EQ(h.rung(5), 2);
}

TEST(SuccessiveHalving, APromotedTrialThatCrashesGivesItsPlaceToTheNextInLine) {
  // Three trials, eta 3: rung 0 promotes one. The best (trial 0) crashes at rung 1, so the
  // second (trial 2) goes on in its place and trains the full budget; trial 1 is stopped.
  SuccessiveHalving h(3, 1, 3, 3);
  const auto jobs = drive(h, 1, {{0, {1, 1}}, {1, {3, 3}}, {2, {2, 0.5}}}, {{0, 1}});
  EXPECT_EQ(h.status(0), TrialStatus::Failed);
  EXPECT_EQ(h.status(2), TrialStatus::Completed);
  EXPECT_EQ(h.rung(2), 1);
  EXPECT_EQ(h.status(1), TrialStatus::Stopped);
  EXPECT_EQ(h.rung(1), 0);
  EXPECT_EQ(jobs.size(), 5u);  // three at rung 0, trial 0 and then trial 2 at rung 1
}

TEST(SuccessiveHalving, ACrashAtALaterRungFreesItsPlaceInEveryRungItPassed) {
  // Nine trials, eta 3, rungs 1, 3, 9, one slot. Rung 0 promotes trials 0, 1, 2 (the best
  // three); trial 0 is best at rung 1 and crashes at rung 2. Trial 1, second at rung 1, takes
  // its place at rung 2; trial 3, fourth at rung 0, takes its place at rung 1.
  std::map<int, std::vector<double>> loss;
  for (int t = 0; t < 9; ++t) loss[t] = {1.0 + t, 1.0 + t, 1.0 + t};
  SuccessiveHalving h(9, 1, 9, 3);
  drive(h, 1, loss, {{0, 2}});
  EXPECT_EQ(h.status(0), TrialStatus::Failed);
  EXPECT_EQ(h.status(1), TrialStatus::Completed);
  EXPECT_EQ(h.rung(1), 2);
  EXPECT_EQ(h.rung(3), 1);
  EXPECT_EQ(h.status(3), TrialStatus::Stopped);
  for (int t = 4; t < 9; ++t) EXPECT_EQ(h.rung(t), 0) << "trial " << t;
  EXPECT_EQ(h.count(TrialStatus::Stopped), 7);
}

TEST(SuccessiveHalving, CloseStopsPendingAndWaitingTrials) {
  SuccessiveHalving h(5, 1, 9, 3);
  const auto a = h.next();
  const auto b = h.next();
  ASSERT_TRUE(a && b);
  h.report(a->trial, 1.0);
  h.close();
  h.stop(b->trial);
  EXPECT_TRUE(h.done());
  EXPECT_FALSE(h.next().has_value());
  EXPECT_EQ(h.count(TrialStatus::Stopped), 5);
  EXPECT_EQ(h.rung(a->trial), 0);
  EXPECT_EQ(h.rung(b->trial), -1);
}

// A search that closes flags the trials it stopped: those that could still go on (pending, or
// waiting at a rung that may yet promote them), not the losers of a settled rung.
TEST(SuccessiveHalving, ATrialIsInContentionUntilItsRungIsSettledWithoutIt) {
  SuccessiveHalving h(3, 1, 9, 3);  // rungs of 1, 3 and 9 epochs; one of three goes on
  EXPECT_TRUE(h.in_contention(2));  // pending
  const auto a = h.next(), b = h.next(), c = h.next();
  ASSERT_TRUE(a && b && c);
  h.report(a->trial, 1.0);
  EXPECT_TRUE(h.in_contention(a->trial));  // the others may still finish behind it
  EXPECT_FALSE(h.in_contention(b->trial));  // running: the search counts it on its own
  h.report(b->trial, 0.5);
  h.report(c->trial, 2.0);
  EXPECT_TRUE(h.in_contention(b->trial));  // the rung's one place
  EXPECT_FALSE(h.in_contention(a->trial));
  EXPECT_FALSE(h.in_contention(c->trial));
}

// Equal losses (diverged trials all end at infinity) promote the lower trial, not the one that
// happened to finish first.
TEST(SuccessiveHalving, TiedLossesPromoteTheLowerTrialWhateverOrderTheyCameIn) {
  for (const std::vector<int>& order : {std::vector<int>{2, 0, 1}, {1, 2, 0}, {0, 1, 2}}) {
    SuccessiveHalving h(3, 1, 3, 3);
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(h.next());
    for (int t : order) h.report(t, INFINITY);
    const std::optional<HalvingJob> job = h.next();
    ASSERT_TRUE(job);
    EXPECT_EQ(job->trial, 0) << "reported in the order " << order[0] << order[1] << order[2];
    EXPECT_EQ(job->rung, 1);
  }
}

TEST(SuccessiveHalving, NanLossRanksLast) {
  SuccessiveHalving h(3, 1, 3, 3);
  drive(h, 1, {{0, {NAN, 0}}, {1, {2, 2}}, {2, {3, 3}}});
  EXPECT_EQ(h.status(1), TrialStatus::Completed);
  EXPECT_TRUE(std::isinf(h.loss(0)));
}

}  // namespace
}  // namespace tandem
