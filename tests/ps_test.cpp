// The ZeroMQ parameter server and its client, over real sockets (inproc:// with a shared
// context, tcp://127.0.0.1 on ephemeral ports): round trips, server-side Adam against the
// trainer's kernel bit for bit, several servers and clients, and every kind of bad input.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <array>
#include <cstring>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "aligned_buffer.h"
#include "cpu/adam_cpu.h"
#include "ps_client.h"
#include "ps_placement.h"
#include "ps_server.h"
#include "safetensors.h"
#include "tandem/model.h"
#include "test_support.h"

namespace tandem {
namespace {

using transport::MessageType;

std::vector<NamedTensor> small_params(uint32_t seed) {
  return {{"w", {3, 4}, test::random_floats(12, seed)}, {"b", {4}, test::random_floats(4, seed + 1)}};
}

std::vector<NamedTensor> gradients_like(const std::vector<NamedTensor>& params, uint32_t seed) {
  std::vector<NamedTensor> g;
  for (const auto& p : params)
    g.push_back({p.name, p.shape, test::random_floats(p.values.size(), seed++, -0.5f, 0.5f)});
  return g;
}

bool bit_equal(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].name != b[i].name || a[i].shape != b[i].shape || a[i].values.size() != b[i].values.size() ||
        std::memcmp(a[i].values.data(), b[i].values.data(), a[i].values.size() * 4) != 0)
      return false;
  return true;
}

// The trainer's optimizer, tensor by tensor, each in a 64-byte aligned buffer padded to 16
// floats as in the trainer's arena: what the server must reproduce exactly. (The kernel's vector
// body contracts to FMA and its scalar tail may not, so bits depend on where an element sits
// relative to alignment and vector width; plain std::vectors would differ in the last bit.)
struct ReferenceAdam {
  struct Slot {
    AlignedBuffer<float> w, m, v, g;
  };
  std::vector<NamedTensor> w;  // the current parameters, copied out after each step
  std::vector<Slot> slots;
  int64_t step = 0;
  kernels::AdamHyper h;
  explicit ReferenceAdam(std::vector<NamedTensor> params) : w(std::move(params)) {
    for (const auto& t : w) {
      const size_t padded = (t.values.size() + 15) / 16 * 16;
      Slot s{AlignedBuffer<float>(padded), AlignedBuffer<float>(padded),
             AlignedBuffer<float>(padded), AlignedBuffer<float>(padded)};
      std::memcpy(s.w.data(), t.values.data(), t.values.size() * 4);
      slots.push_back(std::move(s));
    }
  }
  void apply(const std::vector<NamedTensor>& g) {
    const float lr_t = kernels::adam_step_size(h, ++step);
    for (size_t i = 0; i < w.size(); ++i) {
      Slot& s = slots[i];
      std::memcpy(s.g.data(), g[i].values.data(), g[i].values.size() * 4);
      const float* gp = s.g.data();
      kernels::adam_update_cpu(s.w.data(), s.m.data(), s.v.data(), &gp, 1, 0,
                               int64_t(s.w.size()), lr_t, h);
      std::memcpy(w[i].values.data(), s.w.data(), w[i].values.size() * 4);
    }
  }
};

ServerOptions inproc_options(zmq::context_t& ctx, const std::string& name) {
  ServerOptions o;
  o.bind = "inproc://" + name;
  o.context = &ctx;
  return o;
}

ClientOptions client_options(zmq::context_t* ctx, int timeout_ms = 5000) {
  ClientOptions o;
  o.context = ctx;
  o.timeout_ms = timeout_ms;
  return o;
}

// A bare DEALER that sends whatever frames a test makes and reads the reply, if any.
struct RawPeer {
  zmq::socket_t socket;
  RawPeer(zmq::context_t& ctx, const std::string& endpoint)
      : socket(ctx, zmq::socket_type::dealer) {
    socket.set(zmq::sockopt::linger, 0);
    socket.connect(endpoint);
  }
  void send(const std::vector<std::vector<uint8_t>>& frames) {
    std::vector<transport::ByteSpan> spans;
    for (const auto& f : frames) spans.push_back(transport::span_of(f));
    transport::send_frames(socket, spans, nullptr, "raw peer");
  }
  // The reply's header and extra text; false when none came within timeout_ms.
  bool receive(transport::Message& out, long timeout_ms = 2000) {
    transport::Frames frames;
    if (!transport::receive_frames(socket, frames, timeout_ms, "raw peer")) return false;
    const auto r = transport::decode_frames(frames, 0, {});
    EXPECT_TRUE(r.ok()) << r.error;
    out = r.message;
    return true;
  }
};

// Frames of a message over float tensors, each frame an owned byte vector (so tests can edit).
std::vector<std::vector<uint8_t>> frames_of(MessageType type, uint64_t id,
                                            const std::vector<NamedTensor>& tensors) {
  std::vector<transport::FloatTensorRef> refs;
  for (const auto& t : tensors) refs.push_back({t.name, t.shape, t.values.data()});
  const auto out = transport::encode_float_message(type, id, 0, refs);
  std::vector<std::vector<uint8_t>> frames;
  for (const auto& f : out.frames()) frames.emplace_back(f.data, f.data + f.size);
  return frames;
}

