// Every CUDA kernel against its CPU twin, on fresh random inputs at awkward sizes. Device outputs
// are poisoned (all bits set: NaN for floats and doubles, 0xFF for bytes) before each launch, so
// an element a kernel fails to write shows up; buffers a call must not touch are checked
// byte for byte afterwards. Each comparison uses a named tolerance that says why it is that big.
//
// Without a CUDA device every test is skipped (the fixture's SetUp).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cpu/adam_cpu.h"
#include "cpu/column_stats_cpu.h"
#include "cpu/convert_cpu.h"
#include "cpu/dense_cpu.h"
#include "cpu/softmax_xent_cpu.h"
#include "cuda/adam_cuda.h"
#include "cuda/convert_cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/dense_cuda.h"
#include "cuda/device_buffer.h"
#include "cuda/softmax_xent_cuda.h"
#include "cuda/stats_cuda.h"
#include "test_support.h"

namespace tandem {
namespace {

using kernels::DenseEpilogue;
using kernels::DeviceBuffer;
using kernels::MatmulPrecision;
using test::all_close;
using test::random_floats;

// ---- Tolerances -------------------------------------------------------------------------------

// Dense layers in float32: cuBLASLt and OpenBLAS add the k products of each output in different
// orders (blocking, split-k), and each sum carries a rounding error of about sqrt(k) * 2^-24 times
// its partial sums, which stay below the largest output. 1e-5 * sqrt(k) * max|ref| is ~100x that
// and still far below a wrong index, transpose or missing term (an O(1) * max|ref| error).
constexpr double kDenseFp32Tol = 1e-5;
// TF32 keeps 10 of float32's 23 mantissa bits of each operand (products and sums stay float32).
// Emulating that on these shapes gives errors up to 2.6e-4 * max|ref| with rounding of the
// operands and 7.5e-4 with truncation; 2e-3 covers both.
constexpr double kDenseTf32Tol = 2e-3;
// bfloat16 keeps 7 mantissa bits: the same emulation gives 2.6e-3 (rounding) and 6.2e-3
// (truncation) of max|ref|.
constexpr double kDenseBf16Tol = 1.5e-2;
// dlogits are probabilities minus a one-hot (|g| <= 1), from expf and one division on both
// sides with the row's sum added in another order: a few float32 ulps of 1.0 (6e-8 each).
constexpr double kXentGradAtol = 1e-6;
// The loss: per-row float32 log-softmax values (|loss| < 25), summed in double in another order.
constexpr double kXentLossRtol = 1e-5;
// Adam and SGD: the same float32 formula on both sides. The only difference is fused
// multiply-adds (nvcc contracts b1*m + (1-b1)*g and w - lr*g into FMAs; the host compiler may
// not), about one ulp per step. Relative 1e-6, plus 1e-6 of the array's largest value for
// elements that cancel to near zero (m = b1*m + (1-b1)*g with opposite signs).
constexpr double kOptimizerTol = 1e-6;
// Column statistics in float64 on both sides, summed in another order (and merged with Chan's
// formula on the device): errors near 1e-15 relative; 1e-12 still catches a float32 accumulator
// or a naive sum-of-squares formula on offset data.
constexpr double kStatsTol = 1e-12;

// ---- Host-side helpers ------------------------------------------------------------------------

std::vector<uint8_t> random_bytes(size_t n, uint32_t seed, int hi = 255) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> dist(0, hi);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(dist(gen));
  return v;
}

std::vector<uint8_t> random_labels(size_t n, int64_t classes, uint32_t seed) {
  return random_bytes(n, seed, static_cast<int>(classes) - 1);
}

// `n` row indices in [0, limit), with repeats, in no particular order.
std::vector<int32_t> random_rows(size_t n, int64_t limit, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, static_cast<int32_t>(limit - 1));
  std::vector<int32_t> v(n);
  for (auto& r : v) r = dist(gen);
  return v;
}

// A ReLU output: max(uniform[-1,1], 0), so about half the values are exactly zero (and at least
// the first one is).
std::vector<float> relu_output(size_t n, uint32_t seed) {
  auto x = random_floats(n, seed);
  for (auto& v : x) v = std::max(v, 0.0f);
  if (n > 0) x[0] = 0.0f;
  return x;
}

template <typename T>
double max_abs(const std::vector<T>& v) {
  double m = 0.0;
  for (const T& x : v) m = std::max(m, std::fabs(static_cast<double>(x)));
  return m;
}

// Every element finite: a NaN left over from the poison is an element the kernel did not write.
template <typename T>
::testing::AssertionResult all_finite(const std::vector<T>& v) {
  for (size_t i = 0; i < v.size(); ++i)
    if (!std::isfinite(static_cast<double>(v[i])))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << v.size() << " is " << static_cast<double>(v[i])
             << " (not written, or not finite)";
  return ::testing::AssertionSuccess();
}

// Every byte equal to `byte`: a buffer the call had to leave alone.
template <typename T>
::testing::AssertionResult all_bytes_are(const std::vector<T>& v, uint8_t byte) {
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  for (size_t i = 0; i < v.size() * sizeof(T); ++i)
    if (p[i] != byte)
      return ::testing::AssertionFailure() << "byte " << i << " is " << int(p[i]) << ", expected "
                                           << int(byte) << " (the call wrote where it must not)";
  return ::testing::AssertionSuccess();
}

// The same bits (an exact kernel: copies, gathers, conversions).
template <typename T>
::testing::AssertionResult bitwise_equal(const std::vector<T>& out, const std::vector<T>& ref) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << out.size() << " vs " << ref.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (std::memcmp(&out[i], &ref[i], sizeof(T)) != 0)
      return ::testing::AssertionFailure()
             << "element " << i << " of " << out.size() << ": got " << +out[i] << ", expected "
             << +ref[i];
  return ::testing::AssertionSuccess();
}

// The same values (== per element, so +0 and -0 agree): exact elementwise arithmetic.
template <typename T>
::testing::AssertionResult values_equal(const std::vector<T>& out, const std::vector<T>& ref) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << out.size() << " vs " << ref.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (!(out[i] == ref[i]))
      return ::testing::AssertionFailure()
             << "element " << i << " of " << out.size() << ": got " << +out[i] << ", expected "
             << +ref[i];
  return ::testing::AssertionSuccess();
}

// Float comparison where NaN matches NaN (a twin that returns NaN on purpose).
::testing::AssertionResult same_or_both_nan(const std::vector<double>& out,
                                            const std::vector<double>& ref) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << out.size() << " vs " << ref.size();
  for (size_t i = 0; i < out.size(); ++i)
    if (!(out[i] == ref[i] || (std::isnan(out[i]) && std::isnan(ref[i]))))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << out[i] << ", expected " << ref[i];
  return ::testing::AssertionSuccess();
}

// ---- Device-side fixture ----------------------------------------------------------------------

// One stream per test; everything a test queues goes on it. Skips the test without a device.
// (The helpers are public so that checks shared by several tests can be free functions.)
class CudaKernels : public ::testing::Test {
 public:
  void SetUp() override {
    if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    TANDEM_CUDA_CHECK(cudaStreamCreate(&stream_));
  }
  void TearDown() override {
    if (stream_ == nullptr) return;
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  }

