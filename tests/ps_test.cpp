// The ZeroMQ parameter server and its client, over real sockets (inproc:// with a shared
// context, tcp://127.0.0.1 on ephemeral ports): round trips, server-side Adam against the
// trainer's kernel bit for bit, several servers and clients, every kind of bad input, and CURVE
// (admitted and refused keys, key files).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "aligned_buffer.h"
#include "curve_client.h"
#include "backend.h"
#include "cpu/adam_cpu.h"
#include "ps_checkpoint_choice.h"
#include "ps_checkpoint_file.h"
#include "ps_checkpoint_writer.h"
#include "ps_client.h"
#include "ps_placement.h"
#include "ps_server.h"
#include "ps_shard.h"
#include "safetensors.h"
#include "signal_storm.h"
#include "tandem/model.h"
#include "test_support.h"
#include "zmq_curve.h"
#include "zmq_through_signals.h"

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

// "NAME@SERVER" for each part of a layout, in its order.
std::vector<std::string> part_servers(const std::vector<TensorPart>& layout) {
  std::vector<std::string> out;
  for (const auto& p : layout) out.push_back(p.name + "@" + std::to_string(p.server));
  return out;
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
    EXPECT_TRUE(e.not_initialised()) << e.kind();
  }
  PsClient chief({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(2);
  chief.init(params).wait();
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  // Another reason has another kind: callers that wait out "not initialised" do not wait this.
  auto nan = gradients_like(params, 3);
  nan[0].values[1] = std::numeric_limits<float>::quiet_NaN();
  try {
    worker.push_pull(nan).wait();
    FAIL() << "expected ServerError";
  } catch (const ServerError& e) {
    EXPECT_EQ(e.kind(), transport::kNonFinite) << e.what();
    EXPECT_FALSE(e.not_initialised());
    EXPECT_NE(std::string(e.what()).find("non-finite value at element 1"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(worker.names(), (std::vector<std::string>{"w", "b"}));
}

// A worker waiting for the chief hears from every server: its error names each one that has no
// parameters yet, not only the first (the role's wait says which are still waiting).
TEST(ParameterServer, InitBeforeTheChiefNamesEveryServerWithoutParameters) {
  zmq::context_t ctx;
  ParameterServer a(inproc_options(ctx, "ps-init-a")), b(inproc_options(ctx, "ps-init-b"));
  PsClient worker({a.endpoint(), b.endpoint()}, client_options(&ctx));
  try {
    worker.init({}).wait();
    FAIL() << "expected ServerError";
  } catch (const ServerError& e) {
    EXPECT_TRUE(e.not_initialised()) << e.kind();
    for (const std::string& endpoint : {a.endpoint(), b.endpoint()})
      EXPECT_TRUE(test::contains(e.what(), "parameter server " + endpoint + ": ")) << e.what();
  }
}

// The checkpoints keep Adam's moments as NAME.adam_m and NAME.adam_v in a safetensors file: a
// parameter named so would be read back as a moment (its checkpoints refused at the restart), and
// "__metadata__" cannot be a tensor there. Refused at Init, the server left uninitialised.
TEST(ParameterServer, AnInitWithANameTheCheckpointsReserveIsRefused) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-init-reserved"));
  PsClient chief({server.endpoint()}, client_options(&ctx));
  for (const std::string name : {"emb.adam_m", "emb.adam_v", "__metadata__"}) {
    auto params = small_params(4);
    params[1].name = name;
    try {
      chief.init(params).wait();
      ADD_FAILURE() << "expected " << name << " to be refused";
    } catch (const ServerError& e) {
      EXPECT_EQ(e.kind(), transport::kBadInitialTensor) << e.what();
      EXPECT_NE(std::string(e.what()).find("'" + name + "'"), std::string::npos) << e.what();
    }
  }
  const auto params = small_params(5);
  EXPECT_TRUE(bit_equal(chief.init(params).wait().tensors, params));
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

// ---- Zero-copy sends ------------------------------------------------------------------------

// A float tensor big enough to go zero-copy (kZeroCopyMinBytes) and one small enough to be copied.
std::vector<NamedTensor> zero_copy_params(uint32_t seed) {
  return {{"w", {100, 20}, test::random_floats(2000, seed)}, {"b", {20}, test::random_floats(20, seed + 1)}};
}

bool wait_until_released(const transport::SendHold& hold) {
  return test::eventually([&] { return !hold.in_use(); }, 5000, 1);
}

TEST(ZeroCopy, LargeFramesTravelInPlaceUntilTheReceiverLetsGo) {
  zmq::context_t ctx;
  zmq::socket_t a(ctx, zmq::socket_type::pair), b(ctx, zmq::socket_type::pair);
  b.bind("inproc://zero-copy-pair");
  a.connect("inproc://zero-copy-pair");
  auto held = std::make_shared<transport::Held<std::vector<NamedTensor>>>();
  held->value = zero_copy_params(5);
  const auto& big = held->value[0].values;
  const auto& small = held->value[1].values;
  const auto out = transport::encode_float_message(
      MessageType::Push, 1, 0, {{"w", {100, 20}, big.data()}, {"b", {20}, small.data()}});
  transport::send_message(a, out, nullptr, "test sender", held);
  EXPECT_TRUE(held->in_use());
  transport::Frames frames;
  ASSERT_TRUE(transport::receive_frames(b, frames, 2000, "test receiver"));
  ASSERT_EQ(frames.size(), 3u);
  // Over inproc:// the receiver reads the sender's very bytes: the big frame is the tensor itself,
  // the small one (and the header) a copy.
  EXPECT_EQ(frames[1].data(), static_cast<const void*>(big.data()));
  EXPECT_NE(frames[2].data(), static_cast<const void*>(small.data()));
  EXPECT_EQ(std::memcmp(frames[2].data(), small.data(), small.size() * 4), 0);
  EXPECT_TRUE(held->in_use());  // the receiver still holds the frame
  frames.clear();
  EXPECT_FALSE(held->in_use());

  // Without a hold, every frame is a copy: the sender may change its tensors at once.
  std::vector<float> values = big;
  const auto copied = transport::encode_float_message(MessageType::Push, 2, 0,
                                                      {{"w", {100, 20}, values.data()}});
  transport::send_message(a, copied, nullptr, "test sender");
  std::fill(values.begin(), values.end(), 0.0f);
  ASSERT_TRUE(transport::receive_frames(b, frames, 2000, "test receiver"));
  ASSERT_EQ(frames.size(), 2u);
  EXPECT_NE(frames[1].data(), static_cast<const void*>(values.data()));
  EXPECT_EQ(std::memcmp(frames[1].data(), big.data(), big.size() * 4), 0);
}

TEST(ZeroCopy, OverTcpTheBytesArriveAndTheHoldEnds) {
  zmq::context_t ctx;
  zmq::socket_t a(ctx, zmq::socket_type::pair), b(ctx, zmq::socket_type::pair);
  b.bind("tcp://127.0.0.1:*");
  a.connect(b.get(zmq::sockopt::last_endpoint));
  auto held = std::make_shared<transport::Held<std::vector<float>>>();
  held->value = test::random_floats(100000, 9);  // 400 KB: several writes of the I/O thread
  const auto out = transport::encode_float_message(MessageType::Push, 1, 0,
                                                   {{"w", {100000}, held->value.data()}});
  transport::send_message(a, out, nullptr, "test sender", held);
  transport::Frames frames;
  ASSERT_TRUE(transport::receive_frames(b, frames, 5000, "test receiver"));
  ASSERT_EQ(frames.size(), 2u);
  ASSERT_EQ(frames[1].size(), held->value.size() * 4);
  EXPECT_EQ(std::memcmp(frames[1].data(), held->value.data(), frames[1].size()), 0);
  // Once the bytes are on the wire the sender's I/O thread lets go (the receiver has its own).
  EXPECT_TRUE(wait_until_released(*held));
}

TEST(ZeroCopy, HeldPoolHandsOutOnlyBuffersNoSendHolds) {
  zmq::context_t ctx;
  zmq::socket_t a(ctx, zmq::socket_type::pair), b(ctx, zmq::socket_type::pair);
  b.bind("inproc://zero-copy-pool");
  a.connect("inproc://zero-copy-pool");
  transport::HeldPool<std::vector<float>> pool;
  const auto first = pool.take();
  first->value.assign(2000, 1.0f);
  EXPECT_EQ(pool.take(), first);  // not sent: free
  const auto out = transport::encode_float_message(MessageType::Push, 1, 0,
                                                   {{"w", {2000}, first->value.data()}});
  transport::send_message(a, out, nullptr, "test sender", first);
  const auto second = pool.take();
  EXPECT_NE(second, first);  // the first is the receiver's until it lets go
  EXPECT_EQ(second->value.size(), 0u);
  transport::Frames frames;
  ASSERT_TRUE(transport::receive_frames(b, frames, 2000, "test receiver"));
  frames.clear();
  EXPECT_EQ(pool.take(), first);  // free again, its contents kept
  EXPECT_EQ(first->value.size(), 2000u);
  EXPECT_EQ(pool.size(), 2u);
}

TEST(ParameterServer, ReplyStillHeldIsNeverChangedByTheNextStep) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-copy-on-write"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = zero_copy_params(6);
  client.init(params).wait();
  // A peer pulls and keeps the reply's frames: over inproc:// they are the server's own
  // parameter block, sent zero-copy.
  RawPeer peer(ctx, server.endpoint());
  peer.send(frames_of(MessageType::Pull, 7, {}));
  transport::Frames held_reply;
  ASSERT_TRUE(transport::receive_frames(peer.socket, held_reply, 2000, "raw peer"));
  ASSERT_EQ(held_reply.size(), 3u);
  const std::vector<uint8_t> before(held_reply[1].data<uint8_t>(),
                                    held_reply[1].data<uint8_t>() + held_reply[1].size());
  ASSERT_EQ(std::memcmp(before.data(), params[0].values.data(), before.size()), 0);
  ReferenceAdam ref(params);
  for (int i = 1; i <= 3; ++i) {
    const auto g = gradients_like(params, 300 + uint32_t(i));
    ref.apply(g);
    const PsResult r = client.push_pull(g).wait();
    EXPECT_TRUE(bit_equal(r.tensors, ref.w)) << "step " << i;
    // The step went to a copy: the reply the peer holds still has the version it asked for.
    EXPECT_EQ(std::memcmp(held_reply[1].data(), before.data(), before.size()), 0) << "step " << i;
  }
  held_reply.clear();
  for (int i = 4; i <= 6; ++i) {  // nothing held: steps in place again, same numbers
    const auto g = gradients_like(params, 300 + uint32_t(i));
    ref.apply(g);
    EXPECT_TRUE(bit_equal(client.push_pull(g).wait().tensors, ref.w)) << "step " << i;
  }
}

void expect_zero_copy_pushes_match_adam(const std::string& bind, zmq::context_t* ctx) {
  ServerOptions options;
  options.bind = bind;
  options.context = ctx;
  ParameterServer server(options);
  PsClient client({server.endpoint()}, client_options(ctx));
  const auto params = zero_copy_params(8);
  client.init(params).wait();
  ReferenceAdam ref(params);
  transport::HeldPool<std::vector<NamedTensor>> buffers;
  std::vector<std::shared_ptr<PsClient::GradientBuffer>> sent;
  // wait_into: tensors of the wrong name or size are replaced, the rest reuse their storage.
  std::vector<NamedTensor> into = {{"x", {1}, {7.0f}}};
  for (int i = 1; i <= 8; ++i) {
    const auto buffer = buffers.take();
    buffer->value = gradients_like(params, 400 + uint32_t(i));
    ref.apply(buffer->value);
    if (i % 4 == 1) {
      EXPECT_TRUE(bit_equal(client.push_pull(buffer).wait().tensors, ref.w)) << bind << " step " << i;
    } else if (i % 4 == 3) {
      const float* storage = into.size() == 2 ? into[0].values.data() : nullptr;
      const PsResult r = client.push_pull(buffer).wait_into(into);
      EXPECT_TRUE(r.tensors.empty());
      EXPECT_EQ(r.version, uint64_t(i));
      EXPECT_TRUE(bit_equal(into, ref.w)) << bind << " step " << i;
      if (storage != nullptr) {
        EXPECT_EQ(into[0].values.data(), storage);
      }
    } else {
      client.push(buffer);  // one-way
    }
    sent.push_back(buffer);
  }
  EXPECT_TRUE(bit_equal(client.pull().wait().tensors, ref.w)) << bind;
  for (const auto& b : sent) EXPECT_TRUE(wait_until_released(*b)) << bind;
}

TEST(PsClient, ZeroCopyPushesEqualAdamUpdatesAndTheirBuffersComeBack) {
  zmq::context_t ctx;
  expect_zero_copy_pushes_match_adam("inproc://ps-zero-copy-push", &ctx);
  expect_zero_copy_pushes_match_adam("tcp://127.0.0.1:*", nullptr);
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

// A client that looks for its replies without sleeping (ClientOptions::spin_us) gets the same
// replies, matched by request id as when it blocks, and still gives up at its deadline: a spin
// longer than the request's timeout ends with it.
TEST(PsClient, ASpinningClientGetsTheSameRepliesAndKeepsItsDeadline) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-spinning"));
  ClientOptions o = client_options(&ctx);
  o.spin_us = 300;
  PsClient client({server.endpoint()}, o);
  const auto params = small_params(6);
  client.init(params).wait();
  ReferenceAdam ref(params);
  for (int step = 0; step < 20; ++step) {
    const auto g = gradients_like(params, 400 + step);
    ref.apply(g);
    EXPECT_TRUE(bit_equal(client.push_pull(g).wait().tensors, ref.w)) << "step " << step;
  }
  // Waited for out of order: the reply a spin finds for another request is kept for it.
  const auto g1 = gradients_like(params, 500), g2 = gradients_like(params, 510);
  auto h1 = client.push_pull(g1);
  auto h2 = client.push_pull(g2);
  auto h3 = client.pull();
  ref.apply(g1);
  const auto after1 = ref.w;
  ref.apply(g2);
  EXPECT_TRUE(bit_equal(h3.wait().tensors, ref.w));
  EXPECT_EQ(h2.wait().version, 22u);
  EXPECT_TRUE(bit_equal(h1.wait().tensors, after1));

  ClientOptions patient = client_options(&ctx, 300);
  patient.spin_us = 5'000'000;
  PsClient waiting({"inproc://nobody-answers-a-spinning-client"}, patient);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(waiting.init(small_params(8)).wait(), transport::TransportError);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(ms, 250);
  // Not the spin, then a whole wait after it: about 600 ms.
  EXPECT_LT(ms, 550) << "the spin and the wait after it outlasted the request's 300 ms deadline";
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
  std::vector<std::string> names;
  for (const auto& p : params) names.push_back(p.name);
  EXPECT_EQ(chief.names(), names);
  // hid_w (78,400 of 79,510 floats) split by rows, one half on each server; the rest whole.
  EXPECT_EQ(part_servers(chief.layout()),
            (std::vector<std::string>{"hid_w[0:392]@0", "hid_w[392:784]@1", "hid_b@1", "sm_w@0",
                                      "sm_b@1"}));
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, params));

  // Another worker learns names, order and placement from the servers.
  PsClient worker({s0.endpoint(), s1.endpoint()}, client_options(nullptr));
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  EXPECT_EQ(worker.names(), names);
  EXPECT_EQ(part_servers(worker.layout()), part_servers(chief.layout()));

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

// wait_in_place leaves a reply's parameters in the received frames: the same values as the
// copying waits, installed into a backend with one copy, the object reused step after step.
TEST(PsClient, ParametersReceivedInPlaceEqualTheCopiedOnesAndInstallIntoABackend) {
  ParameterServer s0(ServerOptions{}), s1(ServerOptions{});
  const Model model = Model::initialized(ModelConfig{}, 1);
  const auto& params = model.parameters();
  PsClient client({s0.endpoint(), s1.endpoint()}, client_options(nullptr));
  client.init(params).wait();
  ReceivedParameters received;
  std::vector<NamedTensor> copied;
  EXPECT_THROW(received.copy_into(copied), InputError);  // nothing received yet
  client.pull().wait_in_place(received);
  EXPECT_EQ(received.runs().runs.size(), client.layout().size());  // a run per part, not copied
  received.copy_into(copied);
  EXPECT_TRUE(bit_equal(copied, params));

  const std::unique_ptr<Backend> backend =
      make_backend(BackendKind::Cpu, ModelConfig{}, OptimizerConfig{}, 1);
  backend->set_parameters(received.runs());
  Model installed(ModelConfig{});
  backend->get_parameters(installed);
  EXPECT_TRUE(bit_equal(installed.parameters(), params));

  ReferenceAdam ref(params);
  for (uint32_t step = 0; step < 3; ++step) {
    const auto g = gradients_like(params, 500 + step);
    ref.apply(g);
    const PsResult r = client.push_pull(g).wait_in_place(received);
    EXPECT_EQ(r.version, step + 1);
    EXPECT_TRUE(r.tensors.empty());
    received.copy_into(copied);
    EXPECT_TRUE(bit_equal(copied, ref.w)) << "step " << step;
    backend->set_parameters(received.runs());
    backend->get_parameters(installed);
    EXPECT_TRUE(bit_equal(installed.parameters(), ref.w)) << "step " << step;
  }

  // A backend of another shape refuses the runs and keeps its parameters.
  ModelConfig other;
  other.layers = {784, 50, 10};
  const std::unique_ptr<Backend> small = make_backend(BackendKind::Cpu, other, OptimizerConfig{}, 1);
  Model before(other), after(other);
  small->get_parameters(before);
  try {
    small->set_parameters(received.runs());
    ADD_FAILURE() << "runs of another model were installed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("does not have the shape of"), std::string::npos) << e.what();
  }
  small->get_parameters(after);
  EXPECT_TRUE(bit_equal(after.parameters(), before.parameters()));
  // A handle that brings no parameters cannot be waited for in place.
  EXPECT_THROW(client.push(gradients_like(params, 9)).wait_in_place(received), InputError);
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

// A peer sending the same bad request over and over fills no log: each kind is logged once.
TEST_F(ParameterServerBadInput, EachKindOfBadInputIsLoggedOnce) {
  ::testing::internal::CaptureStderr();
  auto nan = gradients_like(params, 540);
  nan[0].values[0] = std::numeric_limits<float>::quiet_NaN();
  for (const uint64_t id : {51, 52, 53})  // each reply comes after the server logged
    expect_error(frames_of(MessageType::PushPull, id, nan), id, "non-finite value at element 0");
  auto type = frames_of(MessageType::Pull, 54, {});
  type[0][6] = 99;  // message type 99
  expect_error(type, 54, "UnknownType");
  const std::string log = ::testing::internal::GetCapturedStderr();
  size_t lines = 0, non_finite = 0;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    if (!test::contains(line, "bad input (")) continue;
    ++lines;
    non_finite += test::contains(line, "non-finite value at element 0");
  }
  EXPECT_EQ(lines, 2u) << log;
  EXPECT_EQ(non_finite, 1u) << log;
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
  expect_error(checkpoint, 34, transport::kUnsupported);
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
  // A name given twice: the reply could not name it twice, and no reply went out at all.
  auto twice_pull = frames_of(MessageType::Pull, 44, {});
  const auto twice = transport::encode_message(
      transport::make_message(MessageType::Pull, 44, 0, {}, "w\nw"), {});
  twice_pull[0] = std::vector<uint8_t>(twice.header_frame.begin(), twice.header_frame.end());
  expect_error(twice_pull, 44, "parameter 'w' named twice");
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

// Idle is said every 50 ms while a worker has no batch. To a server that is gone it used to pile
// up in the socket until the high-water mark (1,000 messages), and then every idle() waited out
// the send timeout (2 s here) before failing, holding the worker's polling up that long. Now one
// that cannot be queued at once is dropped, and idle() never throws.
TEST(PsClient, IdleToAServerThatIsGoneNeitherWaitsNorThrows) {
  std::string endpoint;
  {
    ParameterServer server(ServerOptions{});
    endpoint = server.endpoint();
  }
  PsClient client({endpoint}, client_options(nullptr, 2000));
  const auto start = std::chrono::steady_clock::now();
  for (int k = 0; k < 1500; ++k) client.idle();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500));
}

// A message over the servers' size limit (here a client told the limit is 1,000 bytes): a server
// would drop the connection, which the client could only report as a timeout. It is refused
// before it is sent, saying why and what to do.
TEST(PsClient, AMessageOverTheServersLimitIsRefusedSayingWhy) {
  ParameterServer server(ServerOptions{});
  ClientOptions o = client_options(nullptr, 2000);
  o.limits.max_message_bytes = 1000;
  PsClient client({server.endpoint()}, o);
  const std::vector<NamedTensor> big = {{"w", {300}, test::random_floats(300, 5)}};
  const std::string why = test::error_of<InputError>([&] { client.init(big).wait(); });
  EXPECT_TRUE(test::contains(why, "over the servers' limit of 1000 bytes") &&
              test::contains(why, "use more servers"))
      << why;
}

// Every server's message is made and its size checked before any is sent. Here ps1's part (b and
// c) is over the limit and ps0's (a) is not: had ps0's Init gone out first, ps0 would hold a from
// the refused call and keep it (a server keeps the first Init), while ps1 took the next call's.
TEST(PsClient, AnInitOverTheLimitForOneServerReachesNoServer) {
  zmq::context_t ctx;
  ParameterServer ps0(inproc_options(ctx, "limit-ps0"));
  ParameterServer ps1(inproc_options(ctx, "limit-ps1"));
  ClientOptions o = client_options(&ctx, 2000);
  o.split_tensors = false;
  o.limits.max_message_bytes = 600;
  PsClient client({ps0.endpoint(), ps1.endpoint()}, o);
  const std::vector<NamedTensor> refused = {{"a", {100}, test::random_floats(100, 1)},
                                            {"b", {90}, test::random_floats(90, 2)},
                                            {"c", {90}, test::random_floats(90, 3)}};
  const std::string why = test::error_of<InputError>([&] { client.init(refused).wait(); });
  EXPECT_TRUE(test::contains(why, "to parameter server " + ps1.endpoint() + " would be") &&
              test::contains(why, "over the servers' limit of 600 bytes"))
      << why;
  const std::vector<NamedTensor> taken = {{"a", {100}, test::random_floats(100, 4)},
                                          {"b", {10}, test::random_floats(10, 5)},
                                          {"c", {10}, test::random_floats(10, 6)}};
  EXPECT_TRUE(bit_equal(client.init(taken).wait().tensors, taken));
  EXPECT_EQ(ps0.stats().by_type["Init"], 1);
  EXPECT_EQ(ps1.stats().by_type["Init"], 1);
}

// At the deadline the client looks once more without waiting before it gives a request up: a
// reply that arrived in time but was read late (the caller busy, or an earlier part of the handle
// using the shared deadline up) is taken, not reported as a timeout that resets the connection.
TEST(PsClient, AReplyWaitingPastTheDeadlineIsTakenNotTimedOut) {
  for (const int spin_us : {0, 50}) {
    zmq::context_t ctx;
    ParameterServer server(inproc_options(ctx, "late-read-" + std::to_string(spin_us)));
    ClientOptions o = client_options(&ctx, 500);
    o.spin_us = spin_us;
    PsClient client({server.endpoint()}, o);
    const auto params = small_params(41);
    client.init(params).wait();
    PsClient::Handle pulled = client.pull();
    ASSERT_TRUE(test::eventually([&] { return server.stats().pulls == 1; }, 2000, 1));
    std::this_thread::sleep_for(std::chrono::milliseconds(600));  // past the 500 ms deadline
    EXPECT_TRUE(bit_equal(pulled.wait().tensors, params)) << "spin_us " << spin_us;
    EXPECT_TRUE(bit_equal(client.pull().wait().tensors, params)) << "spin_us " << spin_us;
  }
}

// Sends Init until a server started again answers it (a request sent before the client's
// socket has reconnected times out): true once one is answered, within 20 tries.
bool init_once_answered(PsClient& client, const std::vector<NamedTensor>& params) {
  for (int attempt = 0; attempt < 20; ++attempt) {
    try {
      client.init(params).wait();
      return true;
    } catch (const transport::TransportError&) {
    }
  }
  return false;
}

// A request to a server that is gone waits in the client's socket. Once the caller has given it
// up (timed out), a server started again at the address must not receive it: the caller may
// send that gradient again, and it would be applied twice.
TEST(PsClient, ARequestThatTimedOutIsNotDeliveredToAServerStartedLater) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(31);
  ServerOptions o = inproc_options(ctx, "unused");
  o.bind = "ipc://" + dir.file("ps.sock");  // the same address again for the second server
  PsClient client({o.bind}, client_options(&ctx, 300));
  {
    ParameterServer server(o);
    client.init(params).wait();
  }
  // The client's socket notices the server is gone (and tries to reconnect).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_THROW(client.push_pull(gradients_like(params, 3100)).wait(), transport::TransportError);
  ParameterServer again(o);
  ASSERT_TRUE(init_once_answered(client, params));
  const ServerStats st = client.stats().at(0);
  EXPECT_EQ(st.by_type.count("PushPull"), 0u) << "the abandoned PushPull reached the new server";
  EXPECT_EQ(st.version, 0);
}

