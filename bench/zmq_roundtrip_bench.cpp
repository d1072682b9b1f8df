// The parameter server's pull+push round trip against its ceiling, in the same run: a raw ZeroMQ
// round trip of the same bytes with nothing of Tandem in the way (a DEALER sends one frame the
// size of the default model's gradients, 79,510 float32 = 318,040 bytes, to a ROUTER thread that
// answers with a frame of the same size; both send without copying, as Tandem's zero-copy kinds
// do), then Tandem's PsClient::push_pull of the 784-100-10 model's gradients against one
// ParameterServer (validation, Adam, the reply with the updated parameters): copying the
// gradients into the request and the reply into new tensors (wait()); sending them zero-copy
// from a held buffer and copying the reply into reused tensors (wait_into); and zero-copy with
// the reply's parameters left where ZeroMQ received them (wait_in_place: readable in place, as
// raw's reply is; the worker role's backend copies them from there). A fifth kind is raw ZeroMQ
// with Tandem's frames. One round trip at a time, as one worker does; tcp://127.0.0.1 and ipc://.
//
// All run interleaved: all are set up first, then each gets a short slice in turn, round after
// round (the order rotating), so a machine whose speed drifts (a shared VM) slows all alike. The
// share of raw is the median over rounds of each round's rate against raw's.
//
//   tandem_zmq_roundtrip_bench --seconds 2 --json
//   tandem_zmq_roundtrip_bench --seconds 2 --optimizer sgd   # the server updates by SGD
#include <zmq.hpp>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <thread>
#include <unistd.h>
#include <vector>

#include "ps_client.h"
#include "ps_server.h"
#include "tandem/config.h"
#include "tandem/model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Result {
  double round_trips_per_s = 0;
  double p50_us = 0, p99_us = 0;
  double median_share_of_raw = 1;  // median over rounds of (this slice's rate / raw's)
};

// One way of doing a round trip, timed slice by slice.
struct Contender {
  std::function<void()> round_trip;
  std::vector<double> latencies_us;
  std::vector<double> slice_rates;
  double seconds = 0;

  void run_slice(double slice_s) {
    const auto start = Clock::now();
    size_t count = 0;
    while (std::chrono::duration<double>(Clock::now() - start).count() < slice_s) {
      const auto t = Clock::now();
      round_trip();
      latencies_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
      ++count;
    }
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    seconds += elapsed;
    slice_rates.push_back(double(count) / elapsed);
  }

  Result result(const Contender& raw) const {
    std::vector<double> sorted = latencies_us;
    std::sort(sorted.begin(), sorted.end());
    Result r;
    r.round_trips_per_s = double(sorted.size()) / seconds;
    r.p50_us = sorted[sorted.size() / 2];
    r.p99_us = sorted[sorted.size() * 99 / 100];
    std::vector<double> shares;
    for (size_t i = 0; i < slice_rates.size(); ++i) shares.push_back(slice_rates[i] / raw.slice_rates[i]);
    std::sort(shares.begin(), shares.end());
    r.median_share_of_raw = shares[shares.size() / 2];
    return r;
  }
};

// The raw pair. The ROUTER and the DEALER each have their own context (one I/O thread each), as
// two processes would and as the ParameterServer and PsClient below do: one shared context would
// put both ends on one I/O thread and save the hand-offs between two, which no deployment has.
class RawPair {
  // A message over `bytes` without copying them (zmq_msg_init_data, nothing to free), as Tandem
  // sends its tensors: zmq::buffer would make zmq_send copy each frame into a new message, two
  // copies a round trip that Tandem's zero-copy kinds do not make, and raw would be no ceiling.
  // The buffers are never written after they are filled, so a send still in flight reads them
  // whole.
  static zmq::message_t unowned(std::vector<uint8_t>& bytes) {
    return zmq::message_t(bytes.data(), bytes.size(), nullptr, nullptr);
  }

