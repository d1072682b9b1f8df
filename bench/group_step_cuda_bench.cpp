// The overhead of a node's worker group on a GPU (issue 8's figure): one worker's step up to the
// gradient it pushes, three ways on the same CUDA backend setup, interleaved in one run:
//   plain        the plain GPU worker: compute_gradients + get_gradients (what cluster_roles
//                runs for a worker without a group)
//   group-host   a WorkerGroup of one with the thread collective: gradients to host memory,
//                summed there (the path a build without NCCL takes)
//   group-nccl   a WorkerGroup of one with the NCCL collective: each layer's sum queued behind
//                its backward pass in the backend's own gradient arena, then the leader's copy
// Each way runs `--seconds` of steps per slice, slices alternate, `--repeats` slices each; the
// median step time is reported with its ratio to plain. On one GPU the sum is of one member, so
// this measures what the hierarchy adds (NCCL launch and synchronisation, staging), not a sum.
//
//   tandem_group_step_cuda_bench --batches 1000,10000 --seconds 0.5 --repeats 5 --json out.json
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "backend.h"
#include "cuda/cuda_device.h"
#include "group_collective.h"
#include "tandem/tandem.h"
#include "worker_group.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Way {
  std::string name;
  std::unique_ptr<tandem::Backend> backend;
  std::unique_ptr<tandem::GroupCollective> collective;
  std::unique_ptr<tandem::WorkerGroup> group;
  std::vector<tandem::NamedTensor> gradients;  // plain's
  std::vector<double> slices_us;               // mean step time of each slice

  void step(const tandem::DatasetView& batch) {
    if (group) {
      group->step({batch});
    } else {
      backend->compute_gradients(batch, nullptr, batch.rows);
      backend->get_gradients(gradients);
    }
  }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A worker group of one GPU against the plain GPU worker: step time up to the push"};
  std::vector<int64_t> batches{1000, 10000};
  double seconds = 0.5;
  int repeats = 5;
  std::string json_path;
  app.add_option("--batches", batches, "Batch sizes")->delimiter(',');
  app.add_option("--seconds", seconds, "Seconds of one way's steps before the next way's");
  app.add_option("--repeats", repeats, "Slices of each way (median reported)");
  app.add_option("--json", json_path, "Write results here");
  CLI11_PARSE(app, argc, argv);
  if (tandem::kernels::cuda_device_count() == 0) {
    std::printf("group_step_cuda_bench: no CUDA device, nothing to measure\n");
    return 0;
  }
  try {
    const tandem::ModelConfig model;  // the default 784-100-10 model
    tandem::OptimizerConfig optimizer;
    const int64_t rows = *std::max_element(batches.begin(), batches.end());
    tandem::Dataset data(tandem::PixelType::UInt8, rows, model.inputs(), 10);
    std::mt19937 gen(7);
    for (int64_t r = 0; r < rows; ++r) data.label_data()[r] = static_cast<uint8_t>(gen() % 10);
    for (int64_t i = 0; i < rows * model.inputs(); ++i)
      data.pixel_data()[i] = static_cast<uint8_t>(gen());
    const tandem::Model initial = tandem::Model::initialized(model, 1);

    nlohmann::json out;
    out["device"] = tandem::kernels::cuda_device_description(0);
    out["results"] = nlohmann::json::array();
    // Written after every batch, so that a failure or the stage's time limit keeps what came
    // before it.
    auto save = [&] {
      if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
    };
    // A collective that does not complete in 10 s is reported (GroupError naming the rank)
    // well before the GPU check's limit for this stage kills the program.
    constexpr int kTimeoutMs = 10000;
    std::vector<Way> ways(3);
    ways[0].name = "plain";
    ways[1].name = "group-host";
    ways[2].name = "group-nccl";
    for (size_t w = 0; w < ways.size(); ++w) {
      Way& way = ways[w];
      try {
        way.backend = tandem::make_cuda_backend(model, optimizer, tandem::Precision::Fp32, 0);
        way.backend->set_parameters(initial);
        if (w == 0) continue;
        way.collective = w == 1 ? tandem::make_thread_collective(1, kTimeoutMs)
                                : tandem::make_nccl_collective({0}, kTimeoutMs);
        way.group = std::make_unique<tandem::WorkerGroup>(
            model, std::vector<tandem::Backend*>{way.backend.get()}, *way.collective);
        way.group->install(initial);
      } catch (const std::exception& e) {
        if (w == 0) throw;  // without the plain worker there is nothing to compare with
        std::fprintf(stderr, "tandem_group_step_cuda_bench: %s: %s\n", way.name.c_str(), e.what());
        out["results"].push_back({{"way", way.name}, {"error", e.what()}});
        way.group.reset();  // left out of the measurements
        way.collective.reset();
        way.backend.reset();
      }
    }
    ways.erase(std::remove_if(ways.begin(), ways.end(), [](const Way& w) { return !w.backend; }),
               ways.end());
    save();
    for (const int64_t batch : batches) {
      try {
        const tandem::DatasetView view = data.view().slice(0, batch);
        for (Way& way : ways) {
          way.slices_us.clear();
          for (int i = 0; i < 5; ++i) way.step(view);  // warm-up: cuBLASLt, NCCL's setup
        }
        for (int r = 0; r < repeats; ++r)
          for (Way& way : ways) {
            int64_t steps = 0;
            const auto start = Clock::now();
            double elapsed = 0.0;
            do {
              way.step(view);
              ++steps;
              elapsed = std::chrono::duration<double>(Clock::now() - start).count();
            } while (elapsed < seconds);
            way.slices_us.push_back(elapsed / static_cast<double>(steps) * 1e6);
          }
        const double plain_us = median(ways[0].slices_us);
        for (const Way& way : ways) {
          const double us = median(way.slices_us);
          std::printf("batch %6lld  %-10s  %8.1f us/step (median of %d)  %.2fx plain\n",
                      static_cast<long long>(batch), way.name.c_str(), us, repeats, us / plain_us);
          out["results"].push_back({{"batch", batch},
                                    {"way", way.name},
                                    {"us_per_step", us},
                                    {"slices_us", way.slices_us},
                                    {"ratio_to_plain", us / plain_us}});
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem_group_step_cuda_bench: batch %lld: %s\n",
                     static_cast<long long>(batch), e.what());
        out["results"].push_back({{"batch", batch}, {"error", e.what()}});
        // A group whose step failed stays failed (its collective aborted), and the batches
        // after are larger: they would only repeat the error.
        save();
        break;
      }
      save();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem_group_step_cuda_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
