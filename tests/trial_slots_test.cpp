// tandem trial-slots' protocol (trial_slot_protocol.h) and server (trial_slot_server.h): every
// message type through encode and decode, the errors for bad frames, and a server on an
// ephemeral loopback port that answers garbage, unknown types, refused commands and a start
// beyond its slots with an error and keeps serving; cancels a job; reports exit statuses; ends
// the jobs of a client that says bye or goes silent, killing one that ignores SIGTERM after the
// grace. The server's jobs here are /bin/sh -c SCRIPT (its allowed command is "-c"), not tandem
// train.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <zmq.hpp>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <mutex>
#include <optional>
#include <thread>

#include "test_support.h"
#include "trial_slot_pool.h"
#include "trial_slot_protocol.h"
#include "trial_process.h"
#include "trial_slot_server.h"

namespace tandem::cli {
namespace {

using Clock = std::chrono::steady_clock;
namespace fs = std::filesystem;

SlotMessage round_trip(const SlotMessage& m) { return decode_slot_message(encode_slot_message(m)); }

TEST(TrialSlotProtocol, EveryTypeRoundTrips) {
  SlotMessage hello(SlotMessageType::Hello);
  hello.slots = 3;
  hello.running = 1;
  hello.threads = 2;
  hello.heartbeat_timeout_ms = 2500;
  const SlotMessage h = round_trip(hello);
  EXPECT_EQ(h.type, SlotMessageType::Hello);
  EXPECT_EQ(h.slots, 3);
  EXPECT_EQ(h.running, 1);
  EXPECT_EQ(h.threads, 2);
  EXPECT_EQ(h.heartbeat_timeout_ms, 2500);
  EXPECT_EQ(round_trip(SlotMessage(SlotMessageType::Hello)).slots, 0);  // the search's hello

  SlotMessage start(SlotMessageType::Start);
  start.job = "trial-3.r1";
  start.args = {"train", "--data", "/d/store with spaces", "--lr", "0.001", "\"quoted\""};
  start.log = "/out/trial-3.log";
  const SlotMessage s = round_trip(start);
  EXPECT_EQ(s.type, SlotMessageType::Start);
  EXPECT_EQ(s.job, start.job);
  EXPECT_EQ(s.args, start.args);
  EXPECT_EQ(s.log, start.log);

  SlotMessage started(SlotMessageType::Started);
  started.job = "j";
  started.pid = 4242;
  EXPECT_EQ(round_trip(started).pid, 4242);

  SlotMessage exited(SlotMessageType::Exited);
  exited.job = "j";
  exited.exit_code = 3;
  EXPECT_EQ(round_trip(exited).exit_code, 3);
  EXPECT_EQ(round_trip(exited).signal, 0);
  exited.exit_code = -1;
  exited.signal = SIGTERM;
  EXPECT_EQ(round_trip(exited).signal, SIGTERM);
  EXPECT_EQ(round_trip(exited).exit_code, -1);

  // An error naming a path that is not UTF-8 (a --root of Latin-1 bytes) is sent with U+FFFD
  // in place of the bad byte: dump() threw on it, out of the slot server's loop.
  SlotMessage refusal(SlotMessageType::Error);
  refusal.error = "outside the root /srv/caf\xe9";
  EXPECT_EQ(round_trip(refusal).error, "outside the root /srv/caf\xef\xbf\xbd");

  SlotMessage cancel(SlotMessageType::Cancel);
  cancel.job = "j";
  EXPECT_EQ(round_trip(cancel).job, "j");

  SlotMessage beat(SlotMessageType::Heartbeat);
  beat.running = 2;
  EXPECT_EQ(round_trip(beat).running, 2);
  EXPECT_FALSE(round_trip(beat).jobs_listed);  // a search's heartbeat lists nothing
  beat.seq = 17;
  beat.jobs = {"trial-0.r0", "trial-3.r1"};
  beat.jobs_listed = true;
  const SlotMessage answer = round_trip(beat);
  EXPECT_EQ(answer.seq, 17);
  EXPECT_TRUE(answer.jobs_listed);
  EXPECT_EQ(answer.jobs, beat.jobs);
  EXPECT_TRUE(answer.ended.empty());
  beat.ended = {{"trial-1.r0", 0, 0}, {"trial-2.r0", -1, SIGKILL}};
  const SlotMessage with_ended = round_trip(beat);
  ASSERT_EQ(with_ended.ended.size(), 2u);
  EXPECT_EQ(with_ended.ended[0].job, "trial-1.r0");
  EXPECT_EQ(with_ended.ended[0].exit_code, 0);
  EXPECT_EQ(with_ended.ended[0].signal, 0);
  EXPECT_EQ(with_ended.ended[1].job, "trial-2.r0");
  EXPECT_EQ(with_ended.ended[1].exit_code, -1);
  EXPECT_EQ(with_ended.ended[1].signal, SIGKILL);
  beat.ended.clear();
  beat.jobs.clear();  // none left: still a list, not the field left out
  EXPECT_TRUE(round_trip(beat).jobs_listed);
  EXPECT_EQ(round_trip(SlotMessage(SlotMessageType::Bye)).type, SlotMessageType::Bye);

  SlotMessage claim(SlotMessageType::Claim);
  claim.dir = "/out/search";
  EXPECT_EQ(round_trip(claim).type, SlotMessageType::Claim);
  EXPECT_EQ(round_trip(claim).dir, "/out/search");
  SlotMessage claimed(SlotMessageType::Claimed);
  claimed.dir = "/out/search";
  claimed.ended_jobs = 2;
  EXPECT_EQ(round_trip(claimed).dir, "/out/search");
  EXPECT_EQ(round_trip(claimed).ended_jobs, 2);

  SlotMessage error(SlotMessageType::Error);
  error.error = "all 1 slot(s) busy";
  error.job = "j";
  EXPECT_EQ(round_trip(error).error, error.error);
  EXPECT_EQ(round_trip(error).job, "j");
  EXPECT_FALSE(round_trip(error).busy);
  error.busy = true;
  EXPECT_TRUE(round_trip(error).busy);
}

void expect_refused(const std::string& frame, const std::string& text) {
  try {
    decode_slot_message(frame);
    ADD_FAILURE() << "decoded: " << frame;
  } catch (const SlotProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what() << " for " << frame;
  }
}

TEST(TrialSlotProtocol, BadFramesAreRefusedWithTheReason) {
  expect_refused(std::string("\xff\x00garbage", 9), "not a JSON object");
  expect_refused("[1, 2]", "not a JSON object");
  expect_refused(R"({"type": "hello"})", "no protocol version");
  expect_refused(R"({"v": 2, "type": "hello"})", "protocol version 2; this program speaks version 1");
  expect_refused(R"({"v": 1})", "missing field \"type\"");
  expect_refused(R"({"v": 1, "type": "launch"})", "unknown message type \"launch\"");
  expect_refused(R"({"v": 1, "type": "start", "job": "j", "log": "l"})", "\"args\" must be");
  expect_refused(R"({"v": 1, "type": "start", "job": "j", "log": "l", "args": []})", "\"args\" must be");
  expect_refused(R"({"v": 1, "type": "start", "job": "j", "log": "l", "args": ["train", 3]})",
                 "list of strings");
  expect_refused(R"({"v": 1, "type": "start", "job": 7, "log": "l", "args": ["train"]})",
                 "\"job\" is not a string");
  expect_refused(R"({"v": 1, "type": "start", "job": "", "log": "l", "args": ["train"]})", "empty \"job\"");
  expect_refused(R"({"v": 1, "type": "cancel"})", "missing field \"job\"");
  expect_refused(R"({"v": 1, "type": "claim"})", "missing field \"dir\"");
  expect_refused(R"({"v": 1, "type": "claim", "dir": ""})", "claim: empty \"dir\"");
  expect_refused(R"({"v": 1, "type": "claim", "dir": "/o\nut"})",
                 "claim: a control character in \"dir\"");
  expect_refused(R"({"v": 1, "type": "claimed", "dir": "/out"})", "missing field \"ended\"");
  expect_refused(R"({"v": 1, "type": "exited", "job": "j"})", "either \"exit_code\" or \"signal\"");
  expect_refused(R"({"v": 1, "type": "heartbeat", "ended": {"job": "j"}})",
                 "\"ended\" must be a list of objects");
  expect_refused(R"({"v": 1, "type": "heartbeat", "ended": ["j"]})", "list of objects");
  expect_refused(R"({"v": 1, "type": "heartbeat", "ended": [{"job": "j"}]})",
                 "an \"ended\" entry: give either \"exit_code\" or \"signal\"");
  expect_refused(R"({"v": 1, "type": "heartbeat", "ended": [{"exit_code": 0}]})",
                 "missing field \"job\"");
  expect_refused(R"({"v": 1, "type": "error", "error": "e", "busy": 1})", "\"busy\" is not a boolean");
  expect_refused(R"({"v": 1, "type": "started", "job": "j", "pid": 1e30})", "\"pid\" is not an integer");
  expect_refused(R"({"v": 1, "type": "heartbeat", "running": 99999999999})", "out of range");
  // 2^64 - 1 was read as -1 (nlohmann's unsigned value, wrapped), which passed the range check.
  expect_refused(R"({"v": 1, "type": "heartbeat", "running": 18446744073709551615})",
                 "out of range");
  // exec would cut an argument at a NUL: what a --root checks would not be what the job gets.
  expect_refused(
      R"({"v": 1, "type": "start", "job": "j", "log": "l", "args": ["train", "/a\u0000/../b"]})",
      "a control character in argument 2 of \"args\"");
  // A newline in an argument, written into the job's log by its error message, let a peer append
  // whole lines of its choosing to any file the server's user can write (the log pointed at it).
  expect_refused(R"({"v": 1, "type": "start", "job": "j", "log": "/tmp/k", "args": ["train",
                 "--data", "/x\nssh-ed25519 AAAA attacker\n"]})",
                 "a control character in argument 3 of \"args\"");
  expect_refused(R"({"v": 1, "type": "start", "job": "j", "log": "l\tog", "args": ["train"]})",
                 "a control character in \"log\" or \"job\"");
  expect_refused(R"({"v": 1, "type": "start", "job": "j\u007f", "log": "l", "args": ["train"]})",
                 "a control character in \"log\" or \"job\"");
  // Refused by the client that would send it too, with the same words (the server's answer to
  // a bad message names no job, and the client took it for the job gone).
  SlotMessage tab(SlotMessageType::Start);
  tab.job = "j";
  tab.log = "j.log";
  tab.args = {"predict", "--data", "/a\tb.zarr"};
  const std::string why = test::error_of<SlotProtocolError>([&] { encode_slot_message(tab); });
  EXPECT_NE(why.find("a control character in argument 3 of \"args\""), std::string::npos) << why;
}

