// Fuzz target: a parameter server's shard (PsShard: the numbers, without sockets) fed a run of
// pushes as the server gets them. The shard starts from fixed parameters: "w" 3x20 (whole
// 16-float groups and a tail), "b" 20 and a scalar "s". The input's first byte chooses the
// optimizer (bit 0: SGD, else Adam); the rest is records, each a little-endian uint16 length and
// then one message's frames (fuzz_frames.h). A message that decodes as a Push or PushPull is
// staged; a refused push must leave the parameters, Adam's moments and the step exactly as they
// were, and an accepted one is applied (request id bit 0: summed as in sync mode, bit 1: the sum
// applied then), after which every parameter must still be finite. Any other message asks the
// shard to select the tensors it names (a Pull's names).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_frames.h"
#include "fuzz_target.h"
#include "ps_shard.h"

namespace {

using namespace tandem;
using namespace tandem::transport;

struct State {
  int64_t step = 0;
  std::vector<float> values, m, v;
  // Bitwise, so that NaN compares equal to itself.
  bool operator==(const State& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() &&
             (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
    };
    return step == o.step && same(values, o.values) && same(m, o.m) && same(v, o.v);
  }
};

State state_of(const PsShard& shard) {
  State s;
  s.step = shard.step();
  for (const PsShard::Entry& e : shard.entries()) {
    s.values.insert(s.values.end(), shard.values(e), shard.values(e) + e.size);
    s.m.insert(s.m.end(), shard.adam_m(e), shard.adam_m(e) + e.size);
    s.v.insert(s.v.end(), shard.adam_v(e), shard.adam_v(e) + e.size);
  }
  return s;
}

void initialize(PsShard& shard) {
  std::vector<float> w(60), b(20), s{0.5f};
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.01f * float(i) - 0.3f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = 0.1f * float(i % 3);
  const Message m = make_message(MessageType::Init, 1, 0,
                                 {float32_tensor("w", {3, 20}), float32_tensor("b", {20}),
                                  float32_tensor("s", {})});
  const std::vector<ByteSpan> data{span_of(w.data(), w.size()), span_of(b.data(), b.size()),
                                   span_of(s.data(), s.size())};
  FUZZ_CHECK(shard.check_initial(m, data).empty());
  shard.initialize(m, data);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  OptimizerConfig optimizer;
  if (data[0] & 1) optimizer.kind = OptimizerKind::Sgd;
  PsShard shard(optimizer);
  initialize(shard);
  for (const ByteSpan& record : tandem::fuzz::cut_frames(data + 1, size - 1, 16)) {
    const DecodeResult r =
        decode(tandem::fuzz::cut_frames(record.data, record.size), tandem::fuzz::small_limits());
    if (!r.ok()) continue;  // the decoder's refusals: wire_frames_fuzz.cpp
    const MessageType type = r.message.header.type;
    if (type != MessageType::Push && type != MessageType::PushPull) {
      std::vector<std::string> names;
      for (const TensorInfo& t : r.message.tensors) names.push_back(t.name);
      std::vector<const PsShard::Entry*> selected;
      if (shard.select(names, selected).empty())
        FUZZ_CHECK(selected.size() == (names.empty() ? shard.entries().size() : names.size()));
      continue;
    }
    const State before = state_of(shard);
    std::string kind;
    const std::string problem = shard.stage_gradients(r.message, r.tensor_data, kind);
    if (!problem.empty()) {
      tandem::fuzz::show_refusal(problem.c_str());
      FUZZ_CHECK(!kind.empty());
      FUZZ_CHECK(state_of(shard) == before);  // a refused push changes nothing
      continue;
    }
    const uint64_t how = r.message.header.request_id;
    if (how & 1) {
      shard.accumulate_staged();
      if (how & 2) shard.apply_accumulated();
    } else {
      shard.apply_staged();
    }
    for (const PsShard::Entry& e : shard.entries())
      for (int64_t i = 0; i < e.size; ++i) FUZZ_CHECK(std::isfinite(shard.values(e)[i]));
  }
  return 0;
}
