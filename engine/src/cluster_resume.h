// Whether a run continues from its parameter servers' checkpoints, and with which epoch: one
// rule for `tandem launch|coordinator|rank --resume`, train_cluster, ClusterCoordinator and the
// Python package's Coordinator (each spells the request its own way: "--resume", "resume").
//
// The servers restore from the newest checkpoint in the settings' checkpoint_dir whenever one
// is there (a server restarted within a run must); the epochs and the shuffle order come from
// the coordinator. Only a run asked to resume has them go on where the checkpoints are.
#pragma once

#include <cstdint>
#include <string>

#include "cluster_roles.h"
#include "ps_checkpoint_choice.h"

namespace tandem {

// Whether `dir` holds a parameter server's checkpoint file (NAME-step-STEP.safetensors).
bool holds_server_checkpoint(const std::string& dir);

// InputError unless `dir` holds a server checkpoint: a request to continue a run with nothing
// to continue (a mistyped directory, a first run) is refused rather than trained from scratch.
void require_server_checkpoint(const std::string& dir, const std::string& request);

// Where a run of `servers` servers asked to resume goes on: require_server_checkpoint on the
// settings' checkpoint_dir (which must be set), then resume_point_of_servers (InputError for a
// server whose checkpoints it cannot resume from: damaged, or another optimizer's), then the
// refusal of checkpoints holding other parts than this run places on each server (another model
// or number of servers); every InputError prefixed by the request.
ResumePoint resume_point_of_run(const RunSettings& settings, int servers,
                                const std::string& request);

// What a resumed run says before it starts, once nothing can refuse it (each line "tandem:
// ...", empty when there is nothing to say): servers at different steps, servers that start
// empty or whose checkpoints do not say their epochs (the epochs count from the first again),
// and where the epochs go on, or that `max_epochs` (spelt `limit_name`) leaves nothing to
// train (`evaluated_at_the_end`: the run then evaluates the servers' parameters).
std::string resume_note(const ResumePoint& point, int64_t max_epochs,
                        const std::string& limit_name, bool evaluated_at_the_end);

// Where a library run on a store starts (train_cluster, ClusterCoordinator, the Python
// package's Coordinator): with `resume`, resume_point_of_run's epochs and what to say of it
// (resume_note, max_epochs spelt as the library spells it); without, the refusal below.
struct RunStart {
  int64_t first_epoch = 0;
  std::string note;
};
RunStart start_of_run(const RunSettings& settings, int servers, int64_t max_epochs, bool resume,
                      const std::string& request, bool evaluated_at_the_end);

// A run not asked to resume whose checkpoint_dir holds server checkpoints: InputError. Its
// servers would start from those parameters while its epochs counted from the first, half of
// a resumed run. (`tandem launch` clears its own run directory's instead.)
void refuse_checkpoints_not_asked_for(const RunSettings& settings, const std::string& request);

}  // namespace tandem
