// Fuzz target: the parameter server's decoder (transport::decode) on the frames of one message.
// The input is cut into frames as fuzz_frames.h says. Limits are small so that the fuzzer
// reaches them. Decoding never throws; a message it accepts must re-encode to exactly its header
// frame (the encoding is canonical), with one in-bounds span per tensor frame.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz_frames.h"
#include "fuzz_target.h"
#include "wire_protocol.h"

namespace {

using namespace tandem::transport;

bool inside(ByteSpan part, ByteSpan whole) {
  return part.data >= whole.data && part.data + part.size <= whole.data + whole.size;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::vector<ByteSpan> frames = tandem::fuzz::cut_frames(data, size);
  const DecodeResult r = decode(frames, tandem::fuzz::small_limits());  // documented never to throw on bad input
  FUZZ_CHECK(r.ok() == (r.code == DecodeError::Ok));
  FUZZ_CHECK(r.ok() || !r.error.empty());
  if (!r.ok()) return 0;

  FUZZ_CHECK(r.header_ok);
  FUZZ_CHECK(frames.size() == 1 + r.message.tensors.size());
  FUZZ_CHECK(r.tensor_data.size() == r.message.tensors.size());
  for (size_t i = 0; i < r.tensor_data.size(); ++i) {
    FUZZ_CHECK(inside(r.tensor_data[i], frames[i + 1]));
    FUZZ_CHECK(r.tensor_data[i].size == r.message.tensors[i].bytes);
    // The finite check's vector paths against its scalar answer, on whatever bytes came.
    const size_t first_bad = first_non_finite(r.tensor_data[i]);
    if (r.tensor_data[i].size % 4 == 0)
      FUZZ_CHECK(all_finite(r.tensor_data[i]) == (first_bad == SIZE_MAX));
  }
  std::vector<uint8_t> header;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { header = encode_header_frame(r.message); }));
  FUZZ_CHECK(header.size() == frames[0].size &&
             std::memcmp(header.data(), frames[0].data, header.size()) == 0);
  return 0;
}