TEST(ParameterServer, InitPullRoundTripIsBitExact) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-roundtrip"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(1);
  const PsResult init = client.init(params).wait();
  EXPECT_TRUE(bit_equal(init.tensors, params));
  EXPECT_EQ(init.version, 0u);
  const PsResult pulled = client.pull().wait();
  EXPECT_TRUE(bit_equal(pulled.tensors, params));
  EXPECT_EQ(pulled.version, 0u);
  // A later Init (another worker's, or a second chief's) gets the current values, unchanged.
  PsClient other({server.endpoint()}, client_options(&ctx));
  EXPECT_TRUE(bit_equal(other.init(small_params(99)).wait().tensors, params));
  EXPECT_TRUE(bit_equal(client.pull().wait().tensors, params));
}

TEST(ParameterServer, InitWithoutTensorsBeforeChiefIsAnErrorThenWorks) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-init-order"));
  PsClient worker({server.endpoint()}, client_options(&ctx));
  try {
    worker.init({}).wait();
    FAIL() << "expected ServerError";
  } catch (const ServerError& e) {
    EXPECT_NE(std::string(e.what()).find("not initialised yet"), std::string::npos) << e.what();
  }
  PsClient chief({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(2);
  chief.init(params).wait();
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  EXPECT_EQ(worker.names(), (std::vector<std::string>{"w", "b"}));
}

TEST(ParameterServer, PushesEqualAdamUpdatesBitwise) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-adam"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(3);
  client.init(params).wait();
  ReferenceAdam ref(params);
  constexpr int kPushes = 7;
  for (int i = 0; i < kPushes; ++i) {
    const auto g = gradients_like(params, 100 + 10 * uint32_t(i));
    EXPECT_EQ(client.push(g).wait().version, 0u);  // one-way: nothing to wait for
    ref.apply(g);
  }
  // One DEALER to one ROUTER keeps order, so the pull sees every push.
  const PsResult pulled = client.pull().wait();
  EXPECT_EQ(pulled.version, uint64_t(kPushes));
  EXPECT_TRUE(bit_equal(pulled.tensors, ref.w));
  EXPECT_EQ(server.stats().version, kPushes);
}

TEST(ParameterServer, PushPullOverTcpReturnsTheUpdatedParameters) {
  ParameterServer server(ServerOptions{});
  ASSERT_EQ(server.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server.endpoint();
  PsClient client({server.endpoint()}, client_options(nullptr));
  const auto params = small_params(4);
  client.init(params).wait();
  ReferenceAdam ref(params);
  for (int i = 1; i <= 3; ++i) {
    const auto g = gradients_like(params, 200 + uint32_t(i));
    ref.apply(g);
    const PsResult r = client.push_pull(g).wait();
    EXPECT_EQ(r.version, uint64_t(i));
    EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  }
}

TEST(PsClient, SeveralOutstandingRequestsAreMatchedByRequestId) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-outstanding"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(5);
  client.init(params).wait();
  ReferenceAdam ref(params);
  const auto g1 = gradients_like(params, 300), g2 = gradients_like(params, 310);
  auto h1 = client.push_pull(g1);
  auto h2 = client.push_pull(g2);
  auto h3 = client.pull();
  // Waited for out of order: the replies to h1 and h2 arrive first and are kept.
  const PsResult r3 = h3.wait();
  ref.apply(g1);
  const auto after1 = ref.w;
  ref.apply(g2);
  EXPECT_EQ(r3.version, 2u);
  EXPECT_TRUE(bit_equal(r3.tensors, ref.w));
  const PsResult r2 = h2.wait();
  EXPECT_EQ(r2.version, 2u);
  const PsResult r1 = h1.wait();
  EXPECT_EQ(r1.version, 1u);
  EXPECT_TRUE(bit_equal(r1.tensors, after1));
}

TEST(PsClient, PlacementIsGreedyBySize) {
  EXPECT_EQ(place_tensors({78400, 100, 1000, 10}, 2), (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(place_tensors({5, 5, 5, 5}, 2), (std::vector<int>{0, 1, 0, 1}));
  EXPECT_EQ(place_tensors({1, 2, 3}, 1), (std::vector<int>{0, 0, 0}));
  EXPECT_THROW(place_tensors({1}, 0), InputError);
}

TEST(PsClient, TwoServersHoldTheDefaultModelAndAssemblePulls) {
  ParameterServer s0(ServerOptions{}), s1(ServerOptions{});
  const Model model = Model::initialized(ModelConfig{}, 1);
  const auto& params = model.parameters();
  PsClient chief({s0.endpoint(), s1.endpoint()}, client_options(nullptr));
  chief.init(params).wait();
  std::vector<int64_t> sizes;
  std::vector<std::string> names;
  for (const auto& p : params) {
    sizes.push_back(int64_t(p.values.size()));
    names.push_back(p.name);
  }
  EXPECT_EQ(chief.names(), names);
  EXPECT_EQ(chief.placement(), place_tensors(sizes, 2));
  EXPECT_EQ(chief.placement(), (std::vector<int>{0, 1, 1, 1}));  // hid_w alone on server 0
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, params));

  // Another worker learns names, order and placement from the servers.
  PsClient worker({s0.endpoint(), s1.endpoint()}, client_options(nullptr));
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  EXPECT_EQ(worker.names(), names);
  EXPECT_EQ(worker.placement(), chief.placement());

  ReferenceAdam ref(params);
  const auto g = gradients_like(params, 400);
  ref.apply(g);
  const PsResult r = worker.push_pull(g).wait();
  EXPECT_EQ(r.version, 1u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, ref.w));
  const auto stats = chief.stats();
  ASSERT_EQ(stats.size(), 2u);
  EXPECT_EQ(stats[0].pushes, 1);
  EXPECT_EQ(stats[1].pushes, 1);
}

