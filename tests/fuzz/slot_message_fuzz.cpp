// Fuzz target: a frame of the trial-slot protocol (tandem trial-slots) through
// decode_slot_message. Anything but a valid message is a SlotProtocolError; a message it accepts
// encodes to a frame that decodes to the same message.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_target.h"
#include "trial_slot_protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem::cli;
  const std::string frame(reinterpret_cast<const char*>(data), size);
  SlotMessage m;
  if (!tandem::fuzz::accepts([&] { m = decode_slot_message(frame); })) return 0;
  std::string encoded;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { encoded = encode_slot_message(m); }));
  SlotMessage again;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { again = decode_slot_message(encoded); }));
  FUZZ_CHECK(encode_slot_message(again) == encoded);
  return 0;
}
