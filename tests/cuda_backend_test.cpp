// The CUDA backend against the CPU backend (one thread): whole training runs, the asynchronous
// step path, evaluation and prediction (classes and logits), moving parameters and optimizer state in and out, and
// the errors bad input gets.
//
// On training data. Two float32 implementations that add in different orders agree step by step
// only while training is well conditioned. This was measured by running these tests on a CPU
// emulation of the CUDA kernels (float64-accumulated products, float64 softmax) against the CPU
// backend, over 40 to 60 draws of the seeds:
// - Pixels and labels both random: the net hovers where a ReLU input or an Adam gradient is
//   within rounding of zero, and the trajectories part in several percent of runs.
// - Learnable data at lr 0.01: the loss reaches ~1e-3 within 15 steps; from there the gradients
//   are p - 1 with p within 1e-5 of 1, float32 noise that Adam's division by sqrt(v) turns into
//   full-size steps, and the parameters random-walk apart (a tenth to a fifth of the runs,
//   depending on the betas, failed a 1e-3 bound).
// - Learnable data (test::separable_dataset: random uint8 noise, each class bright in its own
//   block of features) at lr 0.001, as here: the loss falls from ~230 to ~0.3 over the 50 steps;
//   per-step losses agree within 2e-6 relative, parameters and moments within 2e-4 of each
//   tensor's largest value, except in 2 runs of 60 where one hidden unit's column parted by up
//   to 2.3e-3 (a ReLU input within rounding of zero on one row switched sides).
// The bounds below leave room above those figures for a real GPU's own rounding, and stay far
// below what a wrong gradient, step size or hyperparameter produces (O(lr * steps) = 5e-2).
//
// Without a CUDA device every test is skipped (the fixture's SetUp).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda_backend.h"
#include "cuda/cuda_device.h"
#include "parameter_runs_check.h"
#include "tandem/config.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "test_support.h"

namespace tandem {
namespace {

// ---- Tolerances -------------------------------------------------------------------------------

// A step's summed loss (100 rows, float32 log-softmax per row) in float32 on both backends, with
// parameters that have drifted apart by rounding over the previous steps: emulation gives at most
// 2e-6 relative. The floor of one nat: late in training the loss of a separable batch is ~1e-3,
// where float32's absolute error per row (~1e-7) is all a relative bound would measure.
constexpr double kLossRtol = 1e-4;
// Parameters and Adam's second moment after 50 steps, relative to each tensor's largest value;
// Adam's first moment relative to sqrt(v) element by element (the scale Adam divides it by, so
// the bound reads "the updates agree to 1e-3 of lr"). Up to 1% of a tensor (one hidden unit's
// column of the first layer's weights) may exceed the bound, but none kStateOutlierRtol.
constexpr double kStateRtol = 1e-3;
constexpr double kStateOutlierFraction = 0.01;
constexpr double kStateOutlierRtol = 1e-2;
// One Adam step, or ten SGD steps, from the same state: only those steps' rounding (~1e-6). As
// above, one hidden unit's column may part (emulation: 2 SGD runs in 60, by up to 4.5e-4).
constexpr double kOneStepRtol = 1e-4;
// Evaluation with the same parameters: per-row float32 losses summed in double.
constexpr double kEvalLossRtol = 1e-5;
// The asynchronous path runs the same kernels on the same data: bit-identical in practice; the
// bound (for the summed loss and the parameters) allows another order of summation.
constexpr double kAsyncRtol = 1e-6;
// TF32 rounds every product's operands to 10 mantissa bits. Measured against the first step's
// loss (the run's loss scale): emulation gives at most 8.5e-4 per step over 28 draws (and at
// most 3.2e-3 at lr 0.01). The loss falls by orders of magnitude within the 20 steps, so a
// bound relative to each step's own loss would measure the slope rather than the precision.
constexpr double kTf32LossTol = 1e-2;

// Arg-max decisions: with different rounding a near-tie may go the other way on one row.
constexpr int64_t kCorrectSlack = 1;
// TF32: logits differ by ~1e-3, so a few more near-ties may flip in a batch of 100.
constexpr int64_t kTf32CorrectSlack = 5;

// ---- Setup ------------------------------------------------------------------------------------

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  }
};

ModelConfig mnist_model() { return ModelConfig::parse("784-100-10"); }

// Adam for the training runs: lr 0.001 keeps 50 steps short of the float32 noise floor (see the
// top of the file); not the default, so a backend that ignores the configured rate shows.
OptimizerConfig adam_config() {
  OptimizerConfig opt;
  opt.learning_rate = 0.001f;
  return opt;
}

// Every hyperparameter off its default, for single steps (where no trajectory can part).
OptimizerConfig unusual_adam_config() {
  OptimizerConfig opt;
  opt.learning_rate = 0.003f;
  opt.beta1 = 0.8f;
  opt.beta2 = 0.99f;
  opt.epsilon = 1e-6f;
  return opt;
}

constexpr int64_t kTrainRows = 3000;
constexpr int64_t kBatch = 100;

Dataset training_data() { return test::separable_dataset(kTrainRows, 784, 10, 41); }

// Row lists of `steps` batches: consecutive chunks of fresh random permutations of the rows.
std::vector<int32_t> batch_rows(int64_t rows, int64_t batch, int steps, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> out;
  while (static_cast<int64_t>(out.size()) < batch * steps) {
    std::vector<int32_t> perm(static_cast<size_t>(rows));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), gen);
    out.insert(out.end(), perm.begin(), perm.end());
  }
  out.resize(static_cast<size_t>(batch * steps));
  return out;
}

std::unique_ptr<Backend> cpu_backend(const OptimizerConfig& opt) {
  return make_cpu_backend(mnist_model(), opt, 1);
}

std::unique_ptr<Backend> cuda_backend(const OptimizerConfig& opt,
                                      Precision precision = Precision::Fp32) {
  return make_cuda_backend(mnist_model(), opt, precision);
}