// libzmq replaces the file at an ipc:// path as it binds: a second server given a live server's
// path took its address from under it. Refused, naming the path, the first one serving on; a file
// left by a server gone (nothing listening) is replaced as before.
TEST(ParameterServer, AnIpcPathInUseIsRefusedAndALeftOverFileReplaced) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(34);
  ServerOptions o = inproc_options(ctx, "unused");
  o.bind = "ipc://" + dir.file("ps.sock");
  {
    ParameterServer first(o);
    const std::string why =
        test::error_of<transport::TransportError>([&] { ParameterServer second(o); });
    EXPECT_TRUE(test::contains(why, "a server is listening at " + dir.file("ps.sock"))) << why;
    PsClient client({o.bind}, client_options(&ctx, 2000));
    EXPECT_NO_THROW(client.init(params).wait());  // the first one answers
  }
  const std::string left_over = dir.file("left-over.sock");
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un where{};
  where.sun_family = AF_UNIX;
  std::snprintf(where.sun_path, sizeof(where.sun_path), "%s", left_over.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&where), sizeof(where)), 0);
  ::close(fd);  // the file stays, with nobody listening
  ASSERT_TRUE(std::filesystem::exists(left_over));
  o.bind = "ipc://" + left_over;
  ParameterServer again(o);
  PsClient client({o.bind}, client_options(&ctx, 2000));
  EXPECT_NO_THROW(client.init(params).wait());
}

// libzmq (4.3) leaves the file of an ipc:// path when the socket closes: a stopped server removes
// the one it bound, and not a file that another server has bound at the path since.
TEST(ParameterServer, AStoppedServerRemovesItsIpcFileButNotAnotherServers) {
  zmq::context_t ctx;
  test::TempDir dir;
  ServerOptions o = inproc_options(ctx, "unused");
  o.bind = "ipc://" + dir.file("ps.sock");
  {
    ParameterServer server(o);
    ASSERT_TRUE(std::filesystem::exists(dir.file("ps.sock")));
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("ps.sock")));
  {
    ParameterServer first(o);
    // Another server's socket at the path (its file unlinked first, as libzmq's bind does).
    ASSERT_EQ(::unlink(dir.file("ps.sock").c_str()), 0);
    const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_un where{};
    where.sun_family = AF_UNIX;
    std::snprintf(where.sun_path, sizeof(where.sun_path), "%s", dir.file("ps.sock").c_str());
    ASSERT_EQ(::bind(fd, reinterpret_cast<const sockaddr*>(&where), sizeof(where)), 0);
    ::close(fd);
  }
  EXPECT_TRUE(std::filesystem::exists(dir.file("ps.sock")));
}

// The same with two servers, both gone: the PushPull waits in both sockets, and both are reset
// (once, only the first server's was: the second server got the gradient when it came back).
TEST(PsClient, ARequestThatTimedOutReachesNoServerOfTheHandle) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(32);
  std::vector<ServerOptions> o(2, inproc_options(ctx, "unused"));
  o[0].bind = "ipc://" + dir.file("ps0.sock");
  o[1].bind = "ipc://" + dir.file("ps1.sock");
  PsClient client({o[0].bind, o[1].bind}, client_options(&ctx, 300));
  {
    ParameterServer a(o[0]), b(o[1]);
    client.init(params).wait();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_THROW(client.push_pull(gradients_like(params, 3200)).wait(), transport::TransportError);
  ParameterServer a(o[0]), b(o[1]);
  ASSERT_TRUE(init_once_answered(client, params));
  for (const ServerStats& st : client.stats())
    EXPECT_EQ(st.by_type.count("PushPull"), 0u) << "the abandoned PushPull reached a new server";
}

// A request sent on a connection that was reset since (another request to the server timed
// out) says at once that it was dropped, without resetting the new connection again.
TEST(PsClient, ARequestDroppedByAResetSaysSoAndLeavesTheNewConnectionAlone) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(33);
  ServerOptions o = inproc_options(ctx, "unused");
  o.bind = "ipc://" + dir.file("ps.sock");
  PsClient client({o.bind}, client_options(&ctx, 300));
  {
    ParameterServer server(o);
    client.init(params).wait();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  PsClient::Handle first = client.pull();
  PsClient::Handle second = client.pull();
  EXPECT_THROW(first.wait(), transport::TransportError);  // the reset
  ParameterServer again(o);
  ASSERT_TRUE(init_once_answered(client, params));
  PsClient::Handle third = client.pull();  // on the new connection
  const std::string why = test::error_of<transport::TransportError>([&] { second.wait(); });
  EXPECT_TRUE(test::contains(why, "was dropped when the connection was reset")) << why;
  EXPECT_EQ(third.wait().tensors.size(), params.size());  // its connection was not reset again
}

TEST(ParameterServer, ShutdownStopsServing) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-shutdown"));
  PsClient client({server.endpoint()}, client_options(&ctx, 300));
  client.init(small_params(10)).wait();
  client.shutdown_servers();
  test::eventually([&] { return !server.serving(); }, 1000);
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

struct SyncTimeouts {
  int step_ms = 4000;  // not reached when both push
  int worker_ms = ServerOptions().worker_timeout_ms;
  int client_ms = 5000;
  // The cap on the two above (ServerOptions::longest_wait_ms); 0: no lower than either.
  int longest_ms = 0;
};

// A sync-mode server that aggregates two replicas and two registered clients; `a` initialised
// the parameters. `b` may be dropped (reset) to stand for a worker gone.
struct TwoReplicaSyncServer {
  TwoReplicaSyncServer(const std::string& name, const std::vector<NamedTensor>& params,
                       SyncTimeouts t = {})
      : server(options(ctx, name, t)),
        a({server.endpoint()}, client_options(&ctx, t.client_ms)),
        b(std::make_unique<PsClient>(std::vector<std::string>{server.endpoint()},
                                     client_options(&ctx, t.client_ms))) {
    a.init(params).wait();
    b->init({}).wait();
  }
  static ServerOptions options(zmq::context_t& ctx, const std::string& name, SyncTimeouts t) {
    ServerOptions o = mode_options(ctx, name, PsMode::Sync);
    o.replicas_to_aggregate = 2;
    o.step_timeout_ms = t.step_ms;
    o.worker_timeout_ms = t.worker_ms;
    o.longest_wait_ms =
        t.longest_ms > 0 ? t.longest_ms : std::max({o.longest_wait_ms, t.step_ms, t.worker_ms});
    return o;
  }
  // The first step, on both clients' gradients, mirrored in `ref`.
  void step_on_both(ReferenceAdam& ref, const std::vector<NamedTensor>& params, uint32_t seed) {
    const auto ga = gradients_like(params, seed), gb = gradients_like(params, seed + 1);
    auto ha = a.push_pull(ga);
    auto hb = b->push_pull(gb);
    EXPECT_EQ(ha.wait().version, 1u);  // one step on both gradients
    EXPECT_EQ(hb.wait().version, 1u);
    ref.apply(mean_of(ga, gb));
  }
  zmq::context_t ctx;
  ParameterServer server;
  PsClient a;
  std::unique_ptr<PsClient> b;
};

int64_t ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start)
      .count();
}

TEST(PsMode, SyncAggregatesReplicasIntoOneAdamStepOnTheMean) {
  const auto params = small_params(20);
  TwoReplicaSyncServer sync("ps-sync-mean", params);
  ParameterServer& server = sync.server;
  PsClient &a = sync.a, &b = *sync.b;
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
  const auto params = small_params(21);
  TwoReplicaSyncServer sync("ps-sync-stale", params);
  zmq::context_t& ctx = sync.ctx;
  ParameterServer& server = sync.server;
  PsClient &a = sync.a, &b = *sync.b;
  PsClient late({server.endpoint()}, client_options(&ctx));
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
  test::eventually([&] { return server.stats().stale_dropped >= 2; }, 500);
  s = server.stats();
  EXPECT_EQ(s.stale_dropped, 2);
  EXPECT_EQ(s.version, 2);
  EXPECT_TRUE(bit_equal(a.pull().wait().tensors, ref.w));
}

// A signal handled on the server's thread or on a client's (Ctrl-C's stop handler may land on
// any thread) interrupts their polls: the server goes on serving and the client on waiting, where
// the EINTR that cppzmq throws ended the process (server) or failed the exchange (client).
TEST(ParameterServer, ServesThroughSignalsLandingOnItsThreads) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-signals"));
  const auto params = small_params(30);
  PsClient client({server.endpoint()}, client_options(&ctx));
  client.init(params).wait();
  const auto gradients = gradients_like(params, 3000);
  const test::StormRun run = test::repeat_during_signal_storm(
      std::chrono::seconds(1), [&] { client.push_pull(gradients).wait(); });
  EXPECT_EQ(run.failure, "");
  EXPECT_GT(run.steps, 10);
  EXPECT_GT(run.signals, 100);
  EXPECT_EQ(server.stats().version, run.steps);
}

