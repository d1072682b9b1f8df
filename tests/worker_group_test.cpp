// A node's worker group on the CPU: the thread collective (sums in rank order, bit for bit the
// same on every member; broadcasts; a missing member, an abort and mismatched calls ending every
// member's wait with an error naming the rank) and the group's training step on CPU backends
// against one backend over the combined batch (the test: groups of 1, 2 and 3).
//
// Every wait in these tests ends by the collective's own condition variable: no sleeps. Tests
// that expect a wait to be woken early (abort) use a long timeout and check it was not reached.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "backend.h"
#include "cpu/adam_cpu.h"
#include "group_collective.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "test_support.h"
#include "worker_group.h"

namespace tandem {
namespace {

using test::flatten;
using test::same_bits;

// Runs body(rank) on a thread per rank; returns each rank's exception (null: none).
template <typename Body>
std::vector<std::exception_ptr> run_ranks(int members, Body body) {
  std::vector<std::exception_ptr> errors(static_cast<size_t>(members));
  std::vector<std::thread> threads;
  for (int r = 0; r < members; ++r)
    threads.emplace_back([&, r] {
      try {
        body(r);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  return errors;
}

// The message of a GroupError, or a failure naming what was thrown instead.
std::string group_error_text(const std::exception_ptr& error) {
  if (!error) return "(no exception)";
  try {
    std::rethrow_exception(error);
  } catch (const GroupError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a GroupError) ") + e.what();
  }
}


// ---- The thread collective ---------------------------------------------------------------------

// Sizes: empty, one element (fewer elements than members), odd, and more than the summation's
// 2048-float block in one member's slice.
const size_t kCounts[] = {0, 1, 7, 1001, 5 * 2048 + 3};

TEST(ThreadCollective, AllReduceSumsInRankOrderAndEveryMemberGetsTheSameBits) {
  for (const int members : {1, 2, 3, 5}) {
    auto group = make_thread_collective(members, 10000);
    ASSERT_EQ(group->size(), members);
    ASSERT_EQ(group->memory(), GroupCollective::Memory::Host);
    for (const size_t count : kCounts) {
      SCOPED_TRACE("members " + std::to_string(members) + ", count " + std::to_string(count));
      // Three collectives back to back, each on fresh values (seed per member and round).
      std::vector<std::vector<std::vector<float>>> data(3);
      std::vector<std::vector<float>> expected(3);
      for (size_t round = 0; round < 3; ++round) {
        for (int r = 0; r < members; ++r)
          data[round].push_back(test::random_floats(
              count, static_cast<uint32_t>(100 * round + 10 * r + count), -100.0f, 100.0f));
        expected[round] = data[round][0];
        for (int r = 1; r < members; ++r)
          for (size_t i = 0; i < count; ++i) expected[round][i] += data[round][static_cast<size_t>(r)][i];
      }
      const auto errors = run_ranks(members, [&](int rank) {
        for (size_t round = 0; round < 3; ++round)
          group->all_reduce_sum(rank, data[round][static_cast<size_t>(rank)].data(), count);
      });
      for (int r = 0; r < members; ++r) {
        ASSERT_FALSE(errors[static_cast<size_t>(r)]) << group_error_text(errors[static_cast<size_t>(r)]);
        for (size_t round = 0; round < 3; ++round)
          EXPECT_TRUE(same_bits(data[round][static_cast<size_t>(r)], expected[round]))
              << "rank " << r << ", round " << round;
      }
    }
  }
}

TEST(ThreadCollective, BroadcastGivesEveryMemberTheRootsBits) {
  for (const int members : {1, 2, 3, 5}) {
    auto group = make_thread_collective(members, 10000);
    for (const size_t count : kCounts) {
      for (int root = 0; root < members; ++root) {
        SCOPED_TRACE("members " + std::to_string(members) + ", count " + std::to_string(count) +
                     ", root " + std::to_string(root));
        std::vector<std::vector<float>> data;
        for (int r = 0; r < members; ++r)
          data.push_back(test::random_floats(count, static_cast<uint32_t>(7 * r + count + 1)));
        const std::vector<float> expected = data[static_cast<size_t>(root)];
        const auto errors = run_ranks(members, [&](int rank) {
          group->broadcast(rank, data[static_cast<size_t>(rank)].data(), count, root);
        });
        for (int r = 0; r < members; ++r) {
          ASSERT_FALSE(errors[static_cast<size_t>(r)]) << group_error_text(errors[static_cast<size_t>(r)]);
          EXPECT_TRUE(same_bits(data[static_cast<size_t>(r)], expected)) << "rank " << r;
        }
      }
    }
  }
}

// (The timeouts below are seconds, not milliseconds: the members that do take part must all
// arrive within them on a loaded machine, or the error would name them too.)
TEST(ThreadCollective, AMemberThatNeverArrivesIsNamedByTheOthersTimeout) {
  auto group = make_thread_collective(3, 2000);
  std::vector<std::vector<float>> data(3, std::vector<float>(5, 1.0f));
  // Collective #1 with everyone, then #2 without rank 2.
  auto errors = run_ranks(3, [&](int rank) {
    group->all_reduce_sum(rank, data[static_cast<size_t>(rank)].data(), 5);
    if (rank != 2) group->all_reduce_sum(rank, data[static_cast<size_t>(rank)].data(), 5);
  });
  const std::string expected = "worker group: rank 2 did not reach all_reduce #2 within 2000 ms";
  EXPECT_EQ(group_error_text(errors[0]), expected);
  EXPECT_EQ(group_error_text(errors[1]), expected);
  EXPECT_FALSE(errors[2]);
  // The group is broken: rank 2 arriving late gets the same error at once.
  try {
    group->all_reduce_sum(2, data[2].data(), 5);
    ADD_FAILURE() << "a late member's call did not throw";
  } catch (const GroupError& e) {
    EXPECT_EQ(std::string(e.what()), expected);
  }
  // Nobody wrote into another's buffer: the first sum (3) and nothing after it.
  for (const auto& d : data) EXPECT_EQ(d, std::vector<float>(5, 3.0f));
}

TEST(ThreadCollective, TwoMissingMembersAreBothNamed) {
  auto group = make_thread_collective(4, 2000);
  std::vector<float> data(3, 1.0f);
  const auto errors = run_ranks(2, [&](int rank) { group->broadcast(rank * 2, data.data(), 0, 0); });
  for (const auto& e : errors)
    EXPECT_EQ(group_error_text(e), "worker group: ranks 1, 3 did not reach broadcast #1 within 2000 ms");
}

TEST(ThreadCollective, AbortWakesEveryWaitingMemberWithTheReason) {
  // The waiting members may or may not be asleep yet when abort() comes; either way they throw
  // its reason, and long before the timeout. Repeated to see both orders.
  for (int round = 0; round < 20; ++round) {
    auto group = make_thread_collective(3, 60000);
    const auto start = std::chrono::steady_clock::now();
    const auto errors = run_ranks(3, [&](int rank) {
      std::vector<float> data(4, 1.0f);
      if (rank == 2)
        group->abort("rank 2: cannot read batch 17");
      else
        group->all_reduce_sum(rank, data.data(), data.size());
    });
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(seconds, 30.0);
    for (int r = 0; r < 2; ++r)
      EXPECT_EQ(group_error_text(errors[static_cast<size_t>(r)]),
                "worker group aborted: rank 2: cannot read batch 17");
    EXPECT_FALSE(errors[2]);
  }
}

TEST(ThreadCollective, MembersCallingDifferentCollectivesFailTogether) {
  auto group = make_thread_collective(2, 60000);
  const auto errors = run_ranks(2, [&](int rank) {
    std::vector<float> data(12, 1.0f);
    group->all_reduce_sum(rank, data.data(), rank == 0 ? 10 : 12);
  });
  for (const auto& e : errors)
    EXPECT_NE(group_error_text(e).find("as collective #1 but rank"), std::string::npos)
        << group_error_text(e);
}

TEST(ThreadCollective, RefusesBadSizesRanksAndRoots) {
  EXPECT_THROW(make_thread_collective(0, 100), InputError);
  EXPECT_THROW(make_thread_collective(2, 0), InputError);
  auto group = make_thread_collective(2, 100);
  float x = 0.0f;
  EXPECT_THROW(group->all_reduce_sum(2, &x, 1), InputError);
  EXPECT_THROW(group->all_reduce_sum(-1, &x, 1), InputError);
  EXPECT_THROW(group->broadcast(0, &x, 1, 2), InputError);
}

// The stream-ordered all-reduce on a host collective: with no event it is all_reduce_sum (the
// same bits, every member), an event is refused, and finish checks the rank and returns.
TEST(ThreadCollective, AllReduceAfterNoEventIsTheBlockingSumAndAnEventIsRefused) {
  constexpr int kMembers = 3;
  auto group = make_thread_collective(kMembers, 10000);
  std::vector<std::vector<float>> data(kMembers), expected(kMembers);
  for (int r = 0; r < kMembers; ++r) data[size_t(r)] = test::random_floats(1001, 60 + uint32_t(r));
  std::vector<float> sum(1001, 0.0f);
  for (int r = 0; r < kMembers; ++r)
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += data[size_t(r)][i];
  const auto errors = run_ranks(kMembers, [&](int r) {
    group->all_reduce_sum_after(r, data[size_t(r)].data(), data[size_t(r)].size(), nullptr);
    group->finish(r);
  });
  for (int r = 0; r < kMembers; ++r) {
    EXPECT_FALSE(errors[size_t(r)]) << group_error_text(errors[size_t(r)]);
    EXPECT_TRUE(same_bits(data[size_t(r)], sum)) << "rank " << r;
  }
  int not_an_event = 0;
  EXPECT_THROW(group->all_reduce_sum_after(0, sum.data(), sum.size(), &not_an_event), InputError);
  EXPECT_THROW(group->finish(kMembers), InputError);
}

// A collective that sums on GPUs, for the group's refusal of host backends: it reports device
// memory and is never called (the group refuses before any collective).
class DeviceMemoryCollective final : public GroupCollective {
 public:
  int size() const override { return 2; }
  Memory memory() const override { return Memory::Device; }
  int timeout_ms() const override { return 1000; }
  void all_reduce_sum(int, float*, size_t) override { ADD_FAILURE() << "all_reduce_sum called"; }
  void broadcast(int, float*, size_t, int) override { ADD_FAILURE() << "broadcast called"; }
  void abort(const std::string&) override {}
};

TEST(WorkerGroup, ACollectiveOnGpuMemoryRefusesHostBackendsNamingTheRank) {
  auto cpu0 = make_cpu_backend(ModelConfig{{64, 24, 10}}, OptimizerConfig{}, 1);
  auto cpu1 = make_cpu_backend(ModelConfig{{64, 24, 10}}, OptimizerConfig{}, 1);
  // A host backend has no device arenas, and cannot queue gradients for a GPU collective.
  EXPECT_EQ(cpu0->device_buffers().device, -1);
  const Dataset data = test::random_dataset(PixelType::UInt8, 8, 64, 10, 61);
  EXPECT_THROW(cpu0->enqueue_gradients(data.view(), nullptr, 8), InputError);
  EXPECT_THROW(cpu0->finish_gradients(), InputError);
  DeviceMemoryCollective collective;
  try {
    WorkerGroup group(ModelConfig{{64, 24, 10}}, {cpu0.get(), cpu1.get()}, collective);
    ADD_FAILURE() << "a GPU collective took host backends";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0's backend (cpu) keeps its numbers in host memory"),
              std::string::npos)
        << e.what();
  }
}

#ifdef TANDEM_TEST_NO_NCCL
TEST(NcclCollective, ABuildWithoutNcclSaysSo) {
  try {
    make_nccl_collective({0}, 1000);
    ADD_FAILURE() << "made an NCCL group in a build without NCCL";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no NCCL"), std::string::npos) << e.what();
  }
}
#endif

// ---- The group's training step on CPU backends --------------------------------------------------

// A small model and batch: 301 rows (not a multiple of the backend's 128-row blocks, and split
// unevenly between members).
const ModelConfig kModel{{64, 24, 10}};
constexpr int64_t kRows = 301;

OptimizerConfig adam() {
  OptimizerConfig o;
  o.learning_rate = 0.001f;
  return o;
}


// The largest |x| of a tensor.
double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (const float x : v) m = std::max(m, static_cast<double>(std::fabs(x)));
  return m;
}

// Group gradients against one backend's over the combined batch. Not bit for bit: the backend
// adds the rows' contributions block by block (128 rows, sgemm) in one running sum, while a group
// adds each member's slice on its own and then the members' sums, so the same terms are added in
// another order and the float32 roundings differ (about half the elements differ in their last
// bits). Measured on this data: at most 3.1e-7 of the tensor's largest |value| for 2 and 3
// members; the bound leaves 30x room, and a missing or doubled row (~1/300 of a sum) is far
// beyond it.
constexpr double kGradientTol = 1e-5;  // of each tensor's largest |value|, and relative

// A tiny model, so that 200 steps take well under a second.
const ModelConfig kTiny{{6, 5, 3}};

// One CPU backend per member of a group, and the pointers WorkerGroup takes.
struct Members {
  explicit Members(int members, const ModelConfig& model = kTiny) {
    for (int r = 0; r < members; ++r) {
      backends.push_back(make_cpu_backend(model, adam(), 1));
      pointers.push_back(backends.back().get());
    }
  }
  std::vector<std::unique_ptr<Backend>> backends;
  std::vector<Backend*> pointers;
};

struct GroupRun {
  std::vector<NamedTensor> gradients;
  BatchStats stats;
};

GroupRun run_group(int members, const Dataset& data, const Model& initial) {
  Members backends(members, kModel);
  auto collective = make_thread_collective(members, 10000);
  WorkerGroup group(kModel, backends.pointers, *collective);
  group.install(initial);
  std::vector<DatasetView> batches;
  for (int r = 0; r < members; ++r)
    batches.push_back(data.view().slice(kRows * r / members, kRows * (r + 1) / members));
  GroupRun run;
  run.gradients = group.step(batches, &run.stats);
  return run;
}

TEST(WorkerGroup, SummedGradientsOfOneTwoAndThreeMembersEqualOneBackendOverTheCombinedBatch) {
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 21);
  const Model initial = Model::initialized(kModel, 5);
  auto single = make_cpu_backend(kModel, adam(), 1);
  single->set_parameters(initial);
  const BatchStats single_stats = single->compute_gradients(data.view(), nullptr, kRows);
  std::vector<NamedTensor> expected;
  single->get_gradients(expected);
  ASSERT_GT(max_abs(flatten(expected)), 0.0);

