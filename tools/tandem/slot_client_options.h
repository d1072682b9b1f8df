// The options of a client of tandem trial-slots servers, one set for tandem search --slots and
// tandem predict --slots: where the servers are, how long one may stay silent, the CURVE keys.
#pragma once

#include <string>
#include <vector>

#include "trial_slot_pool.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace tandem::cli {

struct SlotClientOptions {
  // --slots as given: endpoints, or directories where tandem trial-slots --endpoint-dir servers
  // left their endpoints; empty: run on this machine. servers() resolves them.
  std::vector<std::string> endpoints;
  double timeout_s = 10;               // --slots-timeout
  int expect = 0;  // --slots-expect: listed servers to wait for in the directories (0: those there)
  std::string curve_server;            // --slots-curve-server: the servers' public key file
  std::string curve_client;            // --slots-curve-client: own key file (default: throwaway)
  const CLI::Option* timeout_option = nullptr;  // set by add_slot_client_options

  bool remote() const { return !endpoints.empty(); }
  // Resolves --slots in place: each directory becomes the endpoints in its *.endpoint files
  // (sorted by name; a file that goes while being read, its server stopping, is passed over),
  // and repeats are dropped. Endpoints found only in directories become the pool's optional
  // ones (pool_options()): a server killed outright leaves its file, and the pool leaves out a
  // listed server that does not answer. InputError for an entry that is neither an endpoint
  // (SCHEME://...) nor a directory, a directory without endpoint files, or a file that holds no
  // endpoint. With `expect`, the directories are read again until they list that many servers
  // between them, for up to timeout_s (servers starting with the client, as under srun);
  // InputError naming how many came when fewer did.
  void resolve();
  std::vector<std::string> listed;  // after resolve(): the endpoints found only in directories
  // Says on stderr which listed servers the pool left out, and why, and takes them out of
  // `endpoints` (what the results name). `command`: "search", "predict".
  void leave_out(const TrialSlotPool& pool, const std::string& command);
  // Throws InputError naming `command` for --slots-timeout or a key without --slots, and for a
  // client key without the servers' key.
  void check(const std::string& command) const;
  // The pool's options: the timeout and the keys read from their files.
  TrialSlotPoolOptions pool_options() const;
};

// Adds --slots, --slots-timeout, --slots-curve-server and --slots-curve-client to `cmd`. `jobs`
// names what runs on the servers ("trials", "shares"), `client` the command ("search",
// "prediction"), `paths` the paths the servers must share ("--data and --out").
void add_slot_client_options(CLI::App* cmd, SlotClientOptions& o, const std::string& jobs,
                             const std::string& client, const std::string& paths);

// A path as every server must see it: absolute and canonical (no "..", no symlinks), since the
// servers run in working directories of their own.
std::string shared_path(const std::string& path);

}  // namespace tandem::cli
