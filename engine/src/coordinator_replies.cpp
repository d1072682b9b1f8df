#include "coordinator_replies.h"

#include "json_fields.h"
#include "tandem/error.h"

namespace tandem {

using json = nlohmann::json;

namespace {

// One field of each member of a role in a spec ("ps", "address"), in the order listed.
std::vector<std::string> member_field(const JsonFields& spec, const char* role,
                                      const char* field) {
  std::vector<std::string> out;
  if (!spec.has(role)) return out;
  const std::string whose = spec.whose() + ": '" + role + "'";
  for (const json& member : spec.array(role))
    out.push_back(JsonFields(member, whose + " member").text(field));
  return out;
}

}  // namespace

RoleRegistration read_registration_reply(const json& reply) {
  const JsonFields f(reply, "the coordinator's reply to 'register'");
  RoleRegistration r;
  const bool no = false;
  const std::string none;
  r.name = f.text("name");
  r.index = f.small_integer("index");
  if (r.index < 0) throw InputError(f.whose() + ": 'index' is negative");
  r.chief = f.flag("chief", &no);
  r.run = f.text("run", &none);  // absent from older coordinators
  r.settings = run_settings_from_json(f.object("config"));
  return r;
}

ClusterSpec read_spec_reply(const json& reply) {
  const JsonFields f(reply, "the coordinator's reply to 'spec'");
  ClusterSpec c;
  const bool no = false;
  const std::string none;
  c.phase = f.text("phase", &none);
  c.ready = f.flag("ready", &no);
  const JsonFields spec(f.object("spec"), f.whose() + ": 'spec'");
  c.scores = spec.text("scores", &none);
  c.run = spec.text("run", &none);
  c.ps_addresses = member_field(spec, "ps", "address");
  c.worker_names = member_field(spec, "worker", "name");
  return c;
}

WorkReply read_work_reply(const json& reply) {
  const JsonFields f(reply, "the coordinator's reply to 'work'");
  WorkReply w;
  const bool no = false;
  const int64_t fifty = 50;
  w.stop = f.flag("stop", &no);
  w.wait_ms = f.small_integer("wait_ms", &fifty);
  if (w.wait_ms < 0 || w.wait_ms > 60000)
    throw InputError(f.whose() + ": 'wait_ms' is " + std::to_string(w.wait_ms) +
                     ", expected 0 to 60000");
  if (w.stop || !f.has("task")) return w;
  const JsonFields task(f.object("task"), f.whose() + ": 'task'");
  w.has_task = true;
  w.task_id = task.integer("id");
  w.epoch = task.integer("epoch");
  if (w.epoch < 0) throw InputError(task.whose() + ": 'epoch' is negative");
  w.batches = task.integers("batches");
  return w;
}

}  // namespace tandem
