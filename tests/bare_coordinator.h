// A coordinator for tests that bring their own roles: on inproc endpoints of `context` (unique
// per call), expecting no parameter server, worker or scorer unless the test asks for them.
#pragma once

#include <string>

#include "coordinator.h"

namespace tandem::test {

inline CoordinatorOptions bare_coordinator_options(zmq::context_t& context) {
  static int counter = 0;
  CoordinatorOptions o;
  o.context = &context;
  o.bind = "inproc://coordinator-test-" + std::to_string(counter);
  o.scores_bind = "inproc://scores-test-" + std::to_string(counter++);
  o.expected_ps = 0;
  o.expected_workers = 0;
  o.expected_scorers = 0;
  o.batches_per_epoch = 10;
  return o;
}

}  // namespace tandem::test