// A blocking send under a time limit (ZMQ_SNDTIMEO) that signals keep interrupting still times
// out: each EINTR restarted the whole limit, so signals coming faster than it (a profiler's
// timer) kept the send waiting for as long as they came.
TEST(ZmqThroughSignals, ASendKeptInterruptedStillTimesOut) {
  zmq::context_t ctx;
  zmq::socket_t socket(ctx, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::sndtimeo, 200);  // connected to nothing: a send waits this long
  struct sigaction action {};
  action.sa_handler = [](int) {};
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;  // as the stop handler's: poll-like calls still see EINTR
  ASSERT_EQ(sigaction(SIGUSR1, &action, nullptr), 0);  // (stays: a late signal must not kill)
  std::atomic<bool> go{false};
  std::atomic<double> seconds{-1.0};
  bool sent = true;
  std::thread sender([&] {  // started before the storm: its signals land here too
    while (!go) std::this_thread::yield();
    const auto start = std::chrono::steady_clock::now();
    sent = transport::send_through_signals(socket, zmq::str_buffer("x"), zmq::send_flags::none)
               .has_value();
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  });
  // Aimed at the sending thread (a process-wide storm may land on any thread not blocking it,
  // OpenBLAS's among them), every 200 us, for 3 s at most.
  int64_t signals = 0;
  go = true;
  const auto storm_until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (seconds.load() < 0.0 && std::chrono::steady_clock::now() < storm_until) {
    if (pthread_kill(sender.native_handle(), SIGUSR1) == 0) ++signals;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  sender.join();
  EXPECT_FALSE(sent);
  EXPECT_GT(signals, 10);
  EXPECT_LT(seconds.load(), 2.0) << "the send outlasted its 200 ms limit while signals came";
}

// Two gradients that are each finite can sum past float32's range: the step is dropped (counted,
// parameters and version as they were) instead of stepping on an infinite mean, which turned the
// parameters into NaN for good (tests/fuzz/ps_shard_fuzz.cpp checks it too). Both workers still
// get the parameters, and the next step goes on as usual.
TEST(PsMode, SyncDropsAStepWhoseSummedGradientsOverflow) {
  const auto params = small_params(24);
  TwoReplicaSyncServer sync("ps-sync-overflow", params);
  PsClient &a = sync.a, &b = *sync.b;
  auto huge = gradients_like(params, 1700);
  huge[0].values[5] = 3e38f;  // finite; twice it is not
  auto ha = a.push_pull(huge);
  auto hb = b.push_pull(huge);
  const PsResult ra = ha.wait(), rb = hb.wait();
  EXPECT_EQ(ra.version, 0u);
  EXPECT_EQ(rb.version, 0u);
  EXPECT_TRUE(bit_equal(ra.tensors, params));
  EXPECT_TRUE(bit_equal(rb.tensors, params));
  ServerStats s = sync.server.stats();
  EXPECT_EQ(s.overflowed_steps, 1);
  EXPECT_EQ(s.version, 0);
  EXPECT_EQ(s.pushes, 2);
  EXPECT_EQ(a.stats().at(0).overflowed_steps, 1);  // over the wire too
  // The next step is an ordinary one, on the mean of its own gradients only.
  ReferenceAdam ref(params);
  const auto ga = gradients_like(params, 1800), gb = gradients_like(params, 1900);
  auto ha2 = a.push_pull(ga);
  auto hb2 = b.push_pull(gb);
  ref.apply(mean_of(ga, gb));
  EXPECT_EQ(ha2.wait().version, 1u);
  EXPECT_TRUE(bit_equal(hb2.wait().tensors, ref.w));
}

// A worker that registered and left before its first push (killed while starting): the first
// step waits out the step timeout for it, and no later one does (a cluster whose worker died
// that early would otherwise take step_timeout_ms per step for the rest of its run).
TEST(PsMode, SyncWorkerThatNeverPushesHoldsBackOnlyTheFirstStep) {
  zmq::context_t ctx;
  ServerOptions o = mode_options(ctx, "ps-sync-departed", PsMode::Sync);
  o.replicas_to_aggregate = 2;
  o.step_timeout_ms = 1000;
  ParameterServer server(o);
  const auto params = small_params(22);
  PsClient a({server.endpoint()}, client_options(&ctx, 5000));
  a.init(params).wait();
  {
    PsClient b({server.endpoint()}, client_options(&ctx, 5000));
    b.init({}).wait();
  }  // b's socket closes before it ever pushes
  ReferenceAdam ref(params);
  for (int step = 1; step <= 3; ++step) {
    const auto g = gradients_like(params, 1700 + uint32_t(step));
    const auto start = std::chrono::steady_clock::now();
    const PsResult r = a.push_pull(g).wait();
    const int64_t ms = ms_since(start);
    if (step == 1) {
      EXPECT_GE(ms, 900);   // it did wait for the other replica...
      EXPECT_LT(ms, 3000);  // ...but only until the step timeout
    } else {
      EXPECT_LT(ms, 900) << "step " << step << " waited for the worker that never came";
    }
    ref.apply(g);  // a partial step: the mean of the one gradient that came
    EXPECT_EQ(r.version, uint64_t(step));
    EXPECT_FALSE(r.stale);
    EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  }
  EXPECT_EQ(server.stats().partial_steps, 3);
  // A worker that comes late counts again from its first push: the next step waits for both.
  PsClient late({server.endpoint()}, client_options(&ctx, 5000));
  late.init({}).wait();  // on version 3
  const auto gl = gradients_like(params, 1710), ga = gradients_like(params, 1711);
  late.push(gl).wait();  // one-way, current: joins the aggregate, which now needs both
  test::eventually([&] { return server.stats().pushes >= 4; }, 1000);  // sent, not yet arrived
  ASSERT_EQ(server.stats().pushes, 4);
  const PsResult r = a.push_pull(ga).wait();
  ref.apply(mean_of(gl, ga));
  EXPECT_EQ(r.version, 4u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  EXPECT_EQ(server.stats().partial_steps, 3);
}

// A worker that pushed and then left for good: once it is silent for worker_timeout_ms, steps
// need only the gradients of the workers still pushing, instead of each waiting out the step
// timeout (a cluster whose worker was killed goes on at full speed).
TEST(PsMode, SyncStepsWithTheWorkersLeftOnceOneIsGone) {
  const auto params = small_params(24);
  TwoReplicaSyncServer sync("ps-sync-gone", params, {10000, 300, 5000});
  ParameterServer& server = sync.server;
  PsClient& a = sync.a;
  ReferenceAdam ref(params);
  sync.step_on_both(ref, params, 1900);
  sync.b.reset();  // b is gone
  for (int step = 2; step <= 5; ++step) {
    const auto g = gradients_like(params, 1900 + uint32_t(step));
    const auto start = std::chrono::steady_clock::now();
    const PsResult r = a.push_pull(g).wait();
    EXPECT_LT(ms_since(start), 2000);  // the first waits ~300 ms for b to count as gone
    ref.apply(g);
    EXPECT_EQ(r.version, uint64_t(step));
    EXPECT_TRUE(bit_equal(r.tensors, ref.w)) << step;
  }
  EXPECT_EQ(server.stats().partial_steps, 4);  // steps on fewer than replicas_to_aggregate
}

// A worker back from idling pulls the current parameters before it computes: from that pull the
// server waits for its gradient again, even before a step has cleared its Idle. Otherwise the
// other worker's push was applied alone and the returning worker's gradient, computed on the
// version it had just pulled, was dropped as stale.
TEST(PsMode, SyncWaitsAgainForAWorkerThatPulledAfterIdling) {
  const auto params = small_params(27);
  TwoReplicaSyncServer sync("ps-sync-resume", params, {60000, 60000, 10000});
  ParameterServer& server = sync.server;
  PsClient &a = sync.a, &b = *sync.b;
  ReferenceAdam ref(params);
  sync.step_on_both(ref, params, 2700);
  b.idle();
  EXPECT_EQ(b.pull().wait().version, 1u);  // back at work (the Idle went first: one socket)
  const auto ga = gradients_like(params, 2710), gb = gradients_like(params, 2720);
  auto ha = a.push_pull(ga);
  auto hb = b.push_pull(gb);
  const PsResult ra = ha.wait(), rb = hb.wait();
  ref.apply(mean_of(ga, gb));
  EXPECT_EQ(ra.version, 2u);
  EXPECT_FALSE(rb.stale);
  EXPECT_TRUE(bit_equal(rb.tensors, ref.w));
  EXPECT_EQ(server.stats().stale_dropped, 0);
}

// Workers whose batches take longer than the timeouts (a step's 200 ms, a worker's 300 ms; each
// "batch" a 400 ms sleep, b's 300 ms more, after a first of 290 ms that shows the server their
// pace) still make every step together: each counts for three of its push gaps, and a step waits
// as long for the second gradient. With the bare timeouts, b looked gone whenever a pushed first,
// each step was applied on a's gradient alone and b's was dropped as stale, every round.
TEST(PsMode, SyncWaitsForWorkersWhoseBatchesTakeLongerThanTheTimeouts) {
  const auto params = small_params(25);
  TwoReplicaSyncServer sync("ps-sync-slow", params, {200, 300, 10000});
  ParameterServer& server = sync.server;
  PsClient &a = sync.a, &b = *sync.b;
  ReferenceAdam ref(params);
  sync.step_on_both(ref, params, 2500);
  for (int step = 2; step <= 5; ++step) {
    std::this_thread::sleep_for(std::chrono::milliseconds(step == 2 ? 290 : 400));
    const auto ga = gradients_like(params, 2500 + 10 * uint32_t(step));
    const auto gb = gradients_like(params, 2505 + 10 * uint32_t(step));
    auto ha = a.push_pull(ga);
    // b is slower still: its gradient comes after the step timeout of a's.
    if (step > 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    auto hb = b.push_pull(gb);
    const PsResult ra = ha.wait(), rb = hb.wait();
    ref.apply(mean_of(ga, gb));
    EXPECT_EQ(ra.version, uint64_t(step));
    EXPECT_FALSE(rb.stale) << step;
    EXPECT_TRUE(bit_equal(rb.tensors, ref.w)) << step;
  }
  const ServerStats stats = server.stats();
  EXPECT_EQ(stats.partial_steps, 0);
  EXPECT_EQ(stats.stale_dropped, 0);
}

// The step and worker timeouts are capped at longest_wait_ms, which the cluster sets below the
// workers' request timeout: a partial step held a worker's PushPull past that timeout (2 s against
// --ps-timeout 1000), the worker pushed its gradient again, and the step counted it twice. (Either
// cap alone keeps this step within longest_wait_ms, b silent ceasing to count or the step's own
// timeout ending it: the test fails with neither.)
TEST(PsMode, APartialStepWaitsNoLongerThanTheLongestWait) {
  const auto params = small_params(27);
  SyncTimeouts t;
  t.step_ms = t.worker_ms = 4000;
  t.client_ms = 3000;  // a step held 4 s times this out: RequestTimedOut fails the test
  t.longest_ms = 1000;  // (the first step's two pushes must come within it)
  TwoReplicaSyncServer sync("ps-sync-longest", params, t);
  ReferenceAdam ref(params);
  sync.step_on_both(ref, params, 2700);
  const auto g = gradients_like(params, 2702);
  const PsResult r = sync.a.push_pull(g).wait();  // b never pushes again
  ref.apply(g);  // the mean of the one gradient the step had
  EXPECT_EQ(r.version, 2u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  EXPECT_EQ(sync.server.stats().pushes, 3);
  ServerOptions none = TwoReplicaSyncServer::options(sync.ctx, "ps-sync-no-wait", t);
  none.longest_wait_ms = 0;
  const std::string why = test::error_of<InputError>([&] { ParameterServer refused(none); });
  EXPECT_NE(why.find("longest_wait_ms must be at least 1"), std::string::npos) << why;
}

// A worker with no batch for now (the end of an epoch's share) says Idle: the step waiting for its
// gradient is applied on the others' at once, not after worker_timeout_ms (60 s here: longer than
// the client's timeout, so a step that still waited fails the test). The next step waits for it
// again, and an Idle from a worker the server has not seen push, or one with tensors, changes
// nothing.
TEST(PsMode, SyncStepNeedNotWaitForAnIdleWorker) {
  const auto params = small_params(26);
  TwoReplicaSyncServer sync("ps-sync-idle", params, {60000, 60000, 10000});
  ParameterServer& server = sync.server;
  PsClient &a = sync.a, &b = *sync.b;
  PsClient reader({server.endpoint()}, client_options(&sync.ctx, 10000));
  reader.init({}).wait();
  ReferenceAdam ref(params);
  sync.step_on_both(ref, params, 2600);
  // a's next gradient waits for b's; b has no batch and says so.
  const auto g2 = gradients_like(params, 2602);
  auto h2 = a.push_pull(g2);
  reader.idle();  // never pushed: not a worker the step waits for, so this changes nothing
  test::eventually([&] { return server.stats().by_type.count("Idle") != 0; }, 5000);
  EXPECT_EQ(server.stats().version, 1);
  b.idle();
  const PsResult r2 = h2.wait();
  ref.apply(g2);
  EXPECT_EQ(r2.version, 2u);
  EXPECT_TRUE(bit_equal(r2.tensors, ref.w));
  EXPECT_EQ(server.stats().partial_steps, 1);
  // b counts again once a step is applied: the next step takes both gradients (b's computed on
  // the version it pulls, as a worker's first after a pause: one on version 1 would be stale).
  EXPECT_EQ(b.pull().wait().version, 2u);
  const auto g3a = gradients_like(params, 2603), g3b = gradients_like(params, 2604);
  auto h3a = a.push_pull(g3a);
  test::eventually([&] { return server.stats().pushes >= 4; }, 5000);
  EXPECT_EQ(server.stats().version, 2);  // held for b
  auto h3b = b.push_pull(g3b);
  ref.apply(mean_of(g3a, g3b));
  EXPECT_TRUE(bit_equal(h3a.wait().tensors, ref.w));
  EXPECT_EQ(h3b.wait().version, 3u);
  EXPECT_EQ(server.stats().partial_steps, 1);
}

// A worker's clock is its pushes: with k = 1 the fast worker may be one push ahead of the slow
// one, not two.
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
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1800)).wait().version, 1u);  // slow: 1 push
  EXPECT_EQ(fast.push_pull(gradients_like(params, 1801)).wait().version, 2u);  // fast: 1
  EXPECT_EQ(fast.push_pull(gradients_like(params, 1802)).wait().version, 3u);  // 2: 1 ahead
  // A third push, 2 ahead of the slow worker's 1 > k = 1: the reply waits.
  auto pending = std::async(std::launch::async, [&] {
    return fast.push_pull(gradients_like(params, 1803)).wait().version;
  });
  // (Waited for, not assumed after a fixed time: the push may take a while to reach the server.)
  test::eventually([&] { return server.stats().deferred >= 1; }, 5000);
  EXPECT_EQ(server.stats().deferred, 1);
  EXPECT_EQ(pending.wait_for(std::chrono::milliseconds(0)), std::future_status::timeout);
  // The slow worker's second push: now 3 - 2 <= 1, the fast one goes on.
  const auto slow_heard = std::chrono::steady_clock::now();  // no later than the server hears it
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1804)).wait().version, 5u);
  ASSERT_EQ(pending.wait_for(std::chrono::milliseconds(1000)), std::future_status::ready);
  EXPECT_EQ(pending.get(), 5u);
  // Fast's fourth push, 2 ahead: deferred until the silent slow worker times out (300 ms after
  // the server last heard it; without that, the client's 3 s timeout throws).
  const PsResult r = fast.push_pull(gradients_like(params, 1805)).wait();
  EXPECT_EQ(r.version, 6u);
  EXPECT_GE(ms_since(slow_heard), 300);
  EXPECT_EQ(server.stats().deferred, 2);
  // Once the slow worker is inactive the fast one is not held back (a held pull would wait for
  // the client's 3 s timeout).
  const auto start2 = std::chrono::steady_clock::now();
  EXPECT_EQ(fast.pull().wait().version, 6u);
  EXPECT_LT(ms_since(start2), 1000);
  // Back after its silence, the slow worker starts level with the fast one (4 pushes): neither
  // is held for the other's missed pushes.
  const auto start3 = std::chrono::steady_clock::now();
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1806)).wait().version, 7u);
  EXPECT_EQ(fast.push_pull(gradients_like(params, 1807)).wait().version, 8u);
  EXPECT_EQ(slow.push_pull(gradients_like(params, 1808)).wait().version, 9u);
  EXPECT_LT(ms_since(start3), 250);
  EXPECT_EQ(server.stats().deferred, 2);
}

// Two servers that see two workers' pushes in opposite orders. With clocks taken from the
// parameter versions (each server's own order), k = 0 held worker A on one server for B and B on
// the other for A, until the worker timeout; pushes counted agree on every server.
TEST(PsMode, BoundedStalenessAgreesAcrossServersWhateverOrderPushesArriveIn) {
  zmq::context_t ctx;
  ServerOptions o0 = mode_options(ctx, "ps-bounded-order-0", PsMode::BoundedStaleness);
  ServerOptions o1 = mode_options(ctx, "ps-bounded-order-1", PsMode::BoundedStaleness);
  for (ServerOptions* o : {&o0, &o1}) {
    o->staleness_bound = 0;
    o->worker_timeout_ms = 5000;
  }
  ParameterServer s0(o0), s1(o1);
  const auto params = small_params(25);
  // Each worker talks to the servers in the other order: its requests reach its first server
  // before its second.
  PsClient a({s0.endpoint(), s1.endpoint()}, client_options(&ctx, 3000));
  PsClient b({s1.endpoint(), s0.endpoint()}, client_options(&ctx, 3000));
  a.init(params).wait();
  b.init({}).wait();
  // A round held for the other worker would wait out the clients' 3 s timeout (the servers
  // would release it only after their 5 s worker timeout) and throw.
  for (int round = 0; round < 20; ++round) {
    auto ha = a.push_pull(gradients_like(params, 2500 + 2 * uint32_t(round)));
    auto hb = b.push_pull(gradients_like(params, 2501 + 2 * uint32_t(round)));
    ha.wait();
    hb.wait();
  }
  for (ParameterServer* s : {&s0, &s1}) EXPECT_EQ(s->stats().version, 40);
}

