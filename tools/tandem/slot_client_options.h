// The options of a client of tandem trial-slots servers, one set for tandem search --slots and
// tandem predict --slots: where the servers are, how long one may stay silent, the CURVE keys.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "trial_slot_pool.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tandem::cli {

struct SlotClientOptions {
  // --slots: endpoints, or directories where tandem trial-slots --endpoint-dir servers list
  // themselves; empty: run on this machine. After prepare(), the endpoints only.
  std::vector<std::string> endpoints;
  double timeout_s = 10;  // --slots-timeout
  int expect = 0;         // --slots-expect: listed servers to wait for (0: those listed now)
  std::string curve_server;  // --slots-curve-server: the servers' public key file
  std::string curve_client;  // --slots-curve-client: own key file (default: throwaway)
  const CLI::Option* timeout_option = nullptr;  // set by add_slot_client_options
  std::vector<std::string> listed;  // after prepare(): the endpoints found only in directories
  std::vector<std::string> dirs;    // after prepare(): the --slots directories
  std::vector<std::string> passed_over;  // entries newly_listed() found without an endpoint
  std::vector<std::string> named;   // after prepare(): the endpoints --slots names itself
  std::set<std::string> seen_entries;  // the directories' entries read so far (their servers)

  bool remote() const { return !endpoints.empty(); }
  // Checks the options: InputError naming `command` for --slots-timeout, --slots-expect or a key
  // without --slots, and for a client key without the servers' key. Then, with --slots, resolves
  // the directories in place: each becomes the endpoints in its *.endpoint files (sorted by
  // name; a file that goes while being read, its server stopping, is passed over), repeats
  // dropped. With `expect`, the directories are read again until they list that many servers
  // between them, for up to timeout_s (servers starting with the client, as under srun).
  // InputError for an entry that is neither an endpoint (SCHEME://...) nor a directory, a
  // directory without endpoint files, a file that holds no endpoint, or fewer servers than
  // expected.
  void prepare(const std::string& command);
  // The pool of the servers. Endpoints found only in directories are optional there (a server
  // killed outright leaves its file): those that do not answer are said on stderr and taken out
  // of `endpoints` (what the results name).
  std::unique_ptr<TrialSlotPool> connect(const std::string& command);
  // The endpoints the directories list now under entries not read before (servers started
  // since, at a new endpoint or at that of one that stopped), for TrialSlotPool::add; an
  // endpoint --slots names itself is never among them. A directory that cannot be read now
  // lists none: a long search does not end for a hiccup of its shared filesystem.
  std::vector<std::string> newly_listed();
};

// Adds --slots, --slots-timeout, --slots-curve-server and --slots-curve-client to `cmd`. `jobs`
// names what runs on the servers ("trials", "shares"), `client` the command ("search",
// "prediction"), `paths` the paths the servers must share ("--data and --out").
void add_slot_client_options(CLI::App* cmd, SlotClientOptions& o, const std::string& jobs,
                             const std::string& client, const std::string& paths);

}  // namespace tandem::cli
