// Google Benchmark suite of the CPU kernels at the seed model's shapes, single-threaded (the CPU
// backend runs one such call per thread). FLOP/s and bytes/s are reported as counters; compare
// the dense kernels with the sgemm rates tandem_train_bench prints, and the element-wise ones
// with the machine's memory bandwidth (~20 GB/s from DRAM, far more from cache at these sizes).
//
//   build/bench/tandem_kernels_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "blas_kernels.h"
#include "cpu/adam_cpu.h"
#include "cpu/convert_cpu.h"
#include "cpu/dense_cpu.h"
#include "cpu/softmax_xent_cpu.h"
#include "cpu/vector_clones.h"

namespace {

std::vector<float> random_vector(size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(gen);
  return v;
}

void set_flops(benchmark::State& state, double flops_per_iteration) {
  state.counters["FLOP/s"] = benchmark::Counter(flops_per_iteration * static_cast<double>(state.iterations()),
                                                benchmark::Counter::kIsRate);
}

void BM_DenseForwardRelu(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), out = state.range(2);
  const auto x = random_vector(rows * in, 1), w = random_vector(in * out, 2), b = random_vector(out, 3);
  std::vector<float> y(rows * out);
  for (auto _ : state) {
    tandem::kernels::dense_forward_cpu(x.data(), w.data(), b.data(), y.data(), rows, in, out, true);
    benchmark::DoNotOptimize(y.data());
  }
  set_flops(state, 2.0 * rows * in * out);
}
BENCHMARK(BM_DenseForwardRelu)->Args({128, 784, 100})->Args({50, 784, 100})->Args({128, 100, 10});

void BM_DenseBackwardParams(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), out = state.range(2);
  const auto x = random_vector(rows * in, 1), dy = random_vector(rows * out, 2);
  std::vector<float> dw(in * out), db(out);
  for (auto _ : state) {
    tandem::kernels::dense_backward_params_cpu(x.data(), dy.data(), dw.data(), db.data(), rows, in,
                                               out, true);
    benchmark::DoNotOptimize(dw.data());
  }
  set_flops(state, 2.0 * rows * in * out);
}
BENCHMARK(BM_DenseBackwardParams)->Args({128, 784, 100})->Args({50, 784, 100})->Args({128, 100, 10});

void BM_DenseBackwardInputRelu(benchmark::State& state) {
  const int64_t rows = state.range(0), in = state.range(1), out = state.range(2);
  const auto dy = random_vector(rows * out, 1), w = random_vector(in * out, 2);
  auto x = random_vector(rows * in, 3);
  std::vector<float> dx(rows * in);
  for (auto _ : state) {
    tandem::kernels::dense_backward_input_relu_cpu(dy.data(), w.data(), x.data(), dx.data(), rows,
                                                   in, out);
    benchmark::DoNotOptimize(dx.data());
  }
  set_flops(state, 2.0 * rows * in * out);
}
BENCHMARK(BM_DenseBackwardInputRelu)->Args({128, 100, 10});

void BM_SoftmaxXent(benchmark::State& state) {
  const int64_t rows = state.range(0), classes = 10;
  const auto z = random_vector(rows * classes, 1);
  std::vector<uint8_t> labels(rows);
  for (int64_t r = 0; r < rows; ++r) labels[r] = static_cast<uint8_t>(r % classes);
  std::vector<float> dz(rows * classes);
  for (auto _ : state) {
    tandem::kernels::SoftmaxXentStats stats;
    tandem::kernels::softmax_xent_cpu(z.data(), labels.data(), dz.data(), rows, classes, stats);
    benchmark::DoNotOptimize(stats);
  }
  state.SetBytesProcessed(state.iterations() * rows * classes * 8);
}
BENCHMARK(BM_SoftmaxXent)->Arg(128)->Arg(10000);

void BM_AdamAllParameters(benchmark::State& state) {
  // The seed model's 79,510 parameters, gradients from `parts` threads summed on the fly.
  const int64_t n = 79510;
  const int parts = static_cast<int>(state.range(0));
  auto w = random_vector(n, 1), m = random_vector(n, 2), v = random_vector(n, 3);
  for (auto& x : v) x = x * x;
  std::vector<std::vector<float>> grads;
  std::vector<const float*> pointers;
  for (int p = 0; p < parts; ++p) grads.push_back(random_vector(n, 10 + p));
  for (auto& g : grads) pointers.push_back(g.data());
  const tandem::kernels::AdamHyper h;
  for (auto _ : state) {
    tandem::kernels::adam_update_cpu(w.data(), m.data(), v.data(), pointers.data(), parts, 0, n,
                                     0.001f, h);
    benchmark::DoNotOptimize(w.data());
  }
  state.SetBytesProcessed(state.iterations() * n * 4 * (6 + parts));  // read w,m,v,g; write w,m,v
}
BENCHMARK(BM_AdamAllParameters)->Arg(1)->Arg(2);