TEST(PsClient, ConcurrentClientsEveryPushCounts) {
  ParameterServer server(ServerOptions{});
  const auto params = small_params(6);
  PsClient(std::vector<std::string>{server.endpoint()}, client_options(nullptr)).init(params).wait();
  constexpr int kClients = 2, kPushes = 25;
  std::vector<std::thread> threads;
  std::vector<std::string> failures(kClients);
  for (int c = 0; c < kClients; ++c)
    threads.emplace_back([&, c] {
      try {
        PsClient client({server.endpoint()}, client_options(nullptr));
        client.init({}).wait();
        for (int i = 0; i < kPushes; ++i) {
          const auto g = gradients_like(params, 1000 * uint32_t(c) + uint32_t(i));
          if (i % 2 == 0) client.push(g).wait();
          else client.push_pull(g).wait();
        }
        client.pull().wait();  // after this client's pushes (FIFO per connection)
      } catch (const std::exception& e) {
        failures[size_t(c)] = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (const auto& f : failures) EXPECT_EQ(f, "");
  PsClient check({server.endpoint()}, client_options(nullptr));
  check.init({}).wait();
  EXPECT_EQ(check.pull().wait().version, uint64_t(kClients * kPushes));
  EXPECT_EQ(server.stats().pushes, kClients * kPushes);
}

class ParameterServerBadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    client.init(params).wait();
  }
  // Sends `frames` raw and expects an Error reply to request `id` whose text holds `needle`.
  void expect_error(const std::vector<std::vector<uint8_t>>& frames, uint64_t id,
                    const std::string& needle) {
    raw.send(frames);
    transport::Message reply;
    ASSERT_TRUE(raw.receive(reply)) << "no reply, expected an Error with '" << needle << "'";
    EXPECT_EQ(reply.header.type, MessageType::Error);
    EXPECT_EQ(reply.header.request_id, id);
    EXPECT_NE(reply.extra.find(needle), std::string::npos) << reply.extra;
    expect_untouched();
  }
  void expect_untouched() {
    const PsResult r = client.pull().wait();
    EXPECT_EQ(r.version, 0u);
    EXPECT_TRUE(bit_equal(r.tensors, params));
  }

  zmq::context_t ctx;
  ParameterServer server{inproc_options(ctx, "ps-bad-input")};
  PsClient client{{server.endpoint()}, client_options(&ctx)};
  RawPeer raw{ctx, server.endpoint()};
  std::vector<NamedTensor> params = small_params(7);
};

TEST_F(ParameterServerBadInput, UnknownNameWrongShapeAndMissingGradient) {
  auto g = gradients_like(params, 500);
  auto unknown = g;
  unknown[1].name = "nope";
  expect_error(frames_of(MessageType::PushPull, 11, unknown), 11, "unknown parameter 'nope'");
  auto shape = g;
  shape[0].shape = {4, 3};
  expect_error(frames_of(MessageType::PushPull, 12, shape), 12, "shape [4, 3], expected [3, 4]");
  expect_error(frames_of(MessageType::PushPull, 13, {g[0]}), 13, "lacks a gradient for 'b'");
}

TEST_F(ParameterServerBadInput, NanAndInfGradients) {
  auto nan = gradients_like(params, 510);
  nan[0].values[5] = std::numeric_limits<float>::quiet_NaN();
  expect_error(frames_of(MessageType::PushPull, 21, nan), 21, "non-finite value at element 5");
  auto inf = gradients_like(params, 520);
  inf[1].values[2] = -std::numeric_limits<float>::infinity();
  expect_error(frames_of(MessageType::PushPull, 22, inf), 22, "non-finite value at element 2");
  // A one-way push of the same is dropped and counted, never answered.
  raw.send(frames_of(MessageType::Push, 23, inf));
  expect_untouched();
  transport::Message none;
  EXPECT_FALSE(raw.receive(none, 100));
  EXPECT_EQ(server.stats().dropped, 1);
}

TEST_F(ParameterServerBadInput, WrongVersionUnknownTypeTruncatedHeader) {
  auto version = frames_of(MessageType::Pull, 31, {});
  version[0][4] = 7;  // protocol version 7
  expect_error(version, 31, "BadVersion");
  auto type = frames_of(MessageType::Pull, 32, {});
  type[0][6] = 99;  // message type 99
  expect_error(type, 32, "UnknownType");
  auto truncated = frames_of(MessageType::Pull, 33, {});
  truncated[0].resize(20);
  expect_error(truncated, 33, "Truncated");
  auto checkpoint = frames_of(MessageType::Checkpoint, 34, {});
  expect_error(checkpoint, 34, "unsupported");
}

TEST_F(ParameterServerBadInput, MalformedBodyWithReadableHeader) {
  auto g = gradients_like(params, 530);
  auto short_frame = frames_of(MessageType::PushPull, 41, g);
  short_frame[1].pop_back();  // tensor frame one byte shorter than its table entry
  expect_error(short_frame, 41, "LengthMismatch");
  auto missing_frame = frames_of(MessageType::PushPull, 42, g);
  missing_frame.pop_back();
  expect_error(missing_frame, 42, "FrameCountMismatch");
  auto unknown_pull = frames_of(MessageType::Pull, 43, {});
  // A pull by name (extra = '\n'-separated names) of a name nobody has.
  transport::Message m = transport::make_message(MessageType::Pull, 43, 0, {}, "w\nzz");
  const auto out = transport::encode_message(m, {});
  unknown_pull[0] = std::vector<uint8_t>(out.header_frame.begin(), out.header_frame.end());
  expect_error(unknown_pull, 43, "unknown parameter 'zz'");
}

TEST(ParameterServer, OversizedMessagesAreRejected) {
  zmq::context_t ctx;
  ServerOptions options = inproc_options(ctx, "ps-oversized");
  options.limits.max_message_bytes = 1024;
  ParameterServer server(options);
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(12);
  client.init(params).wait();
  RawPeer raw(ctx, server.endpoint());
  raw.send(frames_of(MessageType::PushPull, 51, {{"w", {300}, std::vector<float>(300, 1.0f)}}));
  transport::Message reply;
  ASSERT_TRUE(raw.receive(reply));
  EXPECT_EQ(reply.header.type, MessageType::Error);
  EXPECT_NE(reply.extra.find("TooLarge"), std::string::npos) << reply.extra;
  EXPECT_TRUE(bit_equal(client.pull().wait().tensors, params));
}

TEST(ParameterServer, PullByNameReturnsThoseTensors) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-pull-by-name"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(13);
  client.init(params).wait();
  RawPeer raw(ctx, server.endpoint());
  const auto out = transport::encode_message(
      transport::make_message(MessageType::Pull, 61, 0, {}, "b"), {});
  raw.send({std::vector<uint8_t>(out.header_frame.begin(), out.header_frame.end())});
  transport::Message reply;
  ASSERT_TRUE(raw.receive(reply));
  ASSERT_EQ(reply.header.type, MessageType::Reply);
  ASSERT_EQ(reply.tensors.size(), 1u);
  EXPECT_EQ(reply.tensors[0].name, "b");
}

