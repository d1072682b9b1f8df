// The parameter server's pull+push round trip against its ceiling, in the same run: a raw ZeroMQ
// round trip of the same bytes with nothing of Tandem in the way (a DEALER sends one frame the
// size of the default model's gradients, 79,510 float32 = 318,040 bytes, to a ROUTER thread that
// answers with a frame of the same size), then Tandem's PsClient::push_pull of the 784-100-10
// model's gradients against one ParameterServer (validation, Adam, the reply with the updated
// parameters). One round trip at a time, as one worker does; tcp://127.0.0.1 and ipc://.
//
//   tandem_zmq_roundtrip_bench --seconds 2 --json
#include <zmq.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>
#include <vector>

#include "ps_client.h"
#include "ps_server.h"
#include "tandem/model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double round_trips_per_s = 0;
  double p50_us = 0, p99_us = 0;
};

template <typename RoundTrip>
Result time_round_trips(RoundTrip&& round_trip, double seconds) {
  for (int i = 0; i < 50; ++i) round_trip();  // connect, warm the buffers
  std::vector<double> latencies;
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t = Clock::now();
    round_trip();
    latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(latencies.begin(), latencies.end());
  Result r;
  r.round_trips_per_s = static_cast<double>(latencies.size()) / elapsed;
  r.p50_us = latencies[latencies.size() / 2];
  r.p99_us = latencies[latencies.size() * 99 / 100];
  return r;
}

Result measure(const std::string& bind, size_t bytes, double seconds) {
  zmq::context_t context(1);
  zmq::socket_t router(context, zmq::socket_type::router);
  router.set(zmq::sockopt::linger, 0);
  router.bind(bind);
  const std::string endpoint = router.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    std::vector<uint8_t> reply(bytes, 0x5a);
    zmq::pollitem_t item{router.handle(), 0, ZMQ_POLLIN, 0};
    while (!stop.load()) {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
      zmq::message_t identity, request;
      (void)router.recv(identity);
      (void)router.recv(request);
      router.send(identity, zmq::send_flags::sndmore);
      router.send(zmq::buffer(reply), zmq::send_flags::none);
    }
  });
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::linger, 0);
  dealer.connect(endpoint);
  std::vector<uint8_t> request(bytes, 0xa5);
  auto round_trip = [&] {
    dealer.send(zmq::buffer(request), zmq::send_flags::none);
    zmq::message_t reply;
    (void)dealer.recv(reply);
    if (reply.size() != bytes) throw std::runtime_error("short reply");
  };
  const Result r = time_round_trips(round_trip, seconds);
  stop = true;
  server.join();
  return r;
}

// push_pull of the default model's gradients against one server bound to `bind`.
Result measure_ps(const std::string& bind, double seconds) {
  tandem::ServerOptions options;
  options.bind = bind;
  tandem::ParameterServer server(options);
  tandem::PsClient client({server.endpoint()});
  const tandem::Model model = tandem::Model::initialized(tandem::ModelConfig{}, 1);
  client.init(model.parameters()).wait();
  // Small gradients: the parameters stay finite however many steps the benchmark takes.
  std::vector<tandem::NamedTensor> gradients = model.parameters();
  for (auto& t : gradients)
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = 1e-3f * static_cast<float>((i % 7) - 3);
  return time_round_trips([&] { client.push_pull(gradients).wait(); }, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Raw ZeroMQ round trips of one model's bytes: the parameter server's ceiling"};
  double seconds = 2.0;
  size_t bytes = 79510 * sizeof(float);
  bool json = false;
  app.add_option("--seconds", seconds, "Seconds per transport");
  app.add_option("--bytes", bytes, "Bytes each way per round trip");
  app.add_flag("--json", json, "One JSON line per transport");
  CLI11_PARSE(app, argc, argv);
  const std::string ipc = "ipc:///tmp/tandem-zmq-bench-" + std::to_string(::getpid());
  for (const std::string& bind : {std::string("tcp://127.0.0.1:*"), ipc}) {
    const Result raw = measure(bind, bytes, seconds);
    const Result ps = measure_ps(bind, seconds);
    const std::string transport = bind.substr(0, bind.find(':'));
    if (json)
      std::printf("%s\n", nlohmann::json{{"transport", transport}, {"bytes", bytes},
                                         {"raw_round_trips_per_s", raw.round_trips_per_s},
                                         {"raw_p50_us", raw.p50_us}, {"raw_p99_us", raw.p99_us},
                                         {"ps_round_trips_per_s", ps.round_trips_per_s},
                                         {"ps_p50_us", ps.p50_us}, {"ps_p99_us", ps.p99_us},
                                         {"ps_over_raw", ps.round_trips_per_s / raw.round_trips_per_s}}
                              .dump()
                              .c_str());
    else
      std::printf("%-4s raw zmq %7.0f/s (p50 %5.0f us)  tandem push_pull %7.0f/s (p50 %5.0f us)  %.0f%% of raw\n",
                  transport.c_str(), raw.round_trips_per_s, raw.p50_us, ps.round_trips_per_s,
                  ps.p50_us, 100 * ps.round_trips_per_s / raw.round_trips_per_s);
  }
  ::unlink(ipc.substr(6).c_str());
  return 0;
}