  // A device copy of `host` (at least one element, so that empty inputs still have an address).
  template <typename T>
  DeviceBuffer<T> upload(const std::vector<T>& host) {
    DeviceBuffer<T> d(std::max<size_t>(host.size(), 1));
    if (!host.empty())
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(d.data(), host.data(), host.size() * sizeof(T),
                                        cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `host` may be a temporary
    return d;
  }
  // `n` elements (at least one) with every bit set: NaN as float or double, 0xFF as bytes.
  template <typename T>
  DeviceBuffer<T> poisoned(size_t n) {
    DeviceBuffer<T> d(std::max<size_t>(n, 1));
    poison(d);
    return d;
  }
  template <typename T>
  void poison(DeviceBuffer<T>& d) {
    TANDEM_CUDA_CHECK(cudaMemsetAsync(d.data(), 0xFF, d.bytes(), stream_));
  }
  template <typename T>
  DeviceBuffer<T> zeroed(size_t n) {
    DeviceBuffer<T> d(std::max<size_t>(n, 1));
    TANDEM_CUDA_CHECK(cudaMemsetAsync(d.data(), 0, d.bytes(), stream_));
    return d;
  }
  // Waits for the stream, then copies `n` elements back.
  template <typename T>
  std::vector<T> download(const T* device, size_t n) {
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    TANDEM_CUDA_CHECK(cudaGetLastError());
    std::vector<T> host(n);
    if (n > 0)
      TANDEM_CUDA_CHECK(cudaMemcpy(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost));
    return host;
  }
  template <typename T>
  std::vector<T> download(const DeviceBuffer<T>& d) {
    return download(d.data(), d.size());
  }

  cudaStream_t stream_ = nullptr;
};

// ---- Dense layers -----------------------------------------------------------------------------

struct DenseShape {
  int64_t rows, in, out;
};

std::string describe(const DenseShape& s) {
  return "rows " + std::to_string(s.rows) + " in " + std::to_string(s.in) + " out " +
         std::to_string(s.out);
}

const char* describe(DenseEpilogue e) { return e == DenseEpilogue::Fused ? "fused" : "separate"; }

size_t count(int64_t a, int64_t b = 1) { return static_cast<size_t>(a * b); }

std::vector<float> cpu_forward(const std::vector<float>& x, const std::vector<float>& w,
                               const std::vector<float>& b, const DenseShape& s, bool relu) {
  std::vector<float> y(count(s.rows, s.out));
  kernels::dense_forward_cpu(x.data(), w.data(), b.data(), y.data(), s.rows, s.in, s.out, relu);
  return y;
}

// Batch rows 1, 7, 10001; inputs 784, 13, 100, 333, 1; outputs 100, 333, 10, 37, 3, 1.
const DenseShape kForwardShapes[] = {
    {1, 784, 100},  {7, 784, 333},  {10001, 784, 100}, {10001, 13, 333},
    {7, 13, 1},     {1, 100, 10},   {10001, 100, 10},  {10001, 333, 37},
    {7, 333, 3},    {1, 1, 1},      {10001, 1, 10},    {10001, 784, 1}};

// Checks DenseCuda::forward in `precision` against the float32 CPU twin, every epilogue and both
// ReLU settings, with the error bound tol * sqrt_k_factor * max|pre-activation|.
void check_forward(CudaKernels& t, kernels::DenseCuda& dense, const DenseShape& s, uint32_t seed,
                   double tol, bool scale_with_sqrt_k);

TEST_F(CudaKernels, DenseForwardMatchesCpuInFloat32) {
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  EXPECT_EQ(dense.precision(), MatmulPrecision::Fp32);
  uint32_t seed = 1000;
  for (const DenseShape& s : kForwardShapes) check_forward(*this, dense, s, seed += 3, kDenseFp32Tol, true);
  // A form without a cuBLASLt algorithm falls back to Tandem's kernels (and is checked all the
  // same above); say how many did, so that a fused path that never ran is seen in the results.
  RecordProperty("fallback_forms", static_cast<int>(dense.fallback_forms()));
}

// A NaN reaching a ReLU layer stays NaN on every path, as in the CPU twin (std::max(NaN, 0) is
// NaN): made 0, a diverged run's NaN would be hidden from the loss and the parameter server's
// finite check, and the unit would stay dead. cuBLASLt's RELU epilogue is reported to make it 0,
// so the fused path runs ReLU in Tandem's own kernel.
TEST_F(CudaKernels, ANaNInputStaysNaNThroughReluOnEveryPath) {
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  const DenseShape s{7, 784, 100};
  std::vector<float> x = random_floats(count(s.rows, s.in), 71);
  x[0] = std::numeric_limits<float>::quiet_NaN();  // row 0
  const std::vector<float> w = random_floats(count(s.in, s.out), 72);
  const std::vector<float> b = random_floats(count(s.out), 73);
  const std::vector<float> expected = cpu_forward(x, w, b, s, true);
  ASSERT_TRUE(std::isnan(expected[0]));
  auto dx = upload(x);
  auto dw = upload(w);
  auto db = upload(b);
  for (DenseEpilogue epilogue : {DenseEpilogue::Fused, DenseEpilogue::Separate}) {
    auto y = poisoned<float>(count(s.rows, s.out));
    dense.forward(dx.data(), dw.data(), db.data(), y.data(), s.rows, s.in, s.out, true, epilogue);
    const std::vector<float> got = download(y);
    for (int64_t j = 0; j < s.out; ++j)
      ASSERT_TRUE(std::isnan(got[static_cast<size_t>(j)]))
          << describe(epilogue) << ": unit " << j << " of the NaN row is " << got[size_t(j)];
    for (size_t i = static_cast<size_t>(s.out); i < got.size(); ++i)
      ASSERT_FALSE(std::isnan(got[i])) << describe(epilogue) << ": element " << i;
  }
}

// A bias that is not 16-byte aligned (a view into a larger buffer) takes the separate path: the
// cuBLASLt heuristic is not told the bias's alignment and may pick vector loads that fault.
TEST_F(CudaKernels, AMisalignedBiasGivesTheCpuResult) {
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  for (const DenseShape& s : {DenseShape{1000, 784, 100}, DenseShape{7, 100, 10}}) {
    SCOPED_TRACE(describe(s));
    const std::vector<float> x = random_floats(count(s.rows, s.in), 81);
    const std::vector<float> w = random_floats(count(s.in, s.out), 82);
    std::vector<float> b_with_one_before = random_floats(count(s.out + 1), 83);
    const std::vector<float> b(b_with_one_before.begin() + 1, b_with_one_before.end());
    auto dx = upload(x);
    auto dw = upload(w);
    auto db = upload(b_with_one_before);
    auto y = poisoned<float>(count(s.rows, s.out));
    const int64_t fused_before = dense.fused_forwards();
    dense.forward(dx.data(), dw.data(), db.data() + 1, y.data(), s.rows, s.in, s.out, true,
                  DenseEpilogue::Fused);
    EXPECT_EQ(dense.fused_forwards(), fused_before) << "a misaligned bias went to cuBLASLt";
    const std::vector<float> got = download(y);
    const std::vector<float> expected = cpu_forward(x, w, b, s, true);
    const std::vector<float> linear = cpu_forward(x, w, b, s, false);  // for the error's scale
    double worst = 0.0, scale = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(double(got[i]) - expected[i]));
      scale = std::max(scale, std::abs(double(linear[i])));
    }
    EXPECT_LE(worst, kDenseFp32Tol * std::sqrt(double(s.in)) * std::max(scale, 1.0));
  }
}

