#include "slot_client_options.h"

#include "number_checks.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include <sys/stat.h>

#include "tandem/error.h"
#include "zmq_curve.h"

namespace tandem::cli {

namespace {

// Which server wrote an entry: its file (named after the server's host and process), inode and
// modification time (a new file each time it is written, the file being renamed into place;
// the time tells it apart from an earlier file that had the same name and, freed, the same
// inode: a container's server restarted with its host name and pid). A server started again at
// the endpoint of one that died writes a new entry.
std::string entry_of(const std::string& file) {
  struct stat st {};
  if (::stat(file.c_str(), &st) != 0) return file;
  return file + " " + std::to_string(st.st_ino) + " " + std::to_string(st.st_mtim.tv_sec) + "." +
         std::to_string(st.st_mtim.tv_nsec);
}

// The endpoints in DIR's *.endpoint files, sorted by file name; a file that goes while being
// read (its server stopping) is passed over. `may_be_missing`: a DIR not there yet lists none
// (its servers make it). `bad`: where a file that holds no endpoint goes, passed over, instead
// of an InputError. `entries`: where each endpoint's entry goes (entry_of).
std::vector<std::string> listed_in(const std::string& dir, bool may_be_missing,
                                   std::vector<std::string>* bad = nullptr,
                                   std::vector<std::string>* entries = nullptr) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (may_be_missing && !fs::exists(dir, error)) return {};
  if (!fs::is_directory(dir, error))
    throw InputError("--slots " + dir + ": neither an endpoint (tcp://HOST:PORT, ipc://PATH) "
                     "nor a directory of endpoint files (tandem trial-slots --endpoint-dir)");
  std::vector<std::string> files;
  for (const auto& file : fs::directory_iterator(dir))
    if (file.path().extension() == ".endpoint") files.push_back(file.path().string());
  std::sort(files.begin(), files.end());
  std::vector<std::string> endpoints;
  for (const std::string& file : files) {
    std::ifstream in(file);
    if (!in) {
      if (!fs::exists(file, error)) continue;
      throw InputError("--slots " + dir + ": cannot read " + file);
    }
    std::string endpoint;
    std::getline(in, endpoint);
    if (endpoint.find("://") == std::string::npos) {
      if (bad == nullptr) throw InputError("--slots " + dir + ": " + file + " holds no endpoint");
      bad->push_back(file);
      continue;
    }
    endpoints.push_back(endpoint);
    if (entries) entries->push_back(entry_of(file));
  }
  return endpoints;
}

// The pool's options: the timeout, the optional (listed) endpoints, the keys from their files.
TrialSlotPoolOptions pool_options(const SlotClientOptions& o) {
  TrialSlotPoolOptions pool;
  pool.timeout_ms = static_cast<int>(o.timeout_s * 1000);
  pool.optional_endpoints = o.listed;
  if (o.curve_server.empty()) return pool;
  pool.curve = transport::curve_client_keys(transport::read_curve_key_file(o.curve_server).public_key,
                                            o.curve_client, "--slots-curve-server");
  return pool;
}

}  // namespace

