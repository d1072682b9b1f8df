// Google Benchmark suite of the CUDA kernels at the default model's shapes (784-100-10; batches
// of 1000, 10000 and 60000 rows), next to the two ceilings they are judged against.
//
//   build/bench/tandem_kernels_cuda_bench [--benchmark_filter=...] [--benchmark_format=json]
//
// What is measured
//   * Ceilings: "ceiling/d2d_copy" (cudaMemcpyAsync of 1 GiB device to device: the memory
//     bandwidth a streaming kernel can hope for), "ceiling/sgemm_fp32" (cublasSgemm 8192^3 in
//     CUBLAS_DEFAULT_MATH, which never uses TF32: the plain float32 FLOP rate) and
//     "ceiling/sgemm_tf32" (the same in CUBLAS_TF32_TENSOR_OP_MATH, for reference).
//   * The kernels: dense forward (fused cuBLASLt epilogue vs. separate bias+ReLU kernel; fp32,
//     TF32, bf16), the two dense backward pieces, softmax + cross-entropy (and cuDNN's softmax as
//     a baseline), Adam, the uint8 batch gather, column statistics and count_correct.
//
// How it is timed
//   Only device time, with CUDA events recorded on the benchmark's own stream around the timed
//   launches (UseManualTime; Google Benchmark appends "/manual_time" to every name). Before
//   timing, every benchmark launches its work at least 8 times (warm-up: module loading, cuBLASLt
//   heuristics, clocks), then measures one pass to choose `calls_per_iter`, the number of calls
//   per benchmark iteration (a whole number of passes over the rotation sets, about 1 ms of work,
//   so event resolution and launch latency do not matter). Those calls are captured once into a
//   CUDA Graph and replayed, as the training engine replays its steps; where capture fails the
//   calls are launched one by one on the stream (the label says "graph" or "stream", and why).
//   count_correct synchronises by design and always runs on the stream, so its time includes the
//   host round trip of each call; the ceilings also run on the stream (one long call each).
//
// Cache
//   Where one call's working set would fit in L2 (50-60 MB), the inputs and outputs are
//   replicated into `sets` independent copies and consecutive calls rotate through them, so that
//   max(4 x L2, 256 MiB) of distinct data lies between two uses of the same bytes (at most 1024
//   sets; the 1000-row softmax is latency-bound anyway). Sizes above that run with one set.
//   Inputs are random (std::mt19937 on the host, copied once); outputs are overwritten.
//
// Counters (all per call, from the mean measured time per call; plain values)
//   GBps        the minimum bytes a call must move / time / 1e9: every input read once, every
//               output written once, nothing for intermediates (d2d_copy: 2 x bytes copied).
//               Compare with ceiling/d2d_copy's GBps.
//   TFLOPs      matrix kernels only: 2 x rows x in x out / time / 1e12 (bias, ReLU and the bias
//               gradient's column sums are not counted); sgemm: 2 x M x N x K.
//   us_per_call the mean device time of one call, in microseconds. The "Time" column is the time
//               of one benchmark iteration, i.e. of `calls_per_iter` calls.
//   calls_per_iter, sets   as described above.
//   The label also carries "check=ok" (or "check=FAILED ...") from a host recomputation of part of
//   the output of rotation set 0 after warm-up, where a cheap one exists.
//
// Byte counts per benchmark (B = rows, floats 4 bytes):
//   dense_forward             x B*784 + w 784*100 + b 100 (read), y B*100 (written)
//   dense_backward_params     x B*784 + dy B*100 (read), dw 784*100 + db 100 (written)
//   dense_backward_input_relu dy B*10 + w 100*10 + x B*100 (read), dx B*100 (written)
//   softmax_xent              logits B*10*4 + labels B (read), dlogits B*10*4 + predictions B
//                             (written); the per-block partials and totals are not counted
//   cudnn_softmax             x B*10*4 (read), y B*10*4 (written)
//   adam                      7*4*N: w, m, v, g read, w, m, v written (the step counter ignored)
//   gather_u8                 B*784 (pixels read) + B*784*4 (floats written) + B*4 (row indices)
//                             + 2*B (labels read and written)
//   column_stats_u8           rows*cols (read) + 2*8*cols (means and variances written)
//   count_correct             2*n (predictions and labels read)
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cpu/adam_cpu.h"
#include "cpu/convert_cpu.h"
#include "cuda/adam_cuda.h"
#include "cuda/convert_cuda.h"
#include "cuda/cublas_check.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "cuda/dense_cuda.h"
#include "cuda/device_buffer.h"
#include "cuda/softmax_xent_cuda.h"
#include "cuda/stats_cuda.h"