// The default model's products (784-100-10, batches of 1,000) in every precision: cuBLASLt must
// offer the fused bias/ReLU epilogues and the bias gradient's matrix-vector form for them, or
// every training step pays for the fallback kernels.
TEST_F(CudaKernels, TheDefaultModelsProductsRunInCublasLt) {
  for (MatmulPrecision precision :
       {MatmulPrecision::Fp32, MatmulPrecision::Tf32, MatmulPrecision::Bf16}) {
    kernels::DenseCuda dense(stream_, precision);
    const int64_t rows = 1000;
    auto x = upload(random_floats(count(rows, 784), 31));
    auto w1 = upload(random_floats(count(784, 100), 32));
    auto b1 = upload(random_floats(count(100), 33));
    auto w2 = upload(random_floats(count(100, 10), 34));
    auto b2 = upload(random_floats(count(10), 35));
    auto h = poisoned<float>(count(rows, 100));
    auto y = poisoned<float>(count(rows, 10));
    auto dw1 = poisoned<float>(count(784, 100));
    auto db1 = poisoned<float>(count(100));
    auto dw2 = poisoned<float>(count(100, 10));
    auto db2 = poisoned<float>(count(10));
    dense.forward(x.data(), w1.data(), b1.data(), h.data(), rows, 784, 100, true);
    dense.forward(h.data(), w2.data(), b2.data(), y.data(), rows, 100, 10, false);
    dense.backward_params(h.data(), y.data(), dw2.data(), db2.data(), rows, 100, 10, false);
    dense.backward_params(x.data(), h.data(), dw1.data(), db1.data(), rows, 784, 100, false);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
    EXPECT_EQ(dense.fallback_forms(), 0u) << "precision " << static_cast<int>(precision);
    EXPECT_EQ(dense.fused_forwards(), 2) << "precision " << static_cast<int>(precision);
  }
}

TEST_F(CudaKernels, DenseForwardInTf32AndBf16StaysNearFloat32) {
  // Operand rounding dominates (no sqrt(k) growth: its relative size does not depend on k).
  const DenseShape shapes[] = {{10001, 784, 100}, {7, 13, 333}, {1, 100, 10}, {10001, 333, 37},
                               {10001, 1, 10}};
  {
    kernels::DenseCuda dense(stream_, MatmulPrecision::Tf32);
    EXPECT_EQ(dense.precision(), MatmulPrecision::Tf32);
    uint32_t seed = 1100;
    for (const DenseShape& s : shapes) check_forward(*this, dense, s, seed += 3, kDenseTf32Tol, false);
  }
  {
    kernels::DenseCuda dense(stream_, MatmulPrecision::Bf16);
    EXPECT_EQ(dense.precision(), MatmulPrecision::Bf16);
    uint32_t seed = 1200;
    for (const DenseShape& s : shapes) check_forward(*this, dense, s, seed += 3, kDenseBf16Tol, false);
  }
}

void check_forward(CudaKernels& t, kernels::DenseCuda& dense, const DenseShape& s, uint32_t seed,
                   double tol, bool scale_with_sqrt_k) {
  SCOPED_TRACE(describe(s));
  const auto x = random_floats(count(s.rows, s.in), seed);
  const auto w = random_floats(count(s.in, s.out), seed + 1);
  const auto b = random_floats(count(s.out), seed + 2);
  const auto linear = cpu_forward(x, w, b, s, false);
  const auto rectified = cpu_forward(x, w, b, s, true);
  // Relative to the largest pre-activation (never zero for random inputs; the ReLU output can be).
  const double bound =
      tol * (scale_with_sqrt_k ? std::sqrt(static_cast<double>(s.in)) : 1.0) * max_abs(linear);
  auto dx = t.upload(x);
  auto dw = t.upload(w);
  auto db = t.upload(b);
  for (DenseEpilogue epilogue : {DenseEpilogue::Fused, DenseEpilogue::Separate})
    for (bool relu : {false, true}) {
      SCOPED_TRACE(std::string(describe(epilogue)) + (relu ? " relu" : " linear"));
      auto dy = t.poisoned<float>(count(s.rows, s.out));
      dense.forward(dx.data(), dw.data(), db.data(), dy.data(), s.rows, s.in, s.out, relu,
                    epilogue);
      const auto y = t.download(dy.data(), count(s.rows, s.out));
      EXPECT_TRUE(all_finite(y));
      EXPECT_TRUE(all_close(y, relu ? rectified : linear, bound, 0.0));
      if (relu) {
        EXPECT_GE(*std::min_element(y.begin(), y.end()), 0.0f) << "a ReLU output is negative";
      }
    }
}

TEST_F(CudaKernels, DenseBackwardParamsOverwriteAndAccumulate) {
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  // Fewer rows than most shapes below: backward_params must grow what it needs by itself.
  dense.reserve_rows(7);
  const DenseShape shapes[] = {{1, 784, 100}, {7, 100, 10},  {10001, 784, 100}, {10001, 100, 10},
                               {10001, 13, 333}, {7, 333, 37}, {10001, 1, 3}, {1, 1, 1},
                               {7, 784, 1}};
  uint32_t seed = 2000;
  for (const DenseShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const auto x = random_floats(count(s.rows, s.in), seed++);
    const auto dy = random_floats(count(s.rows, s.out), seed++);
    const auto dw0 = random_floats(count(s.in, s.out), seed++);
    const auto db0 = random_floats(count(s.out), seed++);
    auto dx = upload(x);
    auto ddy = upload(dy);
    for (bool accumulate : {false, true}) {
      SCOPED_TRACE(accumulate ? "accumulate" : "overwrite");
      std::vector<float> ref_w = dw0, ref_b = db0;
      kernels::dense_backward_params_cpu(x.data(), dy.data(), ref_w.data(), ref_b.data(), s.rows,
                                         s.in, s.out, accumulate);
      // Overwriting must not read the old values: they are NaN here.
      auto ddw = accumulate ? upload(dw0) : poisoned<float>(count(s.in, s.out));
      auto ddb = accumulate ? upload(db0) : poisoned<float>(count(s.out));
      dense.backward_params(dx.data(), ddy.data(), ddw.data(), ddb.data(), s.rows, s.in, s.out,
                            accumulate);
      const auto out_w = download(ddw.data(), count(s.in, s.out));
      const auto out_b = download(ddb.data(), count(s.out));
      const double sqrt_k = std::sqrt(static_cast<double>(s.rows));  // sums run over the rows
      EXPECT_TRUE(all_finite(out_w));
      EXPECT_TRUE(all_finite(out_b));
      EXPECT_TRUE(all_close(out_w, ref_w, kDenseFp32Tol * sqrt_k * max_abs(ref_w), 0.0));
      EXPECT_TRUE(all_close(out_b, ref_b, kDenseFp32Tol * sqrt_k * max_abs(ref_b), 0.0));
    }
  }
}

