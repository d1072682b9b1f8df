// A node's worker group on GPUs: CUDA backends summing their gradients with NCCL in their own
// device arenas, each layer's sum queued behind that layer's backward pass (worker_group.h).
// The test: the NCCL group with one rank against the plain single-GPU worker (the same
// backend's compute_gradients and get_gradients), bit for bit; with two GPUs or more, the group
// against one backend over the combined batch.
//
// Without a CUDA device every test is skipped; the two-GPU one skips on a single GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "backend.h"
#include "cuda/cuda_device.h"
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

// Three layers, so the backward pass finishes three pieces one after another; 301 rows split
// unevenly between members.
const ModelConfig kModel{{64, 40, 24, 10}};
constexpr int64_t kRows = 301;

OptimizerConfig adam() {
  OptimizerConfig o;
  o.learning_rate = 0.001f;
  return o;
}

std::unique_ptr<Backend> gpu_backend(int device = 0) {
  return make_cuda_backend(kModel, adam(), Precision::Fp32, device);
}

// One GPU backend's gradients (into `expected`) and statistics over the whole of `data`.
BatchStats one_backend_over(const Dataset& data, const Model& initial,
                            std::vector<NamedTensor>& expected) {
  auto single = gpu_backend(0);
  single->set_parameters(initial);
  const BatchStats stats = single->compute_gradients(data.view(), nullptr, data.rows());
  single->get_gradients(expected);
  return stats;
}

// One step of a group of two over the rows 0-119 and 120-300 of `data` against one backend's
// gradients and statistics over all of them (`expected`, `single`): the same terms summed in
// another order (each member's rows, then the sum across members), so within float32 rounding
// (the CPU group's test measures at most 3.1e-7 of a tensor's largest |value|; 1e-5 leaves room
// and a missing or doubled row is far beyond it).
void expect_group_step_like_one_backend(WorkerGroup& group, const Dataset& data,
                                        const std::vector<NamedTensor>& expected,
                                        const BatchStats& single) {
  BatchStats stats;
  const auto& got =
      group.step({data.view().slice(0, 120), data.view().slice(120, kRows)}, &stats);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t t = 0; t < expected.size(); ++t) {
    double largest = 0.0;
    for (const float x : expected[t].values) largest = std::max(largest, double(std::fabs(x)));
    EXPECT_TRUE(test::all_close(got[t].values, expected[t].values, 1e-5 * largest, 1e-5))
        << expected[t].name;
  }
  EXPECT_EQ(stats.samples, kRows);
  EXPECT_EQ(stats.correct, single.correct);
  EXPECT_NEAR(stats.loss_sum, single.loss_sum, 1e-5 * std::fabs(single.loss_sum));
}

TEST(WorkerGroupNccl, PiecesCoverTheGradientArenaLastLayerFirst) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  auto backend = gpu_backend();
  backend->set_parameters(Model::initialized(kModel, 3));
  const Backend::DeviceBuffers buffers = backend->device_buffers();
  ASSERT_EQ(buffers.device, 0);
  ASSERT_NE(buffers.gradients, nullptr);
  ASSERT_NE(buffers.parameters, nullptr);
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 31);
  EXPECT_THROW(backend->finish_gradients(), InputError);  // nothing queued
  for (const int64_t rows : {kRows, int64_t{0}}) {
    SCOPED_TRACE("rows " + std::to_string(rows));
    // One left unfinished (a failed group's) is followed by the next.
    backend->enqueue_gradients(data.view().slice(0, 10), nullptr, 10);
    const auto pieces = backend->enqueue_gradients(data.view(), nullptr, rows);
    ASSERT_EQ(pieces.size(), kModel.layers.size() - 1);
    // Last layer first: each piece ends where the one after it (an earlier layer) begins...
    int64_t end = buffers.count;
    for (const auto& piece : pieces) {
      EXPECT_NE(piece.ready, nullptr);
      EXPECT_GT(piece.count, 0);
      EXPECT_EQ(piece.offset + piece.count, end);
      end = piece.offset;
    }
    EXPECT_EQ(end, 0);  // ...and the first layer's begins the arena
    const BatchStats stats = backend->finish_gradients();
    EXPECT_EQ(stats.samples, rows);
    EXPECT_THROW(backend->finish_gradients(), InputError);  // finished already
  }
}