// A worker that overlaps installs the next reply before it pushes the gradient of the parameters
// before: the push says the versions they had (computed_on), or its staleness reads one too low.
TEST(PsMode, APushPullSaysTheVersionsItsGradientWasComputedOn) {
  zmq::context_t ctx;
  ParameterServer server(inproc_options(ctx, "ps-computed-on"));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(24);
  client.init(params).wait();
  transport::HeldPool<std::vector<NamedTensor>> buffers;
  auto buffer = buffers.take();
  buffer->value = gradients_like(params, 1960);
  const std::vector<uint64_t> before = client.versions();
  EXPECT_EQ(before, std::vector<uint64_t>{0});
  EXPECT_EQ(client.push_pull(buffer).wait().version, 1u);  // on 0 at 0: staleness 0
  EXPECT_EQ(client.versions(), std::vector<uint64_t>{1});
  buffer = buffers.take();
  buffer->value = gradients_like(params, 1961);
  EXPECT_EQ(client.push_pull(buffer, &before).wait().version, 2u);  // on 0 at 1: staleness 1
  const ServerStats s = client.stats().at(0);
  EXPECT_EQ(s.staleness[0], 1);
  EXPECT_EQ(s.staleness[1], 1);
  const std::vector<uint64_t> two_servers{0, 0};
  EXPECT_THROW(client.push_pull(buffer, &two_servers), InputError);
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
                          "\"partial_steps\"", "\"overflowed_steps\"", "\"deferred\"",
                          "\"pushes\":1", "\"pulls\":1"})
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  const ServerStats back = client.stats().at(0);  // over the wire, parsed back
  EXPECT_EQ(back.mode, "sync");
  EXPECT_EQ(back.version, 1);
  EXPECT_EQ(back.staleness[0], 1);
  EXPECT_GT(back.seconds, 0.0);
  EXPECT_GT(back.pushes_per_s, 0.0);
  EXPECT_GT(back.pulls_per_s, 0.0);
}

// A server's stats come from another process (perhaps of another release): each field is read
// as its type or refused naming it, where nlohmann's conversions cast 1e300 to an integer
// (undefined) and named nothing.
TEST(PsMode, StatsFromAServerAreReadFieldByField) {
  ServerStats s;
  s.mode = "bounded_staleness";
  s.version = 12;
  s.pushes = 30;
  s.staleness[6] = 4;
  s.seconds = 2.5;
  s.by_type["PushPull"] = 30;
  const nlohmann::json good = nlohmann::json::parse(to_json(s));
  const ServerStats back = stats_from_json(good.dump());
  EXPECT_EQ(back.mode, s.mode);
  EXPECT_EQ(back.version, 12);
  EXPECT_EQ(back.staleness[6], 4);
  EXPECT_EQ(back.by_type, s.by_type);
  nlohmann::json older = good;  // from before these were counted
  older.erase("curve_rejected");
  older.erase("overflowed_steps");
  EXPECT_EQ(stats_from_json(older.dump()).curve_rejected, 0);
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = good;
    j[key] = std::move(value);
    return j.dump();
  };
  nlohmann::json no_bucket = good;
  no_bucket["staleness_histogram"].erase("16+");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"{", "server stats: not JSON"},
      {"[1]", "server stats: [1] is not an object"},
      {with("version", 1e300), "server stats: 'version' is 1e+300, expected an integer"},
      {with("pushes", "many"), "'pushes' is \"many\", expected an integer"},
      {with("seconds", nullptr), "'seconds' is null, expected a number"},
      {with("by_type", {{"Push", 2.5}}), "by_type: 'Push' is 2.5, expected an integer"},
      {no_bucket.dump(), "staleness_histogram: '16+' is missing"},
  };
  for (const auto& [text, expected] : bad) {
    const std::string why = test::error_of<InputError>([&] { stats_from_json(text); });
    EXPECT_TRUE(test::contains(why, expected)) << text << ": " << why;
  }
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
  EXPECT_EQ(file.metadata.count("epochs_whole"), 0u);  // not in a cluster run: not said
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
  EXPECT_EQ(transport::decode_error_reason(reply.extra).kind, transport::kUnsupported)
      << reply.extra;
}

// A Checkpoint request is answered once its file is written, and the server serves on meanwhile:
// a Stats request sent after it is answered first (writing and syncing 48 MB, the parameters and
// Adam's moments, takes far longer than a Stats reply).
TEST(PsCheckpoint, ServingGoesOnWhileARequestedCheckpointIsWritten) {
  zmq::context_t ctx;
  test::TempDir dir;
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-serving", dir));
  PsClient client({server.endpoint()}, client_options(&ctx));
  const std::vector<NamedTensor> params = {{"w", {4000, 1000}, std::vector<float>(4000000, 0.5f)}};
  client.init(params).wait();
  client.push_pull(gradients_like(params, 4050)).wait();
  RawPeer raw(ctx, server.endpoint());
  raw.send(frames_of(MessageType::Checkpoint, 81, {}));
  raw.send(frames_of(MessageType::Stats, 82, {}));
  transport::Message first, second;
  ASSERT_TRUE(raw.receive(first, 10000));
  ASSERT_TRUE(raw.receive(second, 10000));
  EXPECT_EQ(first.header.request_id, 82u) << "the Stats request waited for the write";
  EXPECT_EQ(second.header.request_id, 81u);
  EXPECT_EQ(second.header.type, MessageType::Reply) << second.extra;
  EXPECT_EQ(second.extra, dir.file("ps0-step-1.safetensors"));
  EXPECT_EQ(read_safetensors(second.extra).metadata.at("step"), "1");
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
  // The writer thread writes and prunes behind the serving thread: wait for the step-6 file and
  // the pruning after it. Snapshots at steps 2, 4 and 6 were taken; one that had not started
  // when the next came is replaced by it, so the file before step 6 is step 2's or step 4's, or
  // there is none when the writer had started neither (a loaded machine: both were replaced).
  test::eventually([&] {
    const auto files = shard_files(dir);
    return !files.empty() && files.size() <= 2 && files.back() == "shardA-step-6.safetensors";
  }, 5000);
  const auto files = shard_files(dir);
  ASSERT_TRUE(files.size() == 1 || files.size() == 2) << files.size() << " files";
  if (files.size() == 2) {
    EXPECT_TRUE(files[0] == "shardA-step-2.safetensors" || files[0] == "shardA-step-4.safetensors")
        << files[0];
  }
  EXPECT_EQ(files.back(), "shardA-step-6.safetensors");
  for (const auto& f : files) EXPECT_NO_THROW(read_safetensors(dir.file(f))) << f;
  server.stop();  // step 7 changed since step 6: a final checkpoint, written before stop returns
  EXPECT_EQ(shard_files(dir),
            (std::vector<std::string>{"shardA-step-6.safetensors", "shardA-step-7.safetensors"}));
}

SafeTensorsFile one_tensor_file(float value) {
  SafeTensorsFile f;
  SafeTensor t{"w", "F32", {1}, std::vector<uint8_t>(4)};
  std::memcpy(t.data.data(), &value, 4);
  f.tensors.push_back(t);
  return f;
}

TEST(PsCheckpoint, WriterReplacesASnapshotThatHasNotStartedAndReportsFailures) {
  test::TempDir dir;
  std::mutex mutex;
  std::condition_variable released_cv;
  bool released = false, first_done = false;
  std::vector<int64_t> written;
  CheckpointWriter writer("test", [&](const std::string&, int64_t step) {
    std::unique_lock<std::mutex> lock(mutex);
    written.push_back(step);
    if (step != 1) return;
    first_done = true;
    released_cv.notify_all();
    released_cv.wait(lock, [&] { return released; });  // hold the writer inside job 1
  });
  writer.submit(dir.file("s-1.safetensors"), 1, one_tensor_file(1));
  {
    std::unique_lock<std::mutex> lock(mutex);
    released_cv.wait(lock, [&] { return first_done; });
  }
  // Job 1 is being written: job 2 waits, and job 3 replaces it before it starts.
  writer.submit(dir.file("s-2.safetensors"), 2, one_tensor_file(2));
  writer.submit(dir.file("s-3.safetensors"), 3, one_tensor_file(3));
  {
    std::lock_guard<std::mutex> lock(mutex);
    released = true;
  }
  released_cv.notify_all();
  EXPECT_EQ(writer.wait_idle(), "");
  EXPECT_EQ(written, (std::vector<int64_t>{1, 3}));
  EXPECT_FALSE(std::filesystem::exists(dir.file("s-2.safetensors")));
  EXPECT_EQ(read_safetensors(dir.file("s-3.safetensors")).tensors.at(0).data,
            one_tensor_file(3).tensors[0].data);
  // A write that fails (no such directory) is reported by wait_idle, and the next one works.
  writer.submit(dir.file("missing/s-4.safetensors"), 4, one_tensor_file(4));
  const std::string error = writer.wait_idle();
  EXPECT_NE(error.find("missing/s-4.safetensors"), std::string::npos) << error;
  const uint64_t last = writer.submit(dir.file("s-5.safetensors"), 5, one_tensor_file(5));
  EXPECT_EQ(writer.wait_idle(), "");
  EXPECT_TRUE(std::filesystem::exists(dir.file("s-5.safetensors")));
  // Each submission's outcome, by its ticket (1 to 5, in order): its own write's, or for job 2
  // the write of job 3, which replaced it. A failure does not stand for the writes around it.
  ASSERT_EQ(last, 5u);
  const auto outcome = [&](uint64_t ticket) {
    const auto o = writer.outcome_since(ticket);
    return o ? o->path + (o->error.empty() ? "" : ": failed") : std::string("none");
  };
  EXPECT_EQ(outcome(1), dir.file("s-1.safetensors"));
  EXPECT_EQ(outcome(2), dir.file("s-3.safetensors"));
  EXPECT_EQ(outcome(3), dir.file("s-3.safetensors"));
  EXPECT_EQ(outcome(4), dir.file("missing/s-4.safetensors") + ": failed");
  EXPECT_EQ(outcome(5), dir.file("s-5.safetensors"));
  EXPECT_EQ(outcome(6), "none");
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
  // (A step-0 file may come first if the interval passed between Init and the push; the
  // rename makes the step-1 file appear whole.)
  const std::string want = "ps0-step-1.safetensors";
  EXPECT_TRUE(test::eventually([&] {
    const auto files = shard_files(dir);
    return std::find(files.begin(), files.end(), want) != files.end();
  }, 5000, 10));
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

// In a cluster run each checkpoint says the epochs its parameters hold whole, as the coordinator
// last told the server before the snapshot (ServerOptions::epochs_whole), or as the checkpoint it
// resumed from said where it has heard nothing higher since: `launch --resume` goes on after them.
TEST(PsCheckpoint, EachCheckpointSaysTheEpochsItHoldsWhole) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(44);
  auto heard = std::make_shared<std::atomic<int64_t>>(-1);
  auto with_epochs = [&](const std::string& name) {
    ServerOptions o = checkpoint_options(ctx, name, dir);
    o.epochs_whole = [heard] { return heard->load(); };
    return o;
  };
  auto epochs_in = [](const std::string& path) {
    const SafeTensorsFile file = read_safetensors(path);
    return decode_shard_checkpoint(file, path, /*adam=*/true).epochs_whole;
  };
  {
    ParameterServer first(with_epochs("ps-epochs-first"));
    PsClient c({first.endpoint()}, client_options(&ctx));
    c.init(params).wait();
    c.push_pull(gradients_like(params, 4401)).wait();
    EXPECT_EQ(epochs_in(request_checkpoint(ctx, first.endpoint())), -1);  // nothing heard yet
    heard->store(2);
    c.push_pull(gradients_like(params, 4402)).wait();
    const std::string path = request_checkpoint(ctx, first.endpoint());
    EXPECT_EQ(read_safetensors(path).metadata.at("epochs_whole"), "2");
    EXPECT_EQ(epochs_in(path), 2);
  }
  heard->store(-1);  // a restarted server that has not heard from the coordinator yet
  {
    ParameterServer second(with_epochs("ps-epochs-second"));
    PsClient c({second.endpoint()}, client_options(&ctx));
    c.init(params).wait();
    c.push_pull(gradients_like(params, 4403)).wait();
    EXPECT_EQ(epochs_in(request_checkpoint(ctx, second.endpoint())), 2);  // its checkpoint's
    heard->store(5);
    c.push_pull(gradients_like(params, 4404)).wait();
    EXPECT_EQ(epochs_in(request_checkpoint(ctx, second.endpoint())), 5);
    heard->store(6);  // the run's last epoch, counted after that checkpoint of the last step
  }
  // The final checkpoint is written again for it, though the step is the same.
  EXPECT_EQ(epochs_in(dir.file("ps0-step-4.safetensors")), 6);
  // A count that is not a number is a damaged file, named.
  SafeTensorsFile bad = read_safetensors(dir.file("ps0-step-4.safetensors"));
  bad.metadata["epochs_whole"] = "x";
  try {
    decode_shard_checkpoint(bad, "bad.safetensors", true);
    ADD_FAILURE() << "decoded";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.safetensors: metadata epochs_whole 'x'"),
              std::string::npos) << e.what();
  }
}

// `launch --resume` goes on after the epochs every server's checkpoint holds: the fewest of
// them; none when a server has no checkpoint (it starts empty) or one's does not say (an older
// version's). A server with checkpoints none of which reads back refuses the resume.
TEST(PsCheckpoint, AResumeGoesOnAfterTheEpochsEveryServerHolds) {
  zmq::context_t ctx;
  test::TempDir dir;
  {
    ServerOptions o = checkpoint_options(ctx, "ps-resume-point", dir);
    o.epochs_whole = [] { return int64_t{4}; };
    ParameterServer server(o);
    PsClient c({server.endpoint()}, client_options(&ctx));
    const auto params = small_params(45);
    c.init(params).wait();
    c.push_pull(gradients_like(params, 4501)).wait();
    c.push_pull(gradients_like(params, 4502)).wait();
  }  // stop: ps0-step-2, after 4 epochs
  const SafeTensorsFile ps0 = read_safetensors(dir.file("ps0-step-2.safetensors"));
  auto write_ps1 = [&](const std::string& epochs) {
    SafeTensorsFile f = ps0;
    f.metadata["shard"] = "ps1";
    f.metadata["step"] = "1";
    if (epochs.empty()) f.metadata.erase("epochs_whole");
    else f.metadata["epochs_whole"] = epochs;
    write_safetensors_atomic(dir.file("ps1-step-1.safetensors"), f);
  };
  write_ps1("3");
  const std::string d = dir.path().string();
  ResumePoint p = resume_point_of_servers(d, 2, true);
  EXPECT_EQ(p.epochs, 3);
  EXPECT_EQ(p.step, 1);
  EXPECT_EQ(p.highest_step, 2);
  EXPECT_EQ(p.steps, "ps0 at step 2, ps1 at step 1");
  EXPECT_TRUE(p.without_checkpoint.empty());
  EXPECT_FALSE(p.epochs_unsaid);
  EXPECT_EQ(resume_point_of_servers(d, 1, true).epochs, 4);
  p = resume_point_of_servers(d, 3, true);  // ps2 starts empty
  EXPECT_EQ(p.epochs, 0);
  EXPECT_EQ(p.without_checkpoint, std::vector<std::string>{"ps2"});
  write_ps1("");  // an older version's
  p = resume_point_of_servers(d, 2, true);
  EXPECT_EQ(p.epochs, 0);
  EXPECT_TRUE(p.epochs_unsaid);
  test::write_bytes(dir.file("ps1-step-1.safetensors"), "not a checkpoint");
  try {
    resume_point_of_servers(d, 2, true);
    ADD_FAILURE() << "resumed";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("ps1"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("can be restored"), std::string::npos) << e.what();
  }
}

// Replies the client will not wait for are not kept: those of a handle dropped unwaited (a
// worker's overlapped exchange abandoned), and the other servers' when one of a handle's servers
// failed. Before, each stayed in the client for good: a shard of parameters per reply.
TEST(PsClient, RepliesNoHandleWaitsForAreNotKept) {
  zmq::context_t ctx;
  // s1 over TCP: once stopped, a request to it is queued (ZeroMQ reconnects) and times out.
  ServerOptions tcp = inproc_options(ctx, "unused");
  tcp.bind = "tcp://127.0.0.1:*";
  ParameterServer s1(tcp), s0(inproc_options(ctx, "ps-forget-0"));
  PsClient c({s1.endpoint(), s0.endpoint()}, client_options(&ctx, 1000));
  const auto params = small_params(46);
  c.init(params).wait();
  {
    PsClient::Handle dropped = c.push_pull(gradients_like(params, 4600));
    EXPECT_EQ(c.requests_in_flight(), 2u);
  }
  EXPECT_EQ(c.requests_in_flight(), 0u);
  // The replies to the dropped handle arrive while this pull waits for its own: dropped too.
  c.pull().wait();
  EXPECT_EQ(c.requests_in_flight(), 0u);
  // A handle moved keeps its requests; the moved-from one forgets nothing.
  PsClient::Handle first = c.pull();
  PsClient::Handle moved = std::move(first);
  EXPECT_EQ(moved.wait().tensors.size(), params.size());
  EXPECT_EQ(c.requests_in_flight(), 0u);
  // One server gone: the wait fails naming it (the first part waited for), and the other
  // server's reply, which came meanwhile, is not kept.
  s1.stop();
  const std::string why = test::error_of<transport::TransportError>([&] { c.pull().wait(); });
  EXPECT_TRUE(test::contains(why, s1.endpoint() + " did not answer Pull")) << why;
  EXPECT_EQ(c.requests_in_flight(), 0u);
}