void SlotClientOptions::prepare(const std::string& command) {
  if (!remote() && ((timeout_option != nullptr && timeout_option->count() > 0) ||
                    !curve_server.empty() || !curve_client.empty() || expect > 0))
    throw InputError(command + ": --slots-timeout, --slots-expect and --slots-curve-* need --slots");
  if (!curve_client.empty() && curve_server.empty())
    throw InputError("--slots-curve-client needs --slots-curve-server (the servers' public key)");
  std::vector<std::string> named;
  dirs.clear();
  for (const std::string& entry : endpoints) {
    if (entry.find("://") == std::string::npos) {
      dirs.push_back(entry);
    } else if (std::find(named.begin(), named.end(), entry) == named.end()) {
      named.push_back(entry);
    }
  }
  if (expect > 0 && dirs.empty())
    throw InputError("--slots-expect counts the servers listed in --slots directories; none given");
  // Read the directories until they list `expect` servers (or, without it, once).
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(timeout_s * 1000));
  for (;;) {
    listed.clear();
    for (const std::string& dir : dirs) {
      std::vector<std::string> entries;
      const std::vector<std::string> here = listed_in(dir, expect > 0, nullptr, &entries);
      seen_entries.insert(entries.begin(), entries.end());
      if (here.empty() && expect == 0)
        throw InputError("--slots " + dir + ": no *.endpoint files there (start the servers with "
                         "tandem trial-slots --endpoint-dir " + dir + ")");
      for (const std::string& endpoint : here)
        if (std::find(named.begin(), named.end(), endpoint) == named.end() &&
            std::find(listed.begin(), listed.end(), endpoint) == listed.end())
          listed.push_back(endpoint);
    }
    if (int(listed.size()) >= expect) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      char waited[32];
      std::snprintf(waited, sizeof waited, "%g", timeout_s);
      throw InputError("--slots-expect " + std::to_string(expect) + ": only " +
                       std::to_string(listed.size()) + " server(s) listed after " + waited +
                       " s (--slots-timeout)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  this->named = named;
  endpoints = named;
  endpoints.insert(endpoints.end(), listed.begin(), listed.end());
}

std::unique_ptr<TrialSlotPool> SlotClientOptions::connect(const std::string& command) {
  TrialSlotPoolOptions options = pool_options(*this);
  options.client = command;
  auto pool = std::make_unique<TrialSlotPool>(endpoints, std::move(options));
  for (const auto& [endpoint, why] : pool->skipped()) {
    std::fprintf(stderr,
                 "tandem %s: left out slot server %s, listed in a --slots directory: %s (a server "
                 "killed outright leaves its entry behind; remove its file)\n",
                 command.c_str(), endpoint.c_str(), why.c_str());
    endpoints.erase(std::remove(endpoints.begin(), endpoints.end(), endpoint), endpoints.end());
  }
  return pool;
}

std::vector<std::string> SlotClientOptions::newly_listed() {
  std::vector<std::string> fresh;
  for (const std::string& dir : dirs) {
    std::vector<std::string> here, bad, entries;
    try {
      here = listed_in(dir, true, &bad, &entries);
    } catch (const std::exception&) {
      continue;  // unreadable for now: the next look may do
    }
    for (const std::string& file : bad)  // said once; the other entries still count
      if (std::find(passed_over.begin(), passed_over.end(), file) == passed_over.end()) {
        passed_over.push_back(file);
        std::fprintf(stderr, "tandem: --slots %s: %s holds no endpoint; passed over\n",
                     dir.c_str(), file.c_str());
      }
    for (size_t i = 0; i < here.size(); ++i) {
      const std::string& endpoint = here[i];
      if (!seen_entries.insert(entries[i]).second) continue;  // the same server's entry
      // A named endpoint is the pool's from the start; a server listed again under a new
      // entry was started again there (the pool connects afresh if the old one is gone).
      if (std::find(named.begin(), named.end(), endpoint) != named.end()) continue;
      if (std::find(listed.begin(), listed.end(), endpoint) == listed.end())
        listed.push_back(endpoint);
      if (std::find(fresh.begin(), fresh.end(), endpoint) == fresh.end())
        fresh.push_back(endpoint);
    }
  }
  return fresh;
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
  cmd->add_option("--slots-expect", o.expect,
                  "With --slots DIR: wait (up to --slots-timeout) until the directories list this "
                  "many servers, for servers started with the " + client + " (as under srun)")
      ->check(positive_number());
  cmd->add_option("--slots-curve-server", o.curve_server,
                  "The slot servers' CURVE public key file (tandem keygen; servers run with "
                  "--curve-secret)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--slots-curve-client", o.curve_client,
                  "This " + client + "'s CURVE key file (.key_secret) for servers with "
                  "--curve-allowed (default: a throwaway key)")
      ->check(CLI::ExistingFile);
}

}  // namespace tandem::cli