// Two bounds for BM_AdamAllParameters/1, built as the kernel is (the same vector clones and
// flags): the time of a parameter server's update (bench/RESULTS.md, issue 5) is as long as the
// longer of its memory traffic and its square roots and divisions.

// Adam's loads and stores and its multiply-adds, with the square root and the division replaced
// by a multiplication.
TANDEM_VECTOR_CLONES __attribute__((noinline)) void adam_without_sqrt_divide(
    float* w, float* m, float* v, const float* g, int64_t n, float lr_t,
    const tandem::kernels::AdamHyper& h) {
  // Locals, as in the kernel: the stores could alias h, and would keep the loop scalar.
  const float b1 = h.beta1, b2 = h.beta2, one_b1 = 1.0f - h.beta1, one_b2 = 1.0f - h.beta2;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    m[i] = b1 * m[i] + one_b1 * g[i];
    v[i] = b2 * v[i] + one_b2 * g[i] * g[i];
    w[i] -= lr_t * m[i] * v[i];
  }
}

// Adam's square root and division with nothing else: the moments are read, not updated, and
// there is no gradient.
TANDEM_VECTOR_CLONES __attribute__((noinline)) void sqrt_divide_only(float* w, const float* m,
                                                              const float* v, int64_t n,
                                                              float lr_t, float eps) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
}

void BM_AdamBound(benchmark::State& state) {
  const int64_t n = 79510;
  const bool memory = state.range(0) == 0;
  auto w = random_vector(n, 1), m = random_vector(n, 2), v = random_vector(n, 3),
       g = random_vector(n, 10);
  for (auto& x : v) x = x * x;
  const tandem::kernels::AdamHyper h;
  for (auto _ : state) {
    if (memory)
      adam_without_sqrt_divide(w.data(), m.data(), v.data(), g.data(), n, 0.001f, h);
    else
      sqrt_divide_only(w.data(), m.data(), v.data(), n, 0.001f, h.epsilon);
    benchmark::DoNotOptimize(w.data());
  }
  state.SetLabel(memory ? "memory: no sqrt or divide" : "sqrt and divide only");
  state.SetBytesProcessed(state.iterations() * n * 4 * (memory ? 7 : 4));
}
BENCHMARK(BM_AdamBound)->Arg(0)->Arg(1);

// Arg 1: rows per call; arg 2: 0 gathers the same rows every call (they stay in cache after the
// first), 1 fresh random rows every call, as training draws them from the whole 43 MB array.
void BM_GatherScaleU8(benchmark::State& state) {
  const int64_t rows = state.range(0), features = 784, source_rows = 55000;
  const bool fresh = state.range(1) != 0;
  std::vector<uint8_t> src(source_rows * features);
  std::mt19937 gen(1);
  for (auto& x : src) x = static_cast<uint8_t>(gen());
  // 4,096 index sets of fresh rows: 512k rows, many times the source, cycled through.
  const int64_t sets = fresh ? 4096 : 1;
  std::vector<int32_t> order(rows * sets);
  for (auto& r : order) r = static_cast<int32_t>(gen() % source_rows);
  std::vector<float> dst(rows * features);
  int64_t set = 0;
  for (auto _ : state) {
    tandem::kernels::gather_rows_u8_cpu(src.data(), features, order.data() + set * rows, rows,
                                        dst.data());
    benchmark::DoNotOptimize(dst.data());
    set = set + 1 == sets ? 0 : set + 1;
  }
  state.SetLabel(fresh ? "fresh rows each call" : "the same rows each call (in cache)");
  state.SetBytesProcessed(state.iterations() * rows * features * 5);
}
BENCHMARK(BM_GatherScaleU8)->Args({128, 0})->Args({128, 1});

}  // namespace

int main(int argc, char** argv) {
  // As the tandem binary does: the kernels a user's run gets (bench/RESULTS.md).
  const std::string blas_warning = tandem::use_better_blas_kernels();
  if (!blas_warning.empty()) std::fprintf(stderr, "warning: %s\n", blas_warning.c_str());
  openblas_set_num_threads(1);  // as the CPU backend runs them
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