// A server restarted from an older checkpoint counts from there: the client's pushes say they
// were computed on the version its latest reply carried, not on the largest it ever saw (which
// the restarted server would take for a future version, so a stale gradient for a fresh one).
TEST(PsCheckpoint, AClientFollowsARestartedServerBackToItsCheckpointsVersion) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(45);
  ServerOptions o = checkpoint_options(ctx, "unused", dir);
  o.bind = "ipc://" + dir.file("ps.sock");  // the same address again: the client reconnects
  PsClient c({o.bind}, client_options(&ctx, 1000));
  {
    ParameterServer server(o);
    c.init(params).wait();
    c.push_pull(gradients_like(params, 4500)).wait();
    request_checkpoint(ctx, server.endpoint());  // ps0-step-1
    for (int i = 0; i < 3; ++i) c.push_pull(gradients_like(params, 4510 + uint32_t(i))).wait();
    EXPECT_EQ(c.last_version(0), 4u);
  }  // stop: ps0-step-4, removed below, as if the server had been killed before writing it
  std::filesystem::remove(dir.file("ps0-step-4.safetensors"));
  ParameterServer restarted(o);
  ASSERT_EQ(restarted.restored_from(), dir.file("ps0-step-1.safetensors"));
  // A request sent before the client's socket has noticed the restart is lost (as a worker's
  // is: it times out and pulls again).
  bool answered = false;
  for (int attempt = 0; attempt < 10 && !answered; ++attempt) {
    try {
      EXPECT_EQ(c.pull().wait().version, 1u);
      answered = true;
    } catch (const transport::TransportError&) {
    }
  }
  ASSERT_TRUE(answered);
  EXPECT_EQ(c.last_version(0), 1u);
  const PsResult r = c.push_pull(gradients_like(params, 4520)).wait();
  EXPECT_EQ(r.version, 2u);
  EXPECT_EQ(c.last_version(0), 2u);
  // Its next push is on version 2, the server's own: no staleness counted.
  c.push_pull(gradients_like(params, 4530)).wait();
  const ServerStats st = c.stats().at(0);
  EXPECT_EQ(st.staleness[0], 2);
}

// A server (options `o`) that initialised `params`, took one step (gradients of `seed`) and
// wrote ps0-step-1 at its stop.
void one_step_checkpointed(zmq::context_t& ctx, ServerOptions o,
                           const std::vector<NamedTensor>& params, uint32_t seed) {
  ParameterServer server(std::move(o));
  PsClient c({server.endpoint()}, client_options(&ctx));
  c.init(params).wait();
  c.push_pull(gradients_like(params, seed)).wait();
}

// A server resumed from a checkpoint of another model (or of another number of servers, whose
// parts differ) refuses the chief's Init, naming the checkpoint, instead of serving parameters
// the workers' model does not have; the model it holds is still served to its own Init.
TEST(PsCheckpoint, AnInitForAnotherModelThanTheRestoredOneIsRefused) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(47);
  one_step_checkpointed(ctx, checkpoint_options(ctx, "ps-ckpt-model-a", dir), params, 4700);
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-model-b", dir));
  ASSERT_EQ(server.restored_from(), dir.file("ps0-step-1.safetensors"));
  auto wider = params;
  wider[0] = {"w", {3, 5}, test::random_floats(15, 48)};
  auto renamed = params;
  renamed[1].name = "bias";
  for (const auto* other : {&wider, &renamed}) {
    PsClient c({server.endpoint()}, client_options(&ctx));
    const std::string why = test::error_of<ServerError>([&] { c.init(*other).wait(); });
    EXPECT_TRUE(test::contains(why, "restored from checkpoint " +
                                        dir.file("ps0-step-1.safetensors"))) << why;
    EXPECT_TRUE(test::contains(why, "this server holds b [4], w [3x4]")) << why;
  }
  PsClient same({server.endpoint()}, client_options(&ctx));
  EXPECT_EQ(same.init(small_params(999)).wait().version, 1u);
}

// A server that wrote ps0-step-1 (on request) and ps0-step-2 (at its stop) into `dir`: the
// parameters at step 1.
std::vector<NamedTensor> two_checkpoints(zmq::context_t& ctx, const test::TempDir& dir,
                                         const std::string& name, uint32_t seed) {
  const auto params = small_params(seed);
  ParameterServer server(checkpoint_options(ctx, name, dir));
  PsClient c({server.endpoint()}, client_options(&ctx));
  c.init(params).wait();
  std::vector<NamedTensor> at_step_1 =
      c.push_pull(gradients_like(params, seed * 100)).wait().tensors;
  request_checkpoint(ctx, server.endpoint());
  c.push_pull(gradients_like(params, seed * 100 + 10)).wait();
  return at_step_1;
}

TEST(PsCheckpoint, TruncatedNewestIsSkippedForThePreviousComplete) {
  zmq::context_t ctx;
  test::TempDir dir;
  const std::vector<NamedTensor> at_step_1 = two_checkpoints(ctx, dir, "ps-ckpt-trunc", 44);
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

// A newest checkpoint whose Adam moments are corrupt (a negative second moment, then a NaN first
// one) is skipped like a truncated one: restored, it would have turned the parameters into NaN at
// the first step, far from the cause.
TEST(PsCheckpoint, ANewestWithCorruptMomentsIsSkippedForThePreviousComplete) {
  zmq::context_t ctx;
  test::TempDir dir;
  const std::vector<NamedTensor> at_step_1 = two_checkpoints(ctx, dir, "ps-ckpt-moments", 46);
  const std::string newest = dir.file("ps0-step-2.safetensors");
  for (const auto& [name, value] : std::vector<std::pair<std::string, float>>{
           {"w.adam_v", -1.0f}, {"b.adam_m", std::nanf("")}}) {
    SafeTensorsFile file = read_safetensors(newest);
    const SafeTensorsFile good = file;
    bool found = false;
    for (auto& t : file.tensors) {
      if (t.name != name) continue;
      std::memcpy(t.data.data() + 4, &value, 4);  // the second value
      found = true;
    }
    ASSERT_TRUE(found) << name;
    write_safetensors_atomic(newest, file);
    ParameterServer server(checkpoint_options(ctx, "ps-ckpt-moments2" + name, dir));
    EXPECT_EQ(server.restored_from(), dir.file("ps0-step-1.safetensors")) << name;
    PsClient c({server.endpoint()}, client_options(&ctx));
    const PsResult r = c.init({}).wait();
    EXPECT_EQ(r.version, 1u);
    EXPECT_TRUE(bit_equal(r.tensors, at_step_1));
    server.stop();
    write_safetensors_atomic(newest, good);
  }
}

// A server of another optimizer than the checkpoints' (launch --resume without the run's
// --optimizer sgd) refuses them, saying which optimizer wrote them, and leaves them as they
// were: it once started empty and wrote its own checkpoint over the run's.
TEST(PsCheckpoint, CheckpointsOfAnotherOptimizerAreRefusedAndKept) {
  zmq::context_t ctx;
  test::TempDir dir;
  auto sgd = [&](const std::string& name) {
    ServerOptions o = checkpoint_options(ctx, name, dir);
    o.optimizer.kind = OptimizerKind::Sgd;
    return o;
  };
  one_step_checkpointed(ctx, sgd("ps-ckpt-sgd"), small_params(47), 4700);
  const std::string file = dir.file("ps0-step-1.safetensors");
  const auto before = test::read_bytes(file);
  try {
    ParameterServer adam(checkpoint_options(ctx, "ps-ckpt-adam", dir));
    ADD_FAILURE() << "expected an Adam server to refuse SGD checkpoints";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("updating with sgd"), std::string::npos) << e.what();
  }
  EXPECT_EQ(test::read_bytes(file), before);
  ParameterServer again(sgd("ps-ckpt-sgd2"));
  EXPECT_EQ(again.restored_from(), file);

  // And the other way: an SGD server took an Adam run's parameters and dropped its moments
  // (`launch --resume --optimizer sgd` on an Adam run trained on with SGD, exit 0).
  test::TempDir adam_dir;
  ServerOptions adam_options = checkpoint_options(ctx, "ps-ckpt-adam2", adam_dir);
  one_step_checkpointed(ctx, adam_options, small_params(48), 4800);
  const std::string adam_file = adam_dir.file("ps0-step-1.safetensors");
  const auto adam_before = test::read_bytes(adam_file);
  ServerOptions sgd_options = checkpoint_options(ctx, "ps-ckpt-sgd3", adam_dir);
  sgd_options.optimizer.kind = OptimizerKind::Sgd;
  const std::string why = test::error_of<InputError>([&] { ParameterServer s(sgd_options); });
  EXPECT_NE(why.find("a server updating with adam wrote it, this one updates with sgd"),
            std::string::npos)
      << why;
  EXPECT_EQ(test::read_bytes(adam_file), adam_before);
  EXPECT_THROW(resume_point_of_servers(adam_dir.path().string(), 1, /*adam=*/false), InputError);
  EXPECT_EQ(resume_point_of_servers(adam_dir.path().string(), 1, /*adam=*/true).step, 1);
}

