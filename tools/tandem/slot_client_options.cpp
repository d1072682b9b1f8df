#include "slot_client_options.h"

#include <CLI/CLI.hpp>

#include <filesystem>

#include "tandem/error.h"
#include "zmq_curve.h"

namespace tandem::cli {

void SlotClientOptions::check(const std::string& command) const {
  if (!remote() && ((timeout_option != nullptr && timeout_option->count() > 0) ||
                    !curve_server.empty() || !curve_client.empty()))
    throw InputError(command + ": --slots-timeout and --slots-curve-* need --slots");
  if (!curve_client.empty() && curve_server.empty())
    throw InputError("--slots-curve-client needs --slots-curve-server (the servers' public key)");
}

TrialSlotPoolOptions SlotClientOptions::pool_options() const {
  TrialSlotPoolOptions pool;
  pool.timeout_ms = static_cast<int>(timeout_s * 1000);
  if (curve_server.empty()) return pool;
  pool.curve_server_key = transport::read_curve_key_file(curve_server).public_key;
  if (!curve_client.empty()) {
    const transport::CurveKeyPair mine = transport::read_curve_secret_key_file(curve_client);
    pool.curve_public_key = mine.public_key;
    pool.curve_secret_key = mine.secret_key;
  }
  return pool;
}

void add_slot_client_options(CLI::App* cmd, SlotClientOptions& o, const std::string& jobs,
                             const std::string& client, const std::string& paths) {
  cmd->add_option("--slots", o.endpoints,
                  "Run the " + jobs + " on slot servers (tandem trial-slots) at these endpoints "
                  "instead of on this machine, one per slot. " + paths + " must be on a "
                  "filesystem the servers share (the same paths there)")
      ->delimiter(',');
  o.timeout_option =
      cmd->add_option("--slots-timeout", o.timeout_s,
                      "Seconds a slot server may stay silent before its running " + jobs +
                          " are failed (the " + client + " goes on with the others)")
          ->check(CLI::Range(0.2, 3600.0))
          ->capture_default_str();
  cmd->add_option("--slots-curve-server", o.curve_server,
                  "The slot servers' CURVE public key file (tandem keygen; servers run with "
                  "--curve-secret)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--slots-curve-client", o.curve_client,
                  "This " + client + "'s CURVE key file (.key_secret) for servers with "
                  "--curve-allowed (default: a throwaway key)")
      ->check(CLI::ExistingFile);
}

std::string shared_path(const std::string& path) {
  return std::filesystem::weakly_canonical(std::filesystem::absolute(path)).string();
}

}  // namespace tandem::cli
