// What the cluster's roles share (cluster_role_support.h).
#include "cluster_role_support.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <thread>

#include "cluster_ranks.h"
#include "json_fields.h"
#include "zmq_messaging.h"
#include "tandem/error.h"

namespace tandem::roles {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

// Whether the chief worker (worker0) is among the live workers the coordinator lists.
bool chief_alive(CoordinatorLink& link) {
  const std::vector<std::string> workers =
      read_spec_reply(link.request({{"type", "spec"}})).worker_names;
  return std::find(workers.begin(), workers.end(), "worker0") != workers.end();
}

}  // namespace

RoleRegistration register_role(CoordinatorLink& link, const RoleOptions& o, const char* role) {
  json request{{"type", "register"}, {"role", role}, {"pid", int64_t(getpid())},
               {"host", host_name()}};
  if (!o.name.empty()) request["name"] = o.name;
  // "full": every place of its kind is held (a server restarted before its old self is counted
  // lost): asked again until the coordinator's wait_ms have passed.
  const auto started = std::chrono::steady_clock::now();
  bool said = false;
  for (;;) {
    const json reply = link.request(request);
    if (!reply.contains("full")) {
      RoleRegistration r = read_registration_reply(reply);
      if (!o.data.empty()) r.settings.data = o.data;
      return r;
    }
    const std::string full = json_string_or(reply, "full", "every place is held");
    // (Bounded as a peer's number: twice the longest heartbeat timeout, a day, and a second.)
    const int64_t wait_ms =
        std::clamp<int64_t>(json_integer_or(reply, "wait_ms", 0), 0, 2 * int64_t{86400000} + 1000);
    if (std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(wait_ms))
      throw InputError("coordinator at " + link.endpoint() + ": register: " + full);
    if (!said)
      std::fprintf(stderr, "tandem %s: %s; waiting up to %.0f s for one to be counted lost, "
                   "whose place a restarted one takes\n", role, full.c_str(),
                   static_cast<double>(wait_ms) / 1000);
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (link.cancelled())  // (a stop from its process: run_cancellable ends the role quietly)
      throw transport::TransportError("coordinator at " + link.endpoint() +
                                      ": stopped while waiting to register");
  }
}

bool training_over(const std::string& phase) {
  return phase == "draining" || phase == "done" || phase == "failed";
}

void check_coordinator(const CoordinatorLink& link, const RoleOptions& o, const std::string& who) {
  // Its heartbeats answered by a coordinator that does not know it: the one it registered with
  // has gone (restarted at the address), and with it this role's run. Going on would serve, or
  // score, a run that is over, and under a name the new run may give another role.
  if (link.forgotten())
    throw Error(who + ": the coordinator at " + link.endpoint() + " does not know this role (it "
                "restarted, or another run serves there): the run it belonged to is over");
  if (const std::string why = link.heartbeat_failure(); !why.empty())
    throw Error(who + ": its heartbeats to the coordinator at " + link.endpoint() +
                " stopped: " + why);
  if (link.coordinator_lost(o.coordinator_lost_ms))
    throw Error(who + ": the coordinator at " + link.endpoint() + " has not answered for " +
                std::to_string(o.coordinator_lost_ms / 1000) + " s");
}