bool process_running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  std::getline(stat, text);
  return !text.empty() && text.find(") Z ") == std::string::npos;
}

// A search's side, by hand: a DEALER that sends raw frames and reads the answers.
class Client {
 public:
  Client(zmq::context_t& context, const std::string& endpoint,
         const std::string& routing_id = std::string())
      : socket_(context, zmq::socket_type::dealer) {
    socket_.set(zmq::sockopt::linger, 0);
    if (!routing_id.empty()) socket_.set(zmq::sockopt::routing_id, routing_id);
    socket_.connect(endpoint);
  }
  // The server's answer to a heartbeat of this sequence number, within 10 s (or a message of
  // type Bye: none came).
  SlotMessage heartbeat_answer(int seq) {
    const std::optional<SlotMessage> m = first(
        [seq](const SlotMessage& m) { return m.type == SlotMessageType::Heartbeat && m.seq == seq; },
        seq, true);
    return m ? *m : SlotMessage(SlotMessageType::Bye);
  }
  void send_raw(const std::vector<std::string>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      socket_.send(zmq::buffer(frames[i]),
                   i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  }
  void send(const SlotMessage& m) { send_raw({encode_slot_message(m)}); }
  // The next message that is not a heartbeat, within 10 s. Heartbeats go out meanwhile (every
  // 250 ms), so a slow answer does not make this client silent.
  SlotMessage next() {
    const std::optional<SlotMessage> m =
        first([](const SlotMessage& m) { return m.type != SlotMessageType::Heartbeat; }, 0, false);
    if (m) return *m;
    ADD_FAILURE() << "no answer within 10 s";
    return SlotMessage(SlotMessageType::Bye);
  }
  SlotMessage start(const std::string& job, const std::string& script) {
    SlotMessage m(SlotMessageType::Start);
    m.job = job;
    m.args = {"-c", script};
    m.log = log_;
    send(m);
    return next();
  }
  std::string log_ = "/dev/null";

 private:
  // The first message `wanted` takes, within 10 s; heartbeats of sequence number `seq` go out
  // every 250 ms meanwhile (the first at once when `beat_now`).
  template <typename Wanted>
  std::optional<SlotMessage> first(Wanted wanted, int seq, bool beat_now) {
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    auto beat = beat_now ? Clock::time_point() : Clock::now();
    while (Clock::now() < deadline) {
      if (Clock::now() - beat >= std::chrono::milliseconds(250)) {
        SlotMessage m(SlotMessageType::Heartbeat);
        m.seq = seq;
        send(m);
        beat = Clock::now();
      }
      zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(50));
      zmq::message_t frame;
      if (!socket_.recv(frame, zmq::recv_flags::dontwait)) continue;
      const SlotMessage m = decode_slot_message(frame.to_string());
      if (wanted(m)) return m;
    }
    return std::nullopt;
  }
  zmq::socket_t socket_;
};

class TrialSlotServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    TrialSlotServerOptions o;
    o.slots = slots_;
    o.program = "/bin/sh";
    o.allowed_commands = {"-c"};
    o.heartbeat_timeout_ms = heartbeat_timeout_ms_;
    o.kill_grace_ms = 500;
    o.log = [this](const std::string& line) {
      const std::lock_guard<std::mutex> lock(log_mutex_);
      log_ += line + "\n";
    };
    server_ = std::make_unique<TrialSlotServer>(o);
    thread_ = std::thread([this] { server_->serve(stop_); });
  }
  void TearDown() override {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::string server_log() {
    const std::lock_guard<std::mutex> lock(log_mutex_);
    return log_;
  }
  std::mutex log_mutex_;
  std::string log_;  // the server's event lines
  int heartbeat_timeout_ms_ = 1500;
  int slots_ = 1;
  zmq::context_t context_{1};
  std::unique_ptr<TrialSlotServer> server_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_F(TrialSlotServerTest, AnswersBadInputWithErrorsAndKeepsServing) {
  ASSERT_EQ(server_->endpoint().rfind("tcp://127.0.0.1:", 0), 0u) << server_->endpoint();
  Client c(context_, server_->endpoint());
  c.send_raw({std::string("\x01\x02 not json", 11)});
  SlotMessage m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_NE(m.error.find("bad message: not a JSON object"), std::string::npos) << m.error;
  c.send_raw({"{}", "{}"});
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_NE(m.error.find("expected one frame"), std::string::npos) << m.error;
  c.send_raw({R"({"v": 1, "type": "reboot"})"});
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_NE(m.error.find("unknown message type \"reboot\""), std::string::npos) << m.error;
  c.send_raw({R"({"v": 7, "type": "hello"})"});
  EXPECT_NE(c.next().error.find("protocol version 7"), std::string::npos);
  SlotMessage exited(SlotMessageType::Exited);  // a server's message, sent to a server
  exited.job = "j";
  exited.exit_code = 0;
  c.send(exited);
  EXPECT_NE(c.next().error.find("does not take \"exited\""), std::string::npos);
  SlotMessage cancel(SlotMessageType::Cancel);
  cancel.job = "nothing";
  c.send(cancel);
  EXPECT_NE(c.next().error.find("no running job nothing"), std::string::npos);

  // Only the allowed command runs.
  SlotMessage start(SlotMessageType::Start);
  start.job = "evil";
  start.args = {"rm", "-rf", "/tmp/x"};
  start.log = "/dev/null";
  c.send(start);
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_EQ(m.job, "evil");
  EXPECT_NE(m.error.find("runs only `tandem -c ...`, not `rm`"), std::string::npos) << m.error;

  // A job's output goes to a .log file only: a peer once had it appended to any file it named
  // (~/.bashrc), its arguments, echoed in the job's errors, choosing the text.
  const test::TempDir home;
  start.job = "rc";
  start.args = {"-c", "exit 0"};
  start.log = home.file(".bashrc");
  c.send(start);
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_NE(m.error.find("its log, " + start.log + ", is not a .log file"), std::string::npos)
      << m.error;
  EXPECT_FALSE(std::filesystem::exists(start.log));
  // The server's log quotes what peers send with its control characters escaped: a newline in
  // a message's text forged a line of the peer's own.
  c.send_raw({R"({"v": 1, "type": "reboot\nforged line"})"});
  EXPECT_EQ(c.next().type, SlotMessageType::Error);
  const std::string log = server_log();
  EXPECT_NE(log.find("reboot\\x0aforged line"), std::string::npos) << log;
  EXPECT_EQ(log.find("\nforged line"), std::string::npos) << log;

  // Still serving: hello answers with the slot count.
  c.send(SlotMessage(SlotMessageType::Hello));
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Hello);
  EXPECT_EQ(m.slots, 1);
  EXPECT_EQ(m.heartbeat_timeout_ms, 1500);
}

