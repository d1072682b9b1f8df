#include "cluster_ranks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {

namespace {

std::optional<int> env_int(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 0 || value > 1000000)
    throw InputError(std::string("the environment variable ") + name + "='" + text +
                     "' is not a rank or task count");
  return int(value);
}

std::string env_text(const char* name) {
  const char* text = std::getenv(name);
  return text ? text : "";
}

}  // namespace

std::optional<LauncherRank> launcher_rank_from_environment() {
  // `step`: what tells two launches of one job apart (every srun of one allocation has the
  // allocation's SLURM_JOB_ID), so that a rank never takes the previous step's coordinator.
  struct Source {
    const char *rank, *size, *job, *step, *name;
  };
  const Source sources[] = {{"SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_STEP_ID",
                             "slurm"},
                            {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                             "OMPI_MCA_ess_base_jobid", "", "openmpi"},
                            {"PMI_RANK", "PMI_SIZE", "", "", "pmi"}};
  for (const Source& s : sources) {
    const auto rank = env_int(s.rank);
    if (!rank) continue;
    const auto size = env_int(s.size);
    if (!size)
      throw InputError(std::string(s.rank) + " is set but " + s.size + " is not: cannot tell the job's size");
    if (*rank >= *size)
      throw InputError(std::string(s.rank) + "=" + std::to_string(*rank) + " is not below " +
                       s.size + "=" + std::to_string(*size));
    std::string job = *s.job ? env_text(s.job) : "";
    const std::string step = *s.step ? env_text(s.step) : "";
    if (!job.empty() && !step.empty()) job += "." + step;
    return LauncherRank{*rank, *size, s.name, job};
  }
  return std::nullopt;
}

RankRole role_for_rank(int rank, int size, int ps, int scorers) {
  const int workers = size - 1 - ps - scorers;
  if (ps < 1 || scorers < 0 || workers < 1)
    throw InputError("a job of " + std::to_string(size) + " tasks cannot hold a coordinator, " +
                     std::to_string(ps) + " parameter servers, " + std::to_string(scorers) +
                     " scorers and at least one worker: ask for " +
                     std::to_string(ps + scorers + 2) + " tasks or more");
  if (rank < 0 || rank >= size) throw InputError("rank " + std::to_string(rank) + " is outside the job");
  if (rank == 0) return {"coordinator", 0, workers};
  if (rank <= ps) return {"ps", rank - 1, workers};
  if (rank <= ps + scorers) return {"scorer", rank - 1 - ps, workers};
  return {"worker", rank - 1 - ps - scorers, workers};
}

namespace {
constexpr const char* kEveryInterface = "tcp://0.0.0.0:";
}  // namespace

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

bool binds_every_interface(const std::string& endpoint) {
  return endpoint.rfind(kEveryInterface, 0) == 0 || endpoint.rfind("tcp://*:", 0) == 0;
}

std::string advertise_problem(const std::string& bind, const std::string& advertise,
                              const std::string& what) {
  if (advertise.empty() || binds_every_interface(bind)) return {};
  return "--advertise is for " + what + " bound to every interface (--bind tcp://0.0.0.0:PORT); "
         "this one binds " + bind;
}

std::string advertised_endpoint(const std::string& bound, const std::string& host) {
  if (!binds_every_interface(bound)) return bound;
  return "tcp://" + (host.empty() ? host_name() : host) + ":" +
         bound.substr(bound.rfind(':') + 1);
}

std::string scores_bind_beside(const std::string& bind) {
  const size_t colon = bind.rfind(':');
  if (bind.rfind("tcp://", 0) != 0 || colon == std::string::npos || colon < 6)
    return "tcp://127.0.0.1:*";
  return bind.substr(0, colon) + ":*";
}

namespace {
std::string rendezvous_text(const std::string& address, const std::string& job) {
  return address + ' ' + job + '\n';
}
}  // namespace

void write_rendezvous(const std::string& path, const std::string& address, const std::string& job) {
  write_text_atomic(path, rendezvous_text(address, job));
}

void remove_rendezvous(const std::string& path, const std::string& address,
                       const std::string& job) {
  remove_if_it_holds(path, rendezvous_text(address, job));
}

std::string wait_for_rendezvous(const std::string& path, const std::string& job,
                                double not_before_unix_s, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::string seen;
  for (;;) {
    struct stat st {};
    if (stat(path.c_str(), &st) == 0) {
      std::ifstream in(path);
      std::string address, their_job;
      in >> address;
      std::getline(in, their_job);
      while (!their_job.empty() && their_job.front() == ' ') their_job.erase(0, 1);
      const bool fresh = job.empty() ? double(st.st_mtime) >= not_before_unix_s : their_job == job;
      if (!address.empty() && fresh) return address;
      seen = address + " (job '" + their_job + "')";
    }
    if (std::chrono::steady_clock::now() > deadline)
      throw Error("no coordinator address for this job in " + path + " after " +
                  std::to_string(timeout_ms / 1000) + " s" +
                  (seen.empty() ? " (no file)" : "; it holds an older one: " + seen) +
                  ": rank 0 writes it once it listens; is the run directory on a filesystem "
                  "every node shares?");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace tandem