  for (const int members : {1, 2, 3}) {
    SCOPED_TRACE("members " + std::to_string(members));
    const GroupRun run = run_group(members, data, initial);
    ASSERT_EQ(run.gradients.size(), expected.size());
    for (size_t t = 0; t < expected.size(); ++t) {
      EXPECT_EQ(run.gradients[t].name, expected[t].name);
      EXPECT_EQ(run.gradients[t].shape, expected[t].shape);
      if (members == 1) {
        // The same backend, rows and thread count: the same bits.
        EXPECT_TRUE(same_bits(run.gradients[t].values, expected[t].values)) << expected[t].name;
      } else {
        EXPECT_TRUE(test::all_close(run.gradients[t].values, expected[t].values,
                                    kGradientTol * max_abs(expected[t].values), kGradientTol))
            << expected[t].name;
      }
    }
    EXPECT_EQ(run.stats.samples, kRows);
    EXPECT_EQ(run.stats.correct, single_stats.correct);
    EXPECT_NEAR(run.stats.loss_sum, single_stats.loss_sum, 1e-5 * std::fabs(single_stats.loss_sum));
  }
}

TEST(WorkerGroup, AdamStepFromTheGroupsGradientEqualsTheStepFromTheCombinedBatch) {
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 22);
  const Model initial = Model::initialized(kModel, 6);
  // One backend over the combined batch, one Adam step (its own gradient).
  auto single = make_cpu_backend(kModel, adam(), 1);
  single->set_parameters(initial);
  single->compute_gradients(data.view(), nullptr, kRows);
  single->apply_gradients();
  Model stepped(kModel);
  single->get_parameters(stepped);
  const std::vector<float> expected = flatten(stepped.parameters());

