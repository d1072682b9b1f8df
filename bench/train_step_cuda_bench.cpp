// Whole training steps of the CUDA backend with the data resident on the GPU: the figure set
// side by side with PyTorch eager and torch.compile (torch_gpu_bench.py) by bench/gpu_check.sh.
//
// A step is what `tandem train` runs: a shuffled batch given as a row list (copied to the
// device), gather + uint8->float, forward, summed clipped cross-entropy, backward, Adam, replayed
// as one CUDA Graph. Steps are queued back to back and timed from the host around a
// synchronisation, after warm-up steps that include the graph captures. Each configuration is
// measured --repeats times and the median is reported.
//
// With --store, also the data feed from a persisted store through the chunk manager (issue 4's
// GPU figures): pinned cudaMemcpy host-to-device bandwidth for one batch (the ceiling), the
// stream's batches copied to the device with no compute (against that ceiling), and training
// steps fed by the stream against the same steps on resident data, all in the same run.
//
//   tandem_train_step_cuda_bench --batches 1000,10000,60000 --seconds 2 --json out.json
//   tandem_train_step_cuda_bench --batches 10000 --store /tmp/store.zarr --assemblers 4
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <cstring>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"

#include "cuda/cuda_device.h"
#include "cuda_backend.h"
#include "tandem/tandem.h"

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Random pixels and labels, and a shuffled order of the rows: a step's cost does not depend on
// the values, and random data keeps every element live (no zeros that could hide unwritten
// memory or run faster).
struct RandomData {
  tandem::Dataset data;
  std::vector<int32_t> order;
};
RandomData random_rows(int64_t rows, int64_t features, int classes, uint32_t seed) {
  RandomData r{tandem::Dataset(tandem::PixelType::UInt8, rows, features, classes), {}};
  std::mt19937 rng(seed);
  for (int64_t i = 0; i < rows * features; ++i)
    r.data.pixel_data()[i] = static_cast<uint8_t>(rng());
  for (int64_t i = 0; i < rows; ++i)
    r.data.label_data()[i] = static_cast<uint8_t>(rng() % static_cast<uint32_t>(classes));
  r.order.resize(static_cast<size_t>(rows));
  std::iota(r.order.begin(), r.order.end(), 0);
  std::shuffle(r.order.begin(), r.order.end(), rng);
  return r;
}

// Floating-point operations of one step of an MLP over `batch` rows: forward and weight-gradient
// products for every layer, input-gradient products for every layer but the first (no gradient
// is taken for the images). Bias, activation, softmax and Adam are ignored (memory-bound).
double step_flops(const tandem::ModelConfig& model, int64_t batch) {
  double flops = 0.0;
  for (size_t l = 0; l + 1 < model.layers.size(); ++l) {
    const double mk = static_cast<double>(model.layers[l]) * static_cast<double>(model.layers[l + 1]);
    flops += 2.0 * 2.0 * static_cast<double>(batch) * mk;  // forward + weight gradient
    if (l > 0) flops += 2.0 * static_cast<double>(batch) * mk;  // input gradient
  }
  return flops;
}

struct Measurement {
  double steps_per_s = 0.0;
  std::vector<double> repeats_ms;
};

Measurement measure(tandem::CudaBackend& backend, const tandem::DatasetView& data,
                    const std::vector<int32_t>& order, int64_t batch, double seconds, int repeats) {
  int64_t cursor = 0;
  auto step = [&] {
    if (cursor + batch > data.rows) cursor = 0;
    backend.train_step(data, order.data() + cursor, batch);
    cursor += batch;
  };
  // Warm-up: the first steps of each row-list slot run eagerly, then are captured.
  for (int i = 0; i < 8; ++i) step();
  backend.synchronize();
  // Calibrate how many steps fill `seconds`.
  auto start = Clock::now();
  int64_t calibrate = 0;
  while (since(start) < std::min(0.2, seconds / 4)) {
    step();
    ++calibrate;
    if (calibrate % 16 == 0) backend.synchronize();
  }
  backend.synchronize();
  const double per_step = since(start) / static_cast<double>(calibrate);
  const int64_t steps = std::max<int64_t>(10, static_cast<int64_t>(seconds / per_step));
  Measurement m;
  for (int r = 0; r < repeats; ++r) {
    start = Clock::now();
    for (int64_t i = 0; i < steps; ++i) step();
    backend.synchronize();
    m.repeats_ms.push_back(since(start) * 1e3 / static_cast<double>(steps));
  }
  (void)backend.take_stats();
  std::vector<double> sorted = m.repeats_ms;
  std::sort(sorted.begin(), sorted.end());
  m.steps_per_s = 1e3 / sorted[sorted.size() / 2];
  return m;
}