Model parameters_of(const Backend& backend) {
  Model model(mnist_model());
  backend.get_parameters(model);
  return model;
}

OptimizerState optimizer_state_of(const Backend& backend) {
  OptimizerState state;
  backend.get_optimizer_state(state);
  return state;
}

// `steps` synchronous steps (compute_gradients + apply_gradients); the stats of each.
std::vector<BatchStats> train(Backend& backend, const Dataset& data,
                              const std::vector<int32_t>& rows, int steps) {
  std::vector<BatchStats> out;
  for (int s = 0; s < steps; ++s) {
    out.push_back(backend.compute_gradients(data.view(), rows.data() + s * kBatch, kBatch));
    backend.apply_gradients();
  }
  return out;
}

BatchStats sum(const std::vector<BatchStats>& stats) {
  BatchStats total;
  for (const auto& s : stats) {
    total.loss_sum += s.loss_sum;
    total.correct += s.correct;
    total.samples += s.samples;
  }
  return total;
}

// The same tensors (names, shapes) holding uniform random values in [lo, hi).
std::vector<NamedTensor> random_like(const std::vector<NamedTensor>& shape_of, uint32_t seed,
                                     float lo, float hi) {
  std::vector<NamedTensor> out = shape_of;
  for (auto& t : out) t.values = test::random_floats(t.values.size(), seed++, lo, hi);
  return out;
}

// ---- Comparisons ------------------------------------------------------------------------------

::testing::AssertionResult same_layout(const std::vector<NamedTensor>& out,
                                       const std::vector<NamedTensor>& ref) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << out.size() << " tensors, expected " << ref.size();
  for (size_t t = 0; t < out.size(); ++t)
    if (out[t].name != ref[t].name || out[t].shape != ref[t].shape ||
        out[t].values.size() != ref[t].values.size())
      return ::testing::AssertionFailure()
             << "tensor " << t << " is '" << out[t].name << "' with " << out[t].values.size()
             << " values, expected '" << ref[t].name << "' with " << ref[t].values.size();
  return ::testing::AssertionSuccess();
}

// How far a tensor may be from its reference: every value finite; |out - ref| <= rel * scale
// for all but a fraction `outlier_fraction` of the values (rounded down), and those within
// outlier_rel * scale (see the top of the file for why single elements or one hidden unit's
// column may part).
struct Closeness {
  double rel;
  double outlier_fraction = 0.0;
  double outlier_rel = 0.0;
};

// Checks one tensor; `scale(i)` is the scale of element i.
template <typename Scale>
::testing::AssertionResult tensor_close(const std::string& name, const std::vector<float>& o,
                                        const std::vector<float>& r, const Closeness& c,
                                        Scale scale) {
  size_t over = 0, worst = 0;
  double worst_ratio = -1.0;
  for (size_t i = 0; i < o.size(); ++i) {
    if (!std::isfinite(o[i]))
      return ::testing::AssertionFailure() << name << "[" << i << "] is " << o[i];
    const double diff = std::fabs(static_cast<double>(o[i]) - r[i]);
    const double s = scale(i);
    over += diff > c.rel * s;
    const double ratio = diff == 0.0 ? 0.0 : diff / s;  // inf when the scale is 0
    if (ratio > worst_ratio) {
      worst_ratio = ratio;
      worst = i;
    }
  }
  const auto allowed = static_cast<size_t>(c.outlier_fraction * static_cast<double>(o.size()));
  const double cap = std::max(c.rel, c.outlier_rel);
  if (over > allowed || worst_ratio > cap)
    return ::testing::AssertionFailure()
           << name << ": " << over << " of " << o.size() << " values differ by more than " << c.rel
           << " of their scale (" << allowed << " may, by up to " << cap << "); worst [" << worst
           << "]: got " << o[worst] << ", expected " << r[worst] << ", " << worst_ratio
           << " of the scale " << scale(worst);
  return ::testing::AssertionSuccess();
}