  for (const int members : {1, 2, 3}) {
    SCOPED_TRACE("members " + std::to_string(members));
    const GroupRun run = run_group(members, data, initial);
    // The leader's update as a parameter server applies it: the engine's Adam kernel, step 1,
    // moments from zero, on the summed gradient.
    std::vector<float> w = flatten(initial.parameters());
    std::vector<float> m(w.size(), 0.0f), v(w.size(), 0.0f);
    const std::vector<float> g = flatten(run.gradients);
    const float* grads[] = {g.data()};
    const kernels::AdamHyper hyper{adam().learning_rate, adam().beta1, adam().beta2,
                                   adam().epsilon};
    kernels::adam_update_cpu(w.data(), m.data(), v.data(), grads, 1, 0,
                             static_cast<int64_t>(w.size()), kernels::adam_step_size(hyper, 1),
                             hyper);
    if (members == 1) {
      EXPECT_TRUE(same_bits(w, expected));
    } else {
      // Adam's first step moves each parameter by lr * g / (|g| + ~eps): a gradient that differs
      // in its last bits moves it by the same amount, so the parameters agree to their own
      // rounding (measured: at most 1.5e-8, one ulp of the weights, in ~25 of 1810). A gradient
      // within rounding of zero could flip sign and move its parameter by 2 lr; on this data the
      // smallest nonzero |g| is 1.3e-4, far above the ~3e-6 the gradients differ by.
      EXPECT_TRUE(test::all_close(w, expected, 1e-4 * adam().learning_rate, 1e-6));
    }
  }
}