// The first line a job of `client` writes to its log, once there (within 10 s). The client
// sends heartbeats meanwhile: a slow start must not make it a silent client whose jobs end.
std::string first_line_of(Client& client, const std::string& log) {
  std::string first;
  test::eventually(
      [&] {
        client.send(SlotMessage(SlotMessageType::Heartbeat));
        std::ifstream in(log);
        std::getline(in, first);
        return !first.empty();
      },
      10000, 10);
  return first;
}

// A search's routing id is its secret: whoever connects with it takes over its session (its
// replies, its jobs' cancels). The server's log, often on a shared filesystem, named it whole.
TEST_F(TrialSlotServerTest, TheLogNamesASearchWithoutItsSecret) {
  const std::string secret = "0123456789abcdef0123456789abcdef";
  Client c(context_, server_->endpoint(), "search-4242-" + secret);
  c.send(SlotMessage(SlotMessageType::Hello));
  EXPECT_EQ(c.next().type, SlotMessageType::Hello);
  const std::string log = server_log();
  EXPECT_NE(log.find("(search-4242-0123...) connected"), std::string::npos) << log;
  EXPECT_EQ(log.find(secret.substr(4)), std::string::npos) << log;
}

TEST_F(TrialSlotServerTest, RunsCancelsAndRefusesJobsBeyondItsSlots) {
  Client c(context_, server_->endpoint());
  const std::string log = ::testing::TempDir() + "trial_slots_test.log";
  std::remove(log.c_str());
  c.log_ = log;
  SlotMessage m = c.start("a", "echo hello from a; exec sleep 30");
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  EXPECT_EQ(m.job, "a");
  const pid_t a = m.pid;
  EXPECT_TRUE(process_running(a));
  EXPECT_EQ(first_line_of(c, log), "hello from a");  // the job's output goes to its log
  m = c.start("b", "exit 0");  // one slot, taken
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_EQ(m.job, "b");
  EXPECT_NE(m.error.find("all 1 slot(s) of this server are busy"), std::string::npos) << m.error;
  EXPECT_TRUE(m.busy);  // the search may try again later
  m = c.start("a", "exit 0");
  ASSERT_EQ(m.type, SlotMessageType::Error);
  SlotMessage beat(SlotMessageType::Heartbeat);
  c.send(beat);
  SlotMessage cancel(SlotMessageType::Cancel);
  cancel.job = "a";
  c.send(cancel);
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Exited);
  EXPECT_EQ(m.job, "a");
  EXPECT_EQ(m.signal, SIGTERM);
  EXPECT_FALSE(process_running(a));
  // The slot is free again; an exit status comes back as it is.
  m = c.start("c", "exit 3");
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Exited);
  EXPECT_EQ(m.job, "c");
  EXPECT_EQ(m.exit_code, 3);
}

// A job that ignores SIGTERM (sleep inherits the ignored signal across exec), started once its
// log says the trap is set, so that SIGTERM cannot land before it.
const char* kJobIgnoringSigterm = "trap '' TERM; echo ready; exec sleep 30";

void wait_until_ready(Client& client) { ASSERT_EQ(first_line_of(client, client.log_), "ready"); }

bool ends_within(pid_t pid, std::chrono::seconds limit) {
  return test::eventually([&] { return !process_running(pid); },
                          int(std::chrono::milliseconds(limit).count()), 20);
}

TEST_F(TrialSlotServerTest, KillsTheJobsOfASilentClientEvenWhenTheyIgnoreSigterm) {
  pid_t pid = 0;
  {
    Client silent(context_, server_->endpoint());
    silent.log_ = ::testing::TempDir() + "trial_slots_silent.log";
    std::remove(silent.log_.c_str());
    const SlotMessage m = silent.start("long", kJobIgnoringSigterm);
    ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
    pid = m.pid;
    wait_until_ready(silent);
  }  // the client says nothing more (its socket is closed, as a killed search's would be)
  EXPECT_TRUE(process_running(pid));
  EXPECT_TRUE(ends_within(pid, std::chrono::seconds(10)))
      << "the silent client's job outlived the 1.5 s timeout and the 0.5 s grace by 10 s";
  // The slot is free for the next client.
  Client next(context_, server_->endpoint());
  EXPECT_EQ(next.start("after", "exit 0").type, SlotMessageType::Started);
}