// Per tensor, the scale being the tensor's largest reference value.
::testing::AssertionResult tensors_close(const std::vector<NamedTensor>& out,
                                         const std::vector<NamedTensor>& ref, const Closeness& c) {
  if (auto layout = same_layout(out, ref); !layout) return layout;
  for (size_t t = 0; t < out.size(); ++t) {
    double scale = 0.0;
    for (float v : ref[t].values) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    auto result = tensor_close(out[t].name, out[t].values, ref[t].values, c,
                               [scale](size_t) { return scale; });
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

// Adam's first moments, element i's scale being sqrt(v_ref[i]): the scale Adam divides m by.
// (Where v is 0 the gradient was always 0, and m must be exactly 0 too.)
::testing::AssertionResult first_moments_close(const OptimizerState& out, const OptimizerState& ref,
                                               const Closeness& c) {
  if (auto layout = same_layout(out.m, ref.m); !layout) return layout;
  if (auto layout = same_layout(ref.v, ref.m); !layout) return layout;
  for (size_t t = 0; t < out.m.size(); ++t) {
    const auto& v = ref.v[t].values;
    auto result = tensor_close(out.m[t].name, out.m[t].values, ref.m[t].values, c,
                               [&v](size_t i) { return std::sqrt(static_cast<double>(v[i])); });
    if (!result) return result;
  }
  return ::testing::AssertionSuccess();
}

// The same bits in every tensor.
::testing::AssertionResult tensors_identical(const std::vector<NamedTensor>& out,
                                             const std::vector<NamedTensor>& ref) {
  if (auto layout = same_layout(out, ref); !layout) return layout;
  for (size_t t = 0; t < out.size(); ++t)
    for (size_t i = 0; i < out[t].values.size(); ++i)
      if (std::memcmp(&out[t].values[i], &ref[t].values[i], sizeof(float)) != 0)
        return ::testing::AssertionFailure() << out[t].name << "[" << i << "]: got "
                                             << out[t].values[i] << ", expected "
                                             << ref[t].values[i];
  return ::testing::AssertionSuccess();
}

void expect_step_agrees(const BatchStats& gpu, const BatchStats& cpu, int step) {
  EXPECT_EQ(gpu.samples, cpu.samples) << "step " << step;
  EXPECT_NEAR(gpu.loss_sum, cpu.loss_sum, kLossRtol * std::max(std::fabs(cpu.loss_sum), 1.0))
      << "step " << step;
  EXPECT_LE(std::abs(gpu.correct - cpu.correct), kCorrectSlack) << "step " << step;
}

// ---- Training ---------------------------------------------------------------------------------

TEST_F(CudaBackendTest, FiftyTrainingStepsMatchTheCpuBackend) {
  const Dataset data = training_data();
  const auto rows = batch_rows(kTrainRows, kBatch, 50, 42);
  const Model init = Model::initialized(mnist_model(), 43);
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config());
  cpu->set_parameters(init);
  gpu->set_parameters(init);
  const auto cpu_stats = train(*cpu, data, rows, 50);
  const auto gpu_stats = train(*gpu, data, rows, 50);
  for (int s = 0; s < 50; ++s) expect_step_agrees(gpu_stats[s], cpu_stats[s], s);
  // The run learns (so the comparison covers a real trajectory, not a flat one).
  EXPECT_LT(cpu_stats.back().loss_sum, 0.1 * cpu_stats.front().loss_sum);
  EXPECT_EQ(gpu->step(), 50);
  EXPECT_EQ(cpu->step(), 50);
  const Closeness state{kStateRtol, kStateOutlierFraction, kStateOutlierRtol};
  EXPECT_TRUE(tensors_close(parameters_of(*gpu).parameters(), parameters_of(*cpu).parameters(),
                            state));
  const OptimizerState gpu_state = optimizer_state_of(*gpu), cpu_state = optimizer_state_of(*cpu);
  EXPECT_TRUE(first_moments_close(gpu_state, cpu_state, state)) << "Adam m";
  EXPECT_TRUE(tensors_close(gpu_state.v, cpu_state.v, state)) << "Adam v";
}

// A batch of no rows leaves zero gradients on both backends (the CUDA backend once kept the
// previous batch's, which a push would have sent again).
TEST_F(CudaBackendTest, NoRowsLeaveZeroGradientsLikeTheCpuBackend) {
  const Dataset data = training_data();
  const Model init = Model::initialized(mnist_model(), 47);
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config());
  for (Backend* b : {cpu.get(), gpu.get()}) {
    b->set_parameters(init);
    b->compute_gradients(data.view().slice(0, kBatch), nullptr, kBatch);
    const BatchStats none = b->compute_gradients(data.view().slice(0, 0), nullptr, 0);
    EXPECT_EQ(none.samples, 0) << b->name();
    std::vector<NamedTensor> gradients;
    b->get_gradients(gradients);
    for (const NamedTensor& g : gradients)
      for (float x : g.values) ASSERT_EQ(x, 0.0f) << b->name() << " " << g.name;
  }
}

// finish_gradients returns the statistics of its own enqueue_gradients, even when an evaluate
// (whose totals come back through pinned memory too) runs between the two: the two once shared
// one pinned buffer, and the evaluate's totals came out of finish_gradients.
TEST_F(CudaBackendTest, AnEvaluateBetweenEnqueueAndFinishKeepsTheQueuedStatistics) {
  const Dataset data = training_data();
  auto gpu = cuda_backend(adam_config());
  gpu->set_parameters(Model::initialized(mnist_model(), 49));
  const DatasetView batch = data.view().slice(0, kBatch);
  const BatchStats alone = gpu->compute_gradients(batch, nullptr, kBatch);
  gpu->enqueue_gradients(batch, nullptr, kBatch);
  const BatchStats other = gpu->evaluate(data.view().slice(kBatch, 3 * kBatch));
  const BatchStats queued = gpu->finish_gradients();
  EXPECT_EQ(other.samples, 2 * kBatch);
  EXPECT_EQ(queued.samples, kBatch);
  EXPECT_NEAR(queued.loss_sum, alone.loss_sum, kLossRtol * std::max(alone.loss_sum, 1.0));
  EXPECT_EQ(queued.correct, alone.correct);
}

