// What a role reads in the coordinator's replies, every field checked (json_fields.h). The
// coordinator is another process, perhaps of another release, and whatever answers at its
// address is read the same way: a reply of an unexpected shape is an InputError naming the
// request and the field, never another exception or a number cast out of range.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cluster_roles.h"

namespace tandem {

// The reply to "register": the name and index the role got, and the run's settings.
struct RoleRegistration {
  std::string name;
  int index = 0;
  bool chief = false;
  RunSettings settings;
  std::string run;  // the coordinator's id of this run ("" from an older coordinator)
};
RoleRegistration read_registration_reply(const nlohmann::json& reply);

// The reply to "spec": the phase, whether every role has registered, the scores channel, and
// the members of the roles a role needs, in index order.
struct ClusterSpec {
  std::string phase;
  bool ready = false;
  std::string scores;                      // the scores channel's address
  std::string run;                         // the run's id ("" from an older coordinator)
  std::vector<std::string> ps_addresses;   // each parameter server's
  std::vector<std::string> worker_names;   // the live workers'
};
ClusterSpec read_spec_reply(const nlohmann::json& reply);

// The reply to "work": stop, a task (a list of batches of one epoch), or neither (no batch for
// now: wait up to wait_ms for a change of phase, then ask again).
struct WorkReply {
  bool stop = false;
  bool has_task = false;
  int64_t task_id = 0;
  int64_t epoch = 0;
  std::vector<int64_t> batches;
  int wait_ms = 50;  // 0 to 60,000
};
WorkReply read_work_reply(const nlohmann::json& reply);

}  // namespace tandem