namespace {

namespace tk = tandem::kernels;

[[noreturn]] void throw_cudnn_error(const char* call, const char* file, int line,
                                    cudnnStatus_t status) {
  std::ostringstream text;
  text << "cuDNN error " << static_cast<int>(status) << " (" << cudnnGetErrorString(status)
       << ") in " << call << " at " << file << ":" << line;
  throw std::runtime_error(text.str());
}

#define BENCH_CUDNN_CHECK(call)                                                   \
  do {                                                                            \
    const cudnnStatus_t bench_status_ = (call);                                   \
    if (bench_status_ != CUDNN_STATUS_SUCCESS)                                    \
      throw_cudnn_error(#call, __FILE__, __LINE__, bench_status_);                \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Sizes and tuning.

constexpr int64_t kFeatures = 784;  // the default model: 784-100-10
constexpr int64_t kHidden = 100;
constexpr int64_t kClasses = 10;
constexpr int64_t kDatasetRows = 60000;

constexpr int kMaxSets = 1024;           // rotation copies at most
constexpr int kMaxCallsPerIter = 2048;   // calls (graph nodes ~ 1-2 each) per iteration at most
constexpr double kBatchSeconds = 1e-3;   // aim for about this much device time per iteration
constexpr int kMinWarmupCalls = 8;

// ---------------------------------------------------------------------------------------------
// RAII for the handles (destructors log instead of throwing, as DeviceBuffer).

void log_failure(const char* what, const char* message) {
  std::fprintf(stderr, "kernels_cuda_bench: %s failed: %s\n", what, message);
}

class Stream {
 public:
  Stream() { TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)); }
  ~Stream() {
    const cudaError_t status = cudaStreamDestroy(stream_);
    if (status != cudaSuccess) log_failure("cudaStreamDestroy", cudaGetErrorString(status));
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
};

class Event {
 public:
  Event() { TANDEM_CUDA_CHECK(cudaEventCreate(&event_)); }
  ~Event() {
    const cudaError_t status = cudaEventDestroy(event_);
    if (status != cudaSuccess) log_failure("cudaEventDestroy", cudaGetErrorString(status));
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) {
    TANDEM_CUBLAS_CHECK(cublasCreate(&handle_));
    TANDEM_CUBLAS_CHECK(cublasSetStream(handle_, stream));
  }
  ~CublasHandle() {
    const cublasStatus_t status = cublasDestroy(handle_);
    if (status != CUBLAS_STATUS_SUCCESS) log_failure("cublasDestroy", cublasGetStatusString(status));
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  cublasHandle_t get() const { return handle_; }

 private:
  cublasHandle_t handle_ = nullptr;
};

class CudnnHandle {
 public:
  explicit CudnnHandle(cudaStream_t stream) {
    BENCH_CUDNN_CHECK(cudnnCreate(&handle_));
    BENCH_CUDNN_CHECK(cudnnSetStream(handle_, stream));
  }
  ~CudnnHandle() {
    const cudnnStatus_t status = cudnnDestroy(handle_);
    if (status != CUDNN_STATUS_SUCCESS) log_failure("cudnnDestroy", cudnnGetErrorString(status));
  }
  CudnnHandle(const CudnnHandle&) = delete;
  CudnnHandle& operator=(const CudnnHandle&) = delete;
  cudnnHandle_t get() const { return handle_; }

 private:
  cudnnHandle_t handle_ = nullptr;
};

class CudnnTensor {
 public:
  CudnnTensor() { BENCH_CUDNN_CHECK(cudnnCreateTensorDescriptor(&desc_)); }
  ~CudnnTensor() {
    const cudnnStatus_t status = cudnnDestroyTensorDescriptor(desc_);
    if (status != CUDNN_STATUS_SUCCESS)
      log_failure("cudnnDestroyTensorDescriptor", cudnnGetErrorString(status));
  }
  CudnnTensor(const CudnnTensor&) = delete;
  CudnnTensor& operator=(const CudnnTensor&) = delete;
  cudnnTensorDescriptor_t get() const { return desc_; }

 private:
  cudnnTensorDescriptor_t desc_ = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Host data, transfers and rotation sets.

// Uniform float in [lo, hi) from 24 random bits (fast enough for the 1 GiB buffers).
struct Uniform {
  float lo, hi;
  float operator()(std::mt19937& rng) const {
    return lo + (hi - lo) * static_cast<float>(rng() >> 8) * 0x1p-24f;
  }
};
struct RandomByte {
  uint8_t operator()(std::mt19937& rng) const { return static_cast<uint8_t>(rng() >> 24); }
};
struct RandomClass {
  uint8_t operator()(std::mt19937& rng) const { return static_cast<uint8_t>(rng() % kClasses); }
};
struct RandomRow {
  int32_t operator()(std::mt19937& rng) const {
    return static_cast<int32_t>(rng() % static_cast<uint32_t>(kDatasetRows));
  }
};

template <typename T>
std::vector<T> download(const T* src, size_t count, cudaStream_t stream) {
  std::vector<T> host(count);
  if (count == 0) return host;
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host.data(), src, count * sizeof(T), cudaMemcpyDeviceToHost,
                                    stream));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

int64_t l2_cache_bytes() {
  static const int64_t bytes = [] {
    int device = 0, l2 = 0;
    TANDEM_CUDA_CHECK(cudaGetDevice(&device));
    TANDEM_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
    return static_cast<int64_t>(l2);
  }();
  return bytes;
}

// How many independent copies of a call's working set (`bytes_per_call`) are needed so that
// max(4 x L2, 256 MiB) of other data passes between two uses of the same copy.
int rotation_sets(double bytes_per_call) {
  const double target =
      std::max(4.0 * static_cast<double>(l2_cache_bytes()), 256.0 * 1024.0 * 1024.0);
  const double sets = std::ceil(target / std::max(bytes_per_call, 1.0));
  return static_cast<int>(std::clamp(sets, 1.0, static_cast<double>(kMaxSets)));
}

// `sets` copies of `count` elements in one allocation, each copy 256-byte aligned.
template <typename T>
class Rotated {
 public:
  Rotated() = default;
  // Uninitialised (for outputs).
  Rotated(size_t count, int sets)
      : count_(count), stride_(padded(count)), sets_(sets),
        buffer_(stride_ * static_cast<size_t>(sets)) {}
  // Random contents, one generator over all copies (so each copy differs), copied once.
  template <typename Gen>
  Rotated(size_t count, int sets, uint32_t seed, Gen gen, cudaStream_t stream)
      : Rotated(count, sets) {
    std::vector<T> host(buffer_.size());
    std::mt19937 rng(seed);
    for (auto& x : host) x = gen(rng);
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(buffer_.data(), host.data(), host.size() * sizeof(T),
                                      cudaMemcpyHostToDevice, stream));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  T* operator[](int set) { return buffer_.data() + static_cast<size_t>(set % sets_) * stride_; }
  size_t count() const { return count_; }
  std::vector<T> download_set(int set, cudaStream_t stream) {
    return download((*this)[set], count_, stream);
  }

 private:
  static size_t padded(size_t count) {
    const size_t unit = std::max<size_t>(1, 256 / sizeof(T));
    return (count + unit - 1) / unit * unit;
  }
  size_t count_ = 0;
  size_t stride_ = 0;
  int sets_ = 1;
  tk::DeviceBuffer<T> buffer_;
};

std::string check_result(bool ok, double worst, const char* what) {
  if (ok) return "ok";
  std::ostringstream text;
  text << "FAILED(" << what << " " << worst << ")";
  return text.str();
}

// ---------------------------------------------------------------------------------------------
// The timing harness. A Fixture owns its stream, events, buffers and (when capture works) the
// CUDA Graph of one iteration's calls; it is built once per benchmark and reused by Google
// Benchmark's repeated invocations of the benchmark function.

class Fixture {
 public:
  Fixture() = default;
  virtual ~Fixture() {
    if (graph_ != nullptr) {
      const cudaError_t status = cudaGraphExecDestroy(graph_);
      if (status != cudaSuccess) log_failure("cudaGraphExecDestroy", cudaGetErrorString(status));
    }
  }
  Fixture(const Fixture&) = delete;
  Fixture& operator=(const Fixture&) = delete;

  // Warm-up, calibration of the calls per iteration, graph capture, correctness check.
  void prepare(bool try_graph) {
    const int warmup = std::max(sets_, kMinWarmupCalls);
    for (int i = 0; i < warmup; ++i) launch(i % sets_);
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream()));
    TANDEM_CUDA_CHECK(cudaGetLastError());

    TANDEM_CUDA_CHECK(cudaEventRecord(start_.get(), stream()));
    for (int i = 0; i < sets_; ++i) launch(i);
    TANDEM_CUDA_CHECK(cudaEventRecord(stop_.get(), stream()));
    TANDEM_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
    float ms = 0.0f;
    TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
    const double pass_seconds = std::max(1e-3 * ms, 1e-7);
    const double max_passes = std::max(1, kMaxCallsPerIter / sets_);
    const double passes = std::clamp(std::ceil(kBatchSeconds / pass_seconds), 1.0, max_passes);
    calls_ = sets_ * static_cast<int>(passes);

    mode_ = "stream";
    if (try_graph) capture();
    if (graph_ != nullptr) {  // warm-up of the graph itself; on failure, back to the stream
      cudaError_t status = cudaGraphUpload(graph_, stream());
      if (status == cudaSuccess) status = cudaGraphLaunch(graph_, stream());
      if (status == cudaSuccess) status = cudaStreamSynchronize(stream());
      if (status != cudaSuccess) {
        std::fprintf(stderr, "kernels_cuda_bench: graph launch failed, timing stream launches: %s\n",
                     cudaGetErrorString(status));
        (void)cudaGetLastError();
        const cudaError_t destroyed = cudaGraphExecDestroy(graph_);
        if (destroyed != cudaSuccess)
          log_failure("cudaGraphExecDestroy", cudaGetErrorString(destroyed));
        graph_ = nullptr;
        mode_ = "stream(graph_launch_failed)";
      }
    }
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream()));  // a sticky error stops here
    TANDEM_CUDA_CHECK(cudaGetLastError());
    check_ = check();
    if (check_ != "ok" && !check_.empty())
      std::fprintf(stderr, "kernels_cuda_bench: check %s\n", check_.c_str());
  }

  void measure(benchmark::State& state) {
    double seconds = 0.0;
    int64_t calls = 0;
    for (auto _ : state) {
      TANDEM_CUDA_CHECK(cudaEventRecord(start_.get(), stream()));
      if (graph_ != nullptr) {
        TANDEM_CUDA_CHECK(cudaGraphLaunch(graph_, stream()));
      } else {
        for (int i = 0; i < calls_; ++i) launch(i % sets_);
      }
      TANDEM_CUDA_CHECK(cudaEventRecord(stop_.get(), stream()));
      TANDEM_CUDA_CHECK(cudaEventSynchronize(stop_.get()));
      float ms = 0.0f;
      TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start_.get(), stop_.get()));
      const double iteration_seconds = 1e-3 * static_cast<double>(ms);
      state.SetIterationTime(iteration_seconds);
      seconds += iteration_seconds;
      calls += calls_;
    }
    TANDEM_CUDA_CHECK(cudaGetLastError());
    if (calls == 0 || seconds <= 0.0) return;
    const double per_call = seconds / static_cast<double>(calls);
    if (bytes_per_call_ > 0.0)
      state.counters["GBps"] = benchmark::Counter(bytes_per_call_ / per_call / 1e9);
    if (flops_per_call_ > 0.0)
      state.counters["TFLOPs"] = benchmark::Counter(flops_per_call_ / per_call / 1e12);
    state.counters["us_per_call"] = benchmark::Counter(per_call * 1e6);
    state.counters["calls_per_iter"] = benchmark::Counter(calls_);
    state.counters["sets"] = benchmark::Counter(sets_);
    std::string label = mode_;
    if (!note_.empty()) label += " " + note_;
    if (!check_.empty()) label += " check=" + check_;
    state.SetLabel(label);
  }

 protected:
  cudaStream_t stream() const { return stream_.get(); }
  // Enqueues one call on the stream, using rotation set `set` (in [0, sets_)).
  virtual void launch(int set) = 0;
  // Checks the outputs of set 0 after warm-up: "ok", "FAILED(...)", or "" when not checked.
  virtual std::string check() { return ""; }

  int sets_ = 1;
  double bytes_per_call_ = 0.0;
  double flops_per_call_ = 0.0;
  std::string note_;  // appended to the label

 private:
  // Captures calls_ calls into graph_; leaves graph_ null (and says why in mode_) on failure.
  void capture() {
    TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream(), cudaStreamCaptureModeThreadLocal));
    std::string failure;
    try {
      for (int i = 0; i < calls_; ++i) launch(i % sets_);
    } catch (const std::exception& e) {
      failure = e.what();
    }
    cudaGraph_t graph = nullptr;
    const cudaError_t end = cudaStreamEndCapture(stream(), &graph);
    if (failure.empty() && end != cudaSuccess) failure = cudaGetErrorString(end);
    if (failure.empty() && graph != nullptr) {
      const cudaError_t status = cudaGraphInstantiate(&graph_, graph, 0);
      if (status != cudaSuccess) {
        failure = cudaGetErrorString(status);
        graph_ = nullptr;
      }
    }
    if (graph != nullptr) {
      const cudaError_t status = cudaGraphDestroy(graph);
      if (status != cudaSuccess) log_failure("cudaGraphDestroy", cudaGetErrorString(status));
    }
    if (failure.empty() && graph_ == nullptr) failure = "empty graph";
    if (failure.empty()) {
      mode_ = "graph";
      return;
    }
    (void)cudaGetLastError();  // a failed capture leaves only non-sticky errors
    std::fprintf(stderr, "kernels_cuda_bench: graph capture failed, timing stream launches: %s\n",
                 failure.c_str());
    if (failure.size() > 60) failure = failure.substr(0, 60) + "...";
    for (auto& c : failure)
      if (c == ' ') c = '_';
    mode_ = "stream(capture_failed:" + failure + ")";
  }

  Stream stream_;
  Event start_, stop_;
  cudaGraphExec_t graph_ = nullptr;
  int calls_ = 1;
  std::string mode_ = "stream";
  std::string check_;
};