TEST_F(CudaBackendTest, AsynchronousStepsMatchTheSynchronousPath) {
  const Dataset data = training_data();
  const auto rows = batch_rows(kTrainRows, kBatch, 50, 44);
  const Model init = Model::initialized(mnist_model(), 45);

  auto sync = cuda_backend(adam_config());
  sync->set_parameters(init);
  const BatchStats sync_total = sum(train(*sync, data, rows, 50));

  // The same 50 steps through train_step(), reading the totals twice on the way; then again
  // with the training set resident on the device first.
  struct Async {
    BatchStats first, second, after;
    Model params{mnist_model()};
    OptimizerState state;
    std::unique_ptr<Backend> backend;
  };
  auto run_async = [&](bool resident) {
    Async a;
    a.backend = cuda_backend(adam_config());
    a.backend->set_parameters(init);
    if (resident) a.backend->keep_resident(data.view());
    for (int s = 0; s < 50; ++s) {
      a.backend->train_step(data.view(), rows.data() + s * kBatch, kBatch);
      if (s == 19) a.first = a.backend->take_stats();
    }
    a.second = a.backend->take_stats();
    a.after = a.backend->take_stats();  // taking resets
    a.params = parameters_of(*a.backend);
    a.state = optimizer_state_of(*a.backend);
    return a;
  };
  const Async plain = run_async(false);
  const Async resident = run_async(true);

  for (const Async* a : {&plain, &resident}) {
    SCOPED_TRACE(a == &plain ? "host data" : "resident data");
    EXPECT_EQ(a->first.samples, 20 * kBatch);
    EXPECT_EQ(a->second.samples, 30 * kBatch);
    EXPECT_EQ(a->after.samples, 0);
    EXPECT_EQ(a->after.loss_sum, 0.0);
    EXPECT_EQ(a->after.correct, 0);
    EXPECT_EQ(a->backend->step(), 50);
    const double loss = a->first.loss_sum + a->second.loss_sum;
    EXPECT_NEAR(loss, sync_total.loss_sum, kAsyncRtol * std::fabs(sync_total.loss_sum));
    EXPECT_LE(std::abs(a->first.correct + a->second.correct - sync_total.correct), kCorrectSlack);
    // Expected bit-identical (the same kernels); the bound allows a different summation order.
    EXPECT_TRUE(tensors_close(a->params.parameters(), parameters_of(*sync).parameters(),
                              Closeness{kAsyncRtol}));
  }
  // Resident or not, the device computes on the same bytes: identical results.
  EXPECT_EQ(resident.first.loss_sum, plain.first.loss_sum);
  EXPECT_EQ(resident.second.loss_sum, plain.second.loss_sum);
  EXPECT_EQ(resident.first.correct, plain.first.correct);
  EXPECT_EQ(resident.second.correct, plain.second.correct);
  EXPECT_TRUE(tensors_identical(resident.params.parameters(), plain.params.parameters()));
  EXPECT_TRUE(tensors_identical(resident.state.m, plain.state.m));
  EXPECT_TRUE(tensors_identical(resident.state.v, plain.state.v));

  // A view inside the resident set (read from the device copy) evaluates as the host data does,
  // and still does after the copy is released.
  const DatasetView inside = data.view().slice(500, 2500);
  const BatchStats from_host = plain.backend->evaluate(inside);
  const BatchStats from_device = resident.backend->evaluate(inside);
  EXPECT_EQ(from_device.loss_sum, from_host.loss_sum);
  EXPECT_EQ(from_device.correct, from_host.correct);
  EXPECT_EQ(from_device.samples, 2000);
  resident.backend->release_resident();
  const BatchStats released = resident.backend->evaluate(inside);
  EXPECT_EQ(released.loss_sum, from_host.loss_sum);
  EXPECT_EQ(released.correct, from_host.correct);
}

// Training without shuffle steps through slices of the resident set, each at another address.
// Each is staged as a row list over the whole set, so two graphs (one per staging slot) serve
// every batch, not one captured per batch and kept; and the result is the eager path's, bit for
// bit, and the host data's (not resident) too.
TEST_F(CudaBackendTest, UnshuffledSlicesOfResidentDataReuseTheirGraphs) {
  const Dataset data = training_data();
  const Model init = Model::initialized(mnist_model(), 46);
  struct Run {
    Model params{mnist_model()};
    OptimizerState state;
    BatchStats stats;
    size_t graphs = 0;
  };
  auto run = [&](bool graphs, bool resident) {
    CudaBackendOptions options;
    options.use_graphs = graphs;
    CudaBackend backend(mnist_model(), adam_config(), options);
    backend.set_parameters(init);
    if (resident) backend.keep_resident(data.view());
    for (int epoch = 0; epoch < 3; ++epoch)
      for (int64_t begin = 0; begin < kTrainRows; begin += kBatch)
        backend.train_step(data.view().slice(begin, begin + kBatch), nullptr, kBatch);
    Run r;
    r.stats = backend.take_stats();
    r.params = parameters_of(backend);
    r.state = optimizer_state_of(backend);
    r.graphs = backend.graphs_captured();
    return r;
  };
  if (const char* off = std::getenv("TANDEM_CUDA_GRAPHS"); off && std::strcmp(off, "0") == 0)
    GTEST_SKIP() << "TANDEM_CUDA_GRAPHS=0: graphs are off";
  const Run graphs = run(true, true), eager = run(false, true), host = run(true, false);
  EXPECT_LE(graphs.graphs, 2u) << "a graph per batch: " << kTrainRows / kBatch << " batches";
  EXPECT_GE(graphs.graphs, 1u);
  EXPECT_EQ(eager.graphs, 0u);
  EXPECT_EQ(graphs.stats.samples, 3 * kTrainRows);
  for (const Run* other : {&eager, &host}) {
    SCOPED_TRACE(other == &eager ? "eager" : "host data");
    EXPECT_EQ(graphs.stats.loss_sum, other->stats.loss_sum);
    EXPECT_EQ(graphs.stats.correct, other->stats.correct);
    EXPECT_TRUE(tensors_identical(graphs.params.parameters(), other->params.parameters()));
    EXPECT_TRUE(tensors_identical(graphs.state.m, other->state.m));
    EXPECT_TRUE(tensors_identical(graphs.state.v, other->state.v));
  }
}

