// A DashboardServer over a made-up, live cluster, for the browser test and for looking at the
// page by hand: a score every 200 ms with falling loss, rates and queue depths that move, a
// growing staleness histogram. Prints the dashboard's URL on the first line of stdout, then
// serves until SIGINT or SIGTERM (or --seconds pass, so a forgotten demo does not linger).
//
// SIGUSR1 makes the state another run's (the page must say so).
//
// usage: dashboard_demo [--host 127.0.0.1] [--port 0] [--seconds 300]
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <string>

#include "dashboard_server.h"
#include "prometheus_text.h"
#include "tandem/error.h"

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr double kScoreInterval = 0.2;  // seconds between scores
constexpr int kWorkers = 2, kServers = 2;

double loss_at(double t) { return 1600.0 + 900.0 * std::exp(-t / 4.0) + 15.0 * std::sin(3.0 * t); }

// Everything is a pure function of the time since start, so the callbacks need no lock. Once
// `second_run` (SIGUSR1), the state is another run's, as when a later launch serves its
// dashboard on the port of one that ended.
json state_at(double t, bool second_run) {
  const long step = static_cast<long>(t * 50.0);
  json workers = json::array(), servers = json::array(), roles = json::array(), scores = json::array();
  double total_rate = 0.0;
  for (int i = 0; i < kWorkers; ++i) {
    const double rate = 45000.0 + 5000.0 * std::sin(t + i);
    total_rate += rate;
    workers.push_back({{"name", "worker" + std::to_string(i)},
                       {"samples_per_s", rate},
                       {"queue_depth", static_cast<int>(2.5 + 2.0 * std::sin(1.3 * t + i))},
                       {"steps", step / kWorkers},
                       {"batches_done", step / kWorkers}});
  }
  for (int j = 0; j < kServers; ++j) {
    const double n = 100.0 * t;
    servers.push_back({{"name", "ps" + std::to_string(j)},
                       {"pushes_per_s", 45.0 + 5.0 * std::sin(0.7 * t + j)},
                       {"pulls_per_s", 46.0 + 5.0 * std::cos(0.7 * t + j)},
                       {"version", step},
                       // The servers' buckets (ps_stats.cpp), as they report them.
                       {"staleness", {{"0", static_cast<long>(4.0 * n)},
                                      {"1", static_cast<long>(1.0 * n)},
                                      {"2", static_cast<long>(0.3 * n)},
                                      {"3", static_cast<long>(0.05 * n)},
                                      {"4-7", static_cast<long>(0.02 * n)},
                                      {"8-15", static_cast<long>(0.01 * n)},
                                      {"16+", 0L}}}});
  }
  const long pid = static_cast<long>(getpid());
  auto role = [&](const char* kind, const std::string& name, int port, const char* state) {
    roles.push_back({{"role", kind},
                     {"name", name},
                     {"address", "tcp://127.0.0.1:" + std::to_string(port)},
                     {"state", state},
                     {"pid", pid},
                     {"host", "demo-node"},
                     {"last_seen_s", std::fmod(0.37 * t + 0.1 * static_cast<double>(roles.size()), 1.0)}});
  };
  role("coordinator", "coordinator", 40100, "running");
  for (int j = 0; j < kServers; ++j) role("ps", "ps" + std::to_string(j), 40110 + j, "running");
  for (int i = 0; i < kWorkers; ++i)
    role("worker", "worker" + std::to_string(i), 40120 + i, t < 1.0 ? "starting" : "running");
  role("scorer", "scorer", 40130, t < 1.0 ? "registered" : "running");

  for (long k = 0; k * kScoreInterval <= t; ++k) {
    const double ts = k * kScoreInterval;
    scores.push_back({{"t", ts},
                      {"step", static_cast<long>(ts * 50.0)},
                      {"loss", loss_at(ts)},
                      {"accuracy", 0.88 - 0.2 * std::exp(-ts / 4.0)}});
  }
  return {{"cluster", {{"run", second_run ? "2222bbbbdemo0002" : "1111aaaademo0001"},
                       {"state", t < 0.5 ? "starting" : "training"},
                       {"elapsed_s", t},
                       {"epoch", 1 + static_cast<int>(t / 5.0)},
                       {"step", step},
                       {"target", 1700.0},
                       {"samples_per_s", total_rate}}},
          {"roles", roles},
          {"scores", scores},
          {"workers", workers},
          {"servers", servers}};
}

std::string metrics_of(const json& state) {
  tandem::PrometheusText text;
  const json& cluster = state["cluster"];
  text.gauge("tandem_step", "Global step", cluster["step"].get<double>());
  text.gauge("tandem_samples_per_second", "Samples per second, all workers",
             cluster["samples_per_s"].get<double>());
  for (const json& w : state["workers"]) {
    const tandem::PrometheusLabels labels{{"worker", w["name"].get<std::string>()}};
    text.gauge("tandem_worker_samples_per_second", "Samples per second",
               w["samples_per_s"].get<double>(), labels);
    text.gauge("tandem_worker_queue_depth", "Chunks queued", w["queue_depth"].get<double>(), labels);
  }
  for (const json& s : state["servers"]) {
    const std::string name = s["name"].get<std::string>();
    text.gauge("tandem_ps_pushes_per_second", "Pushes per second", s["pushes_per_s"].get<double>(),
               {{"server", name}});
    for (const auto& [staleness, count] : s["staleness"].items())
      text.counter("tandem_ps_updates_total", "Updates received, by staleness in steps",
                   count.get<double>(), {{"server", name}, {"staleness", staleness}});
  }
  return text.str();
}

}  // namespace

int main(int argc, char** argv) {
  tandem::DashboardOptions options;
  options.port = 0;
  double seconds = 300.0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (i + 1 < argc && arg == "--host") options.host = argv[++i];
    else if (i + 1 < argc && arg == "--port") options.port = std::atoi(argv[++i]);
    else if (i + 1 < argc && arg == "--seconds") seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--host H] [--port N] [--seconds S]\n", argv[0]);
      return 2;
    }
  }
  // Block the signals before the server's threads start, so they inherit the mask and the
  // signals reach sigtimedwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const auto start = Clock::now();
  auto elapsed = [start] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  std::atomic<bool> second_run{false};
  try {
    tandem::DashboardServer server(
        options, [&] { return state_at(elapsed(), second_run.load()).dump(); },
        [&] { return metrics_of(state_at(elapsed(), second_run.load())); });
    std::printf("%s\n", server.url().c_str());
    std::fflush(stdout);
    int sig = 0;
    for (;;) {
      const double left = std::max(0.0, seconds - elapsed());
      timespec limit{static_cast<time_t>(left), static_cast<long>((left - std::floor(left)) * 1e9)};
      sig = sigtimedwait(&signals, nullptr, &limit);
      if (sig == SIGUSR1) second_run.store(true);
      else if (sig > 0 || errno != EINTR) break;
    }
    std::fprintf(stderr, "dashboard_demo: %s, stopping\n",
                 sig > 0 ? strsignal(sig) : "time limit reached");
    server.stop();
  } catch (const tandem::Error& e) {
    std::fprintf(stderr, "dashboard_demo: %s\n", e.what());
    return 1;
  }
  return 0;
}