// A checkpoint skipped as unreadable is not one of the two that pruning keeps: counted, it had
// the older restorable one deleted, leaving a single good checkpoint.
TEST(PsCheckpoint, AnUnreadableNewerCheckpointDoesNotCountAmongTheKept) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = small_params(48);
  one_step_checkpointed(ctx, checkpoint_options(ctx, "ps-ckpt-prune", dir), params, 4800);
  test::write_bytes(dir.file("ps0-step-5.safetensors"), std::string("damaged"));
  {
    ParameterServer server(checkpoint_options(ctx, "ps-ckpt-prune2", dir));
    ASSERT_EQ(server.restored_from(), dir.file("ps0-step-1.safetensors"));
    PsClient c({server.endpoint()}, client_options(&ctx));
    c.init({}).wait();
    for (int i = 0; i < 5; ++i) c.push_pull(gradients_like(params, 4801 + i)).wait();
    EXPECT_EQ(request_checkpoint(ctx, server.endpoint()), dir.file("ps0-step-6.safetensors"));
  }  // (its writer, which prunes after each write, has finished)
  // Kept: step 6 and step 1, the two restorable ones; the damaged one is left as it was.
  EXPECT_TRUE(std::filesystem::exists(dir.file("ps0-step-1.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(dir.file("ps0-step-5.safetensors")));
}

TEST(PsCheckpoint, CorruptDirEntriesNeverCrashTheServer) {
  zmq::context_t ctx;
  test::TempDir dir;
  test::write_bytes(dir.file("ps0-step-9.safetensors"), std::string("garbage"));
  test::write_bytes(dir.file("ps0-step-8.safetensors"), std::string(64, '\xff'));
  test::write_bytes(dir.file("ps0-step-x.safetensors"), std::string("x"));
  test::write_bytes(dir.file("other-step-3.safetensors"), std::string("y"));
  std::filesystem::create_directory(dir.path() / "ps0-step-7.safetensors");
  // A write killed before its rename (no process 999999999, untouched for a minute): removed. A
  // live writer's (this process's, standing in for a server still writing), one written to
  // lately and another shard's are left alone.
  const std::string dead = dir.file("ps0-step-5.safetensors.tmp-999999999-12");  // (PID-TID)
  const std::string dead_older = dir.file("ps0-step-2.safetensors.tmp-999999997");  // (PID)
  const std::string live = dir.file("ps0-step-4.safetensors.tmp-" + std::to_string(::getpid()));
  const std::string other = dir.file("ps1-step-5.safetensors.tmp-999999999");
  const std::string recent = dir.file("ps0-step-3.safetensors.tmp-999999998");
  for (const std::string& f : {dead, dead_older, live, other, recent})
    test::write_bytes(f, std::string("partial"));
  // Untouched for two minutes but `recent`, which another machine's writer may still be writing.
  for (const std::string& f : {dead, dead_older, live, other})
    std::filesystem::last_write_time(
        f, std::filesystem::file_time_type::clock::now() - std::chrono::minutes(2));
  {
    // A valid safetensors file of the wrong format is skipped too.
    SafeTensorsFile f;
    f.metadata["format"] = "something-else";
    f.tensors.push_back({"w", "F32", {1}, std::vector<uint8_t>(4, 0)});
    write_safetensors_atomic(dir.file("ps0-step-6.safetensors"), f);
  }
  // None of the shard's checkpoints restores: refused, naming each, rather than started empty
  // (it would train from scratch as if resumed, and its first checkpoint would replace them).
  try {
    ParameterServer refused(checkpoint_options(ctx, "ps-ckpt-corrupt", dir));
    ADD_FAILURE() << "expected the server to refuse checkpoints it cannot restore";
  } catch (const InputError& e) {
    const std::string what = e.what();
    for (const char* name : {"ps0-step-9.safetensors", "ps0-step-8.safetensors",
                             "ps0-step-7.safetensors", "ps0-step-6.safetensors", "move them away"})
      EXPECT_NE(what.find(name), std::string::npos) << name << " in: " << what;
  }
  EXPECT_FALSE(std::filesystem::exists(dead));
  EXPECT_FALSE(std::filesystem::exists(dead_older));
  EXPECT_TRUE(std::filesystem::exists(live));
  EXPECT_TRUE(std::filesystem::exists(other));
  EXPECT_TRUE(std::filesystem::exists(recent));
  // Moved away, what is left (names that are no checkpoint of this shard, writes in progress)
  // never stops the server.
  for (const char* name : {"ps0-step-9.safetensors", "ps0-step-8.safetensors",
                           "ps0-step-7.safetensors", "ps0-step-6.safetensors"})
    std::filesystem::rename(dir.file(name), dir.file(std::string("moved-") + name));
  ParameterServer server(checkpoint_options(ctx, "ps-ckpt-corrupt", dir));
  EXPECT_EQ(server.restored_from(), "");
  PsClient c({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(45);
  EXPECT_TRUE(bit_equal(c.init(params).wait().tensors, params));
  EXPECT_EQ(c.push_pull(gradients_like(params, 4500)).wait().version, 1u);
  const std::string path = request_checkpoint(ctx, server.endpoint());
  EXPECT_EQ(path, dir.file("ps0-step-1.safetensors"));
}

// ---- Sharding: large tensors split by rows across servers -----------------------------------

struct ModelShapes {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
};

ModelShapes shapes_of(const std::vector<NamedTensor>& tensors) {
  ModelShapes m;
  for (const auto& t : tensors) {
    m.names.push_back(t.name);
    m.shapes.push_back(t.shape);
  }
  return m;
}

ModelShapes default_model_shapes() {
  return shapes_of(Model::initialized(ModelConfig{}, 1).parameters());
}

std::vector<int64_t> loads(const std::vector<TensorPart>& parts, int servers) {
  std::vector<int64_t> load(size_t(servers), 0);
  for (const auto& p : parts) load[size_t(p.server)] += p.size;
  return load;
}

// The parts of each tensor tile its rows in order, with offsets and sizes to match.
void expect_parts_tile(const ModelShapes& m, const std::vector<TensorPart>& parts) {
  size_t k = 0;
  for (size_t t = 0; t < m.names.size(); ++t) {
    int64_t row = 0, offset = 0, n = 1;
    for (int64_t d : m.shapes[t]) n *= d;
    for (; k < parts.size() && parts[k].tensor == t; ++k) {
      EXPECT_EQ(parts[k].row_begin, row) << parts[k].name;
      EXPECT_EQ(parts[k].offset, offset) << parts[k].name;
      row = parts[k].row_end;
      offset += parts[k].size;
    }
    EXPECT_EQ(row, row_count(m.shapes[t])) << m.names[t];
    EXPECT_EQ(offset, n) << m.names[t];
  }
  EXPECT_EQ(k, parts.size());
}

// The shard reads a push's gradients from the received frames themselves, and gathers a frame
// at an odd byte offset (not readable as floats) into aligned memory first: either way each step
// equals the trainer's Adam bit for bit, including the tensors whose length is not a multiple of
// 16 floats (their last part group is swept from a zero-padded copy, as the trainer pads). A push
// refused for a non-finite value in its last tensor, after the earlier ones passed, leaves the
// parameters and moments as they were.
TEST(PsShard, GradientsReadInPlaceOrGatheredStepAsTheTrainer) {
  // The default model's shapes (784x100: whole groups of 16; 100, 100x10 and 10: a tail each).
  std::vector<NamedTensor> params = Model::initialized(ModelConfig{}, 7).parameters();
  for (size_t offset : {size_t(0), size_t(1)}) {
    SCOPED_TRACE("frames at byte offset " + std::to_string(offset));
    // A message decoded as the server decodes what it receives, its tensor frames copied back to
    // back to `offset` bytes past a 64-byte boundary (the header frame stays where it is).
    AlignedBuffer<uint8_t> storage;
    auto decoded_at_offset = [&](const std::vector<std::vector<uint8_t>>& frames) {
      size_t bytes = 0;
      for (size_t i = 1; i < frames.size(); ++i) bytes += frames[i].size();
      storage = AlignedBuffer<uint8_t>(bytes + offset);
      std::vector<transport::ByteSpan> spans{{frames[0].data(), frames[0].size()}};
      uint8_t* at = storage.data() + offset;
      for (size_t i = 1; i < frames.size(); ++i) {
        std::memcpy(at, frames[i].data(), frames[i].size());
        spans.push_back({at, frames[i].size()});
        at += frames[i].size();
      }
      return transport::decode(spans);
    };
    PsShard shard{OptimizerConfig{}};
    {
      const transport::DecodeResult init = decoded_at_offset(frames_of(MessageType::Init, 1, params));
      ASSERT_TRUE(init.ok()) << init.error;
      shard.initialize(init.message, init.tensor_data);
    }
    ReferenceAdam ref(params);
    for (int step = 0; step < 3; ++step) {
      const auto g = gradients_like(params, 40 + 10 * uint32_t(step));
      const transport::DecodeResult in = decoded_at_offset(frames_of(MessageType::Push, 2, g));
      ASSERT_TRUE(in.ok()) << in.error;
      std::string kind;
      ASSERT_EQ(shard.stage_gradients(in.message, in.tensor_data, kind), "");
      shard.apply_staged();
      ref.apply(g);
      for (size_t i = 0; i < params.size(); ++i)
        ASSERT_EQ(std::memcmp(shard.values(shard.entries()[i]), ref.w[i].values.data(),
                              ref.w[i].values.size() * 4), 0)
            << "step " << step << ", tensor " << params[i].name;
    }
    // A NaN in the last tensor: refused, nothing changed.
    auto bad = gradients_like(params, 99);
    bad.back().values[3] = std::numeric_limits<float>::quiet_NaN();
    const transport::DecodeResult in = decoded_at_offset(frames_of(MessageType::Push, 3, bad));
    ASSERT_TRUE(in.ok()) << in.error;
    const std::vector<float> m_before(shard.adam_m(shard.entries()[0]),
                                      shard.adam_m(shard.entries()[0]) + 100);
    std::string kind;
    EXPECT_NE(shard.stage_gradients(in.message, in.tensor_data, kind), "");
    EXPECT_EQ(kind, transport::kNonFinite);
    EXPECT_EQ(shard.step(), 3);
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_EQ(std::memcmp(shard.values(shard.entries()[i]), ref.w[i].values.data(),
                            ref.w[i].values.size() * 4), 0);
    EXPECT_EQ(std::memcmp(m_before.data(), shard.adam_m(shard.entries()[0]), 100 * 4), 0);
  }
}

// A device for a shard that steps on the host (w -= g) and fails while told to: the shard's
// handling of a GPU that fails part way, which no test on a machine without one could reach.
struct DeviceControl {  // set by the test's thread, read by the server's
  std::atomic<bool> fail{false};
  std::atomic<int> calls{0};
};
class HostShardDevice final : public ShardDevice {
 public:
  explicit HostShardDevice(std::shared_ptr<DeviceControl> control) : control_(std::move(control)) {}
  int device() const override { return 7; }
  void upload(const float* params, const float*, int64_t total, int64_t) override {
    enter("an upload failed");
    w_.assign(params, params + total);
  }
  const float* step(const float* gradients, int64_t total) override {
    enter("an illegal memory access was encountered");
    EXPECT_EQ(total, int64_t(w_.size()));
    for (size_t k = 0; k < w_.size(); ++k) w_[k] -= gradients[k];
    return w_.data();
  }
  void download_moments(float* m, float* v) override {
    enter("a download failed");
    std::fill(m, m + w_.size(), 0.0f);
    std::fill(v, v + w_.size(), 0.0f);
  }

 private:
  void enter(const char* failure) {
    ++control_->calls;
    if (control_->fail) throw std::runtime_error(failure);
  }
  std::shared_ptr<DeviceControl> control_;
  std::vector<float> w_;
};

// A server whose shard is on a HostShardDevice (device 7) that `control` steers.
void with_host_device(ServerOptions& o, const std::shared_ptr<DeviceControl>& control) {
  o.device = 7;
  o.make_device = [control](const OptimizerConfig&, int) {
    return std::make_unique<HostShardDevice>(control);
  };
}

// A device step that fails (a CUDA error) leaves the shard's parameters and step as they were,
// not a fresh parameter block that nothing filled; the shard then says why it failed, and refuses
// every later use of the device, even one that would work again: what the device holds is
// unknown.
TEST(PsShard, AFailedDeviceStepChangesNothingAndTheDeviceIsNotUsedAgain) {
  std::vector<NamedTensor> params = Model::initialized(ModelConfig{}, 7).parameters();
  OptimizerConfig sgd;
  sgd.kind = OptimizerKind::Sgd;
  PsShard shard{sgd};
  auto control = std::make_shared<DeviceControl>();
  shard.use_device(std::make_unique<HostShardDevice>(control));
  auto decoded = [](const std::vector<std::vector<uint8_t>>& frames) {
    std::vector<transport::ByteSpan> spans;
    for (const auto& f : frames) spans.push_back({f.data(), f.size()});
    return transport::decode(spans);
  };
  const auto init_frames = frames_of(MessageType::Init, 1, params);
  const transport::DecodeResult init = decoded(init_frames);
  ASSERT_TRUE(init.ok()) << init.error;
  shard.initialize(init.message, init.tensor_data);
  ASSERT_TRUE(shard.initialized());
  auto push = [&](uint32_t seed, std::vector<NamedTensor>& g) {
    g = gradients_like(params, seed);
    const auto frames = frames_of(MessageType::Push, 2, g);
    const transport::DecodeResult in = decoded(frames);
    ASSERT_TRUE(in.ok()) << in.error;
    std::string kind;
    ASSERT_EQ(shard.stage_gradients(in.message, in.tensor_data, kind), "");
    shard.apply_staged();
  };
  std::vector<NamedTensor> g1, g2, g3;
  push(11, g1);
  ASSERT_EQ(shard.step(), 1);
  ASSERT_EQ(shard.device_failure(), "");
  std::vector<std::vector<float>> after_one;
  for (size_t i = 0; i < params.size(); ++i) {
    const float* v = shard.values(shard.entries()[i]);
    after_one.emplace_back(v, v + params[i].values.size());
    for (size_t k = 0; k < params[i].values.size(); ++k)
      ASSERT_EQ(after_one[i][k], params[i].values[k] - g1[i].values[k]) << params[i].name;
  }
  // A reply still being sent holds the current block (counted as send_message counts it): the
  // failed step must not swap in another block, which nothing would fill.
  const auto held = shard.params_hold();
  transport::SendHoldCount::add(*held);

  control->fail = true;
  EXPECT_THROW(push(12, g2), ShardDeviceFailed);
  EXPECT_EQ(shard.step(), 1);
  EXPECT_NE(shard.device_failure().find("device 7"), std::string::npos) << shard.device_failure();
  EXPECT_NE(shard.device_failure().find("step"), std::string::npos);
  EXPECT_NE(shard.device_failure().find("illegal memory access"), std::string::npos);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(std::memcmp(shard.values(shard.entries()[i]), after_one[i].data(),
                          after_one[i].size() * 4), 0) << params[i].name;

  control->fail = false;
  const int calls = control->calls;
  EXPECT_THROW(push(13, g3), ShardDeviceFailed);
  EXPECT_THROW(shard.fetch_moments(), ShardDeviceFailed);
  EXPECT_EQ(control->calls.load(), calls) << "the failed device was used again";
  EXPECT_EQ(shard.step(), 1);
  transport::SendHoldCount::remove(*held);
}

// A server whose GPU fails part way: the push that met the failure and every later request for
// the parameters get an Error of kind "shard failed" naming the server and the failure (not a
// timeout, not parameters nothing computed); stats are still answered; no checkpoint is written
// after the failure, so a restart resumes from the last good one.
TEST(ParameterServer, AServerWhoseGpuFailsSaysSoAndCheckpointsNothingAfter) {
  zmq::context_t ctx;
  test::TempDir dir;
  ServerOptions o = checkpoint_options(ctx, "ps-gpu-fails", dir);
  o.optimizer.kind = OptimizerKind::Sgd;
  auto control = std::make_shared<DeviceControl>();
  with_host_device(o, control);
  o.checkpoint_every_steps = 1;
  o.shard_name = "gpu";
  ParameterServer server(o);
  PsClient client({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(4);
  client.init(params).wait();
  EXPECT_EQ(client.push_pull(gradients_like(params, 5)).wait().version, 1u);
  EXPECT_EQ(server.stats().version, 1);
  // The step-1 checkpoint reads the moments from the device after the reply has gone: the device
  // fails only once it is written (else that download, not the next push, meets the failure).
  ASSERT_TRUE(test::eventually(
      [&] { return shard_files(dir) == std::vector<std::string>{"gpu-step-1.safetensors"}; },
      5000));

  control->fail = true;
  auto expect_shard_failed = [&](PsClient::Handle handle, const char* what) {
    SCOPED_TRACE(what);
    try {
      handle.wait();
      ADD_FAILURE() << "no error";
    } catch (const ServerError& e) {
      EXPECT_EQ(e.kind(), transport::kShardFailed);
      const std::string text = e.what();
      EXPECT_NE(text.find(server.endpoint()), std::string::npos) << text;
      EXPECT_NE(text.find("illegal memory access"), std::string::npos) << text;
      EXPECT_NE(text.find("restart"), std::string::npos) << text;
    }
  };
  expect_shard_failed(client.push_pull(gradients_like(params, 6)), "the push that failed");
  control->fail = false;  // what the device holds is unknown all the same
  expect_shard_failed(client.pull(), "a pull after");
  expect_shard_failed(client.push_pull(gradients_like(params, 7)), "a push after");
  const std::vector<ServerStats> stats = client.stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].version, 1);
  server.stop();
  EXPECT_EQ(shard_files(dir), (std::vector<std::string>{"gpu-step-1.safetensors"}));
}

// In sync mode the step runs once the last gradient of the round is in: when the GPU fails
// there, every worker held for that step gets the failure, not only the one whose push ran it
// (the others would wait for a reply that never comes).
TEST(ParameterServer, InSyncModeEveryHeldWorkerGetsTheGpusFailure) {
  zmq::context_t ctx;
  ServerOptions o = inproc_options(ctx, "ps-gpu-fails-sync");
  o.mode = PsMode::Sync;
  o.replicas_to_aggregate = 2;
  o.step_timeout_ms = o.longest_wait_ms = 60000;  // the step waits for both workers
  auto control = std::make_shared<DeviceControl>();
  with_host_device(o, control);
  ParameterServer server(o);
  PsClient a({server.endpoint()}, client_options(&ctx));
  PsClient b({server.endpoint()}, client_options(&ctx));
  const auto params = small_params(8);
  a.init(params).wait();
  b.init({}).wait();
  control->fail = true;
  PsClient::Handle held = a.push_pull(gradients_like(params, 9));
  PsClient::Handle last = b.push_pull(gradients_like(params, 10));
  for (PsClient::Handle* h : {&held, &last}) {
    SCOPED_TRACE(h == &held ? "the worker held for the step" : "the worker whose push ran it");
    try {
      h->wait();
      ADD_FAILURE() << "no error";
    } catch (const ServerError& e) {
      EXPECT_EQ(e.kind(), transport::kShardFailed) << e.what();
    }
  }
  EXPECT_EQ(server.stats().version, 0);
}

TEST(PsSharding, DefaultModelLoadIsEvenOnTwoAndThreeServers) {
  const ModelShapes m = default_model_shapes();
  const auto two = place_parts(m.names, m.shapes, 2);
  EXPECT_EQ(part_servers(two), (std::vector<std::string>{"hid_w[0:392]@0", "hid_w[392:784]@1",
                                                         "hid_b@1", "sm_w@0", "sm_b@1"}));
  EXPECT_EQ(loads(two, 2), (std::vector<int64_t>{40200, 39310}));  // whole: 78,400 and 1,110
  EXPECT_EQ(two[0].shape, (std::vector<int64_t>{392, 100}));
  expect_parts_tile(m, two);
  // Three servers: 784 rows as 262 + 261 + 261, the small tensors onto the least loaded.
  const auto three = place_parts(m.names, m.shapes, 3);
  EXPECT_EQ(part_servers(three),
            (std::vector<std::string>{"hid_w[0:262]@0", "hid_w[262:523]@1", "hid_w[523:784]@2",
                                      "hid_b@2", "sm_w@1", "sm_b@0"}));
  EXPECT_EQ(loads(three, 3), (std::vector<int64_t>{26210, 27100, 26200}));
  expect_parts_tile(m, three);
  for (int servers : {2, 3, 4}) {
    const auto load = loads(place_parts(m.names, m.shapes, servers), servers);
    const int64_t most = *std::max_element(load.begin(), load.end());
    EXPECT_LE(double(most), 1.05 * 79510.0 / servers) << servers << " servers";
  }
}

TEST(PsSharding, SmallTensorsStayWholeAndOneServerNeverSplits) {
  const ModelShapes m = default_model_shapes();
  for (int servers : {1, 2, 3, 8}) {
    const auto parts = place_parts(m.names, m.shapes, servers);
    for (const auto& p : parts)
      if (p.tensor != 0) {
        EXPECT_EQ(p.name, m.names[p.tensor]);  // hid_b, sm_w, sm_b whole
        EXPECT_EQ(p.shape, m.shapes[p.tensor]);
      }
  }
  const auto one = place_parts(m.names, m.shapes, 1);
  EXPECT_EQ(part_servers(one),
            (std::vector<std::string>{"hid_w@0", "hid_b@0", "sm_w@0", "sm_b@0"}));
  // Without splitting: place_tensors' whole placement.
  const auto whole = place_parts(m.names, m.shapes, 2, /*split=*/false);
  std::vector<int> servers;
  for (const auto& p : whole) servers.push_back(p.server);
  EXPECT_EQ(servers, place_tensors({78400, 100, 1000, 10}, 2));
  EXPECT_EQ(part_servers(whole),
            (std::vector<std::string>{"hid_w@0", "hid_b@1", "sm_w@1", "sm_b@1"}));
}

TEST(PsSharding, PlacementIsDeterministic) {
  const ModelShapes m = default_model_shapes();
  for (int servers : {2, 3, 5}) {
    const auto a = place_parts(m.names, m.shapes, servers);
    const auto b = place_parts(m.names, m.shapes, servers);
    EXPECT_EQ(part_servers(a), part_servers(b));
  }
  // Two equal large tensors: each split over both servers, one's parts on different servers.
  const auto twins = place_parts({"a", "b"}, {{5, 3}, {5, 3}}, 2);
  EXPECT_EQ(part_servers(twins),
            (std::vector<std::string>{"a[0:3]@0", "a[3:5]@1", "b[0:3]@1", "b[3:5]@0"}));
  EXPECT_EQ(loads(twins, 2), (std::vector<int64_t>{15, 15}));
}

TEST(PsSharding, MoreServersThanRows) {
  // 3 rows on 5 servers: one row each on 3 servers; a 1-D tensor splits by elements. v, the
  // larger, is split first over all five; w's rows then go to the three least loaded.
  const ModelShapes m{{"w", "v", "one_row", "scalar"}, {{3, 1000}, {4000}, {1, 50}, {}}};
  const auto parts = place_parts(m.names, m.shapes, 5);
  EXPECT_EQ(part_servers(parts),
            (std::vector<std::string>{"w[0:1]@0", "w[1:2]@1", "w[2:3]@2", "v[0:800]@0",
                                      "v[800:1600]@1", "v[1600:2400]@2", "v[2400:3200]@3",
                                      "v[3200:4000]@4", "one_row@3", "scalar@4"}));
  EXPECT_EQ(loads(parts, 5), (std::vector<int64_t>{1800, 1800, 1800, 850, 801}));
  expect_parts_tile(m, parts);
  EXPECT_EQ(parts[3].shape, (std::vector<int64_t>{800}));
  EXPECT_THROW(place_parts(m.names, m.shapes, 0), InputError);
}

TEST(PsSharding, PartNamesReadBack) {
  EXPECT_EQ(part_name("hid_w", 0, 392), "hid_w[0:392]");
  std::string name;
  int64_t b = -1, e = -1;
  ASSERT_TRUE(parse_part_name("hid_w[392:784]", name, b, e));
  EXPECT_EQ(name, "hid_w");
  EXPECT_EQ(b, 392);
  EXPECT_EQ(e, 784);
  ASSERT_TRUE(parse_part_name("a[1:2][3:4]", name, b, e));
  EXPECT_EQ(name, "a[1:2]");
  for (const char* bad : {"hid_w", "[0:3]", "w[3:3]", "w[4:3]", "w[-1:3]", "w[0:]", "w[:3]",
                          "w[0;3]", "w[0:3", "w[a:3]"})
    EXPECT_FALSE(parse_part_name(bad, name, b, e)) << bad;
  EXPECT_THROW(place_parts({"w[0:2]"}, {{2}}, 2), InputError);  // would read as a part
}

// Server-side Adam on split tensors equals the trainer's update of whole tensors, bit for bit;
// every pull assembles exactly; a non-chief client learns the same parts from the replies.
void expect_sharded_round_trip(int servers) {
  std::vector<std::unique_ptr<ParameterServer>> ps;
  std::vector<std::string> endpoints;
  for (int s = 0; s < servers; ++s) {
    ps.push_back(std::make_unique<ParameterServer>(ServerOptions{}));
    endpoints.push_back(ps.back()->endpoint());
  }
  const Model model = Model::initialized(ModelConfig{}, 7);
  const auto& params = model.parameters();
  PsClient chief(endpoints, client_options(nullptr));
  EXPECT_TRUE(bit_equal(chief.init(params).wait().tensors, params));
  ASSERT_EQ(chief.layout().size(), size_t(servers) + 3);  // hid_w in `servers` parts
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, params));
  PsClient worker(endpoints, client_options(nullptr));
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  EXPECT_EQ(worker.names(), chief.names());
  EXPECT_EQ(worker.shapes(), chief.shapes());
  EXPECT_EQ(part_servers(worker.layout()), part_servers(chief.layout()));
  ReferenceAdam ref(params);
  for (int i = 1; i <= 4; ++i) {
    // Gradients in another order than the model's: the client finds each its parts.
    auto g = gradients_like(params, 7000 + 10 * uint32_t(i));
    std::reverse(g.begin(), g.end());
    auto ordered = g;
    std::reverse(ordered.begin(), ordered.end());
    ref.apply(ordered);
    PsClient& client = i % 2 ? worker : chief;
    const PsResult r = client.push_pull(g).wait();
    EXPECT_EQ(r.version, uint64_t(i));
    EXPECT_TRUE(bit_equal(r.tensors, ref.w)) << servers << " servers, push " << i;
  }
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, ref.w));
  EXPECT_TRUE(bit_equal(worker.pull().wait().tensors, ref.w));
  for (const auto& s : chief.stats()) EXPECT_EQ(s.pushes, 4);
}