TEST_F(ParameterServerBadInput, RandomBytesAreDroppedAndTheServerKeepsServing) {
  std::mt19937 gen(42);
  for (int i = 0; i < 50; ++i) {
    std::vector<std::vector<uint8_t>> frames(1 + gen() % 3);
    for (auto& f : frames) {
      f.resize(gen() % 100);
      for (auto& b : f) b = uint8_t(gen());
    }
    raw.send(frames);
  }
  expect_untouched();
  transport::Message none;
  EXPECT_FALSE(raw.receive(none, 100));
  EXPECT_EQ(server.stats().dropped, 50);
}

TEST(PsClient, TimeoutNamesTheSilentEndpoint) {
  zmq::context_t ctx;
  const std::string nobody = "inproc://nobody-serves-this";
  PsClient client({nobody}, client_options(&ctx, 300));
  const auto start = std::chrono::steady_clock::now();
  try {
    client.init(small_params(8)).wait();
    FAIL() << "expected TransportError";
  } catch (const transport::TransportError& e) {
    EXPECT_NE(std::string(e.what()).find(nobody), std::string::npos) << e.what();
  }
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(ms, 250);
  EXPECT_LT(ms, 2000);
}

TEST(PsClient, TimeoutOverTcpNamesTheServerThatStopped) {
  std::string endpoint;
  {
    ParameterServer server(ServerOptions{});
    endpoint = server.endpoint();
  }
  PsClient client({endpoint}, client_options(nullptr, 300));
  try {
    client.init(small_params(9)).wait();
    FAIL() << "expected TransportError";
  } catch (const transport::TransportError& e) {
    EXPECT_NE(std::string(e.what()).find(endpoint), std::string::npos) << e.what();
  }
}

TEST(ParameterServer, ShutdownStopsServing) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-shutdown"));
  PsClient client({server.endpoint()}, client_options(&ctx, 300));
  client.init(small_params(10)).wait();
  client.shutdown_servers();
  for (int i = 0; i < 100 && server.serving(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_FALSE(server.serving());
  EXPECT_THROW(client.pull().wait(), transport::TransportError);
}

TEST(ParameterServer, StatsCountPushesPullsAndRejects) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-stats"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(11);
  client.init(params).wait();
  client.push(gradients_like(params, 600)).wait();
  client.push_pull(gradients_like(params, 610)).wait();
  client.pull().wait();
  client.pull().wait();
  RawPeer raw(ctx, server.endpoint());
  auto bad = gradients_like(params, 620);
  bad[0].values[0] = std::numeric_limits<float>::infinity();
  raw.send(frames_of(MessageType::PushPull, 1, bad));
  transport::Message reply;
  ASSERT_TRUE(raw.receive(reply));
  const ServerStats s = client.stats().at(0);
  EXPECT_EQ(s.version, 2);
  EXPECT_EQ(s.pushes, 2);
  EXPECT_EQ(s.pulls, 2);
  EXPECT_EQ(s.rejected, 1);
  EXPECT_EQ(s.dropped, 0);
  EXPECT_EQ(s.by_type.at("Init"), 1);
  EXPECT_EQ(s.by_type.at("Push"), 1);
  EXPECT_EQ(s.by_type.at("PushPull"), 2);
  EXPECT_EQ(s.by_type.at("Pull"), 2);
  EXPECT_EQ(s.by_type.at("Stats"), 1);
}

// ---- Training modes (ServerOptions::mode) and staleness accounting --------------------------

ServerOptions mode_options(zmq::context_t& ctx, const std::string& name, PsMode mode) {
  ServerOptions o = inproc_options(ctx, name);
  o.mode = mode;
  return o;
}

