// Fuzz target: the coordinator's control channel, over a real ZeroMQ socket (inproc), as roles,
// `tandem scores` and the dashboard reach it. Each line of the input is one request frame, sent
// in order to a coordinator started for this input (expecting a parameter server, a worker and a
// scorer, so that registering, asking for work and the phases past "starting" can be reached).
// Every request must get a reply, a JSON object (a result or {"error": ...}), within the time
// limit: a control message never takes the coordinator down or leaves a role unanswered.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>
#include <zmq.hpp>

#include "bare_coordinator.h"
#include "coordinator.h"
#include "fuzz_target.h"
#include "zmq_through_signals.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static zmq::context_t context(1);
  std::vector<std::string> requests;
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (size_t begin = 0; begin <= text.size() && requests.size() < 16;) {
    const size_t end = std::min(text.find('\n', begin), text.size());
    requests.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  tandem::CoordinatorOptions o = tandem::test::bare_coordinator_options(context);
  o.expected_ps = 1;
  o.expected_workers = 1;
  o.expected_scorers = 1;
  o.heartbeat_timeout_ms = 60000;  // nothing is lost for silence within one input
  tandem::Coordinator coordinator(o);
  zmq::socket_t role(context, zmq::socket_type::dealer);
  role.set(zmq::sockopt::linger, 0);
  role.connect(coordinator.endpoint());
  for (const std::string& request : requests) {
    // Through signals, as Tandem's own calls: libFuzzer's timer interrupts them (EINTR).
    tandem::transport::send_through_signals(role, zmq::buffer(request), zmq::send_flags::none);
    zmq::pollitem_t item{role.handle(), 0, ZMQ_POLLIN, 0};
    FUZZ_CHECK(tandem::transport::poll_through_signals(&item, 1, std::chrono::seconds(5)) == 1);
    zmq::message_t reply;
    FUZZ_CHECK(tandem::transport::recv_through_signals(role, reply, zmq::recv_flags::none));
    const nlohmann::json r = nlohmann::json::parse(reply.to_string_view(), nullptr, false);
    FUZZ_CHECK(!r.is_discarded() && r.is_object());
    if (r.contains("error")) tandem::fuzz::show_refusal(r["error"].dump().c_str());
  }
  return 0;
}