TEST(WorkerGroup, AfterTheBroadcastEveryMemberHoldsTheLeadersParametersBitForBit) {
  constexpr int kMembers = 3;
  Members members(kMembers, kModel);
  for (int r = 0; r < kMembers; ++r)  // every member starts somewhere else
    members.pointers[r]->set_parameters(Model::initialized(kModel, static_cast<uint64_t>(40 + r)));
  auto collective = make_thread_collective(kMembers, 10000);
  WorkerGroup group(kModel, members.pointers, *collective);
  const Model leader = Model::initialized(kModel, 99);
  group.install(leader);
  const std::vector<float> expected = flatten(leader.parameters());
  for (int r = 0; r < kMembers; ++r) {
    Model held(kModel);
    members.pointers[static_cast<size_t>(r)]->get_parameters(held);
    EXPECT_TRUE(same_bits(flatten(held.parameters()), expected)) << "rank " << r;
  }
}

TEST(WorkerGroup, AMemberWhoseBatchFailsAbortsTheGroupAndItsErrorIsRethrown) {
  constexpr int kMembers = 3;
  Members members(kMembers, kModel);
  auto collective = make_thread_collective(kMembers, 60000);
  WorkerGroup group(kModel, members.pointers, *collective);
  group.install(Model::initialized(kModel, 3));
  const Dataset good = test::random_dataset(PixelType::UInt8, 30, kModel.inputs(), 10, 23);
  const Dataset bad = test::random_dataset(PixelType::UInt8, 30, kModel.inputs() - 1, 10, 24);
  const auto start = std::chrono::steady_clock::now();
  // Rank 1's batch is one feature short: its InputError, not the others' GroupError, comes out.
  EXPECT_THROW(group.step({good.view(), bad.view(), good.view()}), InputError);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  // The group is broken now.
  try {
    group.step({good.view(), good.view(), good.view()});
    ADD_FAILURE() << "a broken group stepped";
  } catch (const GroupError& e) {
    EXPECT_NE(std::string(e.what()).find("worker group aborted: rank 1: "), std::string::npos)
        << e.what();
  }
}

