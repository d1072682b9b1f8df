// The ceiling for the parameter server's pull+push figure: a raw ZeroMQ round trip of the same
// bytes, with nothing of Tandem in the way. A DEALER sends one frame the size of the default
// model's gradients (79,510 float32, 318,040 bytes) to a ROUTER thread, which answers with a frame
// of the same size (the updated parameters); one round trip at a time, as one worker does.
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

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double round_trips_per_s = 0;
  double p50_us = 0, p99_us = 0;
};

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
  std::vector<double> latencies;
  auto round_trip = [&] {
    dealer.send(zmq::buffer(request), zmq::send_flags::none);
    zmq::message_t reply;
    (void)dealer.recv(reply);
    if (reply.size() != bytes) throw std::runtime_error("short reply");
  };
  for (int i = 0; i < 50; ++i) round_trip();  // connect, warm the buffers
  const auto start = Clock::now();
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    const auto t = Clock::now();
    round_trip();
    latencies.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
  }
  const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
  stop = true;
  server.join();
  std::sort(latencies.begin(), latencies.end());
  Result r;
  r.round_trips_per_s = static_cast<double>(latencies.size()) / elapsed;
  r.p50_us = latencies[latencies.size() / 2];
  r.p99_us = latencies[latencies.size() * 99 / 100];
  return r;
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
    const Result r = measure(bind, bytes, seconds);
    const std::string transport = bind.substr(0, bind.find(':'));
    if (json)
      std::printf("%s\n", nlohmann::json{{"transport", transport}, {"bytes", bytes},
                                         {"round_trips_per_s", r.round_trips_per_s},
                                         {"p50_us", r.p50_us}, {"p99_us", r.p99_us}}
                              .dump()
                              .c_str());
    else
      std::printf("raw zmq %-4s %zu bytes each way: %8.0f round trips/s, p50 %6.0f us, p99 %6.0f us\n",
                  transport.c_str(), bytes, r.round_trips_per_s, r.p50_us, r.p99_us);
  }
  ::unlink(ipc.substr(6).c_str());
  return 0;
}
