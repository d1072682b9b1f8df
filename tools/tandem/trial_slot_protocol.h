// The messages between tandem search --slots and tandem trial-slots: one JSON object per
// ZeroMQ frame (a ROUTER prefixes the peer's routing-id frame), each with the protocol version
// "v" and a "type". The search (a DEALER per slot server) sends hello, claim, start, cancel,
// heartbeat and bye; the server answers hello, claimed, started, exited, heartbeat and error:
//
//   hello      search -> server  {}                       (its answer is a hello too)
//   hello      server -> search  {slots, running, threads, heartbeat_timeout_ms}
//   claim      search -> server  {dir}                     its output directory, locked by it:
//                                                          the server ends the jobs of other
//                                                          clients whose log lies in it once
//                                                          those clients have been silent for
//                                                          half its heartbeat timeout (a killed
//                                                          search's jobs, which outlive it by
//                                                          the timeout and would write over
//                                                          this search's files)
//   claimed    server -> search  {dir, ended}              once none is left there; ended: how
//                                                          many it ended
//   start      search -> server  {job, args, log}          args: `tandem train ...` without the
//                                                          program; the server runs its own binary
//   started    server -> search  {job, pid}
//   exited     server -> search  {job, exit_code | signal}
//   cancel     search -> server  {job}                     SIGTERM; its exited follows
//   heartbeat  search -> server  {seq}                     the server answers each one:
//   heartbeat  server -> search  {running, seq, jobs,      seq echoed; jobs: the ids of this
//                                 ended}                   client's jobs it still runs; ended:
//                                                          [{job, exit_code | signal}] of its
//                                                          jobs that ended lately (an exited
//                                                          sent while the search's connection
//                                                          was down is lost; this is not)
//   bye        search -> server  {}                        the search ends: its jobs are ended
//   bye        server -> search  {}                        the server stops; its jobs have ended
//   error      server -> search  {error, job?, busy?}      a refused start names its job;
//                                                          busy: every slot was taken
//
// Decoding checks the version, the type and each field's JSON type, and throws
// SlotProtocolError with what is wrong, so a server answers bad input with an error message.
#pragma once

#include <string>
#include <vector>

#include "tandem/error.h"

namespace tandem::cli {

constexpr int kTrialSlotProtocolVersion = 1;

class SlotProtocolError : public InputError {
 public:
  using InputError::InputError;
};

enum class SlotMessageType {
  Hello, Claim, Claimed, Start, Started, Exited, Cancel, Heartbeat, Bye, Error
};
const char* to_string(SlotMessageType type);

// How one job ended: exactly one of exit_code (a normal exit) and signal is set.
struct SlotJobExit {
  std::string job;
  int exit_code = -1;  // the status of a normal exit, else -1
  int signal = 0;      // the signal that killed it, else 0
};

struct SlotMessage {
  SlotMessage() = default;
  explicit SlotMessage(SlotMessageType message_type) : type(message_type) {}

  SlotMessageType type = SlotMessageType::Heartbeat;
  std::string job;                // start, started, exited, cancel; error (when about a job)
  std::vector<std::string> args;  // start
  std::string log;                // start
  std::string dir;                // claim, claimed
  int ended_jobs = 0;             // claimed: the other clients' jobs it ended there
  int slots = 0;                  // hello (server)
  int running = 0;                // hello (server), heartbeat
  int threads = 0;                // hello (server): threads per trial it suggests
  int heartbeat_timeout_ms = 0;   // hello (server)
  int pid = 0;                    // started
  int exit_code = -1;             // exited: the status of a normal exit, else -1
  int signal = 0;                 // exited: the signal that killed it, else 0
  std::string error;              // error
  bool busy = false;              // error: a start refused because every slot was taken
  int seq = 0;                    // heartbeat: the search's count of messages sent, echoed
  // heartbeat (server): this client's jobs it still runs (jobs_listed: the field was there; a
  // search compares it with the jobs it started before that heartbeat, to learn of jobs a
  // restarted server, or one that gave the search up for silent, no longer has).
  std::vector<std::string> jobs;
  bool jobs_listed = false;
  std::vector<SlotJobExit> ended;  // heartbeat (server): this client's jobs that ended lately
};

// One frame's bytes. A Start needs a job, args (args[0] the subcommand) and a log path.
std::string encode_slot_message(const SlotMessage& message);
// Throws SlotProtocolError for anything but a valid message of this version.
SlotMessage decode_slot_message(const std::string& frame);

}  // namespace tandem::cli