// Batches of changing sizes (a partial last batch, then a larger one, as a resume with another
// --batch makes): each size is captured as its own graph, buffers grow and drop the graphs made
// for the smaller ones, and every path gives the same bits as running eagerly.
TEST_F(CudaBackendTest, BatchesOfChangingSizesGiveTheEagerBits) {
  if (const char* off = std::getenv("TANDEM_CUDA_GRAPHS"); off && std::strcmp(off, "0") == 0)
    GTEST_SKIP() << "TANDEM_CUDA_GRAPHS=0: graphs are off";
  const Dataset data = training_data();
  const Model init = Model::initialized(mnist_model(), 47);
  const int64_t sizes[] = {100, 100, 37, 100, 256, 37, 100, 256, 100, 37};
  auto run = [&](bool graphs, bool resident, size_t* captured) {
    CudaBackendOptions options;
    options.use_graphs = graphs;
    CudaBackend backend(mnist_model(), adam_config(), options);
    backend.set_parameters(init);
    if (resident) backend.keep_resident(data.view());
    int64_t begin = 0;
    for (int round = 0; round < 3; ++round)
      for (int64_t n : sizes) {
        if (begin + n > kTrainRows) begin = 0;
        backend.train_step(data.view().slice(begin, begin + n), nullptr, n);
        begin += n;
      }
    if (captured) *captured = backend.graphs_captured();
    return std::make_pair(parameters_of(backend), backend.take_stats());
  };
  size_t captured = 0;
  const auto graphs = run(true, true, &captured), eager = run(false, true, nullptr),
             host = run(true, false, nullptr);
  EXPECT_GE(captured, 1u);
  EXPECT_LE(captured, 6u) << "more graphs than sizes and data kinds";
  for (const auto* other : {&eager, &host}) {
    SCOPED_TRACE(other == &eager ? "eager" : "host data");
    EXPECT_EQ(graphs.second.loss_sum, other->second.loss_sum);
    EXPECT_EQ(graphs.second.samples, other->second.samples);
    EXPECT_TRUE(tensors_identical(graphs.first.parameters(), other->first.parameters()));
  }
}

// Every plain GPU cluster worker installs the parameters it pulls as runs: they land at the
// right offsets of the device arena, and a bad run changes nothing there.
TEST_F(CudaBackendTest, ParameterRunsInstallLikeTensorsAndBadRunsChangeNothing) {
  auto backend = cuda_backend(adam_config());
  test::check_parameter_runs(*backend, mnist_model());
}

TEST_F(CudaBackendTest, Tf32TrainingTracksTheCpuBackend) {
  const Dataset data = training_data();
  const auto rows = batch_rows(kTrainRows, kBatch, 20, 46);
  const Model init = Model::initialized(mnist_model(), 47);
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config(), Precision::Tf32);
  cpu->set_parameters(init);
  gpu->set_parameters(init);
  const auto cpu_stats = train(*cpu, data, rows, 20);
  const auto gpu_stats = train(*gpu, data, rows, 20);
  const double scale = cpu_stats.front().loss_sum;
  for (int s = 0; s < 20; ++s) {
    EXPECT_NEAR(gpu_stats[s].loss_sum, cpu_stats[s].loss_sum, kTf32LossTol * scale) << "step " << s;
    EXPECT_LE(std::abs(gpu_stats[s].correct - cpu_stats[s].correct), kTf32CorrectSlack)
        << "step " << s;
  }
  const double gpu_sum = sum(gpu_stats).loss_sum, cpu_sum = sum(cpu_stats).loss_sum;
  EXPECT_NEAR(gpu_sum, cpu_sum, kTf32LossTol * cpu_sum);
  // Parameters and Adam's state stay float32 (and finite) in TF32 mode.
  const Model trained = parameters_of(*gpu);  // named: a range-for over a temporary's member dangles
  for (const auto& t : trained.parameters())
    for (float v : t.values) ASSERT_TRUE(std::isfinite(v)) << t.name;
}

TEST_F(CudaBackendTest, SgdStepsMatchTheCpuBackend) {
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::Sgd;
  sgd.learning_rate = 0.005f;  // not the default, so a backend that ignores it shows
  const Dataset data = training_data();
  const auto rows = batch_rows(kTrainRows, kBatch, 10, 48);
  const Model init = Model::initialized(mnist_model(), 49);
  auto cpu = cpu_backend(sgd);
  auto gpu = cuda_backend(sgd);
  cpu->set_parameters(init);
  gpu->set_parameters(init);
  const auto cpu_stats = train(*cpu, data, rows, 10);
  const auto gpu_stats = train(*gpu, data, rows, 10);
  for (int s = 0; s < 10; ++s) expect_step_agrees(gpu_stats[s], cpu_stats[s], s);
  EXPECT_TRUE(tensors_close(parameters_of(*gpu).parameters(), parameters_of(*cpu).parameters(),
                            Closeness{kOneStepRtol, kStateOutlierFraction, kStateOutlierRtol}));
  // SGD keeps no moments.
  const OptimizerState state = optimizer_state_of(*gpu);
  EXPECT_TRUE(state.m.empty());
  EXPECT_TRUE(state.v.empty());
  EXPECT_EQ(gpu->step(), 10);
}

// ---- Moving state in and out ------------------------------------------------------------------

TEST_F(CudaBackendTest, ParametersAndOptimizerStateRoundTripBitExact) {
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config());
  Model model(mnist_model());
  model.parameters() = random_like(model.parameters(), 50, -2.0f, 2.0f);
  // Values a conversion would lose: negative zero, a subnormal, large and tiny magnitudes.
  auto& w = model.parameters()[0].values;
  w[0] = -0.0f;
  w[1] = 1e-40f;
  w[2] = -3.0e38f;
  w[3] = 1.17549435e-38f;
  w[w.size() - 1] = 123456.789f;
  gpu->set_parameters(model);
  cpu->set_parameters(model);
  const Model back = parameters_of(*gpu);
  EXPECT_TRUE(tensors_identical(back.parameters(), model.parameters()));
  EXPECT_TRUE(same_layout(back.parameters(), parameters_of(*cpu).parameters()));

  OptimizerState state;
  cpu->get_optimizer_state(state);  // the names and shapes the backends use
  state.m = random_like(state.m, 60, -0.1f, 0.1f);
  state.v = random_like(state.v, 70, 0.0f, 0.01f);
  gpu->set_optimizer_state(state, 7);
  EXPECT_EQ(gpu->step(), 7);
  const OptimizerState state_back = optimizer_state_of(*gpu);
  EXPECT_TRUE(tensors_identical(state_back.m, state.m));
  EXPECT_TRUE(tensors_identical(state_back.v, state.v));
  // Setting the optimizer state leaves the parameters alone.
  EXPECT_TRUE(tensors_identical(parameters_of(*gpu).parameters(), model.parameters()));
}

