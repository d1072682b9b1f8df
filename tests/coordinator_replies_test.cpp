// What a role reads in the coordinator's replies: the replies of a real coordinator read back as
// sent, and a reply of another shape (another release's, or whatever answers at the address) is
// an InputError naming the request and the field.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "bare_coordinator.h"
#include "cluster_link.h"
#include "coordinator.h"
#include "coordinator_replies.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

using nlohmann::json;

TEST(CoordinatorReplies, ARealCoordinatorsRepliesReadAsSent) {
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_ps = 1;
  o.expected_workers = 1;
  RunSettings settings;
  settings.batch = 250;
  o.run_config = to_json(settings);
  Coordinator c(o);
  CoordinatorLink link(c.endpoint(), context);

  const RoleRegistration ps = read_registration_reply(
      link.request({{"type", "register"}, {"role", "ps"}, {"pid", 1}, {"host", "h"}}));
  EXPECT_EQ(ps.name, "ps0");
  EXPECT_EQ(ps.index, 0);
  EXPECT_FALSE(ps.chief);
  EXPECT_FALSE(ps.run.empty());
  EXPECT_EQ(ps.settings.batch, 250);
  link.request({{"type", "ready"}, {"name", "ps0"}, {"address", "tcp://127.0.0.1:5555"}});
  const RoleRegistration worker = read_registration_reply(
      link.request({{"type", "register"}, {"role", "worker"}, {"pid", 2}, {"host", "h"}}));
  EXPECT_EQ(worker.name, "worker0");
  EXPECT_TRUE(worker.chief);
  EXPECT_EQ(worker.run, ps.run);

  ASSERT_EQ(c.wait_for(ClusterPhase::Training, 2000), ClusterPhase::Training);
  const ClusterSpec spec = read_spec_reply(link.request({{"type", "spec"}}));
  EXPECT_TRUE(spec.ready);
  EXPECT_EQ(spec.phase, "training");
  EXPECT_EQ(spec.scores, c.scores_endpoint());
  EXPECT_EQ(spec.ps_addresses, std::vector<std::string>{"tcp://127.0.0.1:5555"});
  EXPECT_EQ(spec.worker_names, std::vector<std::string>{"worker0"});

  const WorkReply work = read_work_reply(link.request({{"type", "work"}, {"name", "worker0"}}));
  ASSERT_TRUE(work.has_task);
  EXPECT_FALSE(work.stop);
  EXPECT_EQ(work.epoch, 0);
  EXPECT_FALSE(work.batches.empty());
  c.request_stop("test over");
  const WorkReply stop = read_work_reply(
      link.request({{"type", "work"}, {"name", "worker0"}, {"finished", work.task_id}}));
  EXPECT_TRUE(stop.stop);
}

TEST(CoordinatorReplies, AReplyOfAnotherShapeIsRefusedNamingTheField) {
  const json config = to_json(RunSettings{});
  const json registered{{"name", "worker0"}, {"index", 0}, {"config", config}};
  auto with = [](json reply, const char* key, json value) {
    reply[key] = std::move(value);
    return reply;
  };
  const std::vector<std::pair<json, std::string>> bad_registrations = {
      {json::array(), "reply to 'register': [] is not an object"},
      {with(registered, "name", 5), "'register': 'name' is 5, expected text"},
      {with(registered, "index", -1), "'register': 'index' is negative"},
      {with(registered, "index", 1e10), "'index' is 10000000000.0, expected an integer within"},
      {with(registered, "chief", "yes"), "'chief' is \"yes\", expected true or false"},
      {with(registered, "config", json::array({1})), "'config' is [1], expected an object"},
      {with(registered, "config", with(config, "batch", 2.5)), "'batch' is 2.5"},
  };
  for (const auto& [reply, expected] : bad_registrations) {
    const std::string why = test::error_of<InputError>([&] { read_registration_reply(reply); });
    EXPECT_TRUE(test::contains(why, expected)) << reply.dump() << ": " << why;
  }
  // A long value is shown cut, between characters: the text reaches Python as UTF-8.
  std::string accents;
  for (int i = 0; i < 150; ++i) accents += "\xC3\xA9";  // U+00E9, two bytes each
  const json long_index = with(registered, "index", accents);
  const std::string cut = test::error_of<InputError>([&] { read_registration_reply(long_index); });
  EXPECT_TRUE(test::contains(cut, "...")) << cut;
  EXPECT_NO_THROW(json(cut).dump()) << "not UTF-8";
  json no_config = registered;
  no_config.erase("config");
  const std::string why = test::error_of<InputError>([&] { read_registration_reply(no_config); });
  EXPECT_TRUE(test::contains(why, "'register': 'config' is missing")) << why;

  const std::vector<std::pair<json, std::string>> bad_specs = {
      {{{"ready", "yes"}, {"spec", json::object()}}, "'spec': 'ready' is \"yes\""},
      {{{"ready", true}}, "reply to 'spec': 'spec' is missing"},
      {{{"spec", {{"ps", json::object()}}}}, "'spec': 'ps' is {}, expected an array"},
      {{{"spec", {{"ps", {{{"address", 7}}}}}}}, "'ps' member: 'address' is 7, expected text"},
      {{{"spec", {{"worker", {1}}}}}, "'worker' member: 1 is not an object"},
      {{{"spec", {{"scores", nullptr}}}}, "'scores' is null, expected text"},
  };
  for (const auto& [reply, expected] : bad_specs) {
    const std::string why = test::error_of<InputError>([&] { read_spec_reply(reply); });
    EXPECT_TRUE(test::contains(why, expected)) << reply.dump() << ": " << why;
  }

  const json task{{"id", 3}, {"epoch", 0}, {"batches", {0, 2, 4}}};
  const std::vector<std::pair<json, std::string>> bad_work = {
      {{{"stop", 1}}, "reply to 'work': 'stop' is 1, expected true or false"},
      {{{"wait_ms", 1e300}}, "'wait_ms' is 1e+300, expected an integer"},
      {{{"wait_ms", -5}}, "'wait_ms' is -5, expected 0 to 60000"},
      {{{"task", "t"}}, "'task' is \"t\", expected an object"},
      {{{"task", with(task, "id", 1.5)}}, "'task': 'id' is 1.5, expected an integer"},
      {{{"task", with(task, "epoch", -1)}}, "'task': 'epoch' is negative"},
      {{{"task", with(task, "batches", {1, 2.5})}}, "'batches' is 2.5, expected an array of"},
      {{{"task", with(task, "batches", 7)}}, "'batches' is 7, expected an array"},
  };
  for (const auto& [reply, expected] : bad_work) {
    const std::string why = test::error_of<InputError>([&] { read_work_reply(reply); });
    EXPECT_TRUE(test::contains(why, expected)) << reply.dump() << ": " << why;
  }
  // What older coordinators leave out has its default; a task's batches are read whole.
  const WorkReply waiting = read_work_reply(json::object());
  EXPECT_FALSE(waiting.stop || waiting.has_task);
  EXPECT_EQ(waiting.wait_ms, 50);
  const WorkReply given = read_work_reply({{"task", task}});
  EXPECT_EQ(given.batches, (std::vector<int64_t>{0, 2, 4}));
  json older = registered;
  EXPECT_EQ(read_registration_reply(older).run, "");
}

}  // namespace
}  // namespace tandem
