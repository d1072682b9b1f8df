#include "driven_coordinator.h"

#include "batch_count.h"
#include "cluster_ranks.h"
#include "cluster_resume.h"
#include "cluster_run.h"
#include "dataset_store.h"
#include "seconds_to_ms.h"
#include "tandem/error.h"

namespace tandem {

DrivenCoordinator driven_coordinator_options(RunSettings& settings,
                                             const ClusterCoordinatorOptions& options,
                                             const std::string& resume_request) {
  for (const std::string* address : {&options.bind, &options.scores_bind})
    if (address->rfind("inproc://", 0) == 0)
      throw InputError("a coordinator whose roles are started apart serves other threads and "
                       "processes over tcp://, not " + *address +
                       " (train_cluster runs every role as a thread)");
  complete_curve_settings(settings);
  check_run_shape(settings, options.ps, options.workers, options.scorers, options.target,
                  options.max_epochs, options.max_seconds, /*driven=*/true);
  DrivenCoordinator driven;
  CoordinatorOptions& o = driven.options;
  o.bind = options.bind;
  // Beside the control socket, on a port of its own (the control address itself, a fixed port,
  // was bound twice: "Address already in use").
  o.scores_bind =
      options.scores_bind.empty() ? scores_bind_beside(options.bind) : options.scores_bind;
  o.advertise_host = options.advertise_host;
  o.expected_ps = options.ps;
  o.expected_workers = options.workers;
  o.expected_scorers = options.scorers;
  o.fed = settings.fed;
  if (!settings.fed) {
    const DatasetStore store = open_store_for_run(settings, options.scorers);
    o.batches_per_epoch = batch_count(store.train.rows, settings.batch);
  }
  o.run_config = to_json(settings);
  o.max_epochs = options.max_epochs;
  o.max_seconds = options.max_seconds;
  o.target = options.target;
  o.startup_timeout_ms = limit_seconds_to_ms(options.startup_timeout_s, "startup_timeout_s");
  o.heartbeat_timeout_ms =
      heartbeat_timeout_to_ms(options.heartbeat_timeout_s, "heartbeat_timeout_s");
  secure_coordinator(o, settings);
  // Last: it reads every server's newest checkpoint. A fed run has no epochs to go on with: its
  // servers start from the checkpoints they find, asked or not, as before resume existed.
  if (!settings.fed) {
    const RunStart start = start_of_run(settings, options.ps, options.max_epochs, options.resume,
                                        resume_request, /*evaluated_at_the_end=*/false);
    o.first_epoch = start.first_epoch;
    driven.resume_note = start.note;
  }
  return driven;
}

}  // namespace tandem