TEST_F(CudaBackendTest, RestoredOptimizerStateTakesTheSameStepAsTheCpuBackend) {
  const Dataset data = training_data();
  // 20 rows: few (row, unit) pairs, so a ReLU input within rounding of zero is unlikely to
  // switch sides between the backends in this one step.
  const auto rows = batch_rows(kTrainRows, 20, 1, 51);
  const Model init = Model::initialized(mnist_model(), 52);
  auto cpu = cpu_backend(unusual_adam_config());
  auto gpu = cuda_backend(unusual_adam_config());
  OptimizerState state;
  cpu->get_optimizer_state(state);
  state.m = random_like(state.m, 80, -0.05f, 0.05f);
  state.v = random_like(state.v, 90, 1e-4f, 1e-2f);
  for (Backend* b : {cpu.get(), gpu.get()}) {
    b->set_parameters(init);
    b->set_optimizer_state(state, 7);
  }
  const BatchStats c = cpu->compute_gradients(data.view(), rows.data(), 20);
  const BatchStats g = gpu->compute_gradients(data.view(), rows.data(), 20);
  cpu->apply_gradients();
  gpu->apply_gradients();
  EXPECT_NEAR(g.loss_sum, c.loss_sum, kEvalLossRtol * std::fabs(c.loss_sum));
  EXPECT_LE(std::abs(g.correct - c.correct), kCorrectSlack);
  EXPECT_EQ(g.samples, 20);
  EXPECT_EQ(gpu->step(), 8);
  EXPECT_EQ(cpu->step(), 8);
  // The step size of step 8 (not step 1) and the restored moments: a wrong step count moves
  // every parameter by ~1e-3, far outside the bound.
  const Closeness one_step{kOneStepRtol, kStateOutlierFraction, kStateOutlierRtol};
  EXPECT_TRUE(tensors_close(parameters_of(*gpu).parameters(), parameters_of(*cpu).parameters(),
                            one_step));
  const OptimizerState gs = optimizer_state_of(*gpu), cs = optimizer_state_of(*cpu);
  EXPECT_TRUE(tensors_close(gs.m, cs.m, one_step)) << "Adam m";
  EXPECT_TRUE(tensors_close(gs.v, cs.v, one_step)) << "Adam v";
}

// ---- Evaluation and prediction ----------------------------------------------------------------

TEST_F(CudaBackendTest, EvaluateAndPredictMatchTheCpuBackend) {
  const int64_t n = 2001;
  const Model model = Model::initialized(mnist_model(), 53);
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config());
  cpu->set_parameters(model);
  gpu->set_parameters(model);
  uint32_t seed = 54;
  for (PixelType type : {PixelType::UInt8, PixelType::Float32}) {
    SCOPED_TRACE(type == PixelType::UInt8 ? "uint8 pixels" : "float32 pixels");
    const Dataset data = test::random_dataset(type, n, 784, 10, seed++);
    auto expect_same = [&](const BatchStats& g, const BatchStats& c, const char* what) {
      EXPECT_NEAR(g.loss_sum, c.loss_sum, kEvalLossRtol * std::fabs(c.loss_sum)) << what;
      EXPECT_LE(std::abs(g.correct - c.correct), kCorrectSlack) << what;
      EXPECT_EQ(g.samples, c.samples) << what;
    };
    const BatchStats evaluated = gpu->evaluate(data.view());
    expect_same(evaluated, cpu->evaluate(data.view()), "whole view");
    EXPECT_EQ(evaluated.samples, n);
    // A view that starts one row in.
    const DatasetView shifted = data.view().slice(1, n);
    expect_same(gpu->evaluate(shifted), cpu->evaluate(shifted), "view from row 1");
    // compute_gradients without a row list: the first `count` rows of the view.
    for (int64_t count : {n, int64_t{777}})
      expect_same(gpu->compute_gradients(data.view(), nullptr, count),
                  cpu->compute_gradients(data.view(), nullptr, count), "rows == nullptr");

    // Predictions: written for every row, the CPU's classes but for a near-tie, and the count
    // that evaluate() reported.
    std::vector<uint8_t> predicted(static_cast<size_t>(n), 0xFF), cpu_predicted(predicted);
    gpu->predict(data.view(), predicted.data());
    cpu->predict(data.view(), cpu_predicted.data());
    int64_t mismatches = 0, correct = 0;
    for (size_t r = 0; r < predicted.size(); ++r) {
      ASSERT_LT(predicted[r], 10) << "row " << r << " not written";
      mismatches += predicted[r] != cpu_predicted[r];
      correct += predicted[r] == data.label_data()[r];
    }
    EXPECT_LE(mismatches, kCorrectSlack);
    EXPECT_EQ(correct, evaluated.correct) << "predict() and evaluate() disagree on the device";
    // Unlabelled data: the same predictions.
    DatasetView unlabelled = data.view();
    unlabelled.labels = nullptr;
    std::vector<uint8_t> again(static_cast<size_t>(n), 0xFF);
    gpu->predict(unlabelled, again.data());
    EXPECT_EQ(again, predicted);
    // A shifted unlabelled view predicts the shifted rows. Its product has another row count,
    // for which cuBLASLt may choose another kernel (other rounding): a near-tie may flip, as
    // between the backends.
    std::vector<uint8_t> shifted_out(static_cast<size_t>(n - 1), 0xFF);
    gpu->predict(unlabelled.slice(1, n), shifted_out.data());
    int64_t shifted_mismatches = 0;
    for (size_t r = 0; r < shifted_out.size(); ++r) {
      ASSERT_LT(shifted_out[r], 10) << "row " << r << " of the shifted view not written";
      shifted_mismatches += shifted_out[r] != predicted[r + 1];
    }
    EXPECT_LE(shifted_mismatches, kCorrectSlack);
  }
}

