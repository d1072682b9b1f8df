#include "trial_slot_protocol.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "json_fields.h"

namespace tandem::cli {

namespace {

using nlohmann::json;

constexpr SlotMessageType kTypes[] = {
    SlotMessageType::Hello,   SlotMessageType::Claim,  SlotMessageType::Claimed,
    SlotMessageType::Start,   SlotMessageType::Started, SlotMessageType::Exited,
    SlotMessageType::Cancel,  SlotMessageType::Heartbeat, SlotMessageType::Bye,
    SlotMessageType::Error};

std::string string_field(const json& j, const char* key, bool required) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw SlotProtocolError(std::string("missing field \"") + key + "\"");
    return {};
  }
  if (!it->is_string()) throw SlotProtocolError(std::string("field \"") + key + "\" is not a string");
  return it->get<std::string>();
}

int int_field(const json& j, const char* key, bool required, int fallback = 0) {
  const auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw SlotProtocolError(std::string("missing field \"") + key + "\"");
    return fallback;
  }
  if (!it->is_number_integer())
    throw SlotProtocolError(std::string("field \"") + key + "\" is not an integer");
  // An unsigned value of 2^63 or more would wrap into a negative int64_t (2^64 - 1 read as -1,
  // which passes the range check below).
  if (it->is_number_unsigned() && it->get<uint64_t>() >= (uint64_t{1} << 31))
    throw SlotProtocolError(std::string("field \"") + key + "\" is out of range");
  const auto v = it->get<int64_t>();
  if (v < -(int64_t{1} << 31) || v >= (int64_t{1} << 31))
    throw SlotProtocolError(std::string("field \"") + key + "\" is out of range");
  return static_cast<int>(v);
}

// An exited message's fields (or a heartbeat's "ended" entry): the job, and how it ended.
json exit_object(const SlotJobExit& e, json j = json::object()) {
  j["job"] = e.job;
  if (e.signal > 0) j["signal"] = e.signal;
  else j["exit_code"] = e.exit_code;
  return j;
}

SlotJobExit decode_exit(const json& j, const std::string& what) {
  SlotJobExit e;
  e.job = string_field(j, "job", true);
  e.exit_code = int_field(j, "exit_code", false, -1);
  e.signal = int_field(j, "signal", false);
  if ((e.exit_code < 0) == (e.signal <= 0))
    throw SlotProtocolError(what + ": give either \"exit_code\" or \"signal\"");
  return e;
}

// What a start message may hold. exec and open would cut a text at its first NUL: what the
// server checks (a --root) would not be what the job gets. Other control characters are
// refused too: the job's arguments, id and log path go into the server's log and the job's own
// error messages, and a newline there let a peer write whole lines of its choosing into a file
// (its log pointed at that file, a bad argument holding the lines).
bool has_control_character(const std::string& text) {
  return std::any_of(text.begin(), text.end(),
                     [](unsigned char c) { return c < 0x20 || c == 0x7f; });
}

void check_start(const SlotMessage& m) {
  if (m.job.empty()) throw SlotProtocolError("start: empty \"job\"");
  if (m.log.empty()) throw SlotProtocolError("start: empty \"log\"");
  if (has_control_character(m.log) || has_control_character(m.job))
    throw SlotProtocolError("start: a control character in \"log\" or \"job\"");
  for (size_t i = 0; i < m.args.size(); ++i)
    if (has_control_character(m.args[i]))
      throw SlotProtocolError("start: a control character in argument " +
                              std::to_string(i + 1) + " of \"args\"");
}

// A claim's directory goes into the server's log: no control characters, as a start's log.
void check_claim(const SlotMessage& m) {
  if (m.dir.empty()) throw SlotProtocolError(std::string(to_string(m.type)) + ": empty \"dir\"");
  if (has_control_character(m.dir))
    throw SlotProtocolError(std::string(to_string(m.type)) + ": a control character in \"dir\"");
}

}  // namespace

const char* to_string(SlotMessageType type) {
  switch (type) {
    case SlotMessageType::Hello: return "hello";
    case SlotMessageType::Claim: return "claim";
    case SlotMessageType::Claimed: return "claimed";
    case SlotMessageType::Start: return "start";
    case SlotMessageType::Started: return "started";
    case SlotMessageType::Exited: return "exited";
    case SlotMessageType::Cancel: return "cancel";
    case SlotMessageType::Heartbeat: return "heartbeat";
    case SlotMessageType::Bye: return "bye";
    case SlotMessageType::Error: return "error";
  }
  return "?";
}

