// One command per task under a batch launcher: SLURM's srun or an MPI launcher starts the same
// `tandem rank ...` N times, and each copy picks its role from its rank. Rank 0 is the
// coordinator, ranks 1..ps the parameter servers, the next `scorers` ranks the scorer, the rest
// workers. Ranks find the coordinator through a rendezvous file on the shared filesystem (the run
// directory, which holds the data store anyway): rank 0 writes its address there once it listens.
#pragma once

#include <optional>
#include <string>

namespace tandem {

struct LauncherRank {
  int rank = 0;
  int size = 1;
  std::string launcher;  // "slurm", "openmpi", "pmi"
  std::string job;       // the job's id when the launcher says it (SLURM's: JOB.STEP), or ""
};

// From the environment: SLURM_PROCID/SLURM_NTASKS (SLURM_JOB_ID), OMPI_COMM_WORLD_RANK/
// OMPI_COMM_WORLD_SIZE (OMPI_MCA_ess_base_jobid), PMI_RANK/PMI_SIZE; nullopt when none is set.
// InputError when a variable is set but not a number, or the rank is outside the size.
std::optional<LauncherRank> launcher_rank_from_environment();

struct RankRole {
  std::string kind;  // "coordinator", "ps", "scorer", "worker"
  int index = 0;     // within its kind
  int workers = 0;   // how many workers the job has (the coordinator expects them)
};

// InputError when the job is too small: it needs 1 + ps + scorers + at least one worker ranks.
RankRole role_for_rank(int rank, int size, int ps, int scorers);

// This machine's name (gethostname), or "localhost" when it has none.
std::string host_name();

// True for tcp://0.0.0.0:PORT and tcp://*:PORT: a socket bound to every interface, which peers
// reach by a name.
bool binds_every_interface(const std::string& endpoint);

// Why `advertise` (a host name given with --advertise) cannot go with `bind`, or "": only a
// socket bound to every interface is advertised by a name (elsewhere it was dropped without a
// word). `what` names the server in the text ("a server", "a coordinator").
std::string advertise_problem(const std::string& bind, const std::string& advertise,
                              const std::string& what);

// tcp://0.0.0.0:PORT (a socket bound to every interface) as peers can reach it: tcp://HOST:PORT,
// HOST being `host` or, when empty, this machine's name. Other endpoints are returned as given.
std::string advertised_endpoint(const std::string& bound, const std::string& host = "");

// The scores channel's bind address beside the control socket's `bind`: the same host, any port
// (tcp://127.0.0.1:* for anything but tcp). A coordinator bound to every interface so that other
// nodes reach it serves its scores there too.
std::string scores_bind_beside(const std::string& bind);

// The rendezvous file: written atomically by rank 0 ("ADDRESS JOB\n"); read by the others, who
// wait up to timeout_ms for one of their job (or, without a job id, one written after
// not_before_unix_s). Throws tandem::Error naming the file when none comes.
void write_rendezvous(const std::string& path, const std::string& address, const std::string& job);
// Removes the file when it still holds what write_rendezvous wrote for (address, job), as rank 0
// ends (remove_if_it_holds): under PMI (no job id) a rank of the next job started within a
// minute took a file left behind for its own job's, and waited on an address nobody listened
// at. A newer rank 0's file, written before this check, is left.
void remove_rendezvous(const std::string& path, const std::string& address,
                       const std::string& job);
std::string wait_for_rendezvous(const std::string& path, const std::string& job,
                                double not_before_unix_s, int timeout_ms);

}  // namespace tandem
