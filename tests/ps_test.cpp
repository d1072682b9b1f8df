// The ZeroMQ parameter server and its client, over real sockets (inproc:// with a shared
// context, tcp://127.0.0.1 on ephemeral ports): round trips, server-side Adam against the
// trainer's kernel bit for bit, several servers and clients, and every kind of bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <random>
#include <thread>

#include "aligned_buffer.h"
#include "cpu/adam_cpu.h"
#include "ps_client.h"
#include "ps_placement.h"
#include "ps_server.h"
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

}  // namespace
}  // namespace tandem