// ---- Prediction with logits -------------------------------------------------------------------

// Logits of the same parameters and rows on both backends: both compute in float32 (the CUDA
// backend's Fp32 turns TF32 off) and differ only in the order of the sums. With weights and
// biases uniform in [-0.25, 0.25] and pixels in [0, 1] (the largest |logit| ~7-10 for 784-100-10,
// ~0.5-1 for 61-33-17-10), a float32 forward pass is within 6e-7 of the largest |logit| of a
// float64 one (numpy, three draws of 4000 rows per model), so two float32 orders are within
// ~1.2e-6 of it of each other. The bound is 2e-5 of the largest |logit|: over an order of
// magnitude of room for cuBLAS's blocking and split sums, while a wrong bias, layer or row is off
// by O(0.1) of it.
constexpr double kLogitTol = 2e-5;

// Rows whose CPU top two logits are within 2 * kLogitTol * scale may have their arg-max flip;
// the other rows must have the same class. Under 1% of the rows may be such near-ties, so the
// allowance cannot hide a wrong arg-max (with these seeds the CPU finds 0 to 7 per view, up to
// 0.04% of the rows).
constexpr double kNearTieFraction = 0.01;

// The first maximum of each row (the CPU's rule), computed here.
std::vector<uint8_t> first_argmax(const std::vector<float>& logits, int64_t classes) {
  std::vector<uint8_t> out(logits.size() / static_cast<size_t>(classes));
  for (size_t r = 0; r < out.size(); ++r) {
    const float* z = logits.data() + r * static_cast<size_t>(classes);
    out[r] = static_cast<uint8_t>(std::max_element(z, z + classes) - z);  // first of equals
  }
  return out;
}

// predict_logits on both backends over `view`: the CUDA classes equal its own predict() and the
// first arg-max of its own logits bit for bit, the CPU's on every row but near-ties, and the
// logits agree within kLogitTol of their scale.
void expect_logits_match(Backend& gpu, Backend& cpu, const DatasetView& view, int64_t classes,
                         uint32_t seed) {
  SCOPED_TRACE("rows " + std::to_string(view.rows) + ", data seed " + std::to_string(seed));
  const auto n = static_cast<size_t>(view.rows);
  // Filled with values no backend writes, so an unwritten row or logit shows.
  std::vector<uint8_t> gpu_classes(n, 0xFF), cpu_classes(n, 0xFE), gpu_predicted(n, 0xFD);
  std::vector<float> gpu_logits(n * static_cast<size_t>(classes), NAN);
  std::vector<float> cpu_logits(gpu_logits.size(), NAN);
  gpu.predict_logits(view, gpu_classes.data(), gpu_logits.data());
  cpu.predict_logits(view, cpu_classes.data(), cpu_logits.data());
  gpu.predict(view, gpu_predicted.data());

  ASSERT_EQ(gpu_classes, gpu_predicted) << "predict_logits' classes are not predict()'s";
  ASSERT_EQ(gpu_classes, first_argmax(gpu_logits, classes))
      << "the classes are not the first arg-max of the logits copied back";
  double scale = 0.0;
  for (float v : cpu_logits) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  ASSERT_GT(scale, 0.0) << "all logits zero: the test would prove nothing";
  EXPECT_TRUE(test::all_close(gpu_logits, cpu_logits, kLogitTol * scale, 0.0));

  int64_t near_ties = 0, distinct = 0;
  for (size_t r = 0; r < n; ++r) {
    const float* z = cpu_logits.data() + r * static_cast<size_t>(classes);
    std::vector<float> sorted(z, z + classes);
    std::sort(sorted.begin(), sorted.end());
    const bool near_tie =
        classes > 1 && sorted[static_cast<size_t>(classes - 1)] -
                               sorted[static_cast<size_t>(classes - 2)] <= 2 * kLogitTol * scale;
    near_ties += near_tie;
    distinct += gpu_classes[r] != gpu_classes[0];
    if (!near_tie) {
      ASSERT_EQ(gpu_classes[r], cpu_classes[r]) << "row " << r << " (not a near-tie)";
    }
  }
  EXPECT_LE(near_ties, static_cast<int64_t>(kNearTieFraction * static_cast<double>(n)))
      << "near-ties";
  EXPECT_GT(distinct, 0) << "every row has the same class: a constant model proves little";
}

TEST_F(CudaBackendTest, PredictLogitsMatchTheCpuBackend) {
  // Rows: one piece of an odd size, and more than one of predict's 16384-row pieces ending in a
  // ragged one (neither a multiple of any block or warp size).
  const std::vector<int64_t> row_counts = {2001, 16384 + 2417};
  uint32_t seed = 60;
  for (const char* layers : {"784-100-10", "61-33-17-10"}) {
    SCOPED_TRACE(layers);
    const ModelConfig config = ModelConfig::parse(layers);
    Model model(config);
    model.parameters() = random_like(model.parameters(), seed++, -0.25f, 0.25f);
    auto cpu = make_cpu_backend(config, adam_config(), 1);
    auto gpu = make_cuda_backend(config, adam_config(), Precision::Fp32);
    cpu->set_parameters(model);
    gpu->set_parameters(model);
    for (int64_t rows : row_counts) {
      for (PixelType type : {PixelType::UInt8, PixelType::Float32}) {
        SCOPED_TRACE(type == PixelType::UInt8 ? "uint8 pixels" : "float32 pixels");
        const uint32_t data_seed = seed++;
        const Dataset data = test::random_dataset(type, rows, config.inputs(), 10, data_seed);
        expect_logits_match(*gpu, *cpu, data.view(), config.classes(), data_seed);
        // Unlabelled, and a view that starts one row in (an odd offset into the pixels).
        DatasetView unlabelled = data.view();
        unlabelled.labels = nullptr;
        expect_logits_match(*gpu, *cpu, unlabelled.slice(1, rows), config.classes(), data_seed);
      }
    }
    // No rows: nothing written, no error.
    const Dataset empty = test::random_dataset(PixelType::UInt8, 1, config.inputs(), 10, seed++);
    uint8_t untouched_class = 0xFF;
    float untouched_logit = -1.0f;
    gpu->predict_logits(empty.view().slice(0, 0), &untouched_class, &untouched_logit);
    EXPECT_EQ(untouched_class, 0xFF);
    EXPECT_EQ(untouched_logit, -1.0f);
  }
}