 public:
  // One frame per entry of `frame_bytes`, each way (a multipart message when more than one).
  RawPair(const std::string& bind, std::vector<size_t> frame_bytes)
      : router_(server_context_, zmq::socket_type::router),
        dealer_(client_context_, zmq::socket_type::dealer),
        sizes_(std::move(frame_bytes)) {
    for (size_t n : sizes_) {
      request_.emplace_back(n, 0xa5);
      reply_.emplace_back(n, 0x5a);
    }
    router_.set(zmq::sockopt::linger, 0);
    router_.bind(bind);
    server_ = std::thread([this] {
      zmq::pollitem_t item{router_.handle(), 0, ZMQ_POLLIN, 0};
      while (!stop_.load()) {
        if (zmq::poll(&item, 1, std::chrono::milliseconds(50)) == 0) continue;
        zmq::message_t identity, part;
        (void)router_.recv(identity);
        do (void)router_.recv(part);
        while (part.more());
        router_.send(identity, zmq::send_flags::sndmore);
        for (size_t i = 0; i < reply_.size(); ++i)
          router_.send(unowned(reply_[i]),
                       i + 1 < reply_.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
      }
    });
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect(router_.get(zmq::sockopt::last_endpoint));
  }
  ~RawPair() {
    stop_ = true;
    server_.join();
  }
  void round_trip() {
    for (size_t i = 0; i < request_.size(); ++i)
      dealer_.send(unowned(request_[i]),
                   i + 1 < request_.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
    size_t got = 0;
    zmq::message_t part;
    do {
      (void)dealer_.recv(part);
      got += part.size();
    } while (part.more());
    if (got != total()) throw std::runtime_error("short reply");
  }

 private:
  size_t total() const {
    size_t n = 0;
    for (size_t b : sizes_) n += b;
    return n;
  }
  // Before the contexts: the frames are sent without copies, and a context's end (which the
  // sockets' sends finish before) comes before the buffers go.
  std::vector<std::vector<uint8_t>> request_, reply_;
  zmq::context_t server_context_{1}, client_context_{1};
  zmq::socket_t router_, dealer_;
  std::vector<size_t> sizes_;
  std::atomic<bool> stop_{false};
  std::thread server_;
};

// push_pull of the default model's gradients against one server bound to `bind`.
enum class Receive {
  Copied,   // each push copies the gradients, each reply is copied into new tensors
  Into,     // zero-copy push from a held buffer, the reply copied into reused tensors
  InPlace,  // zero-copy push, the reply's parameters left in the received frames (the worker's)
};

class PsPair {
 public:
  PsPair(const std::string& bind, Receive receive, tandem::OptimizerKind optimizer, int spin_us)
      : server_(options(bind, optimizer)),
        client_({server_.endpoint()}, client_options(spin_us)),
        receive_(receive) {
    const tandem::Model model = tandem::Model::initialized(tandem::ModelConfig{}, 1);
    client_.init(model.parameters()).wait();
    // Small gradients: the parameters stay finite however many steps the benchmark takes.
    gradients_ = model.parameters();
    for (auto& t : gradients_)
      for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = 1e-3f * static_cast<float>((i % 7) - 3);
  }
  void round_trip() {
    if (receive_ == Receive::Copied) return (void)client_.push_pull(gradients_).wait();
    // As the worker role does: each step's gradient goes from a buffer no send holds (here the
    // same numbers, so a buffer is filled once, when the pool makes it).
    const auto buffer = buffers_.take();
    if (buffer->value.empty()) buffer->value = gradients_;
    if (receive_ == Receive::Into) return (void)client_.push_pull(buffer).wait_into(parameters_);
    client_.push_pull(buffer).wait_in_place(received_);
  }

 private:
  static tandem::ClientOptions client_options(int spin_us) {
    tandem::ClientOptions o;
    o.spin_us = spin_us;
    return o;
  }
  static tandem::ServerOptions options(const std::string& bind, tandem::OptimizerKind optimizer) {
    tandem::ServerOptions o;
    o.bind = bind;
    o.optimizer.kind = optimizer;
    return o;
  }
  tandem::ParameterServer server_;
  tandem::PsClient client_;
  Receive receive_;
  std::vector<tandem::NamedTensor> gradients_, parameters_;
  tandem::ReceivedParameters received_;
  tandem::transport::HeldPool<std::vector<tandem::NamedTensor>> buffers_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Raw ZeroMQ round trips of one model's bytes: the parameter server's ceiling"};
  double seconds = 2.0;
  size_t bytes = 79510 * sizeof(float);
  bool json = false;
  double slice = 0.2;
  app.add_option("--seconds", seconds, "Seconds of each kind of round trip per transport");
  app.add_option("--slice", slice, "Seconds of one kind before the next takes over");
  app.add_option("--bytes", bytes, "Bytes each way per round trip");
  app.add_flag("--json", json, "One JSON line per transport");
  std::string only;
  app.add_option("--profile-only", only,
                 "Run only this kind, with no comparison (for a profiler): raw, raw-frames, copied, "
                 "zero-copy or in-place")
      ->check(CLI::IsMember({"raw", "raw-frames", "copied", "zero-copy", "in-place"}));
  std::string optimizer = "adam";
  app.add_option("--optimizer", optimizer,
                 "The server's update: adam (the default's) or sgd (no square root or division "
                 "per parameter: how much of the gap to raw is Adam's arithmetic)")
      ->check(CLI::IsMember({"adam", "sgd"}));
  int spin_us = 0;
  app.add_option("--spin-us", spin_us,
                 "Tandem's client looks for each reply without sleeping for up to this many "
                 "microseconds before it blocks (ClientOptions::spin_us; raw ZeroMQ always blocks)")
      ->check(CLI::Range(0, 1'000'000));
  CLI11_PARSE(app, argc, argv);
  const tandem::OptimizerKind kind = tandem::parse_optimizer(optimizer);
  // The frames of Tandem's messages: a header frame (the tensor table) and one per tensor.
  std::vector<size_t> frame_bytes;
  {
    const tandem::Model model = tandem::Model::initialized(tandem::ModelConfig{}, 1);
    std::vector<tandem::transport::FloatTensorRef> refs;
    for (const auto& t : model.parameters()) refs.push_back({t.name, t.shape, t.values.data()});
    const auto out = tandem::transport::encode_float_message(tandem::transport::MessageType::PushPull,
                                                             1, 0, refs);
    for (const auto& f : out.frames()) frame_bytes.push_back(f.size);
  }
  const std::string ipc = "ipc:///tmp/tandem-zmq-bench-" + std::to_string(::getpid());
  // The kinds, in the order of `contenders` (raw first: the others' shares are against it).
  const std::vector<std::string> kinds = {"raw", "copied", "zero-copy", "raw-frames", "in-place"};
  for (const std::string& bind : {std::string("tcp://127.0.0.1:*"), ipc}) {
    // ipc:// endpoints need a path each; tcp:// takes an ephemeral port each.
    const auto endpoint = [&](const std::string& suffix) { return bind == ipc ? ipc + suffix : bind; };
    RawPair raw_pair(endpoint(""), {bytes});
    RawPair frames_pair(endpoint("-frames"), frame_bytes);
    PsPair copied_pair(endpoint("-ps-copied"), Receive::Copied, kind, spin_us);
    PsPair zero_pair(endpoint("-ps"), Receive::Into, kind, spin_us);
    PsPair in_place_pair(endpoint("-ps-in-place"), Receive::InPlace, kind, spin_us);
    std::vector<Contender> contenders(kinds.size());
    contenders[0].round_trip = [&] { raw_pair.round_trip(); };
    contenders[1].round_trip = [&] { copied_pair.round_trip(); };
    contenders[2].round_trip = [&] { zero_pair.round_trip(); };
    contenders[3].round_trip = [&] { frames_pair.round_trip(); };
    contenders[4].round_trip = [&] { in_place_pair.round_trip(); };
    for (auto& c : contenders)
      for (int i = 0; i < 50; ++i) c.round_trip();  // connect, warm the buffers
    if (!only.empty()) {
      Contender& c = contenders[size_t(std::find(kinds.begin(), kinds.end(), only) - kinds.begin())];
      c.run_slice(seconds);
      std::printf("%s %s: %zu round trips in %.2f s\n", bind.substr(0, bind.find(':')).c_str(),
                  only.c_str(), c.latencies_us.size(), c.seconds);
      continue;
    }
    const int rounds = std::max(1, int(seconds / slice + 0.5));
    const size_t n = contenders.size();
    for (int round = 0; round < rounds; ++round)
      for (size_t k = 0; k < n; ++k) contenders[(size_t(round) + k) % n].run_slice(slice);
    const Result raw = contenders[0].result(contenders[0]);
    const Result copied = contenders[1].result(contenders[0]);
    const Result ps = contenders[2].result(contenders[0]);
    const Result frames = contenders[3].result(contenders[0]);
    const Result in_place = contenders[4].result(contenders[0]);
    const std::string transport = bind.substr(0, bind.find(':'));
    if (json)
      std::printf("%s\n", nlohmann::json{{"transport", transport}, {"bytes", bytes},
                                         {"optimizer", optimizer}, {"spin_us", spin_us},
                                         {"raw_round_trips_per_s", raw.round_trips_per_s},
                                         {"raw_p50_us", raw.p50_us}, {"raw_p99_us", raw.p99_us},
                                         {"ps_copied_round_trips_per_s", copied.round_trips_per_s},
                                         {"ps_copied_p50_us", copied.p50_us},
                                         {"ps_round_trips_per_s", ps.round_trips_per_s},
                                         {"ps_p50_us", ps.p50_us}, {"ps_p99_us", ps.p99_us},
                                         {"ps_copied_over_raw", copied.median_share_of_raw},
                                         {"raw_frames_round_trips_per_s", frames.round_trips_per_s},
                                         {"raw_frames_p50_us", frames.p50_us},
                                         {"raw_frames_over_raw", frames.median_share_of_raw},
                                         {"ps_over_raw", ps.median_share_of_raw},
                                         {"ps_in_place_round_trips_per_s", in_place.round_trips_per_s},
                                         {"ps_in_place_p50_us", in_place.p50_us},
                                         {"ps_in_place_p99_us", in_place.p99_us},
                                         {"ps_in_place_over_raw", in_place.median_share_of_raw}}
                              .dump()
                              .c_str());
    else
      std::printf("%-4s %s  raw zmq %7.0f/s (p50 %5.0f us)  raw, Tandem's %zu frames %7.0f/s (p50 %5.0f us, "
                  "%.0f%%)  push_pull copied %7.0f/s (p50 %5.0f us, %.0f%%)  zero-copy into tensors "
                  "%7.0f/s (p50 %5.0f us, %.0f%%)  zero-copy in place %7.0f/s (p50 %5.0f us, %.0f%% of "
                  "raw)\n",
                  transport.c_str(), optimizer.c_str(), raw.round_trips_per_s, raw.p50_us, frame_bytes.size(),
                  frames.round_trips_per_s, frames.p50_us, 100 * frames.median_share_of_raw,
                  copied.round_trips_per_s, copied.p50_us, 100 * copied.median_share_of_raw,
                  ps.round_trips_per_s, ps.p50_us, 100 * ps.median_share_of_raw,
                  in_place.round_trips_per_s, in_place.p50_us, 100 * in_place.median_share_of_raw);
  }
  for (const std::string& path :
       {ipc, ipc + "-frames", ipc + "-ps", ipc + "-ps-copied", ipc + "-ps-in-place"})
    ::unlink(path.substr(6).c_str());
  return 0;
}