// The end of a task: fewer batches than members. A member given an empty view adds zeros, even
// right after a step in which it had a batch (its backend still holds that step's gradients),
// and an empty view that does not fit the model (features 0) is not an error.
TEST(WorkerGroup, AMemberWithoutABatchAddsZeroGradients) {
  constexpr int kMembers = 3;
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 25);
  const Model initial = Model::initialized(kModel, 7);
  Members members(kMembers, kModel);
  auto collective = make_thread_collective(kMembers, 10000);
  WorkerGroup group(kModel, members.pointers, *collective);
  group.install(initial);
  const DatasetView a = data.view().slice(0, 100), b = data.view().slice(100, 220),
                    c = data.view().slice(220, kRows);
  group.step({a, b, c});  // every member now holds a gradient

  // Two members over a and b against a group of two over the same batches: the same sum, in the
  // same order, plus zeros (x + 0 is x): the same values (exact; a -0 may come out +0).
  BatchStats stats;
  const std::vector<float> with_empty = flatten(group.step({a, b, DatasetView{}}, &stats));
  const GroupRun pair = [&] {
    Members two(2, kModel);
    auto pair_collective = make_thread_collective(2, 10000);
    WorkerGroup pair_group(kModel, two.pointers, *pair_collective);
    pair_group.install(initial);
    GroupRun run;
    run.gradients = pair_group.step({a, b}, &run.stats);
    return run;
  }();
  ASSERT_GT(max_abs(with_empty), 0.0);
  EXPECT_TRUE(test::all_close(with_empty, flatten(pair.gradients), 0.0, 0.0));
  EXPECT_EQ(stats.samples, 220);
  EXPECT_EQ(stats.correct, pair.stats.correct);
  EXPECT_EQ(stats.loss_sum, pair.stats.loss_sum);

  // The empty member may be any rank, the leader too: ((0 + a) + b) is (a + b) exactly.
  const std::vector<float> leader_empty = flatten(group.step({DatasetView{}, a, b}));
  EXPECT_TRUE(test::all_close(leader_empty, with_empty, 0.0, 0.0));
  // No batch at all: zeros.
  const std::vector<float> none = flatten(group.step({DatasetView{}, DatasetView{}, DatasetView{}}));
  EXPECT_EQ(max_abs(none), 0.0);
}

// ---- The member threads: started once, woken per step ------------------------------------------

