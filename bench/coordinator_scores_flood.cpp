// A scorer that only scores: registers with a coordinator and sends COUNT scores as fast as the
// coordinator answers, heartbeating meanwhile, then says goodbye. coordinator_scores_bench.sh
// uses it to give a coordinator a long run's worth of scores in seconds.
// usage: tandem_coordinator_scores_flood COORDINATOR_ENDPOINT COUNT
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include <nlohmann/json.hpp>

#include "cluster_link.h"

int main(int argc, char** argv) {
  using nlohmann::json;
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s COORDINATOR_ENDPOINT COUNT\n", argv[0]);
    return 2;
  }
  const long long count = std::atoll(argv[2]);
  try {
    zmq::context_t context;
    tandem::CoordinatorLink link(argv[1], context);
    const json reply = link.request({{"type", "register"}, {"role", "scorer"},
                                     {"pid", int64_t(getpid())}, {"host", "bench"}});
    const std::string name = reply.at("name").get<std::string>();
    link.start_heartbeats(name, [] { return json::object(); });
    const auto start = std::chrono::steady_clock::now();
    for (long long i = 0; i < count; ++i)
      link.request({{"type", "score"}, {"name", name}, {"step", i}, {"loss", 1000.0 - 1e-3 * i},
                    {"loss_mean", 0.5}, {"accuracy", 0.5}, {"samples", 100}});
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    link.request({{"type", "goodbye"}, {"name", name}});
    std::printf("%lld scores in %.1f s (%.0f/s)\n", count, s, count / s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "coordinator_scores_flood: %s\n", e.what());
    return 1;
  }
}