// One fixture alive at a time: Google Benchmark calls a benchmark's function several times in a
// row (growing the iteration count), and runs benchmarks one after another.
std::unique_ptr<Fixture> g_fixture;
std::string g_fixture_name;

void release_fixture() {
  g_fixture.reset();
  g_fixture_name.clear();
}

using MakeFixture = std::function<std::unique_ptr<Fixture>()>;

void run_benchmark(benchmark::State& state, const std::string& name, const MakeFixture& make) {
  try {
    if (g_fixture == nullptr || g_fixture_name != name) {
      release_fixture();
      g_fixture = make();
      g_fixture_name = name;
    }
    g_fixture->measure(state);
  } catch (const std::exception& e) {
    release_fixture();
    (void)cudaGetLastError();
    std::fprintf(stderr, "kernels_cuda_bench: %s: %s\n", name.c_str(), e.what());
    state.SkipWithError(e.what());
  }
}

template <typename F, typename... Args>
MakeFixture fixture(bool try_graph, Args... args) {
  return [=]() -> std::unique_ptr<Fixture> {
    auto f = std::make_unique<F>(args...);
    f->prepare(try_graph);
    return f;
  };
}

// ---------------------------------------------------------------------------------------------
// Ceilings.

class D2DCopy : public Fixture {
 public:
  static constexpr size_t kBytes = size_t{1} << 30;
  D2DCopy()
      : src_(kBytes / sizeof(float), 1, 11, Uniform{-1.0f, 1.0f}, stream()),
        dst_(kBytes / sizeof(float), 1) {
    bytes_per_call_ = 2.0 * static_cast<double>(kBytes);  // read + written
  }