TEST_F(CudaBackendTest, PredictLogitsBreaksExactTiesLikeTheCpuBackend) {
  // The last layer's weights all zero: every row's logits are its biases exactly, on both
  // backends (sums of exact zeros), with the maximum shared by classes 3 and 7. The first
  // maximum wins: class 3 on every row.
  Model model(mnist_model());
  model.parameters() = random_like(model.parameters(), 61, -0.25f, 0.25f);
  auto& params = model.parameters();
  NamedTensor& last_weight = params[params.size() - 2];
  NamedTensor& last_bias = params.back();
  std::fill(last_weight.values.begin(), last_weight.values.end(), 0.0f);
  last_bias.values = {0.1f, -0.2f, 0.3f, 0.5f, 0.0f, 0.25f, -0.5f, 0.5f, 0.4f, 0.45f};
  auto cpu = cpu_backend(adam_config());
  auto gpu = cuda_backend(adam_config());
  cpu->set_parameters(model);
  gpu->set_parameters(model);
  const int64_t n = 1001;
  const Dataset data = test::random_dataset(PixelType::UInt8, n, 784, 10, 62);
  std::vector<uint8_t> gpu_classes(static_cast<size_t>(n), 0xFF), cpu_classes(gpu_classes);
  std::vector<float> gpu_logits(static_cast<size_t>(n * 10), NAN), cpu_logits(gpu_logits);
  gpu->predict_logits(data.view(), gpu_classes.data(), gpu_logits.data());
  cpu->predict_logits(data.view(), cpu_classes.data(), cpu_logits.data());
  EXPECT_EQ(cpu_classes, std::vector<uint8_t>(static_cast<size_t>(n), 3));
  EXPECT_EQ(gpu_classes, cpu_classes);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t k = 0; k < 10; ++k)
      ASSERT_EQ(gpu_logits[static_cast<size_t>(r * 10 + k)], last_bias.values[static_cast<size_t>(k)])
          << "row " << r << " class " << k;
}

// ---- Errors -----------------------------------------------------------------------------------

TEST_F(CudaBackendTest, RefusesDataOfTheWrongWidth) {
  auto gpu = cuda_backend(adam_config());
  gpu->set_parameters(Model::initialized(mnist_model(), 55));
  const Dataset narrow = test::random_dataset(PixelType::UInt8, 10, 783, 10, 56);
  const std::vector<int32_t> rows = {0, 1, 2};
  EXPECT_THROW(gpu->compute_gradients(narrow.view(), rows.data(), 3), InputError);
  EXPECT_THROW(gpu->compute_gradients(narrow.view(), nullptr, 3), InputError);
  EXPECT_THROW(gpu->train_step(narrow.view(), rows.data(), 3), InputError);
  EXPECT_THROW(gpu->evaluate(narrow.view()), InputError);
  std::vector<uint8_t> out(10);
  EXPECT_THROW(gpu->predict(narrow.view(), out.data()), InputError);
  std::vector<float> logits(100);
  EXPECT_THROW(gpu->predict_logits(narrow.view(), out.data(), logits.data()), InputError);
  try {
    gpu->evaluate(narrow.view());
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("783 features"), std::string::npos) << e.what();
  }
  // The backend is still usable afterwards.
  const Dataset good = test::random_dataset(PixelType::UInt8, 10, 784, 10, 57);
  EXPECT_EQ(gpu->evaluate(good.view()).samples, 10);
}

TEST_F(CudaBackendTest, RefusesWhatTheCpuBackendRefuses) {
  auto gpu = cuda_backend(adam_config());
  gpu->set_parameters(Model::initialized(mnist_model(), 58));
  const Dataset data = test::random_dataset(PixelType::UInt8, 10, 784, 10, 59);
  DatasetView unlabelled = data.view();
  unlabelled.labels = nullptr;
  EXPECT_THROW(gpu->evaluate(unlabelled), InputError);
  EXPECT_THROW(gpu->compute_gradients(unlabelled, nullptr, 10), InputError);
  EXPECT_THROW(gpu->compute_gradients(data.view(), nullptr, 11), InputError);  // past the view
  DatasetView many_classes = data.view();
  many_classes.num_classes = 11;  // more classes than the model has outputs
  EXPECT_THROW(gpu->evaluate(many_classes), InputError);
  Dataset bad_label = data;
  bad_label.label_data()[4] = 10;  // past the 10 outputs: the loss kernel would index by it
  const std::vector<int32_t> rows{1, 4};
  EXPECT_THROW(gpu->evaluate(bad_label.view()), InputError);
  EXPECT_THROW(gpu->compute_gradients(bad_label.view(), rows.data(), 2), InputError);
  EXPECT_THROW(gpu->train_step(bad_label.view(), nullptr, 10), InputError);
  EXPECT_THROW(gpu->set_parameters(Model::initialized(ModelConfig::parse("784-50-10"), 1)),
               InputError);
  OptimizerState state;
  gpu->get_optimizer_state(state);
  EXPECT_THROW(gpu->set_optimizer_state(state, -1), InputError);
  OptimizerState wrong = state;
  wrong.m.pop_back();
  EXPECT_THROW(gpu->set_optimizer_state(wrong, 1), InputError);
}

}  // namespace
}  // namespace tandem
