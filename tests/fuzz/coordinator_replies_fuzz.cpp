// Fuzz target: what a role reads in the coordinator's replies (coordinator_replies.h). The
// input's first byte chooses the reply (0: to "register", 1: to "spec", 2: to "work", modulo 3);
// the rest is the reply's JSON text, as the role's link receives it. A reply that is not JSON
// never reaches these readers (CoordinatorLink refuses it), so neither does it here. A reply of
// another shape is an InputError; one that is read gives values within their ranges.
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "coordinator_replies.h"
#include "fuzz_target.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tandem;
  if (size < 1) return 0;
  const nlohmann::json reply = nlohmann::json::parse(
      std::string(reinterpret_cast<const char*>(data) + 1, size - 1), nullptr, false);
  if (reply.is_discarded()) return 0;
  switch (data[0] % 3) {
    case 0: {
      RoleRegistration r;
      if (fuzz::accepts([&] { r = read_registration_reply(reply); }))
        FUZZ_CHECK(r.index >= 0 && r.settings.batch >= 1);
      break;
    }
    case 1: {
      ClusterSpec spec;
      fuzz::accepts([&] { spec = read_spec_reply(reply); });
      break;
    }
    default: {
      WorkReply work;
      if (fuzz::accepts([&] { work = read_work_reply(reply); })) {
        FUZZ_CHECK(work.wait_ms >= 0 && work.wait_ms <= 60000);
        FUZZ_CHECK(!work.has_task || (!work.stop && work.epoch >= 0));
        FUZZ_CHECK(work.has_task || work.batches.empty());
      }
    }
  }
  return 0;
}