 protected:
  void launch(int) override {
    TANDEM_CUDA_CHECK(
        cudaMemcpyAsync(dst_[0], src_[0], kBytes, cudaMemcpyDeviceToDevice, stream()));
  }

 private:
  Rotated<float> src_, dst_;
};

class Sgemm : public Fixture {
 public:
  static constexpr int kN = 8192;
  explicit Sgemm(bool tf32)
      : cublas_(stream()),
        a_(size_t{kN} * kN, 1, 21, Uniform{-1.0f, 1.0f}, stream()),
        b_(size_t{kN} * kN, 1, 22, Uniform{-1.0f, 1.0f}, stream()),
        c_(size_t{kN} * kN, 1) {
    // CUBLAS_DEFAULT_MATH never rounds float32 operands to TF32 (TF32 needs the explicit
    // CUBLAS_TF32_TENSOR_OP_MATH, or NVIDIA_TF32_OVERRIDE, which can only disable it).
    TANDEM_CUBLAS_CHECK(cublasSetMathMode(
        cublas_.get(), tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    const double n = kN;
    flops_per_call_ = 2.0 * n * n * n;
    note_ = tf32 ? "math=tf32_tensor_op" : "math=default(fp32,no_tf32)";
  }

 protected:
  void launch(int) override {
    TANDEM_CUBLAS_CHECK(cublasSgemm(cublas_.get(), CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &alpha_,
                                    a_[0], kN, b_[0], kN, &beta_, c_[0], kN));
  }

 private:
  CublasHandle cublas_;
  Rotated<float> a_, b_, c_;
  const float alpha_ = 1.0f, beta_ = 0.0f;
};

// ---------------------------------------------------------------------------------------------
// Dense layer.

// |a - b| relative to the sum of the magnitudes of the terms (the scale of rounding errors).
double relative_error(double device, double reference, double magnitude) {
  return std::fabs(device - reference) / std::max(magnitude, 1e-30);
}

double tolerance(tk::MatmulPrecision precision) {
  switch (precision) {
    case tk::MatmulPrecision::Fp32: return 1e-4;
    case tk::MatmulPrecision::Tf32: return 1e-2;
    case tk::MatmulPrecision::Bf16: return 3e-2;
  }
  return 3e-2;
}

class DenseForward : public Fixture {
 public:
  DenseForward(int64_t rows, tk::MatmulPrecision precision, tk::DenseEpilogue epilogue)
      : rows_(rows), precision_(precision), epilogue_(epilogue), dense_(stream(), precision) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = 4.0 * (r * kFeatures + kFeatures * kHidden + kHidden + r * kHidden);
    flops_per_call_ = 2.0 * r * kFeatures * kHidden;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    x_ = Rotated<float>(n * kFeatures, sets_, 31, Uniform{0.0f, 1.0f}, stream());  // pixels
    w_ = Rotated<float>(kFeatures * kHidden, sets_, 32, Uniform{-0.1f, 0.1f}, stream());
    b_ = Rotated<float>(kHidden, sets_, 33, Uniform{-0.5f, 0.5f}, stream());
    y_ = Rotated<float>(n * kHidden, sets_);
    dense_.reserve_rows(rows);
  }

 protected:
  void launch(int set) override {
    dense_.forward(x_[set], w_[set], b_[set], y_[set], rows_, kFeatures, kHidden, true, epilogue_);
  }
  std::string check() override {
    const auto x = x_.download_set(0, stream()), w = w_.download_set(0, stream()),
               b = b_.download_set(0, stream()), y = y_.download_set(0, stream());
    std::mt19937 rng(99);
    double worst = 0.0;
    for (int s = 0; s < 256; ++s) {
      const int64_t r = static_cast<int64_t>(rng() % static_cast<uint32_t>(rows_));
      const int64_t c = static_cast<int64_t>(rng() % static_cast<uint32_t>(kHidden));
      double acc = b[c], magnitude = std::fabs(b[c]);
      for (int64_t k = 0; k < kFeatures; ++k) {
        const double term = static_cast<double>(x[r * kFeatures + k]) * w[k * kHidden + c];
        acc += term;
        magnitude += std::fabs(term);
      }
      worst = std::max(worst, relative_error(y[r * kHidden + c], std::max(acc, 0.0), magnitude));
    }
    return check_result(worst <= tolerance(precision_), worst, "rel_err");
  }

 private:
  int64_t rows_;
  tk::MatmulPrecision precision_;
  tk::DenseEpilogue epilogue_;
  tk::DenseCuda dense_;
  Rotated<float> x_, w_, b_, y_;
};

class DenseBackwardParams : public Fixture {
 public:
  explicit DenseBackwardParams(int64_t rows)
      : rows_(rows), dense_(stream(), tk::MatmulPrecision::Fp32) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = 4.0 * (r * kFeatures + r * kHidden + kFeatures * kHidden + kHidden);
    flops_per_call_ = 2.0 * r * kFeatures * kHidden;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    x_ = Rotated<float>(n * kFeatures, sets_, 41, Uniform{0.0f, 1.0f}, stream());
    dy_ = Rotated<float>(n * kHidden, sets_, 42, Uniform{-0.01f, 0.01f}, stream());
    dw_ = Rotated<float>(kFeatures * kHidden, sets_);
    db_ = Rotated<float>(kHidden, sets_);
    dense_.reserve_rows(rows);
  }