TEST_F(TrialSlotServerTest, ACancelledJobThatIgnoresSigtermIsKilledAfterTheGrace) {
  Client c(context_, server_->endpoint());
  c.log_ = ::testing::TempDir() + "trial_slots_cancel.log";
  std::remove(c.log_.c_str());
  SlotMessage m = c.start("ignores-term", kJobIgnoringSigterm);
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  wait_until_ready(c);
  SlotMessage cancel(SlotMessageType::Cancel);
  cancel.job = "ignores-term";
  const auto sent = Clock::now();
  c.send(cancel);
  m = c.next();
  ASSERT_EQ(m.type, SlotMessageType::Exited);
  EXPECT_EQ(m.job, "ignores-term");
  EXPECT_EQ(m.signal, SIGKILL);  // SIGTERM was ignored
  EXPECT_GE(Clock::now() - sent, std::chrono::milliseconds(500)) << "killed before its grace";
}

// A job cancelled (one SIGTERM) and then stopped with the server within its grace gets no second
// SIGTERM: a trial takes a second one, a second or more after the first, as "stop at once"
// (stop_signals.h), and ends without its result.
TEST_F(TrialSlotServerTest, StoppingTheServerSignalsACancelledJobNoMore) {
  Client c(context_, server_->endpoint());
  c.log_ = ::testing::TempDir() + "trial_slots_one_term.log";
  std::remove(c.log_.c_str());
  SlotMessage m =
      c.start("counts-terms", "trap 'echo TERM' TERM; echo ready; while :; do sleep 0.02; done");
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  const pid_t pid = m.pid;
  wait_until_ready(c);
  const auto terms = [&] {
    std::ifstream in(c.log_);
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line == "TERM";
    return n;
  };
  SlotMessage cancel(SlotMessageType::Cancel);
  cancel.job = "counts-terms";
  c.send(cancel);
  ASSERT_TRUE(test::eventually(
      [&] {
        c.send(SlotMessage(SlotMessageType::Heartbeat));
        return terms() == 1;
      },
      5000, 10));
  stop_.store(true);  // the server stops its jobs, this one still within its 500 ms grace
  thread_.join();
  EXPECT_FALSE(process_running(pid));
  EXPECT_EQ(terms(), 1) << "the cancelled job was sent SIGTERM again";
}

// A server told to stop (SIGTERM to tandem trial-slots) drains its running jobs: one SIGTERM each,
// then their grace to end. The job's log tells how it ended: killed at once, signalled twice, or
// not waited for (the serving thread's exit kills its jobs through PR_SET_PDEATHSIG, before the
// job's "drained").
TEST_F(TrialSlotServerTest, StoppingTheServerDrainsARunningJobWithinItsGrace) {
  Client c(context_, server_->endpoint());
  c.log_ = ::testing::TempDir() + "trial_slots_drain.log";
  std::remove(c.log_.c_str());
  const SlotMessage m = c.start("draining", "trap 'echo TERM; sleep 0.2; echo drained; exit 0' "
                                            "TERM; echo ready; while :; do sleep 0.02; done");
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  wait_until_ready(c);
  stop_.store(true);
  thread_.join();
  EXPECT_FALSE(process_running(m.pid));
  std::ifstream in(c.log_);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  EXPECT_EQ(lines, (std::vector<std::string>{"ready", "TERM", "drained"}));
}

// ... and a job that ignores SIGTERM is killed once the grace (500 ms here) is over: the server's
// stop does not wait for it forever.
TEST_F(TrialSlotServerTest, StoppingTheServerKillsAJobIgnoringSigtermAfterTheGrace) {
  Client c(context_, server_->endpoint());
  c.log_ = ::testing::TempDir() + "trial_slots_drain_stubborn.log";
  std::remove(c.log_.c_str());
  const SlotMessage m = c.start("stubborn", kJobIgnoringSigterm);
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  wait_until_ready(c);
  const auto stopped = Clock::now();
  stop_.store(true);
  thread_.join();
  EXPECT_FALSE(process_running(m.pid));
  EXPECT_GE(Clock::now() - stopped, std::chrono::milliseconds(500)) << "killed before its grace";
  EXPECT_LT(Clock::now() - stopped, std::chrono::seconds(10)) << "the job held the stop up";
}

TEST_F(TrialSlotServerTest, ByeEndsTheClientsJobs) {
  // The client goes on sending heartbeats after its bye, so only the bye can end the job (a
  // silent client's jobs end too, but this one is never silent).
  Client c(context_, server_->endpoint());
  SlotMessage m = c.start("plain", "exec sleep 30");
  ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  const pid_t pid = m.pid;
  c.send(SlotMessage(SlotMessageType::Bye));
  EXPECT_TRUE(test::eventually(
      [&] {
        c.send(SlotMessage(SlotMessageType::Heartbeat));
        return !process_running(pid);
      },
      10000, 100))
      << "the job outlived its client's bye by 10 s";
}

// A log the server cannot open (a directory it does not share) is refused with the reason; the
// job once ran on with the server's own output, and its failure came back with no reason.
TEST_F(TrialSlotServerTest, AJobWhoseLogCannotBeOpenedIsRefusedWithTheReason) {
  Client c(context_, server_->endpoint());
  c.log_ = "/nonexistent-dir/trial.log";
  const SlotMessage m = c.start("nolog", "exit 0");
  ASSERT_EQ(m.type, SlotMessageType::Error);
  EXPECT_NE(m.error.find("cannot open its log /nonexistent-dir/trial.log: No such file"),
            std::string::npos)
      << m.error;
}

