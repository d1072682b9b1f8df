// A worker group's step (worker_group.h) on CPU backends, two ways of driving its members:
//   persistent      WorkerGroup::step: rank 0 on this thread, the others on the group's member
//                   threads, started once and woken per step (the engine's way);
//   thread_per_step the same reduce_gradients calls from a std::thread per member other than
//                   rank 0, started and joined every step (how step() ran before).
// The difference is the cost of starting and joining the threads, which matters on small steps.
// Arguments: members, rows per member. Each member's backend has one thread.
//
//   tandem_group_step_bench --benchmark_min_time=2 --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backend.h"
#include "group_collective.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/model.h"
#include "worker_group.h"

namespace {

using namespace tandem;

// Fashion-MNIST's shape with the seed's hidden layer.
const ModelConfig kModel{{784, 100, 10}};

Dataset random_data(int64_t rows, uint32_t seed) {
  Dataset data(PixelType::UInt8, rows, kModel.inputs(), 10);
  std::mt19937 gen(seed);
  for (int64_t r = 0; r < rows; ++r) data.label_data()[r] = static_cast<uint8_t>(gen() % 10);
  for (int64_t i = 0; i < rows * kModel.inputs(); ++i)
    data.pixel_data()[i] = static_cast<uint8_t>(gen());
  return data;
}

struct Fixture {
  explicit Fixture(int members, int64_t rows)
      : data(random_data(std::max<int64_t>(rows * members, 1), 7)), collective(make_thread_collective(members, 60000)) {
    std::vector<Backend*> pointers;
    for (int r = 0; r < members; ++r) {
      backends.push_back(make_cpu_backend(kModel, OptimizerConfig{}, 1));
      pointers.push_back(backends.back().get());
      batches.push_back(rows == 0 ? DatasetView{} : data.view().slice(rows * r, rows * (r + 1)));
    }
    group = std::make_unique<WorkerGroup>(kModel, pointers, *collective);
    group->install(Model::initialized(kModel, 1));
  }
  Dataset data;
  std::vector<std::unique_ptr<Backend>> backends;
  std::unique_ptr<GroupCollective> collective;
  std::unique_ptr<WorkerGroup> group;
  std::vector<DatasetView> batches;
};

void persistent(benchmark::State& state) {
  Fixture f(static_cast<int>(state.range(0)), state.range(1));
  for (auto _ : state) benchmark::DoNotOptimize(f.group->step(f.batches).data());
  state.SetItemsProcessed(state.iterations() * state.range(0) * state.range(1));
}

void thread_per_step(benchmark::State& state) {
  const int members = static_cast<int>(state.range(0));
  Fixture f(members, state.range(1));
  for (auto _ : state) {
    std::vector<std::thread> threads;
    for (int r = 1; r < members; ++r)
      threads.emplace_back([&, r] { f.group->reduce_gradients(r, f.batches[size_t(r)]); });
    f.group->reduce_gradients(0, f.batches[0]);
    for (auto& t : threads) t.join();
    benchmark::DoNotOptimize(f.group->leader_gradients().data());
  }
  state.SetItemsProcessed(state.iterations() * state.range(0) * state.range(1));
}

// Two members (the case) on 0 (no batch: the collective and the hand-offs alone), 1, 16
// and 128 rows each; three on 16.
void arguments(benchmark::internal::Benchmark* b) {
  b->Args({2, 0})->Args({2, 1})->Args({2, 16})->Args({2, 128})->Args({3, 16})->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
}

BENCHMARK(persistent)->Apply(arguments);
BENCHMARK(thread_per_step)->Apply(arguments);

}  // namespace

BENCHMARK_MAIN();