// The element-wise mean of two gradients, computed as the server does: (0 + a) + b, then / 2.
std::vector<NamedTensor> mean_of(const std::vector<NamedTensor>& a, const std::vector<NamedTensor>& b) {
  auto out = a;
  for (size_t i = 0; i < a.size(); ++i)
    for (size_t k = 0; k < a[i].values.size(); ++k)
      out[i].values[k] = ((0.0f + a[i].values[k]) + b[i].values[k]) / 2.0f;
  return out;
}

int64_t ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(PsMode, SyncAggregatesReplicasIntoOneAdamStepOnTheMean) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-sync-mean", PsMode::Sync);
  o.replicas_to_aggregate = 2;
  o.step_timeout_ms = 4000;  // not reached: both replicas push
  ParameterServer server(o);
  const auto params = small_params(20);
  PsClient a({server.endpoint()}, client_options(&ctx)), b({server.endpoint()}, client_options(&ctx));
  a.init(params).wait();
  b.init({}).wait();
  ReferenceAdam ref(params);
  for (int step = 1; step <= 3; ++step) {
    const auto ga = gradients_like(params, 700 + 10 * uint32_t(step));
    const auto gb = gradients_like(params, 900 + 10 * uint32_t(step));
    auto ha = a.push_pull(ga);  // held until the step is complete
    auto hb = b.push_pull(gb);
    ref.apply(mean_of(ga, gb));
    const PsResult ra = ha.wait(), rb = hb.wait();
    EXPECT_EQ(ra.version, uint64_t(step));
    EXPECT_EQ(rb.version, uint64_t(step));
    EXPECT_FALSE(ra.stale);
    EXPECT_TRUE(bit_equal(ra.tensors, ref.w)) << "step " << step;
    EXPECT_TRUE(bit_equal(rb.tensors, ref.w)) << "step " << step;
  }
  const ServerStats s = server.stats();
  EXPECT_EQ(s.version, 3);
  EXPECT_EQ(s.pushes, 6);
  EXPECT_EQ(s.stale_dropped, 0);
  EXPECT_EQ(s.partial_steps, 0);
  EXPECT_EQ(s.staleness[0], 6);
}

TEST(PsMode, SyncDropsAndCountsStaleGradients) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-sync-stale", PsMode::Sync);
  o.replicas_to_aggregate = 2;
  o.step_timeout_ms = 4000;
  ParameterServer server(o);
  const auto params = small_params(21);
  PsClient a({server.endpoint()}, client_options(&ctx)), b({server.endpoint()}, client_options(&ctx)),
      late({server.endpoint()}, client_options(&ctx));
  a.init(params).wait();
  b.init({}).wait();
  late.init({}).wait();  // computes on version 0
  ReferenceAdam ref(params);
  const auto ga = gradients_like(params, 1100), gb = gradients_like(params, 1200);
  auto ha = a.push_pull(ga);
  auto hb = b.push_pull(gb);
  ha.wait();
  hb.wait();
  ref.apply(mean_of(ga, gb));
  // The late worker's gradient was computed on version 0, now 1: dropped, answered at once.
  const auto start = std::chrono::steady_clock::now();
  const PsResult r = late.push_pull(gradients_like(params, 1300)).wait();
  EXPECT_LT(ms_since(start), 1000);
  EXPECT_TRUE(r.stale);
  EXPECT_EQ(r.version, 1u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));  // untouched by the stale gradient
  late.push(gradients_like(params, 1400)).wait();  // one-way, computed on version 1: current
  EXPECT_EQ(late.last_version(0), 1u);
  ServerStats s = late.stats().at(0);
  EXPECT_EQ(s.stale_dropped, 1);
  EXPECT_EQ(s.staleness[1], 1);
  // That last one-way push (on version 1) was current: it waits in the aggregate with a's next.
  const auto ga2 = gradients_like(params, 1500);
  const PsResult r2 = a.push_pull(ga2).wait();
  EXPECT_EQ(r2.version, 2u);
  ref.apply(mean_of(gradients_like(params, 1400), ga2));
  EXPECT_TRUE(bit_equal(r2.tensors, ref.w));
  // A raw one-way push on version 0 is dropped too, without a reply.
  RawPeer raw(ctx, server.endpoint());
  raw.send(frames_of(MessageType::Push, 5, gradients_like(params, 1600)));
  for (int i = 0; i < 100 && server.stats().stale_dropped < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  s = server.stats();
  EXPECT_EQ(s.stale_dropped, 2);
  EXPECT_EQ(s.version, 2);
  EXPECT_TRUE(bit_equal(a.pull().wait().tensors, ref.w));
}

TEST(PsMode, SyncWorkerThatLeavesMidStepDoesNotHangTheOthers) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-sync-departed", PsMode::Sync);
  o.replicas_to_aggregate = 2;
  o.step_timeout_ms = 200;
  ParameterServer server(o);
  const auto params = small_params(22);
  PsClient a({server.endpoint()}, client_options(&ctx, 3000));
  a.init(params).wait();
  {
    PsClient b({server.endpoint()}, client_options(&ctx, 3000));
    b.init({}).wait();
  }  // b's socket closes before it ever pushes
  ReferenceAdam ref(params);
  for (int step = 1; step <= 2; ++step) {
    const auto g = gradients_like(params, 1700 + uint32_t(step));
    const auto start = std::chrono::steady_clock::now();
    const PsResult r = a.push_pull(g).wait();
    const int64_t ms = ms_since(start);
    EXPECT_GE(ms, 150);   // it did wait for the other replica...
    EXPECT_LT(ms, 1500);  // ...but only until the step timeout
    ref.apply(g);         // a partial step: the mean of the one gradient that came
    EXPECT_EQ(r.version, uint64_t(step));
    EXPECT_FALSE(r.stale);
    EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  }
  EXPECT_EQ(server.stats().partial_steps, 2);
}