TEST_F(CudaKernels, DenseBackwardInputThroughRelu) {
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  const DenseShape shapes[] = {{1, 100, 10},   {7, 333, 37},  {10001, 100, 10}, {10001, 333, 3},
                               {7, 1, 10},     {10001, 13, 1}, {1, 784, 100},   {10001, 784, 100}};
  uint32_t seed = 3000;
  size_t zeros_seen = 0;
  for (const DenseShape& s : shapes) {
    SCOPED_TRACE(describe(s));
    const auto dy = random_floats(count(s.rows, s.out), seed++);
    const auto w = random_floats(count(s.in, s.out), seed++);
    const auto x = relu_output(count(s.rows, s.in), seed++);
    std::vector<float> ref(count(s.rows, s.in)), unmasked(count(s.rows, s.in));
    kernels::dense_backward_input_relu_cpu(dy.data(), w.data(), x.data(), ref.data(), s.rows, s.in,
                                           s.out);
    const std::vector<float> ones(count(s.rows, s.in), 1.0f);
    kernels::dense_backward_input_relu_cpu(dy.data(), w.data(), ones.data(), unmasked.data(),
                                           s.rows, s.in, s.out);
    auto ddy = upload(dy);
    auto dw = upload(w);
    auto dx_in = upload(x);
    auto ddx = poisoned<float>(count(s.rows, s.in));
    dense.backward_input_relu(ddy.data(), dw.data(), dx_in.data(), ddx.data(), s.rows, s.in,
                              s.out);
    const auto dx = download(ddx.data(), count(s.rows, s.in));
    EXPECT_TRUE(all_finite(dx));
    EXPECT_TRUE(all_close(dx, ref,
                          kDenseFp32Tol * std::sqrt(static_cast<double>(s.out)) * max_abs(unmasked),
                          0.0));
    // Where the ReLU output is zero the gradient is exactly zero, not merely small.
    size_t wrong = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (x[i] == 0.0f) {
        ++zeros_seen;
        wrong += dx[i] != 0.0f;
      }
    EXPECT_EQ(wrong, 0u) << "gradients passed through a ReLU whose output is zero";
  }
  EXPECT_GT(zeros_seen, 0u);
}

TEST_F(CudaKernels, DenseWithZeroRowsWritesOnlyZeroGradients) {
  const DenseShape s{0, 13, 5};
  kernels::DenseCuda dense(stream_, MatmulPrecision::Fp32);
  auto x = upload(random_floats(count(1, s.in), 4000));  // an address, never read
  auto dy = upload(random_floats(count(1, s.out), 4001));
  auto w = upload(random_floats(count(s.in, s.out), 4002));
  auto b = upload(random_floats(count(s.out), 4003));
  for (DenseEpilogue epilogue : {DenseEpilogue::Fused, DenseEpilogue::Separate})
    for (bool relu : {false, true}) {
      auto y = poisoned<float>(count(s.out));
      dense.forward(x.data(), w.data(), b.data(), y.data(), 0, s.in, s.out, relu, epilogue);
      EXPECT_TRUE(all_bytes_are(download(y), 0xFF)) << describe(epilogue) << " relu " << relu;
    }
  auto dx = poisoned<float>(count(s.in));
  dense.backward_input_relu(dy.data(), w.data(), x.data(), dx.data(), 0, s.in, s.out);
  EXPECT_TRUE(all_bytes_are(download(dx), 0xFF));

  // No rows: x^T dy is an empty sum. Overwriting stores zeros (as the CPU twin does);
  // accumulating leaves the old values.
  auto dw = poisoned<float>(count(s.in, s.out));
  auto db = poisoned<float>(count(s.out));
  dense.backward_params(x.data(), dy.data(), dw.data(), db.data(), 0, s.in, s.out, false);
  EXPECT_TRUE(values_equal(download(dw), std::vector<float>(count(s.in, s.out), 0.0f)));
  EXPECT_TRUE(values_equal(download(db), std::vector<float>(count(s.out), 0.0f)));
  const auto dw0 = random_floats(count(s.in, s.out), 4004);
  const auto db0 = random_floats(count(s.out), 4005);
  auto dw_acc = upload(dw0);
  auto db_acc = upload(db0);
  dense.backward_params(x.data(), dy.data(), dw_acc.data(), db_acc.data(), 0, s.in, s.out, true);
  EXPECT_TRUE(bitwise_equal(download(dw_acc), dw0));
  EXPECT_TRUE(bitwise_equal(download(db_acc), db0));

  auto y = poisoned<float>(count(s.out));
  kernels::bias_relu_cuda(y.data(), b.data(), 0, s.out, true, stream_);
  EXPECT_TRUE(all_bytes_are(download(y), 0xFF));
  auto mask_target = poisoned<float>(4);
  kernels::relu_mask_cuda(mask_target.data(), x.data(), 0, stream_);
  EXPECT_TRUE(all_bytes_are(download(mask_target), 0xFF));
}

TEST_F(CudaKernels, BiasReluIsExact) {
  // One float add and a max per element, on both sides: the same values.
  uint32_t seed = 5000;
  for (int64_t rows : {1, 7, 10001})
    for (int64_t out : {1, 100, 333})
      for (bool relu : {false, true}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " out " + std::to_string(out) +
                     (relu ? " relu" : " linear"));
        const auto y0 = random_floats(count(rows, out), seed++);
        const auto b = random_floats(count(out), seed++);
        std::vector<float> ref(y0.size());
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < out; ++j) {
            const float v = y0[count(r, out) + count(j)] + b[count(j)];
            ref[count(r, out) + count(j)] = relu ? std::max(v, 0.0f) : v;
          }
        auto dy = upload(y0);
        auto db = upload(b);
        kernels::bias_relu_cuda(dy.data(), db.data(), rows, out, relu, stream_);
        EXPECT_TRUE(values_equal(download(dy.data(), y0.size()), ref));
      }
}

TEST_F(CudaKernels, ReluMaskIsExactAndStaysInRange) {
  uint32_t seed = 5100;
  const float guard = 12345.0f;
  for (int64_t n : {1, 7, 100003})
    for (size_t offset : {size_t{0}, size_t{1}}) {  // 1: not 16-byte aligned
      SCOPED_TRACE("n " + std::to_string(n) + " offset " + std::to_string(offset));
      const auto dx0 = random_floats(count(n), seed++);
      const auto x = relu_output(count(n), seed++);
      // Guards on both sides of the range: the kernel must write [offset, offset + n) only (x is
      // 0 there, so a write outside would zero the guard).
      std::vector<float> host_dx(count(n) + offset + 1, guard), host_x(count(n) + offset + 1, 0.0f);
      std::copy(dx0.begin(), dx0.end(), host_dx.begin() + static_cast<std::ptrdiff_t>(offset));
      std::copy(x.begin(), x.end(), host_x.begin() + static_cast<std::ptrdiff_t>(offset));
      std::vector<float> ref = host_dx;
      for (size_t i = 0; i < x.size(); ++i)
        ref[offset + i] = x[i] > 0.0f ? dx0[i] : 0.0f;
      auto ddx = upload(host_dx);
      auto dx_in = upload(host_x);
      kernels::relu_mask_cuda(ddx.data() + offset, dx_in.data() + offset, n, stream_);
      EXPECT_TRUE(values_equal(download(ddx), ref));
    }
}

// ---- Softmax + cross-entropy ------------------------------------------------------------------

