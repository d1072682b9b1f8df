// The coordinator of a run whose driver starts the roles itself: the public ClusterCoordinator
// and the Python package's Coordinator build theirs here, so both check the same things, in the
// same order, with the same words.
#pragma once

#include <string>

#include "cluster_roles.h"
#include "coordinator.h"
#include "tandem/cluster.h"

namespace tandem {

struct DrivenCoordinator {
  CoordinatorOptions options;
  std::string resume_note;  // for stderr once the coordinator is made (cluster_resume.h)
};

// Checks `settings` (completing CURVE's: the servers' public key) and the run `options`
// describe (its shape, stop rule and store; its settings string is not read: the caller parsed
// it into `settings`), works out where a resumed run goes on (options.resume, spelt
// `resume_request` in messages; a run on a store not asked to resume is refused when the
// checkpoint directory holds server checkpoints), and returns the coordinator's options.
// InputError naming what is wrong.
DrivenCoordinator driven_coordinator_options(RunSettings& settings,
                                             const ClusterCoordinatorOptions& options,
                                             const std::string& resume_request);

}  // namespace tandem
