// Aggregate parameter-server throughput as workers and servers are added: S ParameterServers
// (tcp://127.0.0.1, async mode) and W worker threads, each owning a PsClient that does push_pull
// of the default 784-100-10 model's gradients (79,510 float32, random small values) in a loop,
// one round trip at a time. Every accepted push is one Adam update on every server, so the
// aggregate updates/s is the number of push_pulls the W workers finish per second. Each (W, S)
// runs a warm-up, then a fixed time; latencies are merged over workers. The ratio is against
// W=1, S=1 measured in the same run. With 2 servers the model is placed two ways: split (hid_w
// by rows, half on each server: the default) and whole (hid_w alone on server 0, 98.6% of the
// floats), to show what row splitting buys.
//
//   tandem_ps_scaling_bench --seconds 3 --json
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ps_client.h"
#include "ps_server.h"
#include "tandem/model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Config {
  int workers = 1;
  int servers = 1;
  bool split = true;
};

struct Result {
  double updates_per_s = 0;             // all workers together
  double per_worker_per_s = 0;          // updates_per_s / workers
  double p50_us = 0, p99_us = 0;        // one push_pull's wall time, all workers' merged
  int64_t updates = 0;                  // counted in the timed window
};

Result measure(const Config& c, double warmup_s, double seconds) {
  std::vector<std::unique_ptr<tandem::ParameterServer>> servers;
  std::vector<std::string> endpoints;
  for (int s = 0; s < c.servers; ++s) {
    tandem::ServerOptions options;  // async, tcp://127.0.0.1:*
    options.shard_name = "ps" + std::to_string(s);
    servers.push_back(std::make_unique<tandem::ParameterServer>(options));
    endpoints.push_back(servers.back()->endpoint());
  }
  const tandem::Model model = tandem::Model::initialized(tandem::ModelConfig{}, 1);
  tandem::ClientOptions chief_options;
  chief_options.split_tensors = c.split;
  tandem::PsClient(endpoints, chief_options).init(model.parameters()).wait();

  const auto start = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(warmup_s + 0.2));
  const auto end = start + std::chrono::duration_cast<Clock::duration>(
                               std::chrono::duration<double>(seconds));
  std::vector<std::vector<double>> latencies(size_t(c.workers));
  std::vector<std::string> failures(size_t(c.workers));
  std::vector<std::thread> threads;
  for (int w = 0; w < c.workers; ++w)
    threads.emplace_back([&, w] {
      try {
        tandem::PsClient client(endpoints);
        client.init({}).wait();
        // Small random gradients: the parameters stay finite however many steps are taken.
        std::mt19937 gen(1000 + uint32_t(w));
        std::uniform_real_distribution<float> small(-1e-3f, 1e-3f);
        std::vector<tandem::NamedTensor> gradients = model.parameters();
        for (auto& t : gradients)
          for (auto& v : t.values) v = small(gen);
        auto& mine = latencies[size_t(w)];
        // As the worker role exchanges: gradients sent zero-copy from a buffer no send holds
        // (filled once per buffer: the numbers stay the same), parameters into reused tensors.
        tandem::transport::HeldPool<std::vector<tandem::NamedTensor>> buffers;
        std::vector<tandem::NamedTensor> parameters;
        for (;;) {
          const auto t0 = Clock::now();
          if (t0 >= end) break;
          const auto buffer = buffers.take();
          if (buffer->value.empty()) buffer->value = gradients;
          client.push_pull(buffer).wait_into(parameters);
          const auto t1 = Clock::now();
          if (t0 >= start && t1 <= end)
            mine.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
        }
      } catch (const std::exception& e) {
        failures[size_t(w)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& f : failures)
    if (!f.empty()) throw std::runtime_error("worker failed: " + f);
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  if (all.empty()) throw std::runtime_error("no push_pull finished in the timed window");
  std::sort(all.begin(), all.end());
  Result r;
  r.updates = int64_t(all.size());
  r.updates_per_s = double(all.size()) / seconds;
  r.per_worker_per_s = r.updates_per_s / c.workers;
  r.p50_us = all[all.size() / 2];
  r.p99_us = all[all.size() * 99 / 100];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Parameter-server push_pull throughput with W workers against S servers"};
  double seconds = 3.0, warmup = 0.5;
  std::vector<int> workers{1, 2, 4}, server_counts{1, 2};
  bool json = false, whole = true;
  app.add_option("--seconds", seconds, "Timed seconds per (workers, servers)");
  app.add_option("--warmup", warmup, "Seconds of push_pulls before timing");
  app.add_option("--workers", workers, "Worker counts")->delimiter(',');
  app.add_option("--servers", server_counts, "Server counts")->delimiter(',');
  app.add_flag("--whole,!--no-whole", whole,
               "Also measure whole-tensor placement where there is more than one server");
  app.add_flag("--json", json, "One JSON line per configuration");
  CLI11_PARSE(app, argc, argv);

  std::vector<Config> configs{{1, 1, true}};  // the baseline first
  for (int s : server_counts)
    for (int w : workers) {
      if (!(w == 1 && s == 1)) configs.push_back({w, s, true});
      if (whole && s > 1) configs.push_back({w, s, false});
    }
  double baseline = 0;
  if (!json)
    std::printf("%-7s %-7s %-9s %11s %12s %9s %9s %7s\n", "workers", "servers", "placement",
                "updates/s", "per worker/s", "p50 us", "p99 us", "vs 1x1");
  for (const Config& c : configs) {
    const Result r = measure(c, warmup, seconds);
    if (baseline == 0) baseline = r.updates_per_s;
    const char* placement = c.servers == 1 ? "-" : c.split ? "split" : "whole";
    if (json)
      std::printf("%s\n", nlohmann::json{{"workers", c.workers}, {"servers", c.servers},
                                         {"placement", placement}, {"seconds", seconds},
                                         {"updates", r.updates},
                                         {"updates_per_s", r.updates_per_s},
                                         {"per_worker_push_pull_per_s", r.per_worker_per_s},
                                         {"p50_us", r.p50_us}, {"p99_us", r.p99_us},
                                         {"vs_1x1", r.updates_per_s / baseline}}
                              .dump()
                              .c_str());
    else
      std::printf("%-7d %-7d %-9s %11.0f %12.0f %9.0f %9.0f %6.2fx\n", c.workers, c.servers,
                  placement, r.updates_per_s, r.per_worker_per_s, r.p50_us, r.p99_us,
                  r.updates_per_s / baseline);
    std::fflush(stdout);
  }
  return 0;
}