std::vector<std::string> wait_for_cluster(CoordinatorLink& link, const RoleOptions& o,
                                          const std::string& who) {
  for (;;) {
    const ClusterSpec spec = read_spec_reply(link.request({{"type", "spec"}}));
    if (training_over(spec.phase) || training_over(link.phase())) return {};
    if (spec.ready) {
      if (spec.ps_addresses.empty()) throw Error(who + ": the cluster has no parameter server");
      return spec.ps_addresses;
    }
    check_coordinator(link, o, who);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

bool init_parameters(PsClient& client, const RoleRegistration& r, CoordinatorLink& link,
                     Model& model, bool may_stand_in) {
  std::vector<NamedTensor> initial;
  if (r.chief) initial = Model::initialized(r.settings.model, r.settings.seed).parameters();
  const auto deadline = Clock::now() + std::chrono::milliseconds(r.settings.init_timeout_ms);
  auto next_chief_check = Clock::now() + std::chrono::seconds(1);
  std::string waiting_for;  // the last refusal, naming a server still not initialised
  for (;;) {
    try {
      PsResult result = client.init(initial).wait();
      model.parameters() = std::move(result.tensors);
      return true;
    } catch (const ServerError& e) {
      if (!e.not_initialised()) throw;
      waiting_for = e.what();
    }
    if (training_over(link.phase())) return false;
    if (may_stand_in && initial.empty() && Clock::now() >= next_chief_check) {
      next_chief_check = Clock::now() + std::chrono::seconds(1);
      if (!chief_alive(link)) {
        std::fprintf(stderr, "%s: the chief worker (worker0) is gone before initialising the "
                     "parameters; initialising them in its place\n", r.name.c_str());
        initial = Model::initialized(r.settings.model, r.settings.seed).parameters();
        continue;
      }
    }
    if (Clock::now() > deadline)
      throw Error(r.name + ": waited " + std::to_string(r.settings.init_timeout_ms / 1000) +
                  " s for the chief worker (worker0) to initialise the parameters on every "
                  "server; still not initialised: " + waiting_for);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}


ClientOptions client_options(const RunSettings& s, zmq::context_t& context, const RoleOptions& o) {
  ClientOptions c = cluster_client_options(s, &context);
  if (!c.curve_server_key.empty() && !o.coordinator_curve.client.secret_key.empty()) {
    c.curve_public_key = o.coordinator_curve.client.public_key;
    c.curve_secret_key = o.coordinator_curve.client.secret_key;
  }
  return c;
}

bool repull(PsClient& client, CoordinatorLink& link, const RoleOptions& o,
            const RoleRegistration& r, Model& model) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(r.settings.init_timeout_ms);
  for (;;) {
    if (training_over(link.phase())) return false;
    check_coordinator(link, o, r.name);
    try {
      model.parameters() = client.pull().wait().tensors;
      return true;
    } catch (const ServerError& e) {
      // A server restarted without a checkpoint to resume from: give it this worker's newest
      // parameters, which the caller put in `model` (the first Init wins; the servers that
      // kept theirs ignore it).
      if (!e.not_initialised()) throw;
      std::fprintf(stderr, "%s: a parameter server lost its parameters (restarted without a "
                   "checkpoint): initialising it with this worker's newest\n", r.name.c_str());
      try {
        model.parameters() = client.init(model.parameters()).wait().tensors;
        return true;
      } catch (const transport::TransportError&) {
      }
    } catch (const transport::TransportError& e) {
      if (Clock::now() > deadline)
        throw Error(r.name + ": the parameter servers have not answered for " +
                    std::to_string(r.settings.init_timeout_ms / 1000) + " s: " + e.what());
    }
  }
}

void end_role(CoordinatorLink& link, const std::string& name, const json& status) {
  say_goodbye(link, name, status);
  // The run failed (the coordinator's fail(): a start-up timeout, a role's error, a diverged
  // run): the role ends with that error, so that a role started by hand, or a batch system's
  // task, does not report success.
  if (link.phase() == "failed") {
    const std::string why = link.failure();
    throw Error(name + ": the run failed" + (why.empty() ? "" : ": " + why));
  }
}

void say_failed(CoordinatorLink& link, const std::string& name, const std::string& error) {
  try {
    link.request(json{{"type", "goodbye"}, {"name", name}, {"error", error}}, 2000);
  } catch (const Error&) {
    // The coordinator is gone, or the link is what failed: the error goes on up all the same.
  }
}

void say_goodbye(CoordinatorLink& link, const std::string& name, const json& status) {
  try {
    json request{{"type", "goodbye"}, {"name", name}};
    if (!status.is_null()) request["status"] = status;
    // A role stopped from its own process may be stopping because the coordinator is gone:
    // say goodbye, but do not wait long for an answer.
    link.request(request, link.cancelled() ? 500 : -1);
  } catch (const Error&) {
    // The coordinator is gone already; nothing to tell.
  }
}

}  // namespace tandem::roles