TEST(PsMode, BoundedStalenessDefersTheFastWorkerUntilTheSlowOnePushesOrTimesOut) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-bounded", PsMode::BoundedStaleness);
  o.staleness_bound = 1;
  o.worker_timeout_ms = 300;
  ParameterServer server(o);
  const auto params = small_params(23);
  PsClient slow({server.endpoint()}, client_options(&ctx, 3000));
  PsClient fast({server.endpoint()}, client_options(&ctx, 3000));
  slow.init(params).wait();
  fast.init({}).wait();
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1800)).wait().version, 1u);  // slow: clock 0
  EXPECT_EQ(fast.push_pull(gradients_like(params, 1801)).wait().version, 2u);  // fast: clock 0
  // Computed on version 2, 2 ahead of the slow worker's 0 > k = 1: the reply waits.
  auto pending = std::async(std::launch::async, [&] {
    return fast.push_pull(gradients_like(params, 1802)).wait().version;
  });
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  EXPECT_EQ(server.stats().deferred, 1);
  // The slow worker pushes on version 1 (its last reply): now 2 - 1 <= 1, the fast one goes on.
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1803)).wait().version, 4u);
  ASSERT_EQ(pending.wait_for(std::chrono::milliseconds(1000)), std::future_status::ready);
  EXPECT_EQ(pending.get(), 4u);
  // Fast computes on 4, 3 ahead of slow's 1: deferred until the silent slow worker times out.
  const auto start = std::chrono::steady_clock::now();
  const PsResult r = fast.push_pull(gradients_like(params, 1804)).wait();
  const int64_t ms = ms_since(start);
  EXPECT_EQ(r.version, 5u);
  EXPECT_GE(ms, 150);
  EXPECT_LT(ms, 1500);
  EXPECT_EQ(server.stats().deferred, 2);
  // Once the slow worker is inactive the fast one is not held back.
  const auto start2 = std::chrono::steady_clock::now();
  EXPECT_EQ(fast.pull().wait().version, 5u);
  EXPECT_LT(ms_since(start2), 150);
}

TEST(PsMode, AsyncStalenessHistogramCountsKnownSequences) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-staleness-hist"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(24);
  client.init(params).wait();
  for (int i = 0; i < 3; ++i) client.push(gradients_like(params, 1900 + uint32_t(i))).wait();
  // Three one-way pushes computed on version 0 against versions 0, 1, 2.
  EXPECT_EQ(client.pull().wait().version, 3u);
  client.push_pull(gradients_like(params, 1910)).wait();  // on 3 at 3: staleness 0
  // Raw PushPulls claiming versions 0 (at 4: staleness 4) and 0 (at 5: 5), then 0 at 6 ... 0 at 20.
  RawPeer raw(ctx, server.endpoint());
  for (uint64_t i = 0; i < 17; ++i) {
    std::vector<transport::FloatTensorRef> refs;
    const auto g = gradients_like(params, 1920 + uint32_t(i));
    for (const auto& t : g) refs.push_back({t.name, t.shape, t.values.data()});
    const auto out = transport::encode_float_message(MessageType::PushPull, 100 + i, 0, refs);
    std::vector<std::vector<uint8_t>> frames;
    for (const auto& f : out.frames()) frames.emplace_back(f.data, f.data + f.size);
    raw.send(frames);
    transport::Message reply;
    ASSERT_TRUE(raw.receive(reply));
    EXPECT_EQ(reply.header.parameter_version, 5 + i);
  }
  const ServerStats s = client.stats().at(0);
  // Staleness 0, 1, 2, 0, then 4..20: buckets 0:2, 1:1, 2:1, 3:0, 4-7:4, 8-15:8, 16+:5.
  const std::array<int64_t, kStalenessBuckets> expected{2, 1, 1, 0, 4, 8, 5};
  EXPECT_EQ(s.staleness, expected);
  EXPECT_EQ(s.pushes, 21);
  EXPECT_EQ(s.version, 21);
}

TEST(PsMode, StatsJsonCarriesModeHistogramAndRates) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-stats-json", PsMode::Sync);
  o.replicas_to_aggregate = 1;
  ParameterServer server(o);
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(25);
  client.init(params).wait();
  client.push_pull(gradients_like(params, 2000)).wait();
  client.pull().wait();
  ServerStats s = server.stats();
  const std::string json = to_json(s);
  for (const char* key : {"\"mode\":\"sync\"", "\"staleness_histogram\"", "\"4-7\"", "\"16+\"",
                          "\"pushes_per_s\"", "\"pulls_per_s\"", "\"seconds\"", "\"stale_dropped\"",
                          "\"partial_steps\"", "\"deferred\"", "\"pushes\":1", "\"pulls\":1"})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  const ServerStats back = client.stats().at(0);  // over the wire, parsed back
  EXPECT_EQ(back.mode, "sync");
  EXPECT_EQ(back.version, 1);
  EXPECT_EQ(back.staleness[0], 1);
  EXPECT_GT(back.seconds, 0.0);
  EXPECT_GT(back.pushes_per_s, 0.0);
  EXPECT_GT(back.pulls_per_s, 0.0);
}