 protected:
  void launch(int set) override {
    dense_.backward_params(x_[set], dy_[set], dw_[set], db_[set], rows_, kFeatures, kHidden,
                           false);
  }
  std::string check() override {
    const auto x = x_.download_set(0, stream()), dy = dy_.download_set(0, stream()),
               dw = dw_.download_set(0, stream()), db = db_.download_set(0, stream());
    double worst = 0.0;
    for (int64_t c = 0; c < kHidden; ++c) {  // every bias gradient
      double acc = 0.0, magnitude = 0.0;
      for (int64_t r = 0; r < rows_; ++r) {
        acc += dy[r * kHidden + c];
        magnitude += std::fabs(dy[r * kHidden + c]);
      }
      worst = std::max(worst, relative_error(db[c], acc, magnitude));
    }
    std::mt19937 rng(98);
    for (int s = 0; s < 64; ++s) {  // a sample of the weight gradient
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint32_t>(kFeatures));
      const int64_t c = static_cast<int64_t>(rng() % static_cast<uint32_t>(kHidden));
      double acc = 0.0, magnitude = 0.0;
      for (int64_t r = 0; r < rows_; ++r) {
        const double term = static_cast<double>(x[r * kFeatures + k]) * dy[r * kHidden + c];
        acc += term;
        magnitude += std::fabs(term);
      }
      worst = std::max(worst, relative_error(dw[k * kHidden + c], acc, magnitude));
    }
    return check_result(worst <= 1e-4, worst, "rel_err");
  }

 private:
  int64_t rows_;
  tk::DenseCuda dense_;
  Rotated<float> x_, dy_, dw_, db_;
};

// The 100->10 layer's input gradient: in = 100, out = 10.
class DenseBackwardInputRelu : public Fixture {
 public:
  static constexpr int64_t kIn = kHidden, kOut = kClasses;
  explicit DenseBackwardInputRelu(int64_t rows)
      : rows_(rows), dense_(stream(), tk::MatmulPrecision::Fp32) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = 4.0 * (r * kOut + kIn * kOut + r * kIn + r * kIn);
    flops_per_call_ = 2.0 * r * kIn * kOut;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    dy_ = Rotated<float>(n * kOut, sets_, 51, Uniform{-0.1f, 0.1f}, stream());
    w_ = Rotated<float>(kIn * kOut, sets_, 52, Uniform{-0.3f, 0.3f}, stream());
    // Stands for the ReLU output; only x > 0 matters, so negatives play the ReLU's zeros.
    x_ = Rotated<float>(n * kIn, sets_, 53, Uniform{-1.0f, 1.0f}, stream());
    dx_ = Rotated<float>(n * kIn, sets_);
    dense_.reserve_rows(rows);
  }

 protected:
  void launch(int set) override {
    dense_.backward_input_relu(dy_[set], w_[set], x_[set], dx_[set], rows_, kIn, kOut);
  }
  std::string check() override {
    const auto dy = dy_.download_set(0, stream()), w = w_.download_set(0, stream()),
               x = x_.download_set(0, stream()), dx = dx_.download_set(0, stream());
    std::mt19937 rng(97);
    double worst = 0.0;
    for (int s = 0; s < 256; ++s) {
      const int64_t r = static_cast<int64_t>(rng() % static_cast<uint32_t>(rows_));
      const int64_t k = static_cast<int64_t>(rng() % static_cast<uint32_t>(kIn));
      double acc = 0.0, magnitude = 0.0;
      for (int64_t c = 0; c < kOut; ++c) {
        const double term = static_cast<double>(dy[r * kOut + c]) * w[k * kOut + c];
        acc += term;
        magnitude += std::fabs(term);
      }
      const double reference = x[r * kIn + k] > 0.0f ? acc : 0.0;
      worst = std::max(worst, relative_error(dx[r * kIn + k], reference, magnitude));
    }
    return check_result(worst <= 1e-4, worst, "rel_err");
  }

 private:
  int64_t rows_;
  tk::DenseCuda dense_;
  Rotated<float> dy_, w_, x_, dx_;
};