TEST(PsSharding, RoundTripOnTwoServersMatchesTheTrainersAdam) { expect_sharded_round_trip(2); }
TEST(PsSharding, RoundTripOnThreeServersMatchesTheTrainersAdam) { expect_sharded_round_trip(3); }

TEST(PsSharding, WholePlacementOptionAndPushChecks) {
  zmq::context_t ctx;
  ParameterServer s0(inproc_options(ctx, "ps-shard-whole-0")), s1(inproc_options(ctx, "ps-shard-whole-1"));
  const auto params = Model::initialized(ModelConfig{}, 3).parameters();
  ClientOptions whole = client_options(&ctx);
  whole.split_tensors = false;
  PsClient chief({s0.endpoint(), s1.endpoint()}, whole);
  chief.init(params).wait();
  EXPECT_EQ(part_servers(chief.layout()),
            (std::vector<std::string>{"hid_w@0", "hid_b@1", "sm_w@1", "sm_b@1"}));
  // A split-by-default worker follows what the servers hold.
  PsClient worker({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, params));
  EXPECT_EQ(part_servers(worker.layout()), part_servers(chief.layout()));
  // Pushes are checked whole on the client: every parameter once, in its shape.
  auto g = gradients_like(params, 7100);
  auto missing = g;
  missing.pop_back();
  EXPECT_THROW(chief.push_pull(missing), InputError);
  auto twice = g;
  twice.push_back(g[0]);
  EXPECT_THROW(chief.push_pull(twice), InputError);
  auto reshaped = g;
  reshaped[0].shape = {100, 784};
  EXPECT_THROW(chief.push_pull(reshaped), InputError);
  EXPECT_EQ(chief.push_pull(g).wait().version, 1u);
}