// ---- Checkpoints -----------------------------------------------------------------------------

ServerOptions checkpoint_options(zmq::context_t& ctx, const std::string& name,
                                 const test::TempDir& dir) {
  ServerOptions o = inproc_options(ctx, name);
  o.checkpoint_dir = dir.path().string();
  return o;
}

// Sends a Checkpoint request and returns the Reply's extra (the path); fails on an Error.
std::string request_checkpoint(zmq::context_t& ctx, const std::string& endpoint) {
  RawPeer raw(ctx, endpoint);
  raw.send(frames_of(MessageType::Checkpoint, 77, {}));
  transport::Message reply;
  EXPECT_TRUE(raw.receive(reply));
  EXPECT_EQ(reply.header.type, MessageType::Reply) << reply.extra;
  return reply.extra;
}

std::vector<std::string> shard_files(const test::TempDir& dir) {
  std::vector<std::string> out;
  for (const auto& e : std::filesystem::directory_iterator(dir.path()))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<float> floats(const SafeTensor& t) {
  std::vector<float> v(t.data.size() / 4);
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

TEST(PsCheckpoint, RequestWritesAFileThatReadsBackBitExactly) {
  zmq::context_t ctx;
  test::TempDir dir;
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-request", dir));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(40);
  client.init(params).wait();
  ReferenceAdam ref(params);
  for (int i = 0; i < 3; ++i) {
    const auto g = gradients_like(params, 4000 + 10 * uint32_t(i));
    client.push_pull(g).wait();
    ref.apply(g);
  }
  const std::string path = request_checkpoint(ctx, server.endpoint());
  EXPECT_EQ(path, dir.file("ps0-step-3.safetensors"));
  const SafeTensorsFile file = read_safetensors(path);
  EXPECT_EQ(file.metadata.at("format"), "tandem-ps-shard");
  EXPECT_EQ(file.metadata.at("step"), "3");
  EXPECT_EQ(file.metadata.at("mode"), "async");
  ASSERT_EQ(file.tensors.size(), 6u);
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& name = params[i].name;
    ASSERT_NE(file.find(name), nullptr);
    EXPECT_EQ(file.find(name)->shape, params[i].shape);
    EXPECT_TRUE(bit_equal({{name, params[i].shape, floats(*file.find(name))}}, {ref.w[i]}));
    const size_t n = params[i].values.size();
    const std::vector<float> m(ref.slots[i].m.data(), ref.slots[i].m.data() + n);
    const std::vector<float> v(ref.slots[i].v.data(), ref.slots[i].v.data() + n);
    ASSERT_NE(file.find(name + ".adam_m"), nullptr);
    ASSERT_NE(file.find(name + ".adam_v"), nullptr);
    EXPECT_EQ(std::memcmp(floats(*file.find(name + ".adam_m")).data(), m.data(), n * 4), 0);
    EXPECT_EQ(std::memcmp(floats(*file.find(name + ".adam_v")).data(), v.data(), n * 4), 0);
  }
  // Without a checkpoint_dir the request is still an Error.
  ParameterServer plain(inproc_options(ctx, "ps-ckpt-none"));
  RawPeer raw(ctx, plain.endpoint());
  raw.send(frames_of(MessageType::Checkpoint, 5, {}));
  transport::Message reply;
  ASSERT_TRUE(raw.receive(reply));
  EXPECT_EQ(reply.header.type, MessageType::Error);
}

TEST(PsCheckpoint, EveryNStepsWritesAndKeepsTheNewestTwo) {
  zmq::context_t ctx;
  test::TempDir dir;
  ServerOptions o = checkpoint_options(ctx, "ps-ckpt-every", dir);
  o.checkpoint_every_steps = 2;
  o.shard_name = "shardA";
  ParameterServer server(o);
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(41);
  client.init(params).wait();
  for (int i = 0; i < 7; ++i) client.push_pull(gradients_like(params, 4100 + uint32_t(i))).wait();
  client.pull().wait();  // the tick after the 7th push has run
  EXPECT_EQ(shard_files(dir),
            (std::vector<std::string>{"shardA-step-4.safetensors", "shardA-step-6.safetensors"}));
  server.stop();  // step 7 changed since step 6: a final checkpoint
  EXPECT_EQ(shard_files(dir),
            (std::vector<std::string>{"shardA-step-6.safetensors", "shardA-step-7.safetensors"}));
}

TEST(PsCheckpoint, StopWritesAFinalCheckpointOnlyWhenSomethingChanged) {
  zmq::context_t ctx;
  test::TempDir dir;
  {
    ParameterServer server(checkpoint_options(ctx, "ps-ckpt-stop", dir));
    PsClient client({server.endpoint()}, client_options(&ctx));
    const auto params = small_params(42);
    client.init(params).wait();
    client.push_pull(gradients_like(params, 4200)).wait();
    EXPECT_TRUE(shard_files(dir).empty());
  }
  EXPECT_EQ(shard_files(dir), (std::vector<std::string>{"ps0-step-1.safetensors"}));
  {
    // Restored at step 1, nothing pushed: stopping writes nothing new.
    ParameterServer server(checkpoint_options(ctx, "ps-ckpt-stop2", dir));
    EXPECT_EQ(server.restored_from(), dir.file("ps0-step-1.safetensors"));
  }
  EXPECT_EQ(shard_files(dir), (std::vector<std::string>{"ps0-step-1.safetensors"}));
}

TEST(PsCheckpoint, EverySecondsWritesWhenSomethingChanged) {
  zmq::context_t ctx;
  test::TempDir dir;
  ServerOptions o = checkpoint_options(ctx, "ps-ckpt-seconds", dir);
  o.checkpoint_every_seconds = 0.05;
  ParameterServer server(o);
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(46);
  client.init(params).wait();
  client.push_pull(gradients_like(params, 4600)).wait();
  // The server ticks every poll_ms even when idle; allow generous time on a loaded machine.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  // (A step-0 file may come first if the interval passed between Init and the push; the
  // rename makes the step-1 file appear whole.)
  const std::string want = "ps0-step-1.safetensors";
  auto has = [&] {
    const auto files = shard_files(dir);
    return std::find(files.begin(), files.end(), want) != files.end();
  };
  while (!has() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(has());
  EXPECT_EQ(read_safetensors(dir.file(want)).metadata.at("step"), "1");
}

TEST(PsCheckpoint, RestartResumesBitwiseLikeAnUninterruptedServer) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(43);
  const auto g_last = gradients_like(params, 4399);
  // Uninterrupted reference: 4 pushes then one more.
  ParameterServer whole(inproc_options(ctx, "ps-ckpt-whole"));
  PsClient wc({whole.endpoint()}, client_options(&ctx));
  wc.init(params).wait();
  {
    ParameterServer first(checkpoint_options(ctx, "ps-ckpt-first", dir));
    PsClient c({first.endpoint()}, client_options(&ctx));
    c.init(params).wait();
    for (int i = 0; i < 4; ++i) {
      const auto g = gradients_like(params, 4300 + 10 * uint32_t(i));
      c.push_pull(g).wait();
      wc.push_pull(g).wait();
    }
  }  // stop: ps0-step-4
  ParameterServer second(checkpoint_options(ctx, "ps-ckpt-second", dir));
  EXPECT_EQ(second.restored_from(), dir.file("ps0-step-4.safetensors"));
  PsClient c({second.endpoint()}, client_options(&ctx));
  // The chief's Init gets the restored values, not its own.
  const PsResult init = c.init(small_params(999)).wait();
  EXPECT_EQ(init.version, 4u);
  EXPECT_TRUE(bit_equal(init.tensors, wc.pull().wait().tensors));
  EXPECT_EQ(c.names(), (std::vector<std::string>{"w", "b"}));
  const PsResult resumed = c.push_pull(g_last).wait();
  const PsResult expected = wc.push_pull(g_last).wait();
  EXPECT_EQ(resumed.version, 5u);
  EXPECT_EQ(expected.version, 5u);
  EXPECT_TRUE(bit_equal(resumed.tensors, expected.tensors));
}

TEST(PsCheckpoint, TruncatedNewestIsSkippedForThePreviousComplete) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(44);
  std::vector<NamedTensor> at_step_1;
  {
    ParameterServer server(checkpoint_options(ctx, "ps-ckpt-trunc", dir));
    PsClient c({server.endpoint()}, client_options(&ctx));
    c.init(params).wait();
    at_step_1 = c.push_pull(gradients_like(params, 4400)).wait().tensors;
    request_checkpoint(ctx, server.endpoint());
    c.push_pull(gradients_like(params, 4410)).wait();
  }  // ps0-step-1 and ps0-step-2
  const std::string newest = dir.file("ps0-step-2.safetensors");
  auto bytes = test::read_bytes(newest);
  ASSERT_GT(bytes.size(), 20u);
  bytes.resize(bytes.size() - 7);
  test::write_bytes(newest, bytes);
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-trunc2", dir));
  EXPECT_EQ(server.restored_from(), dir.file("ps0-step-1.safetensors"));
  PsClient c({server.endpoint()}, client_options(&ctx));
  const PsResult r = c.init({}).wait();
  EXPECT_EQ(r.version, 1u);
  EXPECT_TRUE(bit_equal(r.tensors, at_step_1));
}