// ---------------------------------------------------------------------------------------------
// Softmax + cross-entropy, and cuDNN's softmax as a baseline.

class SoftmaxXent : public Fixture {
 public:
  explicit SoftmaxXent(int64_t rows)
      : rows_(rows),
        partials_(static_cast<size_t>(tk::softmax_xent_partials_needed(rows))),
        totals_(1) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = 4.0 * r * kClasses + r + 4.0 * r * kClasses + r;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    logits_ = Rotated<float>(n * kClasses, sets_, 61, Uniform{-4.0f, 4.0f}, stream());
    labels_ = Rotated<uint8_t>(n, sets_, 62, RandomClass{}, stream());
    dlogits_ = Rotated<float>(n * kClasses, sets_);
    predictions_ = Rotated<uint8_t>(n, sets_);
    TANDEM_CUDA_CHECK(cudaMemsetAsync(totals_.data(), 0, totals_.bytes(), stream()));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

 protected:
  void launch(int set) override {
    tk::softmax_xent_cuda(logits_[set], labels_[set], dlogits_[set], predictions_[set], rows_,
                          kClasses, partials_.data(), totals_.data(), stream());
  }
  std::string check() override {
    // Predictions: a maximum of each row. dlogits = p - onehot (or 0 for a
    // clipped row): every row sums to 0 whatever the clipping.
    const auto z = logits_.download_set(0, stream()), dz = dlogits_.download_set(0, stream());
    const auto predictions = predictions_.download_set(0, stream());
    int64_t wrong = 0;
    double worst = 0.0;
    for (int64_t r = 0; r < rows_; ++r) {
      const float* row = &z[static_cast<size_t>(r * kClasses)];
      const float best = *std::max_element(row, row + kClasses);
      const uint8_t predicted = predictions[static_cast<size_t>(r)];
      // A maximum (equal values, rare with 24 random bits, may be broken either way).
      if (predicted >= kClasses || row[predicted] < best) ++wrong;
      double sum = 0.0;
      for (int64_t c = 0; c < kClasses; ++c) sum += dz[static_cast<size_t>(r * kClasses + c)];
      worst = std::max(worst, std::fabs(sum));
    }
    if (wrong != 0) return check_result(false, static_cast<double>(wrong), "wrong_argmax_rows");
    return check_result(worst <= 1e-5, worst, "dlogits_row_sum");
  }

 private:
  int64_t rows_;
  tk::DeviceBuffer<tk::SoftmaxXentPartial> partials_;
  tk::DeviceBuffer<tk::DeviceStats> totals_;
  Rotated<float> logits_, dlogits_;
  Rotated<uint8_t> labels_, predictions_;
};

// cudnnSoftmaxForward (still in cuDNN 9's cudnn_ops.h, not deprecated), CUDNN_SOFTMAX_ACCURATE
// (max-subtracted probabilities: what the gradient p - onehot needs), MODE_INSTANCE over a
// [rows, 10, 1, 1] float NCHW tensor.
class CudnnSoftmax : public Fixture {
 public:
  explicit CudnnSoftmax(int64_t rows) : rows_(rows), cudnn_(stream()) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = 2.0 * 4.0 * r * kClasses;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    x_ = Rotated<float>(n * kClasses, sets_, 71, Uniform{-4.0f, 4.0f}, stream());
    y_ = Rotated<float>(n * kClasses, sets_);
    BENCH_CUDNN_CHECK(cudnnSetTensor4dDescriptor(desc_.get(), CUDNN_TENSOR_NCHW,
                                                 CUDNN_DATA_FLOAT, static_cast<int>(rows),
                                                 static_cast<int>(kClasses), 1, 1));
  }

 protected:
  void launch(int set) override {
    BENCH_CUDNN_CHECK(cudnnSoftmaxForward(cudnn_.get(), CUDNN_SOFTMAX_ACCURATE,
                                          CUDNN_SOFTMAX_MODE_INSTANCE, &alpha_, desc_.get(),
                                          x_[set], &beta_, desc_.get(), y_[set]));
  }
  std::string check() override {
    const auto y = y_.download_set(0, stream());
    double worst = 0.0;
    for (int64_t r = 0; r < rows_; ++r) {
      double sum = 0.0;
      for (int64_t c = 0; c < kClasses; ++c) sum += y[static_cast<size_t>(r * kClasses + c)];
      worst = std::max(worst, std::fabs(sum - 1.0));
    }
    return check_result(worst <= 1e-5, worst, "row_sum_minus_1");
  }

 private:
  int64_t rows_;
  CudnnHandle cudnn_;
  CudnnTensor desc_;
  Rotated<float> x_, y_;
  const float alpha_ = 1.0f, beta_ = 0.0f;
};