// A server the placement leaves without a part is never initialised, and the workers, asking
// every server, waited for it until their init timeout: the chief refuses first, naming it and
// the most servers the model fills, and initialises no server.
TEST(PsSharding, AChiefRefusesServersItsModelLeavesEmpty) {
  zmq::context_t ctx;
  ParameterServer s0(inproc_options(ctx, "ps-shard-empty-0")),
      s1(inproc_options(ctx, "ps-shard-empty-1")), s2(inproc_options(ctx, "ps-shard-empty-2"));
  const std::vector<std::string> three{s0.endpoint(), s1.endpoint(), s2.endpoint()};
  PsClient chief(three, client_options(&ctx));
  const std::vector<NamedTensor> two_rows{{"w", {2, 10}, test::random_floats(20, 7200)}};
  const std::string why = test::error_of<InputError>([&] { chief.init(two_rows); });
  EXPECT_NE(why.find("leaves parameter server " + s2.endpoint() + " without a part"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find("wait for that server until their init timeout"), std::string::npos) << why;
  EXPECT_NE(why.find("use at most 2 parameter servers"), std::string::npos) << why;
  for (const ParameterServer* s : {&s0, &s1}) EXPECT_EQ(s->stats().by_type.count("Init"), 0u);
  // Whole tensors: the default model's four fill four servers, not five.
  std::vector<std::unique_ptr<ParameterServer>> five;
  std::vector<std::string> endpoints;
  for (int i = 0; i < 5; ++i) {
    five.push_back(std::make_unique<ParameterServer>(
        inproc_options(ctx, "ps-shard-empty-whole-" + std::to_string(i))));
    endpoints.push_back(five.back()->endpoint());
  }
  ClientOptions whole = client_options(&ctx);
  whole.split_tensors = false;
  PsClient whole_chief(endpoints, whole);
  const std::string whole_why = test::error_of<InputError>(
      [&] { whole_chief.init(Model::initialized(ModelConfig{}, 3).parameters()); });
  EXPECT_NE(whole_why.find("use at most 4 parameter servers"), std::string::npos) << whole_why;
  // Two servers for two rows: the worker, asking both, gets the model.
  PsClient fits({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
  fits.init(two_rows).wait();
  PsClient worker({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
  EXPECT_TRUE(bit_equal(worker.init({}).wait().tensors, two_rows));
}

TEST(PsSharding, ServerRejectsUnknownAndWronglyShapedParts) {
  zmq::context_t ctx;
  ParameterServer s0(inproc_options(ctx, "ps-shard-bad-0")), s1(inproc_options(ctx, "ps-shard-bad-1"));
  const auto params = Model::initialized(ModelConfig{}, 4).parameters();
  PsClient chief({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
  chief.init(params).wait();
  // Server 0 holds hid_w[0:392] and sm_w.
  const auto g = gradients_like(params, 7200);
  const NamedTensor sm_w = g[2];
  RawPeer raw(ctx, s0.endpoint());
  auto expect_error = [&](const std::vector<NamedTensor>& tensors, uint64_t id,
                          const std::string& needle) {
    raw.send(frames_of(MessageType::PushPull, id, tensors));
    transport::Message reply;
    ASSERT_TRUE(raw.receive(reply));
    EXPECT_EQ(reply.header.type, MessageType::Error);
    EXPECT_NE(reply.extra.find(needle), std::string::npos) << reply.extra;
  };
  const std::vector<float> rows(393 * 100, 0.25f);
  expect_error({{"hid_w[0:393]", {393, 100}, rows}, sm_w}, 1, "unknown parameter 'hid_w[0:393]'");
  expect_error({{"hid_w[0:392]", {393, 100}, rows}, sm_w}, 2, "shape [393, 100], expected [392, 100]");
  expect_error({{"hid_w", {784, 100}, g[0].values}, sm_w}, 3, "unknown parameter 'hid_w'");
  expect_error({sm_w}, 4, "lacks a gradient for 'hid_w[0:392]'");
  EXPECT_TRUE(bit_equal(chief.pull().wait().tensors, params));
  EXPECT_EQ(chief.pull().wait().version, 0u);
}

TEST(PsSharding, CheckpointAndRestartKeepsTheParts) {
  zmq::context_t ctx;
  test::TempDir dir;
  const auto params = Model::initialized(ModelConfig{}, 5).parameters();
  auto options = [&](const std::string& name, int shard) {
    ServerOptions o = checkpoint_options(ctx, name, dir);
    o.shard_name = "ps" + std::to_string(shard);
    return o;
  };
  ReferenceAdam ref(params);
  {
    ParameterServer s0(options("ps-shard-ckpt-a0", 0)), s1(options("ps-shard-ckpt-a1", 1));
    PsClient chief({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
    chief.init(params).wait();
    for (int i = 0; i < 3; ++i) {
      const auto g = gradients_like(params, 7300 + 10 * uint32_t(i));
      ref.apply(g);
      chief.push_pull(g).wait();
    }
  }  // stop: ps0-step-3 and ps1-step-3
  EXPECT_EQ(shard_files(dir),
            (std::vector<std::string>{"ps0-step-3.safetensors", "ps1-step-3.safetensors"}));
  const SafeTensorsFile f0 = read_safetensors(dir.file("ps0-step-3.safetensors"));
  ASSERT_NE(f0.find("hid_w[0:392]"), nullptr);
  EXPECT_EQ(f0.find("hid_w[0:392]")->shape, (std::vector<int64_t>{392, 100}));
  ASSERT_NE(f0.find("hid_w[0:392].adam_m"), nullptr);
  EXPECT_EQ(f0.metadata.at("model_order"), "hid_w\nhid_b\nsm_w\nsm_b\n");
  // The first half of hid_w's rows, as the trainer's update left them.
  const std::vector<float> top(ref.w[0].values.begin(), ref.w[0].values.begin() + 39200);
  EXPECT_TRUE(bit_equal({{"x", {392, 100}, floats(*f0.find("hid_w[0:392]"))}},
                        {{"x", {392, 100}, top}}));
  ParameterServer s0(options("ps-shard-ckpt-b0", 0)), s1(options("ps-shard-ckpt-b1", 1));
  EXPECT_EQ(s0.restored_from(), dir.file("ps0-step-3.safetensors"));
  EXPECT_EQ(s1.restored_from(), dir.file("ps1-step-3.safetensors"));
  // A non-chief client learns the parts from the restored servers and resumes.
  PsClient worker({s0.endpoint(), s1.endpoint()}, client_options(&ctx));
  const PsResult init = worker.init({}).wait();
  EXPECT_EQ(init.version, 3u);
  EXPECT_TRUE(bit_equal(init.tensors, ref.w));
  const auto g = gradients_like(params, 7399);
  ref.apply(g);
  const PsResult r = worker.push_pull(g).wait();
  EXPECT_EQ(r.version, 4u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
}

// ---- CURVE: encrypted, authenticated connections (ServerOptions::curve_secret_key) -----------
// Real tcp://127.0.0.1 sockets on ephemeral ports (libzmq secures no inproc://). A refused client
// gets no reply at all, so it waits out its timeout: kept short so these tests stay fast.

constexpr int kCurveRefusedMs = 400;   // how long a client that must be refused waits
constexpr int kCurveAdmittedMs = 1500;  // an admitted client's requests (a loopback handshake)

using test::contains;
using test::error_of;

ServerOptions curve_server(const transport::CurveKeyPair& keys, std::vector<std::string> allowed,
                           zmq::context_t* ctx = nullptr) {
  ServerOptions o;  // binds tcp://127.0.0.1:*
  o.curve_secret_key = keys.secret_key;
  o.curve_allowed_clients = std::move(allowed);
  o.context = ctx;
  return o;
}

ClientOptions curve_client(const std::string& server_key, const transport::CurveKeyPair& me,
                           int timeout_ms, zmq::context_t* ctx = nullptr) {
  ClientOptions o = client_options(ctx, timeout_ms);
  o.curve_server_key = server_key;
  o.curve_public_key = me.public_key;
  o.curve_secret_key = me.secret_key;
  return o;
}

// Sends a one-way Push, then a PushPull, of `g` from a bare DEALER (CURVE with `me` when
// server_key is set); true when the PushPull was answered within timeout_ms.
bool raw_push_pull_answered(const std::string& endpoint, const std::string& server_key,
                            const transport::CurveKeyPair& me, const std::vector<NamedTensor>& g,
                            long timeout_ms) {
  zmq::context_t ctx;
  zmq::socket_t socket(ctx, zmq::socket_type::dealer);
  socket.set(zmq::sockopt::linger, 0);
  if (!server_key.empty()) {
    socket.set(zmq::sockopt::curve_serverkey, server_key);
    socket.set(zmq::sockopt::curve_publickey, me.public_key);
    socket.set(zmq::sockopt::curve_secretkey, me.secret_key);
  }
  socket.connect(endpoint);
  for (MessageType type : {MessageType::Push, MessageType::PushPull}) {
    std::vector<transport::ByteSpan> spans;
    const auto frames = frames_of(type, 77, g);
    for (const auto& f : frames) spans.push_back(transport::span_of(f));
    transport::send_frames(socket, spans, nullptr, "raw CURVE peer");
  }
  transport::Frames reply;
  return transport::receive_frames(socket, reply, timeout_ms, "raw CURVE peer");
}

TEST(Curve, KeyPairsRoundTripThroughZ85) {
  const transport::CurveKeyPair a = transport::generate_curve_keypair();
  const transport::CurveKeyPair b = transport::generate_curve_keypair();
  ASSERT_EQ(a.public_key.size(), 40u);
  ASSERT_EQ(a.secret_key.size(), 40u);
  EXPECT_NE(a.public_key, b.public_key);
  EXPECT_NE(a.secret_key, a.public_key);
  EXPECT_EQ(transport::curve_public_from_secret(a.secret_key), a.public_key);
  EXPECT_EQ(transport::curve_public_from_secret(b.secret_key), b.public_key);
  const std::string bytes = transport::curve_key_bytes(a.public_key, "a");
  ASSERT_EQ(bytes.size(), 32u);
  char z85[41] = {};
  ASSERT_NE(zmq_z85_encode(z85, reinterpret_cast<const uint8_t*>(bytes.data()), 32), nullptr);
  EXPECT_EQ(std::string(z85), a.public_key);
}

TEST(Curve, BadKeysAndOptionsAreRefusedWithAClearMessage) {
  using transport::TransportError;
  const transport::CurveKeyPair keys = transport::generate_curve_keypair();
  std::string msg = error_of<TransportError>([] { transport::validate_curve_key("abc", "my key"); });
  EXPECT_TRUE(contains(msg, "my key") && contains(msg, "40 Z85 characters, got 3")) << msg;
  std::string bad_char = keys.public_key;
  bad_char[7] = '"';
  msg = error_of<TransportError>([&] { transport::validate_curve_key(bad_char, "k"); });
  EXPECT_TRUE(contains(msg, "character 8") && contains(msg, "not a Z85 character")) << msg;
  EXPECT_FALSE(contains(msg, "\"")) << msg;  // no character of the key is quoted
  // "#####" is 85^5 - 1 > 2^32: every character is Z85, the group is not. The message says
  // where, and quotes none of the key (it may be a secret one).
  const std::string overflowing = keys.secret_key.substr(0, 10) + "#####" + keys.secret_key.substr(15);
  msg = error_of<TransportError>([&] { transport::validate_curve_key(overflowing, "k"); });
  EXPECT_TRUE(contains(msg, "characters 11 to 15") && contains(msg, "do not decode")) << msg;
  EXPECT_FALSE(contains(msg, keys.secret_key.substr(0, 10))) << msg;

  msg = error_of<TransportError>([] { transport::curve_public_from_secret("short"); });
  EXPECT_TRUE(contains(msg, "secret key")) << msg;

  ServerOptions o = curve_server(keys, {});
  o.curve_secret_key = keys.secret_key.substr(1);
  msg = error_of<TransportError>([&] { ParameterServer s(o); });
  EXPECT_TRUE(contains(msg, "parameter server at tcp://127.0.0.1:*: curve_secret_key") &&
              contains(msg, "got 39"))
      << msg;
  o = curve_server(keys, {"not a key"});
  msg = error_of<TransportError>([&] { ParameterServer s(o); });
  EXPECT_TRUE(contains(msg, "curve_allowed_clients[0]") && contains(msg, "got 9")) << msg;
  zmq::context_t ctx;
  o = curve_server(keys, {}, &ctx);
  o.bind = "inproc://curve-cannot-apply";
  msg = error_of<InputError>([&] { ParameterServer s(o); });
  EXPECT_TRUE(contains(msg, "inproc://") && contains(msg, "CURVE")) << msg;
  o = ServerOptions{};
  o.curve_allowed_clients = {keys.public_key};
  msg = error_of<InputError>([&] { ParameterServer s(o); });
  EXPECT_TRUE(contains(msg, "without curve_secret_key")) << msg;

  ClientOptions c = client_options(nullptr, kCurveRefusedMs);
  c.curve_server_key = "bad";
  msg = error_of<TransportError>([&] { PsClient client({"tcp://127.0.0.1:1"}, c); });
  EXPECT_TRUE(contains(msg, "curve server key")) << msg;
  c.curve_server_key = keys.public_key;
  c.curve_public_key = keys.public_key;  // a public key without its secret
  msg = error_of<InputError>([&] { PsClient client({"tcp://127.0.0.1:1"}, c); });
  EXPECT_TRUE(contains(msg, "without its secret key")) << msg;
  c.curve_secret_key = transport::generate_curve_keypair().secret_key;  // not its secret
  msg = error_of<InputError>([&] { PsClient client({"tcp://127.0.0.1:1"}, c); });
  EXPECT_TRUE(contains(msg, "does not belong")) << msg;
}

TEST(Curve, KeyFilesRoundTripAndBadFilesNameTheFileAndLine) {
  using transport::TransportError;
  test::TempDir dir;
  const transport::CurveKeyPair keys = transport::generate_curve_keypair();
  // An existing key file is kept unless replacing is asked for: with the secret file alone
  // there, nothing is written (no public key file appears either).
  test::write_bytes(dir.file("server.key_secret"), std::string("old"));
  ASSERT_EQ(chmod(dir.file("server.key_secret").c_str(), 0644), 0);
  std::string kept =
      error_of<InputError>([&] { transport::write_curve_key_files(dir.file("server"), keys); });
  EXPECT_TRUE(contains(kept, dir.file("server.key_secret") + " exists") &&
              contains(kept, "--overwrite"))
      << kept;
  EXPECT_EQ(test::read_bytes(dir.file("server.key_secret")), "old");
  EXPECT_FALSE(std::filesystem::exists(dir.file("server.key")));
  // A prefix given as one of the files' names (k1.key) would write k1.key.key: refused.
  for (const char* name : {"k1.key", "k1.key_secret"}) {
    const std::string why = error_of<InputError>(
        [&] { transport::write_curve_key_files(dir.file(name), keys); });
    EXPECT_TRUE(contains(why, "give the prefix of the two files")) << why;
    EXPECT_FALSE(std::filesystem::exists(dir.file(std::string(name) + ".key")));
  }
  // Replaced on request, the existing world-readable secret file ends up 0600 all the same.
  transport::write_curve_key_files(dir.file("server"), keys, /*replace_existing=*/true);
  struct stat st {};
  ASSERT_EQ(stat(dir.file("server.key_secret").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  const std::string public_text = test::read_bytes(dir.file("server.key"));
  EXPECT_FALSE(contains(public_text, keys.secret_key)) << public_text;
  const transport::CurveKeyPair pub = transport::read_curve_key_file(dir.file("server.key"));
  EXPECT_EQ(pub.public_key, keys.public_key);
  EXPECT_EQ(pub.secret_key, "");
  const transport::CurveKeyPair both = transport::read_curve_key_file(dir.file("server.key_secret"));
  EXPECT_EQ(both.public_key, keys.public_key);
  EXPECT_EQ(both.secret_key, keys.secret_key);
  // A secret file others can read is said when read as a secret (a copy by hand lost its mode).
  ::testing::internal::CaptureStderr();
  transport::read_curve_secret_key_file(dir.file("server.key_secret"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_EQ(chmod(dir.file("server.key_secret").c_str(), 0640), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(transport::read_curve_secret_key_file(dir.file("server.key_secret")).secret_key,
            keys.secret_key);
  const std::string warned = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(warned, dir.file("server.key_secret") + " can be read by others (mode "
                                                                "0640)"))
      << warned;
  // An allowed-keys list others can write: whoever writes it admits a key of their own.
  ::testing::internal::CaptureStderr();
  transport::read_curve_allowed_clients(dir.file("server.key"));
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ASSERT_EQ(chmod(dir.file("server.key").c_str(), 0664), 0);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(transport::read_curve_allowed_clients(dir.file("server.key")),
            std::vector<std::string>{keys.public_key});
  const std::string writable = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(writable, "the allowed keys " + dir.file("server.key") +
                                     " can be written by others (mode 0664)"))
      << writable;
  ASSERT_EQ(chmod(dir.file("server.key").c_str(), 0644), 0);
  // Replacing writes whole new files in place of the old (a link is replaced, not followed: the
  // file it points to keeps its text), and leaves no temporary file behind.
  test::write_bytes(dir.file("target"), std::string("untouched"));
  ASSERT_EQ(std::remove(dir.file("server.key_secret").c_str()), 0);
  ASSERT_EQ(symlink(dir.file("target").c_str(), dir.file("server.key_secret").c_str()), 0);
  transport::write_curve_key_files(dir.file("server"), keys, /*replace_existing=*/true);
  EXPECT_EQ(test::read_bytes(dir.file("target")), "untouched");
  EXPECT_EQ(transport::read_curve_key_file(dir.file("server.key_secret")).secret_key,
            keys.secret_key);
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    EXPECT_FALSE(contains(entry.path().filename().string(), ".tmp-")) << entry.path();
  // A dangling link by the public file's name counts as existing: writing would follow it.
  ASSERT_EQ(symlink(dir.file("nowhere").c_str(), dir.file("linked.key").c_str()), 0);
  kept = error_of<InputError>([&] { transport::write_curve_key_files(dir.file("linked"), keys); });
  EXPECT_TRUE(contains(kept, dir.file("linked.key") + " exists")) << kept;
  EXPECT_FALSE(std::filesystem::exists(dir.file("linked.key_secret")));

  const std::string bad = dir.file("bad.key");
  test::write_bytes(bad, "# a comment\ncurve\n    public-key = \"tooshort\"\n");
  std::string msg = error_of<TransportError>([&] { transport::read_curve_key_file(bad); });
  EXPECT_TRUE(contains(msg, bad) && contains(msg, "line 3") && contains(msg, "got 8")) << msg;
  test::write_bytes(bad, "metadata\ncurve\n");
  msg = error_of<TransportError>([&] { transport::read_curve_key_file(bad); });
  EXPECT_TRUE(contains(msg, bad) && contains(msg, "no public-key")) << msg;
  const transport::CurveKeyPair other = transport::generate_curve_keypair();
  test::write_bytes(bad, "curve\n public-key = \"" + keys.public_key + "\"\n secret-key = \"" +
                             other.secret_key + "\"\n");
  msg = error_of<TransportError>([&] { transport::read_curve_key_file(bad); });
  EXPECT_TRUE(contains(msg, "does not belong")) << msg;
  msg = error_of<IoError>([&] { transport::read_curve_key_file(dir.file("missing.key")); });
  EXPECT_TRUE(contains(msg, dir.file("missing.key"))) << msg;

  // Allowed lists: a file of keys, a key file, or a directory of *.key files (secret files are
  // not read there).
  const std::string list = dir.file("allowed.txt");
  test::write_bytes(list, "# workers\n" + keys.public_key + "\n\n  " + other.public_key + "  \n");
  EXPECT_EQ(transport::read_curve_allowed_clients(list),
            (std::vector<std::string>{keys.public_key, other.public_key}));
  // A truncated key. It starts with a letter: the tail of a key may start with '#' (a Z85
  // character), which would make the line a comment (one run in 85 did).
  test::write_bytes(list, keys.public_key + "\n# next\n" + "x" + other.public_key.substr(3) + "\n");
  msg = error_of<TransportError>([&] { transport::read_curve_allowed_clients(list); });
  EXPECT_TRUE(contains(msg, list) && contains(msg, "line 3")) << msg;
  test::write_bytes(list, "# nobody\n");
  msg = error_of<TransportError>([&] { transport::read_curve_allowed_clients(list); });
  EXPECT_TRUE(contains(msg, "no CURVE public keys")) << msg;
  std::filesystem::create_directory(dir.path() / "clients");
  transport::write_curve_key_files((dir.path() / "clients" / "b").string(), other);
  transport::write_curve_key_files((dir.path() / "clients" / "a").string(), keys);
  EXPECT_EQ(transport::read_curve_allowed_clients((dir.path() / "clients").string()),
            (std::vector<std::string>{keys.public_key, other.public_key}));
  // One client's key file is a list of one (its public key, from either file of the pair).
  const std::string b = (dir.path() / "clients" / "b").string();
  EXPECT_EQ(transport::read_curve_allowed_clients(b + ".key"),
            std::vector<std::string>{other.public_key});
  EXPECT_EQ(transport::read_curve_allowed_clients(b + ".key_secret"),
            std::vector<std::string>{other.public_key});
}

TEST(Curve, AllowedClientTrainsAndAnotherKeyCannotPullOrPush) {
  const auto server_keys = transport::generate_curve_keypair();
  const auto alice = transport::generate_curve_keypair();
  const auto mallory = transport::generate_curve_keypair();
  ParameterServer server(curve_server(server_keys, {alice.public_key}));
  ASSERT_EQ(server.endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server.endpoint();
  EXPECT_EQ(server.curve_public_key(), server_keys.public_key);

  const auto params = small_params(4100);
  ReferenceAdam ref(params);
  PsClient good({server.endpoint()}, curve_client(server.curve_public_key(), alice, kCurveAdmittedMs));
  EXPECT_TRUE(bit_equal(good.init(params).wait().tensors, params));
  auto g = gradients_like(params, 4200);
  ref.apply(g);
  PsResult r = good.push_pull(g).wait();
  EXPECT_EQ(r.version, 1u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  g = gradients_like(params, 4300);
  ref.apply(g);
  good.push(g).wait();
  r = good.pull().wait();
  EXPECT_EQ(r.version, 2u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));

  // Mallory knows the server's public key but is not on the list: no reply, so no parameters.
  PsClient bad({server.endpoint()}, curve_client(server.curve_public_key(), mallory, kCurveRefusedMs));
  EXPECT_EQ(bad.curve_public_key(), mallory.public_key);
  const std::string msg = error_of<transport::TransportError>([&] { bad.init({}).wait(); });
  EXPECT_TRUE(contains(msg, server.endpoint()) && contains(msg, "did not answer")) << msg;
  EXPECT_TRUE(contains(msg, "CURVE authentication failed")) << msg;
  // Nor can Mallory push (a bare socket: PsClient needs an init first). The same path with
  // Alice's key is answered, so the refusal is the key's doing.
  const auto mallory_g = gradients_like(params, 4400);
  EXPECT_FALSE(raw_push_pull_answered(server.endpoint(), server.curve_public_key(), mallory,
                                      mallory_g, kCurveRefusedMs));
  r = good.pull().wait();
  EXPECT_EQ(r.version, 2u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  const auto alice_g = gradients_like(params, 4500);
  ref.apply(alice_g);
  ref.apply(alice_g);  // the raw peer sends a Push and a PushPull
  EXPECT_TRUE(raw_push_pull_answered(server.endpoint(), server.curve_public_key(), alice, alice_g,
                                     kCurveAdmittedMs));
  r = good.pull().wait();
  EXPECT_EQ(r.version, 4u);
  EXPECT_TRUE(bit_equal(r.tensors, ref.w));
  const ServerStats stats = server.stats();
  EXPECT_GE(stats.curve_rejected, 2);
  EXPECT_EQ(stats_from_json(to_json(stats)).curve_rejected, stats.curve_rejected);
}

TEST(Curve, ClientWithoutCurveCannotTalkToACurveServer) {
  const auto server_keys = transport::generate_curve_keypair();
  ParameterServer server(curve_server(server_keys, {}));
  const auto params = small_params(4600);
  PsClient plain({server.endpoint()}, client_options(nullptr, kCurveRefusedMs));
  const std::string msg = error_of<transport::TransportError>([&] { plain.init(params).wait(); });
  EXPECT_TRUE(contains(msg, server.endpoint())) << msg;
  EXPECT_FALSE(raw_push_pull_answered(server.endpoint(), "", {}, params, kCurveRefusedMs));
  // Nothing the plain client sent landed: the server is still uninitialised.
  PsClient keyed({server.endpoint()}, curve_client(server.curve_public_key(), {}, kCurveAdmittedMs));
  const std::string not_yet = error_of<ServerError>([&] { keyed.init({}).wait(); });
  EXPECT_TRUE(contains(not_yet, "not initialised yet")) << not_yet;
}

TEST(Curve, EmptyAllowedListAdmitsAnyKeyHolderButNotAWrongServerKey) {
  const auto server_keys = transport::generate_curve_keypair();
  ParameterServer server(curve_server(server_keys, {}));
  const auto params = small_params(4700);
  // Ephemeral client pairs (only the server key given): both admitted.
  PsClient first({server.endpoint()}, curve_client(server.curve_public_key(), {}, kCurveAdmittedMs));
  PsClient second({server.endpoint()}, curve_client(server.curve_public_key(), {}, kCurveAdmittedMs));
  EXPECT_EQ(first.curve_public_key().size(), 40u);
  EXPECT_NE(first.curve_public_key(), second.curve_public_key());
  EXPECT_TRUE(bit_equal(first.init(params).wait().tensors, params));
  const PsResult r = second.init({}).wait();
  EXPECT_TRUE(bit_equal(r.tensors, params));
  // A client that trusts another server key cannot complete the handshake.
  const auto impostor = transport::generate_curve_keypair();
  PsClient misled({server.endpoint()}, curve_client(impostor.public_key, {}, kCurveRefusedMs));
  const std::string msg = error_of<transport::TransportError>([&] { misled.init({}).wait(); });
  EXPECT_TRUE(contains(msg, server.endpoint())) << msg;
  EXPECT_EQ(server.stats().curve_rejected, 0);
}

TEST(Curve, ServersSharingAContextEnforceTheirOwnAllowedLists) {
  zmq::context_t ctx;
  const auto keys_a = transport::generate_curve_keypair();
  const auto keys_b = transport::generate_curve_keypair();
  const auto alice = transport::generate_curve_keypair();
  const auto bob = transport::generate_curve_keypair();
  const auto params = small_params(4800);
  for (int round = 0; round < 2; ++round) {  // round 2: the context's ZAP handler starts again
    SCOPED_TRACE("round " + std::to_string(round));
    ParameterServer a(curve_server(keys_a, {alice.public_key}, &ctx));
    ParameterServer b(curve_server(keys_b, {bob.public_key}, &ctx));
    PsClient alice_a({a.endpoint()}, curve_client(a.curve_public_key(), alice, kCurveAdmittedMs, &ctx));
    PsClient bob_b({b.endpoint()}, curve_client(b.curve_public_key(), bob, kCurveAdmittedMs, &ctx));
    EXPECT_TRUE(bit_equal(alice_a.init(params).wait().tensors, params));
    EXPECT_TRUE(bit_equal(bob_b.init(params).wait().tensors, params));
    PsClient alice_b({b.endpoint()}, curve_client(b.curve_public_key(), alice, kCurveRefusedMs, &ctx));
    PsClient bob_a({a.endpoint()}, curve_client(a.curve_public_key(), bob, kCurveRefusedMs, &ctx));
    for (PsClient* c : {&alice_b, &bob_a}) {
      const std::string msg = error_of<transport::TransportError>([&] { c->init({}).wait(); });
      EXPECT_TRUE(contains(msg, "CURVE authentication failed")) << msg;
    }
    EXPECT_GE(a.stats().curve_rejected, 1);
    EXPECT_GE(b.stats().curve_rejected, 1);
  }
}

// A handshake watch closed while its socket still runs (a PsClient resetting its connection, or
// closing) must stop the socket's monitor first. It closed only its own end: when a handshake
// then ended (a refused key's, still in flight), libzmq's I/O thread blocked for good on sending
// that event, and every socket of the context went silent. Here the ZAP handler holds its
// answer until the watch is gone, so the handshake ends after it.
TEST(Curve, AWatchClosedDuringAHandshakeLeavesTheContextWorking) {
  zmq::context_t ctx;
  zmq::socket_t zap(ctx, zmq::socket_type::rep);  // a handler of the test's own, to hold
  zap.set(zmq::sockopt::linger, 0);
  zap.bind("inproc://zeromq.zap.01");
  const auto server_keys = transport::generate_curve_keypair();
  const auto client_keys = transport::generate_curve_keypair();
  zmq::socket_t server(ctx, zmq::socket_type::router);
  server.set(zmq::sockopt::linger, 0);
  transport::set_curve_server(server, server_keys.secret_key, "watch-test");
  server.bind("tcp://127.0.0.1:*");
  zmq::socket_t client(ctx, zmq::socket_type::dealer);
  client.set(zmq::sockopt::linger, 0);
  client.set(zmq::sockopt::curve_serverkey, server_keys.public_key);
  client.set(zmq::sockopt::curve_publickey, client_keys.public_key);
  client.set(zmq::sockopt::curve_secretkey, client_keys.secret_key);
  std::vector<zmq::message_t> request;
  {
    transport::CurveHandshakeWatch watch(ctx, client, client_keys.public_key);
    client.connect(server.get(zmq::sockopt::last_endpoint));
    // The handshake has reached the ZAP request: it is in flight.
    zmq::pollitem_t item{zap.handle(), 0, ZMQ_POLLIN, 0};
    ASSERT_EQ(zmq::poll(&item, 1, std::chrono::milliseconds(3000)), 1);
    do {
      request.emplace_back();
      ASSERT_TRUE(zap.recv(request.back(), zmq::recv_flags::none));
    } while (request.back().more());
    ASSERT_GE(request.size(), 2u);
  }
  // Refused now, after the watch closed (and its end of the pipe is gone): the client's
  // handshake fails with nobody reading.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  zap.send(zmq::str_buffer("1.0"), zmq::send_flags::sndmore);
  zap.send(request[1], zmq::send_flags::sndmore);  // the request id
  zap.send(zmq::str_buffer("400"), zmq::send_flags::sndmore);
  zap.send(zmq::str_buffer("refused"), zmq::send_flags::sndmore);
  zap.send(zmq::str_buffer(""), zmq::send_flags::sndmore);
  zap.send(zmq::str_buffer(""), zmq::send_flags::none);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the failure reaches the client

  // The context's I/O thread still moves messages: a fresh pair over TCP talks.
  zmq::socket_t echo(ctx, zmq::socket_type::pair), caller(ctx, zmq::socket_type::pair);
  echo.set(zmq::sockopt::linger, 0);
  caller.set(zmq::sockopt::linger, 0);
  echo.bind("tcp://127.0.0.1:*");
  caller.connect(echo.get(zmq::sockopt::last_endpoint));
  ASSERT_TRUE(caller.send(zmq::str_buffer("still here"), zmq::send_flags::dontwait));
  zmq::pollitem_t item{echo.handle(), 0, ZMQ_POLLIN, 0};
  const bool arrived = zmq::poll(&item, 1, std::chrono::milliseconds(3000)) == 1;
  EXPECT_TRUE(arrived) << "the context's I/O thread is stuck";
  if (!arrived) std::_Exit(1);  // closing the context would wait for that thread for ever
  zmq::message_t got;
  ASSERT_TRUE(echo.recv(got, zmq::recv_flags::none));
  EXPECT_EQ(got.to_string(), "still here");
}

}  // namespace
}  // namespace tandem