TEST(PsCheckpoint, CorruptDirEntriesNeverCrashTheServer) {
  zmq::context_t ctx;
  test::TempDir dir;
  test::write_bytes(dir.file("ps0-step-9.safetensors"), std::string("garbage"));
  test::write_bytes(dir.file("ps0-step-8.safetensors"), std::string(64, '\xff'));
  test::write_bytes(dir.file("ps0-step-x.safetensors"), std::string("x"));
  test::write_bytes(dir.file("other-step-3.safetensors"), std::string("y"));
  std::filesystem::create_directory(dir.path() / "ps0-step-7.safetensors");
  {
    // A valid safetensors file of the wrong format is skipped too.
    SafeTensorsFile f;
    f.metadata["format"] = "something-else";
    f.tensors.push_back({"w", "F32", {1}, std::vector<uint8_t>(4, 0)});
    write_safetensors_atomic(dir.file("ps0-step-6.safetensors"), f);
  }
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-corrupt", dir));
  EXPECT_EQ(server.restored_from(), "");
  PsClient c({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(45);
  EXPECT_TRUE(bit_equal(c.init(params).wait().tensors, params));
  EXPECT_EQ(c.push_pull(gradients_like(params, 4500)).wait().version, 1u);
  const std::string path = request_checkpoint(ctx, server.endpoint());
  EXPECT_EQ(path, dir.file("ps0-step-1.safetensors"));
}

}  // namespace
}  // namespace tandem