// ---------------------------------------------------------------------------------------------
// Adam over the parameter arena: one step-advance launch and one update launch per call.

class Adam : public Fixture {
 public:
  explicit Adam(int64_t n) : n_(n), state_(1) {
    bytes_per_call_ = 7.0 * 4.0 * static_cast<double>(n);
    sets_ = rotation_sets(bytes_per_call_);
    const auto count = static_cast<size_t>(n);
    w_ = Rotated<float>(count, sets_, 81, Uniform{-0.1f, 0.1f}, stream());
    m_ = Rotated<float>(count, sets_, 82, Uniform{-0.01f, 0.01f}, stream());
    v_ = Rotated<float>(count, sets_, 83, Uniform{1e-6f, 1e-4f}, stream());
    g_ = Rotated<float>(count, sets_, 84, Uniform{-0.01f, 0.01f}, stream());
    const tk::AdamDeviceStep initial{0, 0.0f};
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(state_.data(), &initial, sizeof(initial),
                                      cudaMemcpyHostToDevice, stream()));
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream()));
  }

 protected:
  void launch(int set) override {
    tk::adam_advance_step_cuda(state_.data(), hyper_, stream());
    tk::adam_update_cuda(w_[set], m_[set], v_[set], g_[set], n_, state_.data(), hyper_,
                         stream());
  }
  std::string check() override {
    // Many steps have run: the step counter must have advanced once per call, and the
    // parameters must still be finite.
    const auto step = download(state_.data(), 1, stream());
    const auto w = w_.download_set(0, stream());
    int64_t bad = 0;
    for (float x : w) bad += std::isfinite(x) ? 0 : 1;
    if (bad != 0) return check_result(false, static_cast<double>(bad), "non_finite_weights");
    const bool lr_ok = std::isfinite(step[0].lr_t) && step[0].lr_t > 0.0f;
    return check_result(step[0].step > 0 && lr_ok, static_cast<double>(step[0].step), "step");
  }

 private:
  int64_t n_;
  tk::DeviceBuffer<tk::AdamDeviceStep> state_;
  tk::AdamHyper hyper_;
  Rotated<float> w_, m_, v_, g_;
};

// ---------------------------------------------------------------------------------------------
// Input path and statistics.

class GatherU8 : public Fixture {
 public:
  explicit GatherU8(int64_t rows) : rows_(rows) {
    const double r = static_cast<double>(rows);
    bytes_per_call_ = r * kFeatures + r * kFeatures * 4.0 + r * 4.0 + 2.0 * r;
    sets_ = rotation_sets(bytes_per_call_);
    const auto n = static_cast<size_t>(rows);
    // Each set has its own copy of the whole 60000-row data set (47 MB: it alone fits in L2).
    src_ = Rotated<uint8_t>(kDatasetRows * kFeatures, sets_, 91, RandomByte{}, stream());
    labels_ = Rotated<uint8_t>(kDatasetRows, sets_, 92, RandomClass{}, stream());
    order_ = Rotated<int32_t>(n, sets_, 93, RandomRow{}, stream());
    dst_ = Rotated<float>(n * kFeatures, sets_);
    labels_out_ = Rotated<uint8_t>(n, sets_);
  }

 protected:
  void launch(int set) override {
    tk::gather_rows_u8_cuda(src_[set], kFeatures, order_[set], rows_, dst_[set], labels_[set],
                            labels_out_[set], stream());
  }
  std::string check() override {
    const auto src = src_.download_set(0, stream()), labels = labels_.download_set(0, stream());
    const auto order = order_.download_set(0, stream());
    const auto dst = dst_.download_set(0, stream());
    const auto labels_out = labels_out_.download_set(0, stream());
    double worst = 0.0;
    int64_t wrong_labels = 0;
    for (int64_t i = 0; i < rows_; ++i) {
      const auto row = static_cast<size_t>(order[static_cast<size_t>(i)]);
      if (labels_out[static_cast<size_t>(i)] != labels[row]) ++wrong_labels;
      for (int64_t k = 0; k < kFeatures; ++k) {
        const double expected = src[row * kFeatures + static_cast<size_t>(k)] * tk::kPixelScale;
        worst = std::max(worst, std::fabs(dst[static_cast<size_t>(i * kFeatures + k)] - expected));
      }
    }
    if (wrong_labels != 0)
      return check_result(false, static_cast<double>(wrong_labels), "wrong_labels");
    return check_result(worst <= 1e-6, worst, "abs_err");
  }

 private:
  int64_t rows_;
  Rotated<uint8_t> src_, labels_;
  Rotated<int32_t> order_;
  Rotated<float> dst_;
  Rotated<uint8_t> labels_out_;
};

class ColumnStatsU8 : public Fixture {
 public:
  ColumnStatsU8(int64_t rows, int64_t cols)
      : rows_(rows), cols_(cols), mean_(static_cast<size_t>(cols)),
        variance_(static_cast<size_t>(cols)),
        scratch_(static_cast<size_t>(tk::column_stats_scratch_doubles(rows, cols))) {
    bytes_per_call_ = static_cast<double>(rows) * static_cast<double>(cols) +
                      2.0 * 8.0 * static_cast<double>(cols);
    sets_ = rotation_sets(bytes_per_call_);
    data_ = Rotated<uint8_t>(static_cast<size_t>(rows * cols), sets_, 101, RandomByte{},
                             stream());
  }