struct XentResult {
  std::vector<float> dlogits;
  std::vector<uint8_t> predictions;
  kernels::DeviceStats totals{};
};

// The CPU twin's outputs for the same inputs.
XentResult cpu_xent(const std::vector<float>& logits, const std::vector<uint8_t>& labels,
                    int64_t rows, int64_t classes) {
  XentResult r;
  r.dlogits.assign(count(rows, classes), NAN);
  r.predictions.assign(count(rows), 0xFF);
  kernels::SoftmaxXentStats stats;
  kernels::softmax_xent_cpu(logits.data(), labels.data(), r.dlogits.data(), rows, classes, stats);
  kernels::argmax_rows_cpu(logits.data(), r.predictions.data(), rows, classes);
  r.totals.loss_sum = stats.loss_sum;
  r.totals.correct = static_cast<long long>(stats.correct);
  return r;
}

class SoftmaxXentCuda : public CudaKernels {
 protected:
  // One launch with poisoned outputs (and partials) onto freshly zeroed totals.
  XentResult run(const std::vector<float>& logits, const std::vector<uint8_t>& labels,
                 int64_t rows, int64_t classes, bool want_dlogits, bool want_predictions) {
    auto dz = upload(logits);
    auto dl = upload(labels);
    auto grads = poisoned<float>(count(rows, classes));
    auto predictions = poisoned<uint8_t>(count(rows));
    auto partials = poisoned<kernels::SoftmaxXentPartial>(
        static_cast<size_t>(kernels::softmax_xent_partials_needed(rows)));
    auto totals = zeroed<kernels::DeviceStats>(1);
    kernels::softmax_xent_cuda(dz.data(), dl.data(), want_dlogits ? grads.data() : nullptr,
                               want_predictions ? predictions.data() : nullptr, rows, classes,
                               partials.data(), totals.data(), stream_);
    XentResult r;
    r.dlogits = download(grads.data(), count(rows, classes));
    r.predictions = download(predictions.data(), count(rows));
    r.totals = download(totals.data(), 1)[0];
    return r;
  }

  void expect_matches(const XentResult& gpu, const XentResult& cpu, bool dlogits,
                      bool predictions) {
    EXPECT_NEAR(gpu.totals.loss_sum, cpu.totals.loss_sum,
                kXentLossRtol * std::fabs(cpu.totals.loss_sum) + 1e-9);
    EXPECT_EQ(gpu.totals.correct, cpu.totals.correct);
    if (dlogits) {
      EXPECT_TRUE(all_finite(gpu.dlogits));
      EXPECT_TRUE(all_close(gpu.dlogits, cpu.dlogits, kXentGradAtol, 0.0));
    } else {
      EXPECT_TRUE(all_bytes_are(gpu.dlogits, 0xFF)) << "dlogits null, yet something was written";
    }
    if (predictions)
      EXPECT_TRUE(bitwise_equal(gpu.predictions, cpu.predictions));
    else
      EXPECT_TRUE(all_bytes_are(gpu.predictions, 0xFF));
  }
};

TEST_F(SoftmaxXentCuda, MatchesCpuOnRandomLogits) {
  uint32_t seed = 6000;
  // 40,000 rows: more than one pass of the capped grid (4,096 blocks of 8 warps, a row each).
  for (int64_t rows : {1, 7, 10001, 40000})
    for (int64_t classes : {1, 3, 10, 37, 256}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " classes " + std::to_string(classes));
      // [-8, 8]: probabilities down to ~1e-9, never near the 1e-10 clip (log p >= -21.6 here).
      const auto z = random_floats(count(rows, classes), seed++, -8.0f, 8.0f);
      const auto labels = random_labels(count(rows), classes, seed++);
      const XentResult cpu = cpu_xent(z, labels, rows, classes);
      expect_matches(run(z, labels, rows, classes, true, true), cpu, true, true);
      expect_matches(run(z, labels, rows, classes, false, false), cpu, false, false);
      expect_matches(run(z, labels, rows, classes, true, false), cpu, true, false);
      // Without dlogits the loss is the same bits: the same per-row arithmetic, fixed order.
      EXPECT_EQ(run(z, labels, rows, classes, false, true).totals.loss_sum,
                run(z, labels, rows, classes, true, true).totals.loss_sum);
    }
}

TEST_F(SoftmaxXentCuda, TotalsAccumulateAcrossLaunches) {
  const int64_t rows = 10001, classes = 10;
  const auto z = random_floats(count(rows, classes), 6100, -8.0f, 8.0f);
  const auto labels = random_labels(count(rows), classes, 6101);
  auto dz = upload(z);
  auto dl = upload(labels);
  auto grads = poisoned<float>(count(rows, classes));
  auto partials = poisoned<kernels::SoftmaxXentPartial>(
      static_cast<size_t>(kernels::softmax_xent_partials_needed(rows)));
  auto totals = zeroed<kernels::DeviceStats>(1);
  kernels::softmax_xent_cuda(dz.data(), dl.data(), grads.data(), nullptr, rows, classes,
                             partials.data(), totals.data(), stream_);
  const kernels::DeviceStats once = download(totals.data(), 1)[0];
  kernels::softmax_xent_cuda(dz.data(), dl.data(), nullptr, nullptr, rows, classes,
                             partials.data(), totals.data(), stream_);
  const kernels::DeviceStats twice = download(totals.data(), 1)[0];
  const XentResult cpu = cpu_xent(z, labels, rows, classes);
  EXPECT_NEAR(once.loss_sum, cpu.totals.loss_sum, kXentLossRtol * std::fabs(cpu.totals.loss_sum));
  EXPECT_EQ(once.correct, cpu.totals.correct);
  // The second launch adds the same total again (x + x is exact in double).
  EXPECT_NEAR(twice.loss_sum, 2.0 * once.loss_sum, 1e-12 * std::fabs(once.loss_sum));
  EXPECT_EQ(twice.correct, 2 * once.correct);
  // Zero rows: nothing is added and nothing written.
  auto untouched = poisoned<float>(classes);
  kernels::softmax_xent_cuda(dz.data(), dl.data(), untouched.data(), nullptr, 0, classes,
                             partials.data(), totals.data(), stream_);
  const kernels::DeviceStats after_empty = download(totals.data(), 1)[0];
  EXPECT_EQ(after_empty.loss_sum, twice.loss_sum);
  EXPECT_EQ(after_empty.correct, twice.correct);
  EXPECT_TRUE(all_bytes_are(download(untouched), 0xFF));
}