// With --root, a job that names a path outside the directory (its log, an argument, the value
// of --flag=value; "..", symbolic links and relative paths resolved) is refused, naming it; a
// job within it runs there.
// A child that cannot start says why in its log (written between fork and exec, with
// async-signal-safe calls only) and exits 127: a working directory it cannot enter, a program
// that does not exist.
TEST(TrialProcess, AChildThatCannotStartSaysWhyInItsLog) {
  test::TempDir dir;
  int runs = 0;
  auto run = [&](const std::vector<std::string>& argv, const std::string& working_dir) {
    const std::string log = dir.file("log-" + std::to_string(++runs));
    const pid_t pid = cli::start_child_process(argv, log, "test", false, working_dir);
    int status = 0;
    EXPECT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 127) << status;
    std::ifstream in(log);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  const std::string gone = dir.file("no-such-dir");
  EXPECT_EQ(run({"/bin/true"}, gone), "tandem: cannot run /bin/true: cannot enter " + gone +
                                          ": No such file or directory\n");
  const std::string missing = dir.file("no-such-program");
  EXPECT_EQ(run({missing}, ""),
            "tandem: cannot run " + missing + ": No such file or directory\n");
}

// A role launch starts holds the stop signals blocked from the fork until its handlers are in
// place: a SIGTERM to every process of a run (a service stopped) in between waited for them
// instead of ending the role (a server without its final checkpoint). `sleep` never unblocks
// them: it stands for a role still starting.
TEST(TrialProcess, StopSignalsStayBlockedThroughTheExecWhenAsked) {
  // Whether the child is still there `wait_ms` after a SIGTERM; ended, whether by that SIGTERM.
  const auto after_sigterm = [](bool blocked, int wait_ms) {
    const pid_t pid =
        cli::start_child_process({"/bin/sleep", "30"}, "", "test", false, "", blocked);
    kill(pid, SIGTERM);
    int status = 0;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(wait_ms);
    while (waitpid(pid, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        kill(pid, SIGKILL);  // still a child of ours, not reaped: the pid is its own
        waitpid(pid, nullptr, 0);
        return std::string("alive");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return std::string(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM ? "ended by SIGTERM"
                                                                          : "ended otherwise");
  };
  EXPECT_EQ(after_sigterm(true, 500), "alive");
  EXPECT_EQ(after_sigterm(false, 20000), "ended by SIGTERM");
}

TEST(TrialSlotServerRoot, JobsNamingPathsOutsideTheRootAreRefusedAndTheOthersRunThere) {
  test::TempDir root, elsewhere;
  std::filesystem::create_symlink(elsewhere.path(), root.file("door"));
  TrialSlotServerOptions o;
  o.program = "/bin/sh";
  o.allowed_commands = {"-c"};
  o.root = root.path().string();
  o.log = [](const std::string&) {};
  EXPECT_THROW(
      {
        TrialSlotServerOptions bad = o;
        bad.root = root.file("missing");
        TrialSlotServer refused(bad);
      },
      InputError);
  TrialSlotServer server(o);
  std::atomic<bool> stop{false};
  std::thread serving([&] { server.serve(stop); });
  zmq::context_t context(1);
  Client c(context, server.endpoint());
  auto start = [&](const std::string& job, const std::vector<std::string>& args,
                   const std::string& log) {
    SlotMessage m(SlotMessageType::Start);
    m.job = job;
    m.args = args;
    m.log = log;
    c.send(m);
    return c.next();
  };
  const std::string inside_log = root.file("job.log");
  const std::vector<std::pair<std::vector<std::string>, std::string>> refused = {
      {{"-c", "exit 0"}, elsewhere.file("job.log")},
      {{"-c", "exit 0", "--model-out=" + elsewhere.file("m.safetensors")}, inside_log},
      {{"-c", "exit 0", "--data", "../x/y"}, inside_log},
      {{"-c", "exit 0", "door/m.safetensors"}, inside_log},  // a link out of the root
      {{"-c", "exit 0", "--data", ".."}, inside_log},
  };
  for (const auto& [args, log] : refused) {
    const SlotMessage m = start("out", args, log);
    ASSERT_EQ(m.type, SlotMessageType::Error) << args.back();
    EXPECT_NE(m.error.find("is outside this server's --root"), std::string::npos) << m.error;
  }
  // Relative paths and plain words stay in the root, where the job runs.
  const SlotMessage ok = start("in", {"-c", "pwd > where.txt", "--out=sub/dir"}, "job.log");
  ASSERT_EQ(ok.type, SlotMessageType::Started) << ok.error;
  const SlotMessage ended = c.next();
  EXPECT_EQ(ended.type, SlotMessageType::Exited);
  EXPECT_EQ(ended.exit_code, 0);
  std::ifstream where(root.file("where.txt"));
  std::string cwd;
  std::getline(where, cwd);
  EXPECT_EQ(cwd, std::filesystem::canonical(root.path()).string());
  EXPECT_TRUE(std::filesystem::exists(root.file("job.log")));
  stop = true;
  serving.join();
}

// A server that ends a search's jobs without a word (it restarted, or gave the search up after
// hearing nothing from it for its heartbeat timeout) lists them no more in its heartbeat
// answers: the pool reports them ended. It once waited for their exited forever.
TEST_F(TrialSlotServerTest, APoolLearnsOfJobsTheServerEndedWithoutAWord) {
  TrialSlotPoolOptions o;
  o.timeout_ms = 10000;
  TrialSlotPool pool({server_->endpoint()}, o);
  pool.start("sleeper", [](int) { return std::vector<std::string>{"-c", "exec sleep 30"}; },
             "/dev/null");
  std::vector<SlotJobEnd> ended;
  const auto wait_for = [&](int ms) {
    const auto until = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < until && ended.empty()) {
      const std::vector<SlotJobEnd> e = pool.wait(100);
      ended.insert(ended.end(), e.begin(), e.end());
    }
  };
  wait_for(1000);
  EXPECT_TRUE(ended.empty()) << "a running job was reported ended: " << ended[0].how;
  // Silent well past the server's heartbeat timeout (1.5 s): it ends the job and forgets the
  // client (twice the timeout, for a loaded machine or a sanitizer's pace).
  std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  wait_for(10000);
  ASSERT_EQ(ended.size(), 1u) << "the job the server ended was never reported";
  EXPECT_EQ(ended[0].job, "sleeper");
  EXPECT_FALSE(ended[0].clean);
  EXPECT_NE(ended[0].how.find("no longer runs it"), std::string::npos) << ended[0].how;
  EXPECT_EQ(pool.total_slots(), 1) << "the server itself is still there";
}

// A search connects its pool, then may spend longer than the timeout preparing its data before
// it first waits on the pool. The servers said nothing meanwhile because nothing was asked of
// them: silence counts from the first question left unanswered, or a healthy server was dropped
// at the first wait for not answering within its 50 ms poll.
TEST_F(TrialSlotServerTest, APoolBusyElsewhereKeepsItsServers) {
  TrialSlotPoolOptions o;
  o.timeout_ms = 300;
  TrialSlotPool pool({server_->endpoint()}, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // the data being prepared
  for (int i = 0; i < 5; ++i) {
    const std::vector<SlotJobEnd> ended = pool.wait(0);
    EXPECT_TRUE(ended.empty());
  }
  EXPECT_EQ(pool.total_slots(), 1) << pool.lost_servers();
}

// A search's connection that breaks and comes back (its DEALER reconnects with the same routing
// id) misses what the server sent meanwhile: the ROUTER drops it. A job that ended then was
// missing from the next heartbeat's list, and the search failed a trial that had finished. A
// patient server here, so that the reconnect comes well within its heartbeat timeout.
class TrialSlotServerPatientTest : public TrialSlotServerTest {
 protected:
  TrialSlotServerPatientTest() { heartbeat_timeout_ms_ = 30000; }
};

TEST_F(TrialSlotServerPatientTest, AReconnectedSearchLearnsHowItsJobEndedMeanwhile) {
  const std::string id = "search-reconnecting";
  {
    Client before(context_, server_->endpoint(), id);
    const SlotMessage m = before.start("quick", "exit 4");
    ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
  }  // closed (linger 0): whatever the server sends it next is lost
  Client after(context_, server_->endpoint(), id);
  SlotMessage beat;
  int seq = 0;
  ASSERT_TRUE(test::eventually(
      [&] {
        beat = after.heartbeat_answer(++seq);
        return beat.type == SlotMessageType::Heartbeat && beat.jobs.empty();
      },
      10000, 50))
      << "the job never ended";
  ASSERT_EQ(beat.ended.size(), 1u) << "how the job ended is lost with its exited";
  EXPECT_EQ(beat.ended[0].job, "quick");
  EXPECT_EQ(beat.ended[0].exit_code, 4);
  EXPECT_EQ(beat.ended[0].signal, 0);

  // A reconnect the server sees before it has seen the old connection die (that one is still
  // open here) takes over the routing id; it was refused, and the search heard nothing.
  Client again(context_, server_->endpoint(), id);
  beat = again.heartbeat_answer(++seq);
  ASSERT_EQ(beat.type, SlotMessageType::Heartbeat) << "the reconnect was never answered";
  ASSERT_EQ(beat.ended.size(), 1u);
  EXPECT_EQ(beat.ended[0].job, "quick");
}

// A search killed outright leaves its jobs running until the server finds it silent, writing
// into its output directory; a search started into that directory meanwhile claims it. The
// server ends the jobs whose log lies there once their client has been silent for half its
// heartbeat timeout (2 s here; it would end them itself at 4 s), and answers once they have
// exited. A live client's jobs there are not ended: the claim fails, naming the server.
class TrialSlotServerClaimTest : public TrialSlotServerTest {
 protected:
  TrialSlotServerClaimTest() {
    heartbeat_timeout_ms_ = 4000;
    slots_ = 2;
  }
};

TEST_F(TrialSlotServerClaimTest, AClaimEndsASilentClientsJobsInTheDirectoryAndNoLiveOnes) {
  test::TempDir out;
  fs::create_directories(out.file("a"));
  fs::create_directories(out.file("b"));
  pid_t killed_job = 0;
  {
    Client killed(context_, server_->endpoint());
    killed.log_ = out.file("a/trial-0.log");
    const SlotMessage m = killed.start("trial-0", "exec sleep 30");
    ASSERT_EQ(m.type, SlotMessageType::Started) << m.error;
    killed_job = m.pid;
  }  // silent from here, as a killed search
  TrialSlotPoolOptions o;
  o.timeout_ms = 10000;
  TrialSlotPool live({server_->endpoint()}, o);  // another search, alive, writing into b
  live.start("trial-0", [](int) { return std::vector<std::string>{"-c", "exec sleep 30"}; },
             out.file("b/trial-0.log"));
  std::atomic<bool> done{false};
  std::thread heartbeats([&] {
    while (!done.load()) live.wait(50);  // (its heartbeats go out from here)
  });
  o.timeout_ms = 3000;  // (the claim of b waits the server's half timeout and 5 s instead)
  TrialSlotPool pool({server_->endpoint()}, o);
  const auto started = Clock::now();
  EXPECT_EQ(pool.claim(out.file("a") + "/"), 1);  // (a trailing slash is the same directory)
  EXPECT_LT(Clock::now() - started, std::chrono::milliseconds(3900))
      << "ended by the server's own timeout (4 s), not by the claim";
  EXPECT_FALSE(process_running(killed_job)) << "claimed, and answered, before the job had exited";
  EXPECT_TRUE(test::contains(server_log(), "writing into " + out.file("a") + "/: its client is "
                             "silent")) << server_log();
  const std::string why = test::error_of<Error>([&] { pool.claim(out.file("b")); });
  EXPECT_TRUE(test::contains(why, "still run jobs writing into " + out.file("b") + " for a "
                             "client still heard from")) << why;
  EXPECT_FALSE(test::contains(server_log(), "writing into " + out.file("b"))) << server_log();
  done.store(true);
  heartbeats.join();
  EXPECT_EQ(pool.claim(out.file("a")), 0) << "nothing left there to end";
}

// A server stopped cleanly (trial-slots on SIGTERM) ends its jobs and says bye to its clients:
// a search took it for a silent one and waited out its timeout (20 s here) before going on.
TEST_F(TrialSlotServerPatientTest, APoolHearsAServerThatShutsDownAtOnce) {
  TrialSlotPoolOptions o;
  o.timeout_ms = 20000;
  TrialSlotPool pool({server_->endpoint()}, o);
  pool.start("sleeper", [](int) { return std::vector<std::string>{"-c", "exec sleep 30"}; },
             "/dev/null");
  ASSERT_TRUE(test::eventually(
      [&] {
        pool.wait(20);
        return test::contains(server_log(), "job sleeper started");
      },
      10000, 20));
  const auto stopped = Clock::now();
  stop_.store(true);
  thread_.join();
  std::vector<SlotJobEnd> ended;
  while (ended.empty() && Clock::now() - stopped < std::chrono::seconds(10)) {
    const std::vector<SlotJobEnd> e = pool.wait(100);
    ended.insert(ended.end(), e.begin(), e.end());
  }
  ASSERT_EQ(ended.size(), 1u) << "the server's bye was not heard within 10 s";
  EXPECT_EQ(ended[0].job, "sleeper");
  EXPECT_TRUE(test::contains(ended[0].how, "shut down (it said so)")) << ended[0].how;
  EXPECT_EQ(pool.total_slots(), 0);
}

// The pool's side, against a server by hand that lists a job as ended in its heartbeat answer
// (its exited was lost): the job ends as listed, not as one the server no longer runs.
TEST(TrialSlotPoolEnded, AJobListedAsEndedInAHeartbeatEndsAsListed) {
  zmq::context_t context(1);
  zmq::socket_t server(context, zmq::socket_type::router);
  server.set(zmq::sockopt::linger, 0);
  server.bind("tcp://127.0.0.1:*");
  const std::string endpoint = server.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> stop{false};
  std::thread by_hand([&] {
    bool started = false;
    while (!stop.load()) {
      zmq::pollitem_t item{server.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(20));
      zmq::message_t id;
      zmq::message_t frame;
      if (!server.recv(id, zmq::recv_flags::dontwait)) continue;
      if (!server.recv(frame)) continue;
      const SlotMessage m = decode_slot_message(frame.to_string());
      SlotMessage answer(m.type);
      if (m.type == SlotMessageType::Hello) {
        answer.slots = 1;
        answer.threads = 1;
        answer.heartbeat_timeout_ms = 2000;
      } else if (m.type == SlotMessageType::Start) {
        started = true;
        answer.type = SlotMessageType::Started;
        answer.job = m.job;
        answer.pid = 1;
      } else if (m.type == SlotMessageType::Heartbeat) {
        answer.seq = m.seq;
        answer.jobs_listed = true;  // ... and empty: the job no longer runs
        if (started) answer.ended = {{"quick", 0, 0}};
      } else {
        continue;
      }
      const std::string text = encode_slot_message(answer);
      server.send(id, zmq::send_flags::sndmore);
      server.send(zmq::buffer(text));
    }
  });
  std::vector<SlotJobEnd> ended;
  {
    TrialSlotPoolOptions o;
    o.timeout_ms = 5000;
    TrialSlotPool pool({endpoint}, o);
    pool.start("quick", [](int) { return std::vector<std::string>{"-c", "exit 0"}; }, "/dev/null");
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < until && ended.empty()) ended = pool.wait(100);
  }
  stop.store(true);
  by_hand.join();
  ASSERT_EQ(ended.size(), 1u) << "the job was never reported ended";
  EXPECT_EQ(ended[0].job, "quick");
  EXPECT_TRUE(ended[0].clean) << ended[0].how;
  EXPECT_EQ(ended[0].how, "exited with status 0");
}

}  // namespace
}  // namespace tandem::cli
