// tandem trial-slots: a slot server for tandem search --slots (trial_slot_server.h). It binds
// (loopback by default, like the cluster's roles), prints its endpoint, and runs the trials a
// search sends it until SIGINT or SIGTERM, which end its trials too.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <thread>

#include "commands.h"
#include "tandem/error.h"
#include "trial_process.h"
#include "trial_slot_server.h"
#include "zmq_curve.h"

namespace tandem::cli {

namespace {

std::atomic<bool> g_stop{false};
void on_stop_signal(int) { g_stop.store(true); }

struct TrialSlotsOptions {
  std::string bind = "tcp://127.0.0.1:*";
  int slots = 1;
  int threads_per_trial = 0;
  double heartbeat_timeout = 10;
  std::string endpoint_file;
  std::string curve_secret;
  std::string curve_allowed;
};

void run_trial_slots(const TrialSlotsOptions& o) {
  TrialSlotServerOptions options;
  options.bind = o.bind;
  options.slots = o.slots;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.threads = o.threads_per_trial > 0 ? o.threads_per_trial : std::max(1, cores / o.slots);
  options.program = self_path();
  options.heartbeat_timeout_ms = static_cast<int>(o.heartbeat_timeout * 1000);
  if (!o.curve_secret.empty()) {
    const transport::CurveKeyPair keys = transport::read_curve_secret_key_file(o.curve_secret);
    options.curve_secret_key = keys.secret_key;
    if (!o.curve_allowed.empty())
      options.curve_allowed_clients = transport::read_curve_allowed_clients(o.curve_allowed);
  } else if (!o.curve_allowed.empty()) {
    throw InputError("--curve-allowed needs --curve-secret (this server's key)");
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  TrialSlotServer server(options);
  std::fprintf(stderr, "tandem trial-slots: %d slot(s) at %s, %d thread(s) per trial%s\n", o.slots,
               server.endpoint().c_str(), options.threads,
               server.curve_public_key().empty()
                   ? ""
                   : (", CURVE key " + server.curve_public_key()).c_str());
  std::printf("%s\n", server.endpoint().c_str());
  std::fflush(stdout);
  if (!o.endpoint_file.empty()) {  // whole or not at all: readers poll for it
    std::ofstream(o.endpoint_file + ".tmp") << server.endpoint() << "\n";
    std::filesystem::rename(o.endpoint_file + ".tmp", o.endpoint_file);
  }
  server.serve(g_stop);
  std::fprintf(stderr, "tandem trial-slots: stopped\n");
}

}  // namespace

void add_trial_slots_command(CLI::App& app) {
  auto o = std::make_shared<TrialSlotsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "trial-slots",
      "Run trials for tandem search --slots, and shares of tandem predict --slots, on this "
      "machine (data, outputs and logs on a filesystem shared with the search or prediction)");
  cmd->add_option("--bind", o->bind, "Where to serve: tcp://HOST:PORT (PORT * for any), ipc://PATH")
      ->capture_default_str();
  cmd->add_option("--slots", o->slots, "Trials at once")->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--threads-per-trial", o->threads_per_trial,
                  "Threads per trial unless the search gives them (0: cores / slots)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--heartbeat-timeout", o->heartbeat_timeout,
                  "Seconds a search may stay silent before its trials are killed")
      ->check(CLI::Range(0.2, 3600.0))->capture_default_str();
  cmd->add_option("--endpoint-file", o->endpoint_file, "Also write the bound endpoint to this file");
  cmd->add_option("--curve-secret", o->curve_secret,
                  "Secure the server with CURVE: its secret key file (tandem keygen); searches "
                  "give its public key with --slots-curve-server")
      ->check(CLI::ExistingFile);
  cmd->add_option("--curve-allowed", o->curve_allowed,
                  "Search public keys admitted: a file of keys or a directory of *.key (default: "
                  "any search that knows the server's key)")
      ->check(CLI::ExistingPath);
  cmd->callback([o] { run_trial_slots(*o); });
}

}  // namespace tandem::cli
