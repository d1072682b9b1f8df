// tandem trial-slots: a slot server for tandem search --slots (trial_slot_server.h). It binds
// (by default a socket only this user reaches), prints its endpoint, and runs the trials a
// search sends it until SIGINT, SIGTERM or SIGHUP (its terminal gone), which end its trials too.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "bind_address.h"
#include "cluster_ranks.h"
#include "commands.h"
#include "file_io.h"
#include "number_checks.h"
#include "stop_signals.h"
#include "tandem/error.h"
#include "thread_pool.h"
#include "trial_process.h"
#include "trial_slot_server.h"
#include "zmq_curve.h"

namespace tandem::cli {

namespace {

struct TrialSlotsOptions {
  std::string bind;  // empty: a socket in a directory of this user's alone (PrivateSocket)
  int slots = 1;
  int threads_per_trial = 0;
  double heartbeat_timeout = 10;
  double kill_grace = 2;
  std::string endpoint_file;
  std::string endpoint_dir;
  std::string root;  // --root: jobs name paths in this directory only
  std::string advertise;  // the host clients reach this server by, for a wildcard bind
  std::string curve_secret;
  std::string curve_allowed;
  bool any_peer = false;  // --any-peer: serve other machines without an allowed-keys list
};

// Letters, digits, '.', '-' and '_' kept; anything else becomes '_'.
std::string file_safe(std::string text) {
  for (char& c : text)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  return text;
}

// Whole or not at all (AtomicFile: a temporary file renamed), so readers polling for it never
// see part of it. The temporary name does not end in .endpoint: clients reading a directory
// pass it over. Returns what it wrote.
std::string write_endpoint_file(const std::string& path, const std::string& endpoint) {
  const std::string text = endpoint + "\n";
  write_text_atomic(path, text);
  return text;
}

// A server's entry in an --endpoint-dir: HOST-PID.endpoint in it (made if needed), its own; ""
// without one.
std::string directory_entry_path(const std::string& dir) {
  if (dir.empty()) return {};
  create_output_directory(dir, "--endpoint-dir");
  return (std::filesystem::path(dir) /
          (file_safe(host_name()) + "-" + std::to_string(::getpid()) + ".endpoint"))
      .string();
}

// An endpoint file (--endpoint-file, or the server's entry in --endpoint-dir), removed when the
// server stops, however serve() ends, if it still names this server (remove_if_it_holds): a
// client reading it later got the address of a server gone ("did not answer"). A file another
// server has written since is left. Nothing for an empty path.
class EndpointFile {
 public:
  EndpointFile(const std::string& path, const std::string& endpoint)
      : path_(path), text_(path.empty() ? "" : write_endpoint_file(path, endpoint)) {}
  ~EndpointFile() {
    if (!path_.empty()) remove_if_it_holds(path_, text_);
  }
  EndpointFile(const EndpointFile&) = delete;
  EndpointFile& operator=(const EndpointFile&) = delete;

 private:
  std::string path_, text_;
};

// The server's default address: an ipc:// socket in a directory made for it (mode 0700, in
// $XDG_RUNTIME_DIR when that is this user's and short enough for a socket's path, else /tmp),
// so that only this user reaches it; removed when the server stops. A tcp:// port on loopback
// is open to every user of the machine, each of whom could run jobs as this user. The
// directory's name carries the server's pid: a server killed outright leaves it, and the next
// one of this user removes it.
class PrivateSocket {
 public:
  PrivateSocket() {
    for (const std::string& base : bases()) {
      remove_dead_servers_directories(base);
      std::string dir = base + "/tandem-slots-" + std::to_string(::getpid()) + "-XXXXXX";
      if (::mkdtemp(dir.data()) != nullptr) {
        dir_ = dir;
        return;
      }
    }
    throw IoError(std::string("cannot make a directory for the server's socket in /tmp: ") +
                  std::strerror(errno));
  }
  ~PrivateSocket() {
    if (!dir_.empty()) ::rmdir(dir_.c_str());  // after the server removed its socket file
  }
  PrivateSocket(const PrivateSocket&) = delete;
  PrivateSocket& operator=(const PrivateSocket&) = delete;
  std::string address() const { return "ipc://" + dir_ + "/" + kSocket; }

 private:
  static constexpr const char* kSocket = "slots.sock";

