// What the cluster's roles share (the parameter server and the scorer in cluster_roles.cpp, the
// worker in cluster_worker_role.cpp): registering with the coordinator, waiting for the cluster,
// the parameters' first pull and a pull after the servers were away, and saying goodbye.
// Internal to the engine.
#pragma once

#include <zmq.hpp>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster_link.h"
#include "cluster_roles.h"
#include "coordinator_replies.h"
#include "ps_client.h"
#include "tandem/model.h"
#include "zmq_messaging.h"

namespace tandem::roles {

// A role's context: the caller's (inproc) or its own.
struct RoleContext {
  explicit RoleContext(zmq::context_t* shared)
      : own(shared ? nullptr : std::make_unique<zmq::context_t>(1)),
        context(shared ? *shared : *own) {}
  std::unique_ptr<zmq::context_t> own;
  zmq::context_t& context;
};

RoleRegistration register_role(CoordinatorLink& link, const RoleOptions& o, const char* role);

bool training_over(const std::string& phase);  // draining, done or failed

// Throws Error naming `who` when the coordinator has not answered for o.coordinator_lost_ms.
void check_coordinator(const CoordinatorLink& link, const RoleOptions& o, const std::string& who);

// Waits until the coordinator says the cluster is complete; returns the parameter servers'
// addresses in index order, or an empty list when training ended meanwhile.
std::vector<std::string> wait_for_cluster(CoordinatorLink& link, const RoleOptions& o,
                                          const std::string& who);

// The chief sets the parameters; the others wait until someone has. A worker whose wait finds the
// chief gone (it died before its Init, workers started by hand) sets them itself: the seeded
// initial parameters are the chief's, value for value, and a server takes only the first Init.
// Returns false when training ended while waiting.
bool init_parameters(PsClient& client, const RoleRegistration& r, CoordinatorLink& link,
                     Model& model, bool may_stand_in);

// A role's parameter-server client: the settings', with the role's own CURVE pair when it was
// given one (the settings' client key file names a path on the coordinator's node).
ClientOptions client_options(const RunSettings& s, zmq::context_t& context, const RoleOptions& o);

// Pulls until every server answers again (false when training ended meanwhile). Throws when
// they stay silent for init_timeout_ms.
bool repull(PsClient& client, CoordinatorLink& link, const RoleOptions& o,
            const RoleRegistration& r, Model& model);

// `status`: the role's last counters (a worker's batches done), which the heartbeats may not
// have carried yet.
void say_goodbye(CoordinatorLink& link, const std::string& name,
                 const nlohmann::json& status = nullptr);
// A role's end: goodbye, then an Error saying why when the run failed.
void end_role(CoordinatorLink& link, const std::string& name,
              const nlohmann::json& status = nullptr);

// A goodbye that says the error the role is stopping on (shown in the coordinator's log and
// state); a coordinator already gone is not waited for long.
void say_failed(CoordinatorLink& link, const std::string& name, const std::string& error);

// Runs a registered role's work. An error of its own, not the run's failure (end_role's) nor a
// stop from its process, is said to the coordinator before it goes on up (say_failed).
template <typename Body>
void reporting_failure(CoordinatorLink& link, const std::string& name, Body&& body) {
  try {
    body();
  } catch (const std::exception& e) {
    if (link.phase() != "failed" && !link.cancelled()) say_failed(link, name, e.what());
    throw;
  }
}

// A role stopped from its own process (RoleOptions::cancel) gives up on requests that would
// otherwise wait out their timeouts; those failures are the stop itself, not errors.
template <typename Role>
void run_cancellable(const RoleOptions& o, Role role) {
  try {
    role(o);
  } catch (const transport::TransportError&) {
    if (o.cancel && *o.cancel) return;
    throw;
  }
}

}  // namespace tandem::roles