TEST(WorkerGroupNccl, OneRankEqualsThePlainGpuWorkerBitForBit) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 32);
  const Model initial = Model::initialized(kModel, 4);
  auto plain = gpu_backend();
  plain->set_parameters(initial);
  auto member = gpu_backend();
  auto collective = make_nccl_collective({0}, 10000);
  WorkerGroup group(kModel, {member.get()}, *collective);
  group.install(initial);

  // Two batches in turn (the second overwrites the first's gradients everywhere).
  for (const auto& [first, last] : {std::pair<int64_t, int64_t>{0, kRows}, {100, 250}}) {
    SCOPED_TRACE("rows " + std::to_string(first) + ".." + std::to_string(last));
    const DatasetView batch = data.view().slice(first, last);
    const BatchStats expected_stats = plain->compute_gradients(batch, nullptr, batch.rows);
    std::vector<NamedTensor> expected;
    plain->get_gradients(expected);
    BatchStats stats;
    const std::vector<NamedTensor>& got = group.step({batch}, &stats);
    ASSERT_EQ(got.size(), expected.size());
    for (size_t t = 0; t < expected.size(); ++t) {
      EXPECT_EQ(got[t].name, expected[t].name);
      EXPECT_TRUE(same_bits(got[t].values, expected[t].values)) << expected[t].name;
    }
    EXPECT_EQ(stats.samples, expected_stats.samples);
    EXPECT_EQ(stats.correct, expected_stats.correct);
    EXPECT_EQ(stats.loss_sum, expected_stats.loss_sum);
  }

  // No batch: zero gradients, no statistics.
  BatchStats stats;
  for (const float g : flatten(group.step({DatasetView{}}, &stats))) ASSERT_EQ(g, 0.0f);
  EXPECT_EQ(stats.samples, 0);

  // The broadcast leaves the leader's parameters in the member's arena, bit for bit.
  const Model next = Model::initialized(kModel, 5);
  group.install(next);
  Model held(kModel);
  member->get_parameters(held);
  EXPECT_TRUE(same_bits(flatten(held.parameters()), flatten(next.parameters())));
}

// Group gradients (NCCL's sum across two GPUs) against one backend over the combined batch.
TEST(WorkerGroupNccl, TwoGpusSumLikeOneBackendOverTheCombinedBatch) {
  const int gpus = kernels::cuda_device_count();
  if (gpus < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << gpus;
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 33);
  const Model initial = Model::initialized(kModel, 6);
  std::vector<NamedTensor> expected;
  const BatchStats single_stats = one_backend_over(data, initial, expected);

  auto a = gpu_backend(0), b = gpu_backend(1);
  auto collective = make_nccl_collective({0, 1}, 30000);
  WorkerGroup group(kModel, {a.get(), b.get()}, *collective);
  group.install(initial);
  expect_group_step_like_one_backend(group, data, expected, single_stats);
}

// The lent machine has one GPU, where a one-rank NCCL sum changes nothing: the sum itself is
// checked here with two CUDA members on that GPU, summed through host memory (the collective a
// GPU group uses in a build without NCCL), against one backend over the combined batch.
TEST(WorkerGroupNccl, TwoGpuMembersOnOneGpuSumThroughHostMemoryLikeOneBackend) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  const Dataset data = test::random_dataset(PixelType::UInt8, kRows, kModel.inputs(), 10, 34);
  const Model initial = Model::initialized(kModel, 7);
  std::vector<NamedTensor> expected;
  const BatchStats single_stats = one_backend_over(data, initial, expected);

  auto a = gpu_backend(0), b = gpu_backend(0);
  auto collective = make_thread_collective(2, 30000);
  WorkerGroup group(kModel, {a.get(), b.get()}, *collective);
  group.install(initial);
  Model held(kModel);
  b->get_parameters(held);  // the install reached the second member
  EXPECT_TRUE(same_bits(flatten(held.parameters()), flatten(initial.parameters())));
  expect_group_step_like_one_backend(group, data, expected, single_stats);
}

}  // namespace
}  // namespace tandem
