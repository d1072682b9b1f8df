// What a parameter server computes inside one push_pull, without the sockets: the default
// model's gradients through PsShard::stage_gradients (names, shapes and the finite check, read
// from the frames in place) and apply_staged (the Adam sweep, reading the gradients from the
// frames), and a plain memcpy of the parameters, the copy a client makes of a reply
// (Handle::wait_into). The round trip's share of raw ZeroMQ (tandem_zmq_roundtrip_bench) is read
// against these. The frames are hot in this thread's cache here; a server's come from ZeroMQ's
// I/O thread.
//
//   tandem_ps_shard_bench --steps 2000
//   tandem_ps_shard_bench --steps 2000 --optimizer sgd   # the update without Adam's arithmetic
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ps_shard.h"
#include "tandem/config.h"
#include "tandem/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// A message over `tensors` decoded as the server decodes it; its spans point into `out`.
tandem::transport::DecodeResult decoded(tandem::transport::MessageType type,
                                        const std::vector<tandem::NamedTensor>& tensors,
                                        tandem::transport::OutgoingMessage& out) {
  std::vector<tandem::transport::FloatTensorRef> refs;
  for (const auto& t : tensors) refs.push_back({t.name, t.shape, t.values.data()});
  out = tandem::transport::encode_float_message(type, 1, 0, refs);
  return tandem::transport::decode(out.frames());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"A parameter server's work per push, without the sockets"};
  int steps = 2000;
  app.add_option("--steps", steps, "Pushes to time")->check(CLI::PositiveNumber);
  std::string optimizer = "adam";
  app.add_option("--optimizer", optimizer, "The shard's update: adam or sgd")
      ->check(CLI::IsMember({"adam", "sgd"}));
  CLI11_PARSE(app, argc, argv);
  tandem::OptimizerConfig config;
  config.kind = tandem::parse_optimizer(optimizer);

  const tandem::Model model = tandem::Model::initialized(tandem::ModelConfig{}, 1);
  tandem::transport::OutgoingMessage init_out, push_out;
  const auto init = decoded(tandem::transport::MessageType::Init, model.parameters(), init_out);
  tandem::PsShard shard{config};
  shard.initialize(init.message, init.tensor_data);
  std::vector<tandem::NamedTensor> gradients = model.parameters();
  for (auto& t : gradients)
    for (size_t i = 0; i < t.values.size(); ++i) t.values[i] = 1e-3f * float((i % 7) - 3);
  const auto push = decoded(tandem::transport::MessageType::Push, gradients, push_out);
  std::vector<tandem::NamedTensor> parameters = model.parameters();

  double stage = 0, adam = 0, copy = 0;
  for (int i = 0; i < steps; ++i) {
    std::string kind;
    const auto t0 = Clock::now();
    if (!shard.stage_gradients(push.message, push.tensor_data, kind).empty()) return 1;
    const auto t1 = Clock::now();
    shard.apply_staged();
    const auto t2 = Clock::now();
    for (size_t k = 0; k < parameters.size(); ++k)
      std::memcpy(parameters[k].values.data(), shard.values(shard.entries()[k]),
                  parameters[k].values.size() * sizeof(float));
    const auto t3 = Clock::now();
    stage += micros(t0, t1);
    adam += micros(t1, t2);
    copy += micros(t2, t3);
  }
  std::printf("per push (mean of %d): stage_gradients (checks) %.1f us, apply_staged (%s) %.1f us, "
              "copy of the parameters %.1f us\n",
              steps, stage / steps, optimizer.c_str(), adam / steps, copy / steps);
  return 0;
}