TEST_F(SoftmaxXentCuda, ExtremeLogitsClipLikeTheCpu) {
  // Random rows interleaved with the edge cases, so they land in every warp and block position.
  const int64_t rows = 3000, classes = 10;
  auto z = random_floats(count(rows, classes), 6200, -8.0f, 8.0f);
  auto labels = random_labels(count(rows), classes, 6201);
  std::vector<int64_t> clipped_rows;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = z.data() + count(r, classes);
    const int label = labels[count(r)];
    const float top = *std::max_element(row, row + classes);
    switch (r % 6) {
      case 0:  // random
        break;
      case 1:  // the label's logit 1e4 below the best: p underflows, the clip bites
        row[label] = top - 1e4f;
        clipped_rows.push_back(r);
        break;
      case 2:  // the label's logit 1e4 above the rest: p = 1, loss 0
        row[label] = top + 1e4f;
        break;
      case 3:  // huge logits that would overflow a naive exp; the label at -1e30
        row[0] = 1e30f;
        row[1] = -1e30f;
        labels[count(r)] = 1;
        clipped_rows.push_back(r);
        break;
      case 4:  // the same, label at +1e30: p = 1
        row[0] = 1e30f;
        row[1] = -1e30f;
        labels[count(r)] = 0;
        break;
      case 5:  // 18 below the best: log p in [-20.3, -18], above the clip at -23.03; keeps its gradient
        row[label] = top - 18.0f;
        break;
    }
  }
  const XentResult cpu = cpu_xent(z, labels, rows, classes);
  const XentResult gpu = run(z, labels, rows, classes, true, true);
  expect_matches(gpu, cpu, true, true);
  for (int64_t r : clipped_rows)
    for (int64_t j = 0; j < classes; ++j) {
      ASSERT_EQ(cpu.dlogits[count(r, classes) + count(j)], 0.0f) << "CPU row " << r;
      ASSERT_EQ(gpu.dlogits[count(r, classes) + count(j)], 0.0f)
          << "row " << r << ": a clipped row must have a zero gradient";
    }
  // Each clipped row contributes -log(1e-10) ~ 23.03: the total is dominated by them.
  EXPECT_GT(gpu.totals.loss_sum, 23.0 * static_cast<double>(clipped_rows.size()));
}

// Rows full of ties, including ties between classes that different lanes of a warp hold: the
// first maximum wins, as in the CPU twin.
std::vector<float> tied_logits(int64_t rows, int64_t classes, uint32_t seed) {
  auto z = random_floats(count(rows, classes), seed);
  for (auto& v : z) v = std::floor(v * 2.0f);  // {-2, -1, 0, 1}: many ties
  if (classes >= 70 && rows >= 4) {
    auto row = [&](int64_t r) { return z.data() + count(r, classes); };
    std::fill(row(0), row(0) + classes, 3.0f);  // all equal: class 0
    row(1)[5] = row(1)[37] = 9.0f;              // lanes 5 and 5 (second pass): class 5
    row(2)[33] = row(2)[65] = 9.0f;             // class 33
    row(3)[69] = row(3)[1] = 9.0f;              // class 1
  }
  return z;
}

TEST_F(CudaKernels, ArgmaxRowsTakesTheFirstMaximum) {
  uint32_t seed = 6300;
  for (int64_t rows : {1, 7, 10001})
    for (int64_t classes : {1, 3, 10, 37, 70, 256})
      for (bool ties : {false, true}) {
        SCOPED_TRACE("rows " + std::to_string(rows) + " classes " + std::to_string(classes) +
                     (ties ? " ties" : ""));
        const auto z = ties ? tied_logits(rows, classes, seed++)
                            : random_floats(count(rows, classes), seed++, -8.0f, 8.0f);
        std::vector<uint8_t> ref(count(rows));
        kernels::argmax_rows_cpu(z.data(), ref.data(), rows, classes);
        auto dz = upload(z);
        auto out = poisoned<uint8_t>(count(rows));
        kernels::argmax_rows_cuda(dz.data(), out.data(), rows, classes, stream_);
        EXPECT_TRUE(bitwise_equal(download(out.data(), count(rows)), ref));
      }
  auto dz = upload(random_floats(10, seed));
  auto out = poisoned<uint8_t>(4);
  kernels::argmax_rows_cuda(dz.data(), out.data(), 0, 10, stream_);
  EXPECT_TRUE(all_bytes_are(download(out), 0xFF)) << "zero rows wrote a prediction";
}

TEST_F(SoftmaxXentCuda, PredictionsAndCountTakeTheFirstMaximum) {
  uint32_t seed = 6400;
  for (int64_t classes : {3, 10, 70}) {
    SCOPED_TRACE("classes " + std::to_string(classes));
    const int64_t rows = 1001;
    const auto z = tied_logits(rows, classes, seed++);
    auto labels = random_labels(count(rows), classes, seed++);
    // Some labels on a tied maximum: counted correct only when the label is the first one.
    // Even rows get the last maximum of the row, odd rows the first.
    for (int64_t r = 0; r < rows; r += 3) {
      const float* row = z.data() + count(r, classes);
      const float top = *std::max_element(row, row + classes);
      for (int64_t j = classes - 1; j >= 0; --j)
        if (row[j] == top) {
          labels[count(r)] = static_cast<uint8_t>(j);
          if (r % 2 == 0) break;  // stop at the last maximum; odd rows scan on to the first
        }
    }
    const XentResult cpu = cpu_xent(z, labels, rows, classes);
    expect_matches(run(z, labels, rows, classes, true, true), cpu, true, true);
  }
}