// Host-to-device bandwidth of one pinned buffer of `bytes`, copied `times` times, timed with events.
double pinned_copy_gbps(size_t bytes, int times) {
  void* host = nullptr;
  TANDEM_CUDA_CHECK(cudaMallocHost(&host, bytes));
  std::memset(host, 0x5a, bytes);
  tandem::kernels::DeviceBuffer<uint8_t> device(bytes);
  cudaStream_t stream;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t start, stop;
  TANDEM_CUDA_CHECK(cudaEventCreate(&start));
  TANDEM_CUDA_CHECK(cudaEventCreate(&stop));
  for (int i = 0; i < 3; ++i)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(device.data(), host, bytes, cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < times; ++i)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(device.data(), host, bytes, cudaMemcpyHostToDevice, stream));
  TANDEM_CUDA_CHECK(cudaEventRecord(stop, stream));
  TANDEM_CUDA_CHECK(cudaEventSynchronize(stop));
  float ms = 0;
  TANDEM_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFreeHost(host);
  return static_cast<double>(bytes) * times / (ms * 1e-3) / 1e9;
}

// One epoch of the store's stream with each batch copied to the device on a copy stream and
// nothing else: pixel bytes delivered per second. The clock starts once the first batch is on
// the device, so the epoch's start (readers starting, the first band read, the first batch
// assembled: latency, not bandwidth) is not counted, and neither is that batch.
double stream_copy_gbps(tandem::BatchStream& stream, int64_t epoch, size_t batch_bytes) {
  tandem::kernels::DeviceBuffer<uint8_t> device(batch_bytes);
  cudaStream_t copy;
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy, cudaStreamNonBlocking));
  stream.start_epoch(epoch);
  tandem::DatasetView batch;
  double bytes = 0;
  Clock::time_point start;
  for (bool first = true; stream.next(batch); first = false) {
    const size_t n = static_cast<size_t>(batch.rows * batch.features) * batch.pixel_bytes();
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(device.data(), batch.pixels, n, cudaMemcpyHostToDevice, copy));
    // The batch's slot returns to the chunk manager at the next next(): the copy must be done.
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(copy));
    if (first) start = Clock::now();
    else bytes += static_cast<double>(n);
  }
  const double seconds = since(start);
  cudaStreamDestroy(copy);
  return bytes > 0 ? bytes / seconds / 1e9 : 0.0;
}

