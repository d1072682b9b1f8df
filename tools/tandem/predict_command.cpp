// tandem predict: class ids and probabilities of every row of a store's split, written as Zarr
// arrays chunked like the input (engine/src/predictor.h). With --processes N the command runs
// itself N times, each child with a share of the chunks (--chunks i/N), and waits for them. With
// --slots the shares run on slot servers (tandem trial-slots, trial_slot_pool.h) instead, one
// per slot, on a filesystem the servers share: the cluster's machines predicting together.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "json_text.h"
#include "number_checks.h"
#include "commands.h"
#include "cuda/cuda_device.h"
#include "data_store_of.h"
#include "file_io.h"
#include "predictor.h"
#include "run_dir_lock.h"
#include "tandem/config.h"
#include "tandem/error.h"
#include "slot_client_options.h"
#include "stop_signals.h"
#include "thread_pool.h"
#include "trial_process.h"
#include "trial_slot_pool.h"

namespace tandem::cli {

namespace {

struct PredictCliOptions {
  std::string model;
  std::string data;
  std::string out;
  std::string chunks;  // hidden: "i/N", this process's share (set for the children)
  std::string backend = "auto";
  int processes = 1;
  bool json = false;
  PredictOptions engine;
  SlotClientOptions slots;  // --slots ...: shares on tandem trial-slots servers
};

namespace fs = std::filesystem;

pid_t spawn_share(const std::string& self, const PredictCliOptions& o, int share, int threads) {
  std::vector<std::string> args = {self, "predict", "--model", o.model, "--data", o.data,
                                   "--split", o.engine.split, "--out", o.out,
                                   "--backend", o.backend,
                                   "--threads", std::to_string(threads), "--chunks",
                                   std::to_string(share) + "/" + std::to_string(o.processes),
                                   "--output-id", o.engine.output_id};
  return start_child_process(args, "", "predict: cannot start share " + std::to_string(share));
}

// What every error of an unfinished prediction ends with.
const char* const kRerun = "rerun to finish the missing chunks (complete ones are kept)";

// The error of a prediction that a stop signal ended (stop_signals.h), `detail` after the
// signal's name.
Error stopped_by_signal(const std::string& detail) {
  return Error(std::string("prediction stopped by ") + stop_signal_name() + detail + "; " +
               kRerun);
}

// `s`, unless a stop signal ended the prediction it sums up (PredictOptions::stop): then the
// error saying so (the chunks in flight were finished: no temporary file is left).
const PredictSummary& unless_stopped(const PredictSummary& s) {
  if (s.stopped)
    throw stopped_by_signal(" after writing " + std::to_string(s.chunks_written) + " chunk(s)");
  return s;
}

// Runs the shares in child processes; throws naming every child that failed. A stop signal
// (SIGINT, SIGTERM, SIGHUP) is passed on to the children as SIGTERM, and the parent waits for
// them to finish their chunks in flight: dying at once would take them along (PR_SET_PDEATHSIG)
// in the middle of a write, which only a second stop signal asks for (stop_signals.h).
void run_processes(const PredictCliOptions& o) {
  const std::atomic<bool>& stop = stop_on_signals();
  const std::string self = self_path();
  // The cores this process may run on (its affinity: taskset, a batch system's CPU set), as one
  // process's --threads 0 takes, not every core of the machine.
  const int total = o.engine.threads > 0 ? o.engine.threads : ThreadPool::available_cores();
  std::vector<pid_t> pids;
  try {
    for (int i = 0; i < o.processes; ++i)
      pids.push_back(spawn_share(self, o, i,
                                 std::max(1, total / o.processes + (i < total % o.processes))));
  } catch (const std::exception&) {
    // The shares already started are ended and waited for here: left to PR_SET_PDEATHSIG when
    // this process exits, they would be killed in the middle of a write.
    for (const pid_t pid : pids) kill(pid, SIGTERM);
    for (const pid_t pid : pids) waitpid(pid, nullptr, 0);
    throw;
  }
  std::vector<int> statuses(pids.size());
  std::vector<bool> ended(pids.size(), false);
  size_t left = pids.size();
  bool passed_on = false;
  while (left > 0) {
    if (stop.load() && !passed_on) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (!ended[i]) kill(pids[i], SIGTERM);
      passed_on = true;
    }
    for (size_t i = 0; i < pids.size(); ++i)
      if (!ended[i] && waitpid(pids[i], &statuses[i], WNOHANG) == pids[i]) {
        ended[i] = true;
        --left;
      }
    if (left > 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string failures;
  bool all_killed = true;  // (by SIGKILL: nothing said; another signal may have had its say)
  for (int i = 0; i < o.processes; ++i) {
    const int status = statuses[size_t(i)];
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) continue;
    // SIGKILL from nobody here: most often the kernel's, out of memory.
    const bool sigkill = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    all_killed = all_killed && sigkill;
    failures += " share " + std::to_string(i) + "/" + std::to_string(o.processes) + " " +
                describe_exit(status) + (sigkill ? " (out of memory? see dmesg)" : "") + ";";
  }
  if (stop.load())
    throw stopped_by_signal(failures.empty() ? std::string() : " (its processes:" + failures + ")");
  // A share may have failed on its input (a row it cannot predict), which a rerun meets again.
  if (!failures.empty())
    throw Error("prediction processes failed:" + failures +
                (all_killed ? " " : " their errors are above; once what they name is fixed, ") +
                kRerun);
}

// The shares on slot servers: as many shares as the servers have slots, each a `tandem predict
// --chunks i/N` job; a start refused because a server is busy (another client uses its slots)
// waits for a free slot. A share that fails, or whose server goes silent, is reported and not
// started again elsewhere (a server merely cut off may still be writing its chunks); its chunks
// are finished by a rerun, which keeps the complete ones. Returns the number of shares.
int run_on_slots(PredictCliOptions& o) {
  // On a stop signal the prediction leaves: the pool's bye has the servers end the shares
  // (SIGTERM, which a share takes between two chunks).
  const std::atomic<bool>& stop = stop_on_signals();
  const std::unique_ptr<TrialSlotPool> pool = o.slots.connect("predict");
  const int shares = pool->total_slots();
  // The servers' logs of the shares, beside the output (removed when every share succeeded).
  const fs::path logs = o.out + ".logs";
  fs::create_directories(logs);
  auto log_of = [&](int share) {
    return logs / ("share-" + std::to_string(share) + "-of-" + std::to_string(shares) + ".log");
  };
  std::deque<int> waiting;
  for (int i = 0; i < shares; ++i) waiting.push_back(i);
  std::map<std::string, int> running;  // job -> share
  std::string failures;
  // Every failure a refusal by its server (a path outside its --root): those never ran, wrote
  // no log, and a rerun is refused the same way.
  bool refused_only = true;
  while (!waiting.empty() || !running.empty()) {
    if (stop.load()) {
      // The logs are kept for the shares that failed, named; a stop alone is no failure (its
      // shares end on the servers' SIGTERM), and leaves none behind.
      if (failures.empty()) {
        std::error_code ignored;
        fs::remove_all(logs, ignored);
        throw stopped_by_signal("; the slot servers end its shares");
      }
      throw stopped_by_signal("; the slot servers end its shares; before the stop:" + failures +
                              " logs in " + logs.string());
    }
    while (!waiting.empty() && pool->free_slots() > 0) {
      const int share = waiting.front();
      waiting.pop_front();
      const std::string job = "share-" + std::to_string(share);
      pool->start(
          job,
          [&](int server_threads) {
            const int threads = o.engine.threads > 0 ? o.engine.threads : server_threads;
            return std::vector<std::string>{
                "predict", "--model", o.model, "--data", o.data, "--split", o.engine.split,
                "--out", o.out, "--backend", o.backend, "--threads", std::to_string(threads),
                "--chunks", std::to_string(share) + "/" + std::to_string(shares),
                "--output-id", o.engine.output_id};
          },
          log_of(share).string());
      running[job] = share;
    }
    if (running.empty() && pool->total_slots() == 0) {
      for (const int share : waiting)
        failures += " share " + std::to_string(share) + "/" + std::to_string(shares) +
                    " never started;";
      failures += " every slot server is gone (" + pool->lost_servers() + ");";
      refused_only = false;
      break;
    }
    for (const SlotJobEnd& end : pool->wait(200)) {
      const auto it = running.find(end.job);
      if (it == running.end()) continue;
      const int share = it->second;
      running.erase(it);
      if (end.retry) {
        waiting.push_front(share);
      } else if (!end.clean) {
        refused_only = refused_only && end.refused;
        const std::string tail = log_tail(log_of(share).string(), 3);
        failures += " share " + std::to_string(share) + "/" + std::to_string(shares) + " " +
                    end.how + (tail.empty() ? "" : " (" + tail + ")") + ";";
      }
    }
  }
  std::error_code ignored;
  if (!failures.empty()) {
    const bool no_logs = fs::is_empty(logs, ignored) && !ignored;
    if (no_logs) fs::remove(logs, ignored);
    throw Error("prediction shares on slot servers failed:" + failures +
                (no_logs ? "" : " logs in " + logs.string() + ";") + " " +
                (refused_only ? "the servers refused them, and refuse a rerun the same way "
                                "until that changes"
                              : kRerun));
  }
  fs::remove_all(logs, ignored);
  return shares;
}

void print(const PredictCliOptions& o, const PredictSummary& s) {
  if (o.json) {
    nlohmann::json j = {{"rows", s.rows},
                        {"chunks", s.chunks},
                        {"chunks_written", s.chunks_written},
                        {"chunks_skipped", s.chunks_skipped},
                        {"rows_predicted", s.rows_predicted},
                        {"seconds", s.seconds},
                        {"samples_per_s", s.samples_per_s},
                        {"backend", s.backend},
                        {"processes", o.processes},
                        {"split", o.engine.split},
                        {"out", o.out}};
    if (o.slots.remote()) j["slot_servers"] = o.slots.endpoints;
    if (s.has_labels) {
      j["accuracy"] = s.accuracy;
      j["correct"] = s.correct;
    }
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf("%s split: %lld rows in %lld chunks, %lld written, %lld already done; %.0f "
              "samples/s (%.2f s) on %s",
              o.engine.split.c_str(), static_cast<long long>(s.rows),
              static_cast<long long>(s.chunks), static_cast<long long>(s.chunks_written),
              static_cast<long long>(s.chunks_skipped), s.samples_per_s, s.seconds,
              s.backend.c_str());
  if (s.has_labels) std::printf(", accuracy %.4f", s.accuracy);
  std::printf("\n");
}

void run_predict(PredictCliOptions& o) {
  o.engine.backend = parse_backend(o.backend);
  if (!o.engine.output_id.empty() && o.chunks.empty())
    throw InputError("--output-id is for a share (--chunks i/N) of a run that prepared its "
                     "output; a run prepares its own");
  if (!o.chunks.empty()) {  // a child: its share only, no summary beyond its own counts
    if (std::sscanf(o.chunks.c_str(), "%d/%d", &o.engine.share, &o.engine.shares) != 2)
      throw InputError("--chunks takes i/N, got '" + o.chunks + "'");
    // A share ends between two chunks on SIGTERM: what its parent, or a slot server whose
    // client is gone, sends it.
    o.engine.stop = &stop_on_signals();
    unless_stopped(predict_chunks(o.model, o.data, o.out, o.engine));
    return;
  }
  o.slots.prepare("predict");
  if (o.slots.remote()) {
    if (o.processes != 1)
      throw InputError("predict: --processes is for this machine; with --slots the servers' "
                       "slots set the shares");
    o.model = resolved_path(o.model);
    o.data = resolved_path(o.data);
    o.out = resolved_path(o.out);
  }
  // Said before the output's directories and lock are made, which a mistyped path left behind.
  refuse_idx_files_for_a_store(o.data, "--data");
  check_prediction_inputs(o.model, o.data);
  if (o.out.empty()) throw InputError("--out must name the Zarr group to write");
  // One prediction per --out (its shares aside, which this one starts).
  const PredictionOutputLock lock(o.out, "--out");
  if (o.processes <= 1 && !o.slots.remote()) {
    o.engine.stop = &stop_on_signals();
    print(o, unless_stopped(predict_store(o.model, o.data, o.out, o.engine)));
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  // Slot servers predict on their own machines: --backend cuda is theirs to resolve, and a
  // client without a GPU (a login node) must not refuse it here.
  PredictOptions here = o.engine;
  if (o.slots.remote()) here.backend = BackendKind::Cpu;
  // Its shares write under this run's output id (--output-id): a share of an earlier run that
  // starts late writes nothing into the group this run took over.
  const int64_t chunks = prepare_predictions(o.model, o.data, o.out, here, &o.engine.output_id);
  here.output_id = o.engine.output_id;
  // Count what is already there before the children write: written = chunks - skipped after.
  PredictOptions probe = here;
  probe.stop_after_chunks = 0;
  const PredictSummary before = predict_chunks(o.model, o.data, o.out, probe);
  PredictSummary s;
  if (!o.slots.remote()) {
    run_processes(o);
    s.backend = before.backend;  // what the children's --backend resolves to here ...
    // ... except that `auto` on a GPU this build's kernels cannot run on is the CPU (as each
    // child found). Asked only now: the question starts a CUDA context in this process, which
    // the counting call above must not hold while the children predict.
    if (o.engine.backend == BackendKind::Auto && s.backend == "cuda") {
      try {
        if (!kernels::cuda_kernels_unusable_on(0).empty()) s.backend = "cpu";
      } catch (const std::exception&) {
        s.backend = "cpu";  // (busy or failed: not what the children could use either)
      }
    }
  } else {
    o.processes = run_on_slots(o);
    s.backend = o.backend;  // each server resolves it on its own machine
  }
  s.rows = before.rows;
  s.chunks = chunks;
  s.chunks_skipped = before.chunks_skipped;
  s.chunks_written = chunks - before.chunks_skipped;
  s.rows_skipped = before.rows_skipped;
  s.rows_predicted = s.rows - before.rows_skipped;
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.samples_per_s = s.seconds > 0.0 ? double(s.rows_predicted) / s.seconds : 0.0;
  add_accuracy(o.data, o.out, o.engine, s);
  print(o, s);
}

}  // namespace

void add_predict_command(CLI::App& app) {
  auto o = std::make_shared<PredictCliOptions>();
  CLI::App* cmd = app.add_subcommand(
      "predict", "Predict every row of a store's split, writing classes and probabilities (Zarr)");
  cmd->add_option("--model", o->model, "Checkpoint file (safetensors)")->required();
  cmd->add_option("--data", o->data, "Dataset store (Zarr)")->required();
  cmd->add_option("--split", o->engine.split, "train, validation or test")
      ->check(CLI::IsMember({"train", "validation", "test"}))->capture_default_str();
  cmd->add_option("--out", o->out, "Zarr group to write (resumed when it exists)")->required();
  cmd->add_option("--backend", o->backend,
                  "cpu, cuda or auto (auto: the GPU when one is present, else the CPU)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  cmd->add_option("--threads", o->engine.threads,
                  "Threads in all (0: all cores); on the GPU, the threads reading and writing "
                  "chunks")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_option("--processes", o->processes, "Processes, each taking a share of the chunks")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  add_slot_client_options(cmd, o->slots, "shares", "prediction", "The model, --data and --out");
  cmd->add_flag("--overwrite", o->engine.overwrite,
                "Replace an output written from another model or input");
  cmd->add_option("--chunks", o->chunks, "This process's share of the chunks, i/N")
      ->group("");  // hidden: how --processes starts its children
  cmd->add_option("--output-id", o->engine.output_id,
                  "Write only into the group of this output id (the run that started the share)")
      ->group("");  // hidden: the id a run's shares write under
  cmd->add_flag("--json", o->json, "Print one line of JSON");
  cmd->callback([o] { run_predict(*o); });
}

}  // namespace tandem::cli