// A NaN logit is never the maximum, as in the CPU's scan (no comparison with it holds), except
// at class 0, where that scan starts. A lane whose first class was NaN kept it and passed over
// its larger classes (row 0 here: class 5 NaN, class 37 the maximum, both lane 5's).
TEST_F(SoftmaxXentCuda, PredictionsPassOverNaNLogitsLikeTheCpu) {
  const int64_t rows = 4, classes = 40;
  std::vector<float> z = random_floats(count(rows, classes), 6500, -8.0f, 8.0f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  z[count(0, classes) + 5] = nan;
  z[count(0, classes) + 37] = 20.0f;
  z[count(1, classes) + 0] = nan;  // class 0: the CPU's answer whatever follows
  z[count(1, classes) + 9] = 20.0f;
  std::fill(z.begin() + count(2, classes), z.begin() + count(3, classes), nan);  // all NaN
  z[count(3, classes) + 37] = nan;
  z[count(3, classes) + 5] = 20.0f;
  const std::vector<uint8_t> labels{37, 0, 0, 5};
  const XentResult cpu = cpu_xent(z, labels, rows, classes);
  ASSERT_EQ(cpu.predictions, (std::vector<uint8_t>{37, 0, 0, 5}));
  const XentResult gpu = run(z, labels, rows, classes, false, true);
  EXPECT_EQ(gpu.predictions, cpu.predictions);
  EXPECT_EQ(gpu.totals.correct, cpu.totals.correct);
  EXPECT_TRUE(std::isnan(gpu.totals.loss_sum));
}

// ---- Optimizers -------------------------------------------------------------------------------

struct Offsets {
  size_t w, m, v, g;  // in floats from a 256-byte aligned allocation
};

std::string describe(const Offsets& o) {
  return "offsets " + std::to_string(o.w) + "," + std::to_string(o.m) + "," + std::to_string(o.v) +
         "," + std::to_string(o.g);
}

// The values at [offset, offset + n) of a guarded buffer (the rest holds `guard`).
std::vector<float> guarded(const std::vector<float>& values, size_t offset, float guard) {
  std::vector<float> out(values.size() + offset + 3, guard);
  std::copy(values.begin(), values.end(), out.begin() + static_cast<std::ptrdiff_t>(offset));
  return out;
}

::testing::AssertionResult optimizer_close(const std::vector<float>& out,
                                           const std::vector<float>& ref) {
  return all_close(out, ref, kOptimizerTol * max_abs(ref), kOptimizerTol);
}

TEST_F(CudaKernels, AdamMatchesCpuOverSeveralSteps) {
  const kernels::AdamHyper hypers[] = {kernels::AdamHyper{},
                                       kernels::AdamHyper{0.003f, 0.8f, 0.99f, 1e-7f}};
  // Aligned (the 16-byte path plus a tail), all misaligned, and only the gradient misaligned.
  const Offsets offsets[] = {{0, 0, 0, 0}, {1, 1, 1, 1}, {1, 2, 3, 1}, {0, 0, 0, 3}};
  const float guard = -777.0f;
  const int kSteps = 4;
  uint32_t seed = 7000;
  // 4,200,007: more than one pass of the capped grid (4,096 blocks of 256 threads, 4 floats
  // each on the 16-byte path); for the first hyperparameters from step 0 only (it is slow on
  // the CPU twin).
  for (const kernels::AdamHyper& h : hypers)
    for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{100003}, int64_t{4200007}})
      for (const Offsets& o : offsets)
        for (long long first_step : {0LL, 6LL}) {  // 6: a state restored mid-run
          if (n > 100003 && (&h != &hypers[0] || first_step != 0)) continue;
          SCOPED_TRACE("lr " + std::to_string(h.learning_rate) + " n " + std::to_string(n) + " " +
                       describe(o) + " from step " + std::to_string(first_step));
          const size_t un = count(n);
          std::vector<float> w = random_floats(un, seed++);
          std::vector<float> m = random_floats(un, seed++, -0.1f, 0.1f);
          std::vector<float> v = random_floats(un, seed++, 1e-4f, 1e-2f);  // a mid-run state
          auto dw = upload(guarded(w, o.w, guard));
          auto dm = upload(guarded(m, o.m, guard));
          auto dv = upload(guarded(v, o.v, guard));
          auto dstate = upload(std::vector<kernels::AdamDeviceStep>{{first_step, 0.0f}});
          auto dg = upload(std::vector<float>(un + o.g + 3, guard));
          for (int step = 1; step <= kSteps; ++step) {
            const auto g = random_floats(un, seed++);
            TANDEM_CUDA_CHECK(cudaMemcpyAsync(dg.data() + o.g, g.data(), un * sizeof(float),
                                              cudaMemcpyHostToDevice, stream_));
            kernels::adam_advance_step_cuda(dstate.data(), h, stream_);
            kernels::adam_update_cuda(dw.data() + o.w, dm.data() + o.m, dv.data() + o.v,
                                      dg.data() + o.g, n, dstate.data(), h, stream_);
            TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));  // `g` is reused next step
            const float* grads[] = {g.data()};
            kernels::adam_update_cpu(w.data(), m.data(), v.data(), grads, 1, 0, n,
                                     kernels::adam_step_size(h, first_step + step), h);
          }
          const auto state = download(dstate.data(), 1)[0];
          EXPECT_EQ(state.step, first_step + kSteps);
          EXPECT_FLOAT_EQ(state.lr_t, kernels::adam_step_size(h, first_step + kSteps));
          EXPECT_TRUE(optimizer_close(download(dw.data() + o.w, un), w)) << "w";
          EXPECT_TRUE(optimizer_close(download(dm.data() + o.m, un), m)) << "m";
          EXPECT_TRUE(optimizer_close(download(dv.data() + o.v, un), v)) << "v";
          // Nothing outside [offset, offset + n) changed (the guards and the gradient).
          for (auto* buffer : {&dw, &dm, &dv}) {
            const auto all = download(*buffer);
            const size_t off = buffer == &dw ? o.w : buffer == &dm ? o.m : o.v;
            for (size_t i = 0; i < all.size(); ++i)
              if (i < off || i >= off + un) {
                ASSERT_EQ(all[i], guard) << "wrote outside at " << i;
              }
          }
        }
}

TEST_F(CudaKernels, AdamOnNothingChangesNothing) {
  auto w = poisoned<float>(4);
  auto state = upload(std::vector<kernels::AdamDeviceStep>{{0, 0.0f}});
  kernels::adam_advance_step_cuda(state.data(), kernels::AdamHyper{}, stream_);
  kernels::adam_update_cuda(w.data(), w.data(), w.data(), w.data(), 0, state.data(),
                            kernels::AdamHyper{}, stream_);
  kernels::sgd_update_cuda(w.data(), w.data(), 0, 0.1f, stream_);
  EXPECT_TRUE(all_bytes_are(download(w), 0xFF));
  EXPECT_EQ(download(state.data(), 1)[0].step, 1);
}

TEST_F(CudaKernels, SgdMatchesCpu) {
  const float guard = -777.0f;
  uint32_t seed = 7500;
  for (int64_t n : {1, 7, 100003})
    for (size_t w_offset : {size_t{0}, size_t{1}})
      for (size_t g_offset : {size_t{0}, size_t{3}}) {
        SCOPED_TRACE("n " + std::to_string(n) + " offsets " + std::to_string(w_offset) + "," +
                     std::to_string(g_offset));
        const size_t un = count(n);
        std::vector<float> w = random_floats(un, seed++);
        auto dw = upload(guarded(w, w_offset, guard));
        auto dg = upload(std::vector<float>(un + g_offset + 3, guard));
        for (int step = 0; step < 3; ++step) {
          const auto g = random_floats(un, seed++);
          TANDEM_CUDA_CHECK(cudaMemcpyAsync(dg.data() + g_offset, g.data(), un * sizeof(float),
                                            cudaMemcpyHostToDevice, stream_));
          kernels::sgd_update_cuda(dw.data() + w_offset, dg.data() + g_offset, n, 0.03f, stream_);
          TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
          const float* grads[] = {g.data()};
          kernels::sgd_update_cpu(w.data(), grads, 1, 0, n, 0.03f);
        }
        const auto all = download(dw);
        EXPECT_TRUE(optimizer_close(std::vector<float>(all.begin() + static_cast<std::ptrdiff_t>(w_offset),
                                                       all.begin() + static_cast<std::ptrdiff_t>(w_offset + un)),
                                    w));
        for (size_t i = 0; i < all.size(); ++i)
          if (i < w_offset || i >= w_offset + un) {
            ASSERT_EQ(all[i], guard) << "wrote outside at " << i;
          }
      }
}

// ---- Gathering and converting rows ------------------------------------------------------------

