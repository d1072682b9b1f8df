#include "slot_client_options.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

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

void SlotClientOptions::resolve() {
  namespace fs = std::filesystem;
  std::vector<std::string> named, found;
  const auto add = [](std::vector<std::string>& to, const std::string& endpoint) {
    if (std::find(to.begin(), to.end(), endpoint) == to.end()) to.push_back(endpoint);
  };
  for (const std::string& entry : endpoints) {
    if (entry.find("://") != std::string::npos) {
      add(named, entry);
      continue;
    }
    std::error_code error;
    if (!fs::is_directory(entry, error))
      throw InputError("--slots " + entry + ": neither an endpoint (tcp://HOST:PORT, ipc://PATH) "
                       "nor a directory of endpoint files (tandem trial-slots --endpoint-dir)");
    std::vector<std::string> files;
    for (const auto& file : fs::directory_iterator(entry))
      if (file.path().extension() == ".endpoint") files.push_back(file.path().string());
    std::sort(files.begin(), files.end());
    bool any = false;
    for (const std::string& file : files) {
      std::ifstream in(file);
      if (!in) {
        if (!fs::exists(file, error)) continue;  // its server stopped while we looked
        throw InputError("--slots " + entry + ": cannot read " + file);
      }
      std::string endpoint;
      std::getline(in, endpoint);
      if (endpoint.find("://") == std::string::npos)
        throw InputError("--slots " + entry + ": " + file + " holds no endpoint");
      add(found, endpoint);
      any = true;
    }
    if (!any)
      throw InputError("--slots " + entry + ": no *.endpoint files there (start the servers with "
                       "tandem trial-slots --endpoint-dir " + entry + ")");
  }
  endpoints = named;
  listed.clear();
  for (const std::string& endpoint : found) {
    if (std::find(named.begin(), named.end(), endpoint) != named.end()) continue;
    endpoints.push_back(endpoint);
    listed.push_back(endpoint);
  }
}

void SlotClientOptions::leave_out(const TrialSlotPool& pool, const std::string& command) {
  for (const auto& [endpoint, why] : pool.skipped()) {
    std::fprintf(stderr,
                 "tandem %s: left out slot server %s, listed in a --slots directory: %s (a server "
                 "killed outright leaves its entry behind; remove its file)\n",
                 command.c_str(), endpoint.c_str(), why.c_str());
    endpoints.erase(std::remove(endpoints.begin(), endpoints.end(), endpoint), endpoints.end());
  }
}

TrialSlotPoolOptions SlotClientOptions::pool_options() const {
  TrialSlotPoolOptions pool;
  pool.timeout_ms = static_cast<int>(timeout_s * 1000);
  pool.optional_endpoints = listed;
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
                  "instead of on this machine, one per slot; a directory stands for every server "
                  "that wrote its endpoint there (trial-slots --endpoint-dir). " + paths +
                  " must be on a filesystem the servers share (the same paths there)")
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
