// A coordinator for tests that bring their own roles: on inproc endpoints of `context` (unique
// per call), expecting no parameter server, worker or scorer unless the test asks for them.
#pragma once

#include <string>

#include "cluster_link.h"
#include "coordinator.h"

namespace tandem::test {

// Registers `name` as a scorer over `link`: the coordinator takes scores only from a registered
// scorer (a scorer of an earlier run must not stop this one).
inline void register_scorer(CoordinatorLink& link, const std::string& name = "scorer0") {
  link.request({{"type", "register"}, {"role", "scorer"}, {"name", name}});
}

// A score from the scorer register_scorer registered.
inline nlohmann::json score_request(int64_t step, double loss, double accuracy) {
  return {{"type", "score"}, {"name", "scorer0"}, {"step", step}, {"loss", loss},
          {"accuracy", accuracy}};
}

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