TEST_F(CudaKernels, GatherRowsIsExact) {
  const int64_t src_rows = 10007;
  const int64_t classes = 10;
  uint32_t seed = 8000;
  for (int64_t features : {1, 13, 784}) {
    const auto pixels = random_bytes(count(src_rows, features) + 1, seed++);
    const auto floats = random_floats(count(src_rows, features) + 1, seed++);
    const auto labels = random_labels(count(src_rows), classes, seed++);
    auto d_pixels = upload(pixels);
    auto d_floats = upload(floats);
    auto d_labels = upload(labels);
    // 70,001 rows: more than one pass of the capped grid (65,536 blocks); a row list only (the
    // first rows of a 10,007-row source are not as many), and not 784 wide (the CPU twin's pace).
    for (int64_t n : {1, 7, 10001, 70001})
      for (bool row_list : {true, false})
        for (bool with_labels : {true, false})
          for (size_t src_offset : {size_t{0}, size_t{1}}) {  // 1: rows start off alignment
            if (n > src_rows && (!row_list || features == 784)) continue;
            SCOPED_TRACE("features " + std::to_string(features) + " n " + std::to_string(n) +
                         (row_list ? " row list" : " first rows") +
                         (with_labels ? " labels" : "") + " offset " + std::to_string(src_offset));
            const auto rows = random_rows(count(n), src_rows, seed++);
            const int32_t* host_rows = row_list ? rows.data() : nullptr;
            auto d_rows = upload(rows);
            const int32_t* dev_rows = row_list ? d_rows.data() : nullptr;

            std::vector<float> ref_u8(count(n, features)), ref_f32(count(n, features));
            kernels::gather_rows_u8_cpu(pixels.data() + src_offset, features, host_rows, n,
                                        ref_u8.data());
            kernels::gather_rows_f32_cpu(floats.data() + src_offset, features, host_rows, n,
                                         ref_f32.data());
            std::vector<uint8_t> ref_labels(count(n));
            kernels::gather_labels_cpu(labels.data(), host_rows, n, ref_labels.data());

            auto out = poisoned<float>(count(n, features));
            auto out_labels = poisoned<uint8_t>(count(n));
            kernels::gather_rows_u8_cuda(d_pixels.data() + src_offset, features, dev_rows, n,
                                         out.data(), with_labels ? d_labels.data() : nullptr,
                                         with_labels ? out_labels.data() : nullptr, stream_);
            EXPECT_TRUE(bitwise_equal(download(out.data(), count(n, features)), ref_u8)) << "u8";
            if (with_labels)
              EXPECT_TRUE(bitwise_equal(download(out_labels.data(), count(n)), ref_labels));
            else
              EXPECT_TRUE(all_bytes_are(download(out_labels), 0xFF));

            poison(out);
            poison(out_labels);
            kernels::gather_rows_f32_cuda(d_floats.data() + src_offset, features, dev_rows, n,
                                          out.data(), with_labels ? d_labels.data() : nullptr,
                                          with_labels ? out_labels.data() : nullptr, stream_);
            EXPECT_TRUE(bitwise_equal(download(out.data(), count(n, features)), ref_f32)) << "f32";
            if (with_labels)
              EXPECT_TRUE(bitwise_equal(download(out_labels.data(), count(n)), ref_labels));
            else
              EXPECT_TRUE(all_bytes_are(download(out_labels), 0xFF));
          }
  }
}

TEST_F(CudaKernels, GatherOfNoRowsWritesNothing) {
  auto pixels = upload(random_bytes(64, 8100));
  auto floats = upload(random_floats(64, 8101));
  auto labels = upload(random_labels(8, 10, 8102));
  auto rows = upload(std::vector<int32_t>{3, 1});
  auto out = poisoned<float>(16);
  auto out_labels = poisoned<uint8_t>(4);
  for (const int32_t* r : {static_cast<const int32_t*>(rows.data()), static_cast<const int32_t*>(nullptr)}) {
    kernels::gather_rows_u8_cuda(pixels.data(), 8, r, 0, out.data(), labels.data(),
                                 out_labels.data(), stream_);
    kernels::gather_rows_f32_cuda(floats.data(), 8, r, 0, out.data(), labels.data(),
                                  out_labels.data(), stream_);
  }
  EXPECT_TRUE(all_bytes_are(download(out), 0xFF));
  EXPECT_TRUE(all_bytes_are(download(out_labels), 0xFF));
}

// ---- Reductions -------------------------------------------------------------------------------

TEST_F(CudaKernels, CountCorrectIsExact) {
  uint32_t seed = 9000;
  for (int64_t n : {0, 1, 7, 10001, (1 << 20) + 3}) {
    SCOPED_TRACE("n " + std::to_string(n));
    const auto predictions = random_labels(count(n), 10, seed++);
    const auto labels = random_labels(count(n), 10, seed++);
    int64_t expected = 0;
    for (size_t i = 0; i < count(n); ++i) expected += predictions[i] == labels[i];
    auto dp = upload(predictions);
    auto dl = upload(labels);
    EXPECT_EQ(kernels::count_correct_cuda(dp.data(), dl.data(), n, stream_), expected);
    EXPECT_EQ(kernels::count_correct_cuda(dp.data(), dp.data(), n, stream_), n);
  }
}

class ColumnStatsCuda : public CudaKernels {
 protected:
  template <typename T>
  void check(const std::vector<T>& data, int64_t rows, int64_t cols) {
    std::vector<double> ref_mean(count(cols)), ref_var(count(cols));
    if constexpr (std::is_same_v<T, uint8_t>)
      kernels::column_stats_u8_cpu(data.data(), rows, cols, ref_mean.data(), ref_var.data());
    else
      kernels::column_stats_f32_cpu(data.data(), rows, cols, ref_mean.data(), ref_var.data());
    auto d_data = upload(data);
    auto mean = poisoned<double>(count(cols));
    auto var = poisoned<double>(count(cols));
    // The scratch is poisoned too: the kernels must write before they read it.
    auto scratch = poisoned<double>(
        static_cast<size_t>(kernels::column_stats_scratch_doubles(rows, cols)));
    if constexpr (std::is_same_v<T, uint8_t>)
      kernels::column_stats_u8_cuda(d_data.data(), rows, cols, mean.data(), var.data(),
                                    scratch.data(), stream_);
    else
      kernels::column_stats_f32_cuda(d_data.data(), rows, cols, mean.data(), var.data(),
                                     scratch.data(), stream_);
    const auto out_mean = download(mean.data(), count(cols));
    const auto out_var = download(var.data(), count(cols));
    if (rows == 0) {  // no rows: no mean, as the twin says with NaN
      EXPECT_TRUE(same_or_both_nan(out_mean, ref_mean));
      EXPECT_TRUE(same_or_both_nan(out_var, ref_var));
      return;
    }
    EXPECT_TRUE(all_finite(out_mean));
    EXPECT_TRUE(all_finite(out_var));
    EXPECT_TRUE(all_close(out_mean, ref_mean, kStatsTol * max_abs(ref_mean), kStatsTol));
    EXPECT_TRUE(all_close(out_var, ref_var, kStatsTol * max_abs(ref_var), kStatsTol));
    if (rows == 1) {
      EXPECT_EQ(max_abs(out_var), 0.0) << "one row has no variance";
    }
  }
};

TEST_F(ColumnStatsCuda, MatchFloat64TwoPassTwin) {
  uint32_t seed = 9100;
  for (int64_t rows : {1, 7, 10001})
    for (int64_t cols : {1, 13, 784}) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " cols " + std::to_string(cols));
      check(random_bytes(count(rows, cols), seed++), rows, cols);
      // Values near 100 with a spread of about 0.6: a large mean next to a small variance.
      auto floats = random_floats(count(rows, cols), seed++);
      for (auto& v : floats) v += 100.0f;
      check(floats, rows, cols);
    }
  // The largest shape the seed's statistics see (60000 MNIST images) spans several row chunks.
  check(random_bytes(count(60000, 784), seed++), 60000, 784);
}

TEST_F(ColumnStatsCuda, ZeroRowsGiveNanLikeTheTwin) {
  check(std::vector<uint8_t>(), 0, 13);
  check(std::vector<float>(), 0, 13);
}

}  // namespace
}  // namespace tandem