// 200 rounds of install + step on the same group (the same member threads every time), each
// against the same arithmetic on one thread: every member's gradient on a backend of its own,
// summed in rank order (the thread collective's order), bit for bit. The parameters move every
// step (plain SGD on the summed gradient, on the host), the batches cycle through uneven slices
// and now and then a member has none.
TEST(WorkerGroup, TwoHundredStepsOnTheSameMemberThreadsMatchOneThreadBitForBit) {
  constexpr int kMembers = 3, kSteps = 200;
  const Dataset data = test::random_dataset(PixelType::UInt8, 40, kTiny.inputs(), 3, 31);
  Members group_members(kMembers), reference(kMembers);
  auto collective = make_thread_collective(kMembers, 10000);
  WorkerGroup group(kTiny, group_members.pointers, *collective);
  Model parameters = Model::initialized(kTiny, 8);
  int64_t samples = 0, expected_samples = 0;
  for (int step = 0; step < kSteps; ++step) {
    std::vector<DatasetView> batches;
    for (int r = 0; r < kMembers; ++r) {
      const int64_t begin = (step * 7 + r * 11) % 30, rows = 1 + (step + r) % 10;
      batches.push_back((step + r) % 17 == 0 ? DatasetView{} : data.view().slice(begin, begin + rows));
    }
    group.install(parameters);
    BatchStats stats;
    const std::vector<float> got = flatten(group.step(batches, &stats));
    samples += stats.samples;

    std::vector<float> expected(got.size(), 0.0f);
    for (int r = 0; r < kMembers; ++r) {
      const DatasetView& batch = batches[static_cast<size_t>(r)];
      std::vector<float> g(got.size(), 0.0f);
      if (batch.rows > 0) {
        Backend& b = *reference.backends[static_cast<size_t>(r)];
        b.set_parameters(parameters);
        b.compute_gradients(batch, nullptr, batch.rows);
        std::vector<NamedTensor> tensors;
        b.get_gradients(tensors);
        g = flatten(tensors);
        expected_samples += batch.rows;
      }
      for (size_t i = 0; i < g.size(); ++i) expected[i] += g[i];
    }
    ASSERT_TRUE(same_bits(got, expected)) << "step " << step;

    size_t i = 0;
    for (auto& tensor : parameters.parameters())
      for (float& w : tensor.values) w -= 0.01f * got[i++];
  }
  EXPECT_EQ(samples, expected_samples);
  // And an install after all of it reaches every member.
  group.install(parameters);
  for (int r = 0; r < kMembers; ++r) {
    Model held(kTiny);
    group_members.backends[static_cast<size_t>(r)]->get_parameters(held);
    EXPECT_TRUE(same_bits(flatten(held.parameters()), flatten(parameters.parameters())))
        << "rank " << r;
  }
}

// The semantics after a member fails mid-run (worker_group.h): the step that failed rethrows that
// member's own error; from then on the group is broken, and every step() and install() throws at
// once the GroupError that names the failed rank and its reason (not a hang, not a timeout), from
// whichever rank reports it. The member threads survive all of it and the destructor joins them.
// Both a member thread (rank 2) and the leader on the caller's thread (rank 0).
TEST(WorkerGroup, AfterAMemberThrowsMidRunEveryLaterCallReportsItAtOnce) {
  for (const int failing : {2, 0}) {
    SCOPED_TRACE("failing rank " + std::to_string(failing));
    constexpr int kMembers = 3;
    const Dataset good = test::random_dataset(PixelType::UInt8, 30, kTiny.inputs(), 3, 32);
    const Dataset bad = test::random_dataset(PixelType::UInt8, 30, kTiny.inputs() + 1, 3, 33);
    Members members(kMembers);
    auto collective = make_thread_collective(kMembers, 60000);
    const auto start = std::chrono::steady_clock::now();
    {
      WorkerGroup group(kTiny, members.pointers, *collective);
      group.install(Model::initialized(kTiny, 9));
      const std::vector<DatasetView> goods(kMembers, good.view());
      for (int step = 0; step < 20; ++step) group.step(goods);
      std::vector<DatasetView> with_bad = goods;
      with_bad[static_cast<size_t>(failing)] = bad.view();
      try {
        group.step(with_bad);
        ADD_FAILURE() << "a step with a bad batch did not throw";
      } catch (const GroupError& e) {
        ADD_FAILURE() << "the others' GroupError came out, not the member's own: " << e.what();
      } catch (const InputError& e) {
        EXPECT_NE(std::string(e.what()).find("features"), std::string::npos) << e.what();
      }
      const std::string expected = "worker group aborted: rank " + std::to_string(failing) + ": ";
      for (int call = 0; call < 5; ++call) {
        try {
          if (call % 2 == 0) group.step(goods);
          else group.install(Model::initialized(kTiny, 9));
          ADD_FAILURE() << "a broken group ran call " << call;
        } catch (const GroupError& e) {
          EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
        }
      }
    }  // the destructor joins the member threads
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 30.0);
  }
}