std::string encode_slot_message(const SlotMessage& m) {
  json j{{"v", kTrialSlotProtocolVersion}, {"type", to_string(m.type)}};
  switch (m.type) {
    case SlotMessageType::Hello:
      if (m.slots > 0) {  // the server's answer
        j["slots"] = m.slots;
        j["running"] = m.running;
        j["threads"] = m.threads;
        j["heartbeat_timeout_ms"] = m.heartbeat_timeout_ms;
      }
      break;
    case SlotMessageType::Claim:
    case SlotMessageType::Claimed:
      check_claim(m);
      j["dir"] = m.dir;
      if (m.type == SlotMessageType::Claimed) j["ended"] = m.ended_jobs;
      break;
    case SlotMessageType::Start:
      check_start(m);  // said to the client that would send it, not only by the server
      j["job"] = m.job;
      j["args"] = m.args;
      j["log"] = m.log;
      break;
    case SlotMessageType::Started:
      j["job"] = m.job;
      j["pid"] = m.pid;
      break;
    case SlotMessageType::Exited:
      j = exit_object({m.job, m.exit_code, m.signal}, std::move(j));
      break;
    case SlotMessageType::Cancel: j["job"] = m.job; break;
    case SlotMessageType::Heartbeat:
      j["running"] = m.running;
      if (m.seq > 0) j["seq"] = m.seq;
      if (m.jobs_listed) j["jobs"] = m.jobs;
      if (!m.ended.empty()) {
        j["ended"] = json::array();
        for (const SlotJobExit& e : m.ended) j["ended"].push_back(exit_object(e));
      }
      break;
    case SlotMessageType::Bye: break;
    case SlotMessageType::Error:
      j["error"] = m.error;
      if (!m.job.empty()) j["job"] = m.job;
      if (m.busy) j["busy"] = true;
      break;
  }
  // Text that is not UTF-8 (a path in an error) is replaced, not thrown on: dump() throws on
  // it, and out of a slot server's loop that ended every client's jobs.
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

SlotMessage decode_slot_message(const std::string& frame) {
  const json j = parse_bounded_json(frame);
  if (j.is_discarded() || !j.is_object())
    throw SlotProtocolError("not a JSON object nested at most " + std::to_string(kMaxJsonDepth) +
                            " levels deep (" + std::to_string(frame.size()) + " bytes)");
  const auto v = j.find("v");
  if (v == j.end() || !v->is_number_integer())
    throw SlotProtocolError("no protocol version (\"v\")");
  if (v->get<int64_t>() != kTrialSlotProtocolVersion)
    throw SlotProtocolError("protocol version " + v->dump() + "; this program speaks version " +
                            std::to_string(kTrialSlotProtocolVersion));
  const std::string type = string_field(j, "type", true);
  SlotMessage m;
  bool known = false;
  for (SlotMessageType t : kTypes)
    if (type == to_string(t)) {
      m.type = t;
      known = true;
    }
  if (!known) throw SlotProtocolError("unknown message type \"" + type + "\"");
  switch (m.type) {
    case SlotMessageType::Hello:
      m.slots = int_field(j, "slots", false);
      m.running = int_field(j, "running", false);
      m.threads = int_field(j, "threads", false);
      m.heartbeat_timeout_ms = int_field(j, "heartbeat_timeout_ms", false);
      break;
    case SlotMessageType::Claim:
    case SlotMessageType::Claimed:
      m.dir = string_field(j, "dir", true);
      if (m.type == SlotMessageType::Claimed) m.ended_jobs = int_field(j, "ended", true);
      check_claim(m);
      break;
    case SlotMessageType::Start: {
      m.job = string_field(j, "job", true);
      m.log = string_field(j, "log", true);
      const auto args = j.find("args");
      if (args == j.end() || !args->is_array() || args->empty())
        throw SlotProtocolError("start: \"args\" must be a non-empty list of strings");
      for (const json& a : *args) {
        if (!a.is_string()) throw SlotProtocolError("start: \"args\" must be a list of strings");
        m.args.push_back(a.get<std::string>());
      }
      check_start(m);
      break;
    }
    case SlotMessageType::Started:
      m.job = string_field(j, "job", true);
      m.pid = int_field(j, "pid", true);
      break;
    case SlotMessageType::Exited: {
      const SlotJobExit e = decode_exit(j, "exited");
      m.job = e.job;
      m.exit_code = e.exit_code;
      m.signal = e.signal;
      break;
    }
    case SlotMessageType::Cancel:
      m.job = string_field(j, "job", true);
      if (m.job.empty()) throw SlotProtocolError("cancel: empty \"job\"");
      break;
    case SlotMessageType::Heartbeat: {
      m.running = int_field(j, "running", false);
      m.seq = int_field(j, "seq", false);
      const auto jobs = j.find("jobs");
      if (jobs != j.end()) {
        const SlotProtocolError not_strings("heartbeat: \"jobs\" must be a list of strings");
        if (!jobs->is_array()) throw not_strings;
        for (const json& id : *jobs) {
          if (!id.is_string()) throw not_strings;
          m.jobs.push_back(id.get<std::string>());
        }
        m.jobs_listed = true;
      }
      if (const auto ended = j.find("ended"); ended != j.end()) {
        if (!ended->is_array())
          throw SlotProtocolError("heartbeat: \"ended\" must be a list of objects");
        for (const json& e : *ended) {
          if (!e.is_object())
            throw SlotProtocolError("heartbeat: \"ended\" must be a list of objects");
          m.ended.push_back(decode_exit(e, "heartbeat: an \"ended\" entry"));
        }
      }
      break;
    }
    case SlotMessageType::Bye: break;
    case SlotMessageType::Error:
      m.error = string_field(j, "error", true);
      m.job = string_field(j, "job", false);
      if (const auto busy = j.find("busy"); busy != j.end()) {
        if (!busy->is_boolean()) throw SlotProtocolError("field \"busy\" is not a boolean");
        m.busy = busy->get<bool>();
      }
      break;
  }
  return m;
}

}  // namespace tandem::cli