  // Where to make the directory, in order of preference.
  static std::vector<std::string> bases() {
    std::vector<std::string> out;
    const char* runtime = std::getenv("XDG_RUNTIME_DIR");
    struct stat st {};
    // (After `su` without `-` it is still another user's; a socket's path has 107 bytes.)
    if (runtime != nullptr && runtime[0] == '/' && ::stat(runtime, &st) == 0 &&
        S_ISDIR(st.st_mode) && st.st_uid == ::getuid() &&
        std::strlen(runtime) + std::strlen("/tandem-slots-4194304-XXXXXX/slots.sock") <= 107)
      out.push_back(runtime);
    out.push_back("/tmp");
    return out;
  }

  // This user's tandem-slots-PID-* directories in `base` whose server has ended (SIGKILL, a
  // crash, a second stop signal: no destructor ran), with the socket file left in them.
  static void remove_dead_servers_directories(const std::string& base) {
    std::error_code ec;
    for (std::filesystem::directory_iterator it(base, ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string name = it->path().filename().string();
      if (name.rfind("tandem-slots-", 0) != 0) continue;
      const std::string rest = name.substr(std::strlen("tandem-slots-"));
      const size_t dash = rest.find('-');
      if (dash == 0 || dash == std::string::npos ||
          rest.find_first_not_of("0123456789") != dash)
        continue;
      struct stat st {};
      if (::lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
          st.st_uid != ::getuid())
        continue;
      const long pid = std::stol(rest.substr(0, dash));
      if (pid <= 0 || ::kill(pid_t(pid), 0) == 0 || errno != ESRCH) continue;
      ::unlink((it->path() / kSocket).c_str());
      ::rmdir(it->path().c_str());
    }
  }

  std::string dir_;
};

void run_trial_slots(const TrialSlotsOptions& o) {
  // Declared before the server: the directory goes after the server's socket file.
  std::optional<PrivateSocket> private_socket;
  if (o.bind.empty()) private_socket.emplace();
  const std::string bind = o.bind.empty() ? private_socket->address() : o.bind;
  TrialSlotServerOptions options;
  options.bind = bind;
  options.slots = o.slots;
  const int cores = ThreadPool::available_cores();  // its CPU set's, not the machine's
  options.threads = o.threads_per_trial > 0 ? o.threads_per_trial : std::max(1, cores / o.slots);
  options.program = self_path();
  options.heartbeat_timeout_ms = static_cast<int>(o.heartbeat_timeout * 1000);
  options.kill_grace_ms = static_cast<int>(o.kill_grace * 1000);
  options.root = o.root;
  if (!o.curve_secret.empty()) {
    const transport::CurveKeyPair keys = transport::read_curve_secret_key_file(o.curve_secret);
    options.curve_secret_key = keys.secret_key;
    if (!o.curve_allowed.empty())
      options.curve_allowed_clients = transport::read_curve_allowed_clients(o.curve_allowed);
  } else if (!o.curve_allowed.empty()) {
    throw InputError("--curve-allowed needs --curve-secret (this server's key)");
  }
  // A peer of this server runs `tandem train` and `tandem predict` as this user with paths of
  // its choosing (its checkpoint, metrics and log written where it says): on a tcp:// port,
  // which every user of the machine reaches (and other machines beyond loopback), only known
  // keys unless the operator says otherwise. It once served anyone who reached its port,
  // without a word.
  // (An abstract ipc:// name, "ipc://@NAME", has no permissions: any user reaches it too.)
  if ((bind.rfind("tcp://", 0) == 0 || bind.rfind("ipc://@", 0) == 0) &&
      o.curve_allowed.empty() && !o.any_peer)
    throw InputError("--bind " + bind + " is reached by " +
                     (transport::binds_this_machine_only(bind)
                          ? std::string("every user of this machine")
                          : std::string("other machines")) +
                     ", and whoever reaches it runs tandem jobs as this user, writing files "
                     "where it says: admit only known keys (--curve-secret KEY --curve-allowed "
                     "KEYS), or give --any-peer to serve any peer you trust (--root DIR confines "
                     "the jobs' paths; without --bind the server takes a socket only this user "
                     "reaches)");
  const std::atomic<bool>& stop = stop_on_signals();  // SIGHUP too: a closed terminal or ssh
  const bool wildcard = binds_every_interface(bind);
  const std::string problem = advertise_problem(bind, o.advertise, "a server");
  if (!problem.empty()) throw InputError(problem);
  TrialSlotServer server(options);
  // An ipc:// socket file is made as the umask says (0775 under umask 002: the group could run
  // jobs as this user); only this user's from here. (The private directory is 0700 already.)
  if (bind.rfind("ipc://", 0) == 0 && bind.rfind("ipc://@", 0) != 0)
    ::chmod(bind.substr(std::strlen("ipc://")).c_str(), 0600);
  // Bound to every interface (tcp://0.0.0.0:PORT), the server is reached by a name: what it
  // prints and lists is tcp://HOST:PORT, as for the cluster's roles.
  const std::string endpoint = advertised_endpoint(server.endpoint(), o.advertise);
  std::fprintf(stderr, "tandem trial-slots: %d slot(s) at %s, %d thread(s) per trial%s\n", o.slots,
               endpoint.c_str(), options.threads,
               server.curve_public_key().empty()
                   ? ""
                   : (", CURVE key " + server.curve_public_key()).c_str());
  // In the directory the server's file is its own (host and process id) and goes when it stops,
  // so the directory lists the servers running: what a client's --slots DIR finds. A server
  // killed outright (SIGKILL) leaves its file, and clients leave it out when it does not answer.
  // Written first: whoever waits for the endpoint below then finds the entry too.
  if (!o.endpoint_dir.empty() && !wildcard)
    std::fprintf(stderr, "tandem trial-slots: note: %s is listed in %s but only this machine can "
                 "reach it (bind tcp://0.0.0.0:* with --curve-allowed to serve other machines)\n",
                 endpoint.c_str(), o.endpoint_dir.c_str());
  const EndpointFile entry(directory_entry_path(o.endpoint_dir), endpoint);
  const EndpointFile endpoint_file(o.endpoint_file, endpoint);
  std::printf("%s\n", endpoint.c_str());
  std::fflush(stdout);
  server.serve(stop);
  std::fprintf(stderr, "tandem trial-slots: stopped\n");
}

}  // namespace

void add_trial_slots_command(CLI::App& app) {
  auto o = std::make_shared<TrialSlotsOptions>();
  CLI::App* cmd = app.add_subcommand(
      "trial-slots",
      "Run trials for tandem search --slots, and shares of tandem predict --slots, on this "
      "machine (data, outputs and logs on a filesystem shared with the search or prediction)");
  cmd->add_option("--bind", o->bind,
                  "Where to serve: ipc://PATH, or tcp://HOST:PORT (PORT * for any) with "
                  "--curve-allowed or --any-peer (default: a socket only this user reaches)")
      ->check(bind_address());
  cmd->add_option("--slots", o->slots, "Trials at once")->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--threads-per-trial", o->threads_per_trial,
                  "Threads per trial unless the search gives them (0: cores / slots)")
      ->check(CLI::Range(0, ThreadPool::kMaxThreads))->capture_default_str();
  cmd->add_option("--heartbeat-timeout", o->heartbeat_timeout,
                  "Seconds a search may stay silent before its trials are killed")
      ->check(CLI::Range(0.2, 3600.0))->capture_default_str();
  cmd->add_option("--kill-grace", o->kill_grace,
                  "Seconds a job has to end after SIGTERM (a prediction's share finishes the "
                  "chunk it is writing) before SIGKILL")
      ->check(CLI::Range(0.0, 3600.0))->capture_default_str();
  cmd->add_option("--advertise", o->advertise,
                  "With --bind tcp://0.0.0.0:PORT: the host name or address clients reach this "
                  "server by (default: this machine's name)");
  cmd->add_option("--endpoint-file", o->endpoint_file,
                  "Also write the bound endpoint to this file (removed when the server stops, "
                  "if it still names this server and is not a symbolic link)");
  cmd->add_option("--root", o->root,
                  "Refuse jobs that name a path (data, outputs, their log) outside this directory; "
                  "jobs run in it (default: any path the server's user may use)");
  cmd->add_option("--endpoint-dir", o->endpoint_dir,
                  "Also list this server in a directory (its endpoint in HOST-PID.endpoint, "
                  "removed when it stops): a search or prediction given --slots DIR uses every "
                  "server listed there");
  cmd->add_option("--curve-secret", o->curve_secret,
                  "Secure the server with CURVE: its secret key file (tandem keygen); searches "
                  "give its public key with --slots-curve-server")
      ->check(CLI::ExistingFile);
  cmd->add_option("--curve-allowed", o->curve_allowed,
                  "Search public keys admitted: a key file, a file of keys, or a directory of "
                  "*.key (default: any search that knows the server's key)")
      ->check(CLI::ExistingPath);
  cmd->add_flag("--any-peer", o->any_peer,
                "Serve a tcp:// --bind without --curve-allowed: any peer that reaches the port "
                "(every user of this machine, and others beyond loopback) runs jobs as this user");
  cmd->callback([o] { run_trial_slots(*o); });
}

}  // namespace tandem::cli