// Groups made and dropped, with and without a step, one member or several: the member threads
// start and stop cleanly every time (a leaked or detached thread would show under the sanitizers,
// a lost wake-up as a hang).
TEST(WorkerGroup, GroupsStartAndStopTheirMemberThreadsCleanly) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 8, kTiny.inputs(), 3, 34);
  for (int round = 0; round < 30; ++round) {
    const int n = 1 + round % 4;
    Members members(n);
    auto collective = make_thread_collective(n, 10000);
    WorkerGroup group(kTiny, members.pointers, *collective);
    EXPECT_EQ(group.size(), n);
    if (round % 2 == 0) {
      group.install(Model::initialized(kTiny, 10));
      group.step(std::vector<DatasetView>(static_cast<size_t>(n), data.view()));
    }
  }
}

// A CPU backend whose compute_gradients, once hang() was called, waits until release(): a GPU
// stuck in a kernel, as far as the group can tell (no collective is involved in the wait).
class HangingBackend final : public Backend {
 public:
  explicit HangingBackend(const ModelConfig& model) : inner_(make_cpu_backend(model, adam(), 1)) {}
  void hang() {
    std::lock_guard<std::mutex> lock(mutex_);
    hanging_ = true;
  }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      hanging_ = false;
    }
    released_.notify_all();
  }
  std::string name() const override { return "hanging " + inner_->name(); }
  int threads() const override { return inner_->threads(); }
  void set_parameters(const Model& model) override { inner_->set_parameters(model); }
  void set_parameters(const ParameterRuns& runs) override { inner_->set_parameters(runs); }
  void get_parameters(Model& model) const override { inner_->get_parameters(model); }
  void set_optimizer_state(const OptimizerState& state, int64_t step) override {
    inner_->set_optimizer_state(state, step);
  }
  void get_optimizer_state(OptimizerState& state) const override {
    inner_->get_optimizer_state(state);
  }
  int64_t step() const override { return inner_->step(); }
  BatchStats compute_gradients(const DatasetView& data, const int32_t* rows,
                               int64_t count) override {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      released_.wait(lock, [&] { return !hanging_; });
    }
    return inner_->compute_gradients(data, rows, count);
  }
  void apply_gradients() override { inner_->apply_gradients(); }
  void get_gradients(std::vector<NamedTensor>& out) const override { inner_->get_gradients(out); }
  BatchStats evaluate(const DatasetView& data) override { return inner_->evaluate(data); }
  void predict(const DatasetView& data, uint8_t* out) override { inner_->predict(data, out); }

 private:
  std::unique_ptr<Backend> inner_;
  std::mutex mutex_;
  std::condition_variable released_;
  bool hanging_ = false;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Issue 8: a GPU that hangs is reported with its rank within a timeout instead of hanging the
// node. Rank 1 hangs in its backend before the all-reduce: the others time out in the
// collective, and the step, which once waited for rank 1 forever, throws within the timeout
// after that, naming rank 1; every later call throws the same at once. Rank 1 comes back before
// the group is destroyed, and the destructor joins it (it found the collective aborted).
TEST(WorkerGroup, AMemberHangingInItsBackendIsNamedWithinTheTimeoutAndNotWaitedFor) {
  constexpr int kMembers = 3, kTimeoutMs = 300;
  const Dataset data = test::random_dataset(PixelType::UInt8, 12, kTiny.inputs(), 3, 35);
  const std::vector<DatasetView> batches(kMembers, data.view());
  Members members(kMembers);
  HangingBackend hanging(kTiny);
  members.pointers[1] = &hanging;
  auto collective = make_thread_collective(kMembers, kTimeoutMs);
  const std::string expected = "worker group: rank 1 did not finish its step within 300 ms of "
                               "rank 0's failure (its backend hangs";
  {
    WorkerGroup group(kTiny, members.pointers, *collective);
    group.install(Model::initialized(kTiny, 11));
    group.step(batches);  // the group works before the hang
    hanging.hang();
    const auto start = std::chrono::steady_clock::now();
    try {
      group.step(batches);
      ADD_FAILURE() << "a step with a hanging member returned";
    } catch (const GroupError& e) {
      EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
    }
    // The collective's timeout, then the same again for the members: well under a minute.
    EXPECT_LT(seconds_since(start), 30.0);
    for (int call = 0; call < 3; ++call) {
      const auto again = std::chrono::steady_clock::now();
      try {
        if (call % 2 == 0) group.install(Model::initialized(kTiny, 11));
        else group.step(batches);
        ADD_FAILURE() << "a group that left a member behind ran call " << call;
      } catch (const GroupError& e) {
        EXPECT_EQ(std::string(e.what()).rfind(expected, 0), 0u) << e.what();
      }
      EXPECT_LT(seconds_since(again), 0.25);  // at once: no new round, no timeout
    }
    hanging.release();
  }
}

