// Training and inference throughput of the CPU backend on Fashion-MNIST held in memory, in the
// shape PyTorch's reference (torch_reference.py) is measured: contiguous batches taken in order,
// a whole step (forward, summed clipped cross-entropy, backward, Adam) timed end to end. Also
// measures OpenBLAS sgemm at the model's GEMM shapes: the ceiling these steps are held against.
//
//   tandem_train_bench --batch 100,1000,10000 --seconds 3 --json
#include <cblas.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "blas_kernels.h"
#include "cpu_backend.h"
#include "tandem/tandem.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Runs `step` (which processes `samples` samples) for at least `seconds` after a warm-up.
template <typename Step>
std::pair<double, int64_t> rate(Step&& step, int64_t samples, double seconds) {
  const auto warm = Clock::now();
  for (int i = 0; i < 5 || since(warm) < 0.3; ++i) step(i);
  int64_t steps = 0;
  const auto start = Clock::now();
  while (since(start) < seconds) step(static_cast<int>(steps++));
  return {static_cast<double>(steps * samples) / since(start), steps};
}

void print(bool json, const nlohmann::json& j) {
  if (json) std::printf("%s\n", j.dump().c_str());
  else std::printf("%s\n", j.dump(1).c_str());
  std::fflush(stdout);
}

// GFLOP/s of single-threaded-per-call sgemm, `threads` calls side by side as the backend runs them.
double sgemm_gflops(int m, int n, int k, bool trans_a, int threads, double seconds) {
  const int lda = trans_a ? m : k;
  std::vector<std::vector<float>> a(threads, std::vector<float>(size_t(m) * k, 0.5f)),
      b(threads, std::vector<float>(size_t(k) * n, 0.25f)), c(threads, std::vector<float>(size_t(m) * n));
  tandem::ThreadPool pool(threads);
  auto [calls_per_s, steps] = rate(
      [&](int) {
        pool.run([&](int t) {
          cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, CblasNoTrans, m, n, k,
                      1.0f, a[t].data(), lda, b[t].data(), n, 1.0f, c[t].data(), n);
        });
      },
      threads, seconds);
  (void)steps;
  return calls_per_s * 2.0 * m * n * k / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  // As the tandem binary does: the kernels a user's run gets (bench/RESULTS.md).
  const std::string blas_warning = tandem::use_better_blas_kernels();
  if (!blas_warning.empty()) std::fprintf(stderr, "warning: %s\n", blas_warning.c_str());
  CLI::App app{"Tandem CPU training throughput"};
  std::vector<int64_t> batches{100, 1000, 10000};
  double seconds = 3.0;
  int threads = 0;
  int64_t block_rows = tandem::CpuBackend::kDefaultBlockRows;
  bool json = false;
  std::string data_dir = tandem::default_data_dir();
  app.add_option("--batch", batches, "Batch sizes")->delimiter(',');
  app.add_option("--seconds", seconds, "Seconds per measurement");
  app.add_option("--threads", threads, "Threads (0: all cores)");
  app.add_option("--block-rows", block_rows, "Rows per block in the CPU backend");
  app.add_option("--data", data_dir, "Fashion-MNIST directory");
  app.add_flag("--json", json, "JSON lines");
  CLI11_PARSE(app, argc, argv);

  try {
    const tandem::DataSplits data = tandem::load_mnist_splits(data_dir);
    const tandem::DatasetView train = data.train.view();
    const tandem::ModelConfig model;
    tandem::CpuBackend backend(model, tandem::OptimizerConfig{}, threads, block_rows);
    backend.set_parameters(tandem::Model::initialized(model, 1));
    const int used_threads = backend.threads();
    for (int64_t batch : batches) {
      const int64_t per_epoch = train.rows / batch;
      auto [train_rate, train_steps] = rate(
          [&](int i) {
            const int64_t begin = (i % per_epoch) * batch;
            backend.compute_gradients(train.slice(begin, begin + batch), nullptr, batch);
            backend.apply_gradients();
          },
          batch, seconds);
      print(json, {{"impl", "tandem"}, {"mode", "train"}, {"batch", batch}, {"threads", used_threads},
                   {"block_rows", block_rows}, {"samples_per_s", train_rate}, {"steps", train_steps}});
      std::vector<uint8_t> predictions(static_cast<size_t>(batch));
      auto [infer_rate, infer_steps] = rate(
          [&](int i) {
            const int64_t begin = (i % per_epoch) * batch;
            backend.predict(train.slice(begin, begin + batch), predictions.data());
          },
          batch, seconds);
      print(json, {{"impl", "tandem"}, {"mode", "infer"}, {"batch", batch}, {"threads", used_threads},
                   {"block_rows", block_rows}, {"samples_per_s", infer_rate}, {"steps", infer_steps}});
    }
    // The model's big GEMMs at the backend's block size (forward x*W1, backward x^T*dH) and at a
    // large square shape, each with every thread running its own call as the backend does.
    const int r = static_cast<int>(block_rows);
    const struct { const char* name; int m, n, k; bool trans_a; } shapes[] = {
        {"forward_block", r, 100, 784, false}, {"weight_grad_block", 784, 100, r, true},
        {"forward_10000", 10000 / used_threads, 100, 784, false}, {"square_1024", 1024, 1024, 1024, false}};
    for (const auto& s : shapes) {
      const double gflops = sgemm_gflops(s.m, s.n, s.k, s.trans_a, used_threads, seconds / 2);
      print(json, {{"impl", "openblas"}, {"mode", "sgemm"}, {"shape", s.name}, {"m", s.m}, {"n", s.n},
                   {"k", s.k}, {"threads", used_threads}, {"gflops", gflops},
                   {"kernels", tandem::blas_kernels().loaded}});
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_train_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