// Training steps fed by the stream for one epoch: samples per second (an epoch's last batch may
// be short), counted from the end of its first step, as above.
double stream_train_samples_per_s(tandem::CudaBackend& backend, tandem::BatchStream& stream,
                                  int64_t epoch) {
  stream.start_epoch(epoch);
  tandem::DatasetView batch;
  double samples = 0;
  Clock::time_point start;
  for (bool first = true; stream.next(batch); first = false) {
    backend.train_step(batch, nullptr, batch.rows);
    if (first) {
      backend.synchronize();
      start = Clock::now();
    } else {
      samples += static_cast<double>(batch.rows);
    }
  }
  backend.synchronize();
  (void)backend.take_stats();
  return samples > 0 ? samples / since(start) : 0.0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Whole training steps of the CUDA backend, data resident on the GPU"};
  std::vector<int64_t> batches{1000, 10000, 60000};
  std::vector<std::string> precisions{"fp32"};
  double seconds = 2.0;
  int repeats = 3;
  int64_t rows = 60000;
  std::string layers = "784-100-10";
  std::string json_path;
  bool eager_too = false;
  std::string store;
  int readers = 4, assemblers = 4, epochs = 3;
  app.add_option("--batches", batches, "Batch sizes")->delimiter(',');
  app.add_option("--precisions", precisions, "fp32, tf32, bf16")->delimiter(',');
  app.add_option("--seconds", seconds, "Seconds per measurement");
  app.add_option("--repeats", repeats, "Measurements per configuration (median reported)");
  app.add_option("--rows", rows, "Rows of the resident data set");
  app.add_option("--layers", layers, "Model layers");
  app.add_option("--json", json_path, "Write results here");
  app.add_flag("--eager", eager_too, "Also measure without CUDA Graphs");
  app.add_option("--store", store, "Also measure the data feed from this dataset store");
  app.add_option("--readers", readers, "Chunk manager reader threads (with --store)");
  app.add_option("--assemblers", assemblers, "Chunk manager assembler threads (with --store)");
  app.add_option("--epochs", epochs, "Epochs per feed measurement (best kept; with --store)");
  CLI11_PARSE(app, argc, argv);

  nlohmann::json out;
  out["results"] = nlohmann::json::array();
  // Written after every result, so a stage cut short by its time limit, or a configuration that
  // fails, keeps what was measured before it.
  auto save = [&] {
    if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  };
  if (tandem::kernels::cuda_device_count() == 0) {
    std::printf("train_step_cuda_bench: no CUDA device, nothing to measure\n");
    out["device"] = nullptr;
    out["skipped"] = "no CUDA device";
  } else {
    out["device"] = tandem::kernels::cuda_device_description(0);
    const tandem::ModelConfig model = tandem::ModelConfig::parse(layers);
    const auto [data, order] =
        random_rows(rows, model.inputs(), static_cast<int>(model.classes()), 7);

    for (const std::string& precision_name : precisions) {
      for (const bool graphs : eager_too ? std::vector<bool>{true, false} : std::vector<bool>{true}) {
        try {
          tandem::CudaBackendOptions options;
          options.precision = tandem::parse_precision(precision_name);
          options.use_graphs = graphs;
          tandem::CudaBackend backend(model, tandem::OptimizerConfig{}, options);
          backend.set_parameters(tandem::Model::initialized(model, 1));
          backend.keep_resident(data.view());
          for (int64_t batch : batches) {
            const Measurement m =
                measure(backend, data.view(), order, std::min(batch, rows), seconds, repeats);
            const double flops = step_flops(model, batch);
            nlohmann::json r{{"batch", batch},
                             {"precision", precision_name},
                             {"graph", graphs},
                             {"steps_per_s", m.steps_per_s},
                             {"ms_per_step", 1e3 / m.steps_per_s},
                             {"samples_per_s", m.steps_per_s * static_cast<double>(batch)},
                             {"flops_per_step", flops},
                             {"tflops", flops * m.steps_per_s / 1e12},
                             {"repeats_ms", m.repeats_ms}};
            std::printf("tandem %-5s %-6s batch %6lld: %9.1f steps/s  %8.4f ms/step  "
                        "%6.2f TFLOP/s\n", precision_name.c_str(), graphs ? "graph" : "eager",
                        static_cast<long long>(batch), m.steps_per_s, 1e3 / m.steps_per_s,
                        flops * m.steps_per_s / 1e12);
            std::fflush(stdout);
            out["results"].push_back(r);
            save();
          }
        } catch (const std::exception& e) {  // recorded; the other configurations still run
          std::printf("tandem %s %s: failed: %s\n", precision_name.c_str(),
                      graphs ? "graph" : "eager", e.what());
          out["results"].push_back(
              {{"precision", precision_name}, {"graph", graphs}, {"error", e.what()}});
          save();
        }
      }
    }
  }
  if (!store.empty() && tandem::kernels::cuda_device_count() > 0) {
    out["feed"] = nlohmann::json::array();
    for (int64_t batch : batches) {
      try {
        tandem::StreamOptions so;
        so.batch_rows = batch;
        so.readers = readers;
        so.assemblers = assemblers;
        auto stream = tandem::open_store_stream(store, so);
        const tandem::ModelConfig model = tandem::ModelConfig::parse(
            std::to_string(stream->features()) + "-100-" + std::to_string(stream->num_classes()));
        const size_t batch_bytes = static_cast<size_t>(batch * stream->features());  // uint8 stores
        const double pinned = pinned_copy_gbps(batch_bytes, 50);
        double streamed = 0, fed = 0, resident = 0;
        for (int e = 0; e < epochs; ++e)
          streamed = std::max(streamed, stream_copy_gbps(*stream, e, batch_bytes));
        tandem::CudaBackend backend(model, tandem::OptimizerConfig{},
                                    tandem::CudaBackendOptions{});
        backend.set_parameters(tandem::Model::initialized(model, 1));
        for (int e = 0; e < epochs; ++e)
          fed = std::max(fed, stream_train_samples_per_s(backend, *stream, e));
        // The same steps with the data already on the device: one resident copy of a batch-sized
        // window of random rows is enough, the step's cost does not depend on which rows.
        {
          const auto [data, order] = random_rows(std::max<int64_t>(batch, 60000),
                                                 stream->features(), stream->num_classes(), 3);
          backend.keep_resident(data.view());
          resident = measure(backend, data.view(), order, batch, seconds, repeats).steps_per_s *
                     static_cast<double>(batch);
          backend.release_resident();
        }
        nlohmann::json f{{"batch", batch},
                         {"readers", readers},
                         {"assemblers", assemblers},
                         {"pinned_copy_GBps", pinned},
                         {"stream_copy_GBps", streamed},
                         {"stream_fraction_of_pinned", streamed / pinned},
                         // Samples per second: the stream's last batch of an epoch may be short.
                         {"stream_fed_samples_per_s", fed},
                         {"resident_samples_per_s", resident},
                         {"stream_fed_steps_per_s", fed / static_cast<double>(batch)},
                         {"resident_steps_per_s", resident / static_cast<double>(batch)},
                         {"fed_over_resident", fed / resident}};
        std::printf("feed batch %6lld: pinned H2D %6.1f GB/s, stream->device %6.1f GB/s (%.0f%%), "
                    "samples/s fed %10.0f vs resident %10.0f (%.0f%%)\n",
                    static_cast<long long>(batch), pinned, streamed, 100 * streamed / pinned, fed,
                    resident, 100 * fed / resident);
        std::fflush(stdout);
        out["feed"].push_back(f);
        save();
      } catch (const std::exception& e) {
        std::printf("feed batch %lld: failed: %s\n", static_cast<long long>(batch), e.what());
        out["feed"].push_back({{"batch", batch}, {"error", e.what()}});
        save();
      }
    }
  }
  save();
  return 0;
}