 protected:
  void launch(int set) override {
    tk::column_stats_u8_cuda(data_[set], rows_, cols_, mean_.data(), variance_.data(),
                             scratch_.data(), stream());
  }
  std::string check() override {
    // The last call of the warm-up was on set sets_ - 1 (or 0 in the graph); run set 0 once more.
    launch(0);
    const auto data = data_.download_set(0, stream());
    const auto mean = download(mean_.data(), mean_.size(), stream());
    const auto variance = download(variance_.data(), variance_.size(), stream());
    double worst = 0.0;
    for (int64_t c = 0; c < cols_; ++c) {
      double sum = 0.0;
      for (int64_t r = 0; r < rows_; ++r) sum += data[static_cast<size_t>(r * cols_ + c)];
      const double m = sum / static_cast<double>(rows_);
      double m2 = 0.0;
      for (int64_t r = 0; r < rows_; ++r) {
        const double d = data[static_cast<size_t>(r * cols_ + c)] - m;
        m2 += d * d;
      }
      const double var = m2 / static_cast<double>(rows_);
      const auto i = static_cast<size_t>(c);
      worst = std::max(worst, std::fabs(mean[i] - m) / (1.0 + std::fabs(m)));
      worst = std::max(worst, std::fabs(variance[i] - var) / (1.0 + var));
    }
    return check_result(worst <= 1e-9, worst, "rel_err");
  }

 private:
  int64_t rows_, cols_;
  tk::DeviceBuffer<double> mean_, variance_, scratch_;
  Rotated<uint8_t> data_;
};

// Synchronises on every call (the count comes back to the host), so never captured.
class CountCorrect : public Fixture {
 public:
  explicit CountCorrect(int64_t n) : n_(n) {
    bytes_per_call_ = 2.0 * static_cast<double>(n);
    sets_ = rotation_sets(bytes_per_call_);
    const auto count = static_cast<size_t>(n);
    predictions_ = Rotated<uint8_t>(count, sets_, 111, RandomClass{}, stream());
    labels_ = Rotated<uint8_t>(count, sets_, 112, RandomClass{}, stream());
  }

 protected:
  void launch(int set) override {
    last_ = tk::count_correct_cuda(predictions_[set], labels_[set], n_, stream());
    benchmark::DoNotOptimize(last_);
  }
  std::string check() override {
    launch(0);
    const auto predictions = predictions_.download_set(0, stream());
    const auto labels = labels_.download_set(0, stream());
    int64_t expected = 0;
    for (size_t i = 0; i < predictions.size(); ++i) expected += predictions[i] == labels[i];
    return check_result(last_ == expected, static_cast<double>(last_ - expected), "count_diff");
  }

 private:
  int64_t n_;
  int64_t last_ = 0;
  Rotated<uint8_t> predictions_, labels_;
};

// ---------------------------------------------------------------------------------------------
// Registration.

void add(const std::string& name, MakeFixture make) {
  benchmark::RegisterBenchmark(name.c_str(),
                               [name, make](benchmark::State& state) {
                                 run_benchmark(state, name, make);
                               })
      ->UseManualTime()
      ->Unit(benchmark::kMicrosecond);
}

void register_benchmarks() {
  using tk::DenseEpilogue;
  using tk::MatmulPrecision;
  // Ceilings first: the report divides by them.
  add("ceiling/d2d_copy", fixture<D2DCopy>(false));
  add("ceiling/sgemm_fp32", fixture<Sgemm>(false, false));
  add("ceiling/sgemm_tf32", fixture<Sgemm>(false, true));

  const std::vector<int64_t> batches = {1000, 10000, 60000};
  struct Variant {
    const char* name;
    MatmulPrecision precision;
    DenseEpilogue epilogue;
  };
  const Variant variants[] = {{"fused", MatmulPrecision::Fp32, DenseEpilogue::Fused},
                              {"separate", MatmulPrecision::Fp32, DenseEpilogue::Separate},
                              {"fused_tf32", MatmulPrecision::Tf32, DenseEpilogue::Fused},
                              {"fused_bf16", MatmulPrecision::Bf16, DenseEpilogue::Fused}};
  for (const auto& v : variants)
    for (int64_t b : batches)
      add("dense_forward/" + std::string(v.name) + "/" + std::to_string(b),
          fixture<DenseForward>(true, b, v.precision, v.epilogue));
  for (int64_t b : batches)
    add("dense_backward_params/" + std::to_string(b), fixture<DenseBackwardParams>(true, b));
  for (int64_t b : batches)
    add("dense_backward_input_relu/" + std::to_string(b),
        fixture<DenseBackwardInputRelu>(true, b));

  const std::vector<int64_t> softmax_rows = {1000, 10000, 60000, 1000000};
  for (int64_t b : softmax_rows)
    add("softmax_xent/" + std::to_string(b), fixture<SoftmaxXent>(true, b));
  for (int64_t b : softmax_rows)
    add("cudnn_softmax/" + std::to_string(b), fixture<CudnnSoftmax>(true, b));

  for (int64_t n : {int64_t{79510}, int64_t{67108864}})
    add("adam/" + std::to_string(n), fixture<Adam>(true, n));

  for (int64_t b : {int64_t{10000}, int64_t{60000}})
    add("gather_u8/" + std::to_string(b), fixture<GatherU8>(true, b));
  add("column_stats_u8/60000x784", fixture<ColumnStatsU8>(true, kDatasetRows, kFeatures));
  add("count_correct/1000000", fixture<CountCorrect>(false, int64_t{1000000}));
}

}  // namespace

int main(int argc, char** argv) {
  if (tandem::kernels::cuda_device_count() == 0) {
    std::printf("kernels_cuda_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::AddCustomContext("cuda_device", tandem::kernels::cuda_device_description(0));
    benchmark::AddCustomContext("l2_cache_bytes", std::to_string(l2_cache_bytes()));
    register_benchmarks();
    benchmark::RunSpecifiedBenchmarks();
    release_fixture();  // before the CUDA runtime tears down at exit
    benchmark::Shutdown();
  } catch (const std::exception& e) {
    release_fixture();
    std::fprintf(stderr, "kernels_cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