// Rank 0 fails when the collective times out waiting for the hung member; the others are then
// back at once, so the step throws a moment after that timeout, not after a second one (the
// group timeout is a minute and more in a run), naming the hung rank and rank 0's own error.
TEST(WorkerGroup, AHungMemberIsNamedAMomentAfterTheCollectiveTimesOut) {
  constexpr int kMembers = 3, kTimeoutMs = 4000;
  const Dataset data = test::random_dataset(PixelType::UInt8, 12, kTiny.inputs(), 3, 37);
  const std::vector<DatasetView> batches(kMembers, data.view());
  Members members(kMembers);
  HangingBackend hanging(kTiny);
  members.pointers[2] = &hanging;
  auto collective = make_thread_collective(kMembers, kTimeoutMs);
  {
    WorkerGroup group(kTiny, members.pointers, *collective);
    group.install(Model::initialized(kTiny, 13));
    hanging.hang();
    const auto start = std::chrono::steady_clock::now();
    try {
      group.step(batches);
      ADD_FAILURE() << "a step with a hanging member returned";
    } catch (const GroupError& e) {
      const std::string text = e.what();
      EXPECT_EQ(text.rfind("worker group: rank 2 did not finish its step within 1000 ms of rank "
                           "0's failure (its backend hangs",
                           0),
                0u)
          << text;
      EXPECT_NE(text.find("(rank 0: worker group: rank 2 did not reach all_reduce"),
                std::string::npos)
          << text;
    }
    // The collective's 4 s and the 1 s after it; twice the timeout (8 s) before.
    EXPECT_LT(seconds_since(start), 7.0);
    hanging.release();
  }
}

// Rank 0 failing on its own (a bad batch: its backend's error, not the collective's timeout)
// leaves the others the whole timeout: a member in a long step of its own (1.5 s here) is not
// taken for hung. It was, a second after any failure of rank 0, and the group left behind.
TEST(WorkerGroup, ALeaderFailingOnItsOwnLeavesASlowMemberTheWholeTimeout) {
  constexpr int kMembers = 2, kTimeoutMs = 4000;
  const Dataset data = test::random_dataset(PixelType::UInt8, 12, kTiny.inputs(), 3, 38);
  const Dataset bad = test::random_dataset(PixelType::UInt8, 12, kTiny.inputs() - 1, 3, 39);
  Members members(kMembers);
  HangingBackend slow(kTiny);
  members.pointers[1] = &slow;
  auto collective = make_thread_collective(kMembers, kTimeoutMs);
  WorkerGroup group(kTiny, members.pointers, *collective);
  group.install(Model::initialized(kTiny, 14));
  slow.hang();
  std::thread releaser([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    slow.release();
  });
  // Rank 0's own InputError comes out, not "rank 1 did not finish".
  EXPECT_THROW(group.step({bad.view(), data.view()}), InputError);
  releaser.join();
  EXPECT_FALSE(group.abandoned());
}

// A member still hanging when its group is destroyed: the destructor does not wait for it
// forever, nor leave its thread to return into freed memory. After a grace period it ends the
// process, naming the rank (a death test, run in a child that re-executes this test alone).
TEST(WorkerGroup, DestroyingAGroupWithAMemberStillHangingEndsTheProcessNamingIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        constexpr int kMembers = 2;
        const Dataset data = test::random_dataset(PixelType::UInt8, 12, kTiny.inputs(), 3, 36);
        const std::vector<DatasetView> batches(kMembers, data.view());
        Members members(kMembers);
        HangingBackend hanging(kTiny);
        members.pointers[1] = &hanging;
        auto collective = make_thread_collective(kMembers, 200);
        auto group = std::make_unique<WorkerGroup>(kTiny, members.pointers, *collective);
        group->install(Model::initialized(kTiny, 12));
        hanging.hang();
        try {
          group->step(batches);
        } catch (const GroupError&) {
        }
        group.reset();
      },
      "rank 1 did not finish its step within 200 ms of rank 0.*destroyed with that member "
      "still in its backend");
}

TEST(WorkerGroup, RefusesAMismatchedCollective) {
  auto backend = make_cpu_backend(kModel, adam(), 1);
  auto collective = make_thread_collective(2, 100);
  EXPECT_THROW(WorkerGroup(kModel, {backend.get()}, *collective), InputError);
}

}  // namespace
}  // namespace tandem
