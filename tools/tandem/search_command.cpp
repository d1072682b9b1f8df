// tandem search: a hyper-parameter search over a grid or a list of configurations. Each trial is
// an independent `tandem train` run of this binary on the same data (a dataset store is streamed
// through the page cache, so its chunks are shared between the trial processes, not copied), up
// to --processes at once. Asynchronous successive halving (successive_halving.h) decides which
// trials go on to more epochs: a promotion reruns the trial with --resume and a larger --epochs.
// A trial whose process crashes is reported, with the tail of its log, and the search goes on.
// With --slots the trials run on slot servers instead (tandem trial-slots, trial_slot_pool.h),
// here or on other machines that share the search's filesystem.
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <thread>

#include "json_text.h"
#include "commands.h"
#include "cuda/cuda_device.h"
#include "data_store_of.h"
#include "dataset_store.h"
#include "file_io.h"
#include "json_fields.h"
#include "number_checks.h"
#include "run_dir_lock.h"
#include "progress_line.h"
#include "search_space.h"
#include "successive_halving.h"
#include "thread_pool.h"
#include "tandem/tandem.h"
#include "trial_process.h"
#include "slot_client_options.h"
#include "stop_signals.h"
#include "trial_slot_pool.h"

namespace tandem::cli {

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

struct SearchOptions {
  std::string data = default_data_dir();
  std::vector<std::string> grid;
  std::string trials_file;
  int budget = 9;
  double budget_seconds = 0;
  int eta = 3;
  int min_epochs = 1;
  int processes = 0;
  int threads_per_trial = 0;
  std::string backend = "auto";  // each trial's (tandem train --backend)
  std::string precision = "fp32";  // and --precision
  std::string out = "search";
  bool json = false;
  SlotClientOptions slots;  // --slots ...: trials on tandem trial-slots servers
  int crash_trial = -1;  // hidden test hook: this trial's process gets an invalid option
};

struct EpochResult {
  int epoch = 0;
  double loss = 0;  // validation loss per sample
  double accuracy = 0;
};

struct TrialRecord {
  TrialConfig config;
  std::vector<EpochResult> epochs;
  double seconds = 0;
  std::string error;
  std::string slot;  // where its last job ran: "local" or a slot server's endpoint
  // Stopped by the search's close (--budget-seconds, or a signal): running, or not started, or
  // waiting at a rung for a promotion still possible (SuccessiveHalving::in_contention).
  bool cut = false;
  // The epoch of lowest validation loss; a NaN or infinite one is no score (a NaN first epoch
  // would otherwise stay the best, nothing being below it).
  const EpochResult* best() const {
    const EpochResult* b = nullptr;
    for (const EpochResult& e : epochs)
      if (std::isfinite(e.loss) && (!b || e.loss < b->loss)) b = &e;
    return b;
  }
};

struct RunningJob {
  HalvingJob job;
  std::string key;  // the job's name for its runner
  Clock::time_point start;
  uintmax_t log_from = 0;  // the trial's log (appended to by every rung) before this job
};

// Where the trials run: processes of this search, or slots of tandem trial-slots servers. Jobs
// are `tandem train` argument lists (without the program) named by a key.
class TrialRunner {
 public:
  using Args = std::function<std::vector<std::string>(int threads)>;
  virtual ~TrialRunner() = default;
  virtual int free_slots() const = 0;
  // False once no slot can ever free up again (every slot server is gone).
  virtual bool any_slots() const { return true; }
  // Why nothing can start any more.
  virtual std::string why_no_slots() const { return "no trial slots"; }
  // Starts the job, its output appended to `log`; returns where it runs.
  virtual std::string start(const std::string& key, const Args& args, const std::string& log) = 0;
  virtual void cancel(const std::string& key) = 0;  // SIGTERM; its end comes from wait()
  // The jobs that ended within about timeout_ms.
  virtual std::vector<SlotJobEnd> wait(long timeout_ms) = 0;
};

class LocalTrials final : public TrialRunner {
 public:
  LocalTrials(int processes, int threads) : processes_(processes), threads_(threads) {}
  int free_slots() const override { return processes_ - static_cast<int>(trials_.size()); }
  std::string start(const std::string& key, const Args& args, const std::string& log) override {
    std::vector<std::string> argv{self_};
    for (const std::string& a : args(threads_)) argv.push_back(a);
    trials_[key] = {start_child_process(argv, log, "search: cannot start " + key), false, {}};
    return "local";
  }
  void cancel(const std::string& key) override {
    // One SIGTERM per trial: a second would stop it at once, unsaved (stop_signals.h).
    if (const auto it = trials_.find(key); it != trials_.end() && !it->second.cancelled) {
      kill(it->second.pid, SIGTERM);
      it->second.cancelled = true;
      it->second.cancelled_at = std::chrono::steady_clock::now();
    }
  }
  std::vector<SlotJobEnd> wait(long timeout_ms) override {
    std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
    std::vector<SlotJobEnd> ended;
    // A trial still there a kill grace after its SIGTERM (hung in a GPU call, a stalled file
    // system) gets SIGKILL, as a slot server's would: without it the search (its
    // --budget-seconds included) waited for it for ever.
    const auto now = std::chrono::steady_clock::now();
    for (auto& [key, trial] : trials_)
      if (trial.cancelled && !trial.killed && now - trial.cancelled_at > kKillGrace) {
        std::fprintf(stderr, "search: %s did not end within %d s of its SIGTERM: SIGKILL\n",
                     key.c_str(), int(kKillGrace.count() / 1000));
        kill(trial.pid, SIGKILL);
        trial.killed = true;
      }
    for (auto it = trials_.begin(); it != trials_.end();) {
      int status = 0;
      if (waitpid(it->second.pid, &status, WNOHANG) != it->second.pid) {
        ++it;
        continue;
      }
      ended.push_back({it->first, WIFEXITED(status) && WEXITSTATUS(status) == 0, describe_exit(status)});
      it = trials_.erase(it);
    }
    return ended;
  }

 private:
  const std::string self_ = self_path();
  int processes_, threads_;
  // A slot server's default --kill-grace (TrialSlotServerOptions::kill_grace_ms).
  static constexpr std::chrono::milliseconds kKillGrace{2000};
  struct Trial {
    pid_t pid;
    bool cancelled;  // sent its SIGTERM
    std::chrono::steady_clock::time_point cancelled_at;
    bool killed = false;  // sent SIGKILL, a kill grace after
  };
  std::map<std::string, Trial> trials_;
};

class RemoteTrials final : public TrialRunner {
 public:
  explicit RemoteTrials(std::unique_ptr<TrialSlotPool> pool) : pool_(std::move(pool)) {}
  int free_slots() const override { return pool_->free_slots(); }
  // (A server still joining may bring slots: it is waited for until it answers or is left out.)
  bool any_slots() const override { return pool_->total_slots() > 0 || pool_->joining() > 0; }
  std::string why_no_slots() const override {
    return "every slot server is gone (" + pool_->lost_servers() + ")";
  }
  std::string start(const std::string& key, const Args& args, const std::string& log) override {
    return pool_->start(key, args, log);
  }
  void cancel(const std::string& key) override { pool_->cancel(key); }
  int claim(const std::string& dir) { return pool_->claim(dir); }
  std::vector<SlotJobEnd> wait(long timeout_ms) override { return pool_->wait(timeout_ms); }
  int total_slots() const { return pool_->total_slots(); }
  void add(const std::string& endpoint) { pool_->add(endpoint); }
  std::vector<std::string> endpoints() const { return pool_->endpoints(); }

 private:
  std::unique_ptr<TrialSlotPool> pool_;
};


std::string trial_file(const SearchOptions& o, int trial, const std::string& suffix) {
  return (fs::path(o.out) / ("trial-" + std::to_string(trial) + suffix)).string();
}

// A file a search writes for a trial (trial_file): trial-N.log, trial-N.safetensors (and the
// temporary file and the lock file, .lock, of one a killed trial left) and trial-N.rK.jsonl.
// Another file named trial-N.* in DIR is the user's.
bool is_trial_file(const std::string& given) {
  const std::string target = target_of_temp_name(given);
  const std::string& name = target.empty() ? given : target;
  const size_t digits_end = name.find_first_not_of("0123456789", 6);
  if (name.rfind("trial-", 0) != 0 || digits_end == std::string::npos || digits_end == 6 ||
      name[digits_end] != '.')
    return false;
  const std::string suffix = name.substr(digits_end + 1);
  // (Only the checkpoint is written through a temporary file.)
  if (!target.empty()) return suffix == "safetensors";
  if (suffix == "log" || suffix == "safetensors" || suffix == "safetensors.lock") return true;
  const size_t rung_end = suffix.find_first_not_of("0123456789", 1);
  return suffix.size() > 1 && suffix[0] == 'r' && rung_end != std::string::npos && rung_end > 1 &&
         suffix.substr(rung_end) == ".jsonl";
}

// The arguments of `tandem train` for the job (without the program).
std::vector<std::string> train_args(const SearchOptions& o, const TrialConfig& config,
                                    const HalvingJob& job, int threads) {
  std::vector<std::string> args{"train", "--data", o.data};
  for (const std::string& a : config.train_args()) args.push_back(a);
  args.insert(args.end(), {"--epochs", std::to_string(job.epochs), "--backend", o.backend,
                           "--precision", o.precision, "--threads", std::to_string(threads),
                           "--checkpoint", trial_file(o, job.trial, ".safetensors"), "--metrics",
                           trial_file(o, job.trial, ".r" + std::to_string(job.rung) + ".jsonl"),
                           "--json"});
  // Between rungs the checkpoint must hold the last epoch, which --resume continues; the last
  // rung keeps the trial's best epoch, the one the search reports.
  args.insert(args.end(), {"--keep", job.epochs == o.budget ? "best" : "last"});
  if (job.rung > 0) args.insert(args.end(), {"--resume", trial_file(o, job.trial, ".safetensors")});
  if (job.trial == o.crash_trial) args.push_back("--search-test-crash");
  return args;
}

// The epoch records of one job's metrics file (missing or partial files give what is there).
std::vector<EpochResult> read_epochs(const std::string& path) {
  std::vector<EpochResult> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = parse_bounded_json(line);
    if (j.is_discarded() || j.value("type", "") != "epoch") continue;
    // A diverged epoch's loss is NaN, which JSON writes as null: it ranks last, as infinity.
    const auto number = [&](const char* key, double otherwise) {
      const auto it = j.find(key);
      return it != j.end() && it->is_number() ? it->get<double>() : otherwise;
    };
    EpochResult e;
    e.epoch = static_cast<int>(number("epoch", 0));
    e.loss = number("validation_loss_mean", std::numeric_limits<double>::infinity());
    if (!std::isfinite(e.loss)) e.loss = std::numeric_limits<double>::infinity();
    e.accuracy = number("validation_accuracy", 0.0);
    out.push_back(e);
  }
  return out;
}

std::string fixed(double x, int digits) {
  if (std::isnan(x)) return "nan";  // (a diverged trial's loss; it read as "inf")
  if (!std::isfinite(x)) return x > 0 ? "inf" : "-inf";
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, x);
  return text;
}

// The trials' data, checked once here instead of failing in every trial: a dataset store with a
// validation split (trials rank by its loss), or a directory of IDX files, written once as a
// store under --out (data_store_of.h) so that the trials share its chunks. Returns the store the
// trials read. With slot servers, data this machine cannot see is left to them to read.
std::string search_data(const SearchOptions& o) {
  std::error_code ec;
  if (o.slots.remote() && !fs::exists(o.data, ec)) {
    std::fprintf(stderr, "tandem search: %s is not on this machine; the slot servers read it\n",
                 o.data.c_str());
    return o.data;
  }
  const std::string store = data_store_of(o.data, o.out, "tandem search");
  if (DatasetStore::open(store).validation.rows == 0)
    throw InputError("search: the store " + store + " has no validation split, and trials are "
                     "ranked by their validation loss (tandem prepare --validation-rows N)");
  return store;
}

// The state a finished trial's checkpoint holds with the lowest validation loss: its own, or the
// best one saved beside it (a rung before the last keeps its last epoch for --resume, and a trial
// cut short by the time budget or a signal ends wherever it was).
Checkpoint best_state(const std::string& path) {
  Checkpoint c = load_checkpoint(path);
  if (!c.best) return c;
  Checkpoint best = *c.best;
  for (const auto& [key, value] : c.extra) best.extra.emplace(key, value);  // provenance
  best.best.reset();
  return best;
}

void run_search(SearchOptions& o) {
  if (o.grid.empty() == o.trials_file.empty())
    throw InputError("search: give either --grid terms or --trials FILE.json");
  // Said once, before anything starts, rather than by every trial's train.
  if (o.backend == "cpu" && o.precision != "fp32")
    throw InputError("search: --precision " + o.precision + " needs the CUDA backend (--backend "
                     "cuda, or auto where the trials run on a GPU); the CPU backend computes in "
                     "fp32");
  const std::vector<TrialConfig> configs =
      o.trials_file.empty() ? parse_grid(o.grid) : load_trial_file(o.trials_file);
  // The cores this process may use (its CPU set: taskset, a batch system's allocation), not every
  // core of the machine.
  const int cores = ThreadPool::available_cores();
  const int processes = o.processes > 0 ? o.processes : cores;
  int threads = o.threads_per_trial > 0 ? o.threads_per_trial : std::max(1, cores / processes);
  SuccessiveHalving halving(static_cast<int>(configs.size()), o.min_epochs, o.budget, o.eta);
  std::unique_ptr<TrialRunner> runner;
  RemoteTrials* remote = nullptr;
  int slots_at_start = 0;
  std::string where;
  o.slots.prepare("search");
  // Trials run here: a CUDA backend or a reduced precision this machine cannot give is refused
  // once, before anything is made, rather than by each trial's train (every trial started and
  // failed). Slot servers resolve --backend on their own machines.
  if (!o.slots.remote() && (o.backend == "cuda" || o.precision != "fp32") &&
      kernels::cuda_device_count() == 0)
    throw InputError("search: " +
                     (o.backend == "cuda" ? std::string("--backend cuda")
                                          : "--precision " + o.precision) +
                     " needs a CUDA device, and none is usable here (no GPU, no driver, or a "
                     "build without CUDA): every trial would fail (--slots runs them on other "
                     "machines)");
  if (!o.slots.remote()) {
    runner = std::make_unique<LocalTrials>(processes, threads);
    where = std::to_string(processes) + " processes x " + std::to_string(threads) + " threads";
  } else {
    if (o.processes > 0)
      throw InputError("search: --processes is for local trials; with --slots the servers' slot "
                       "counts set how many run at once");
    // The slot servers run the trials in their own working directories: every path absolute.
    o.out = resolved_path(o.out);
    o.data = resolved_path(o.data);
    auto r = std::make_unique<RemoteTrials>(o.slots.connect("search"));
    remote = r.get();
    runner = std::move(r);
    if (o.threads_per_trial == 0) threads = 0;  // each server's own
    slots_at_start = remote->total_slots();
    where = std::to_string(slots_at_start) + " slots on " + std::to_string(o.slots.endpoints.size()) +
            " slot server(s)";
  }
  // Before --out is made: a mistyped --data leaves nothing behind (slot servers may read data
  // this machine does not have).
  if (!o.slots.remote()) check_data_exists(o.data);
  refuse_store_as_output(o.out, "--out");
  // One search per --out: a second one would delete this one's checkpoints as it starts. Made,
  // then removed again if the search is refused.
  LockedOutputDirectory out_dir(o.out, "--out",
                                {"results.csv", "results.json", "best.safetensors"});
  o.data = search_data(o);  // (before anything of an earlier search is removed)
  // A search killed outright leaves its trials running on the slot servers until they find it
  // silent (their heartbeat timeout): they would write over this search's files. Ended first.
  if (remote) {
    if (const int ended = remote->claim(o.out))
      std::fprintf(stderr, "tandem search: ended %d trial(s) of an earlier search, still running "
                   "into %s on the slot servers\n", ended, o.out.c_str());
  }
  // An earlier search's results go first: left beside this search's logs, they would read as
  // this search's results if it were killed before it writes its own.
  for (const char* name : {"results.json", "results.csv", "best.safetensors"})
    fs::remove(fs::path(o.out) / name);
  // Every trial's log, metrics and model of an earlier search, not only those of the numbers
  // this one reuses: an earlier search of more trials left its others beside these.
  std::vector<fs::path> earlier_trials;
  for (const auto& entry : fs::directory_iterator(o.out)) {
    std::error_code ec;  // (a directory of that name is not a trial's file: left alone)
    if (is_trial_file(entry.path().filename().string()) && !entry.is_directory(ec))
      earlier_trials.push_back(entry.path());
  }
  for (const fs::path& path : earlier_trials) fs::remove(path);
  out_dir.keep();

  std::vector<TrialRecord> records(configs.size());
  for (size_t i = 0; i < configs.size(); ++i) records[i].config = configs[i];
  std::string rungs_text;
  for (int r : halving.rung_epochs()) rungs_text += (rungs_text.empty() ? "" : ", ") + std::to_string(r);
  std::fprintf(stderr,
               "tandem search: %zu trials on %s, %s, rungs at %s epochs (eta %d)%s\n",
               configs.size(), o.data.c_str(), where.c_str(), rungs_text.c_str(), o.eta,
               o.budget_seconds > 0 ? (", at most " + fixed(o.budget_seconds, 0) + " s").c_str() : "");

  ProgressLine progress;
  const auto start = Clock::now();
  std::vector<RunningJob> running;
  std::deque<HalvingJob> refused;  // a busy slot server refused them: they start again first
  bool closed = false;        // nothing more starts: the time budget is spent or a signal came
  std::string closed_by;      // "the time budget", "SIGINT", ...
  bool closed_by_signal = false;
  // SIGINT, SIGTERM or SIGHUP close the search as the time budget does, and the results so far
  // are written (then the search exits 1).
  const std::atomic<bool>& stop = stop_on_signals();
  std::string no_slots;  // set when the slot servers are all gone with work left
  int best_trial = -1;
  auto best_loss = [&](int t) {
    const EpochResult* b = records[t].best();
    return b ? b->loss : std::numeric_limits<double>::infinity();
  };
  auto status_line = [&] {
    const int done = halving.count(TrialStatus::Completed) + halving.count(TrialStatus::Stopped);
    // queued: not started yet (more trials than slots); waiting: at a rung, for a promotion.
    std::string line = "running " + std::to_string(running.size()) + "  queued " +
                       std::to_string(halving.count(TrialStatus::Pending)) + "  waiting " +
                       std::to_string(halving.count(TrialStatus::Waiting)) + "  done " +
                       std::to_string(done) + "/" + std::to_string(configs.size()) + "  failed " +
                       std::to_string(halving.count(TrialStatus::Failed));
    if (best_trial >= 0)
      line += "  best " + fixed(best_loss(best_trial), 4) + " (trial " + std::to_string(best_trial) + ")";
    line += "  " + fixed(std::chrono::duration<double>(Clock::now() - start).count(), 0) + " s";
    return line;
  };

  // Servers listed in the --slots directories after the start join the search (a cluster's
  // machines added while it runs): the directories are read again every 2 s.
  auto last_listing = Clock::now();
  // When the time budget is spent, or a signal came: start nothing more, end the running trials
  // where they are. Also checked as soon as trials end, before their ends are counted: a
  // terminal's Ctrl-C reaches the local trials too (one process group), and those it killed are
  // stopped, not failed.
  // A trial the closing search ends where it is: stopped, not failed.
  // A trial that failed: why, in its record and on the progress line (`say`).
  auto fail_trial = [&](int trial, const std::string& why, bool say) {
    records[trial].error = why;
    halving.fail(trial);
    if (trial == best_trial) {  // the table ranks failed trials last: so does the progress line
      best_trial = -1;
      for (int t = 0; t < int(configs.size()); ++t)
        if (halving.status(t) != TrialStatus::Failed && std::isfinite(best_loss(t)) &&
            (best_trial < 0 || best_loss(t) < best_loss(best_trial)))
          best_trial = t;
    }
    if (say)
      progress.print_line("trial " + std::to_string(trial) + " [" +
                          records[trial].config.describe() + "]: FAILED, " + why);
  };
  auto cut_short = [&](int trial) {
    records[trial].cut = true;
    halving.stop(trial);
  };
  auto close_if_due = [&] {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    const bool out_of_time = o.budget_seconds > 0 && elapsed >= o.budget_seconds;
    if (!(out_of_time || stop.load()) || closed) return;
    closed = true;
    closed_by_signal = stop.load();
    closed_by = closed_by_signal ? stop_signal_name() : "the time budget";
    // Those not started yet, and those waiting at a rung for a promotion still possible: stopped
    // by the budget (or the signal) too, not by the halving, and the results say so. (Not the
    // losers of a settled rung: those the halving stopped.)
    for (int t = 0; t < int(configs.size()); ++t)
      if (halving.in_contention(t)) records[t].cut = true;
    halving.close();
    for (RunningJob& r : running) runner->cancel(r.key);
    for (const HalvingJob& j : refused) cut_short(j.trial);
    refused.clear();
    progress.print_line("tandem search: " +
                        (closed_by_signal ? closed_by : std::string("--budget-seconds reached")) +
                        "; stopping " + std::to_string(running.size()) + " running trial(s)");
  };
  while (true) {
    if (remote && !o.slots.dirs.empty() && !closed &&
        Clock::now() - last_listing >= std::chrono::seconds(2)) {
      last_listing = Clock::now();
      for (const std::string& endpoint : o.slots.newly_listed()) remote->add(endpoint);
    }
    close_if_due();
    while (!closed && runner->free_slots() > 0) {
      std::optional<HalvingJob> job;
      if (!refused.empty()) {
        job = refused.front();
        refused.pop_front();
      } else {
        job = halving.next();
      }
      if (!job) break;
      const std::string key = "trial-" + std::to_string(job->trial) + ".r" + std::to_string(job->rung);
      const TrialConfig& config = configs[job->trial];
      const int given_threads = threads;
      // A trial that cannot be started (its old metrics not removable, no process to be had)
      // fails alone: thrown out of this loop, it ended the search with no results at all. While
      // other trials run it waits for them instead (a shortage of processes or files may end
      // with them, and failing there would fail every trial waiting, in a moment).
      try {
        // The rung's metrics start empty (tandem train appends to a resumed run's file).
        fs::remove(trial_file(o, job->trial, ".r" + std::to_string(job->rung) + ".jsonl"));
        std::error_code no_log;
        const uintmax_t log_size = fs::file_size(trial_file(o, job->trial, ".log"), no_log);
        records[job->trial].slot = runner->start(
            key,
            [&, job](int slot_threads) {
              return train_args(o, config, *job, given_threads > 0 ? given_threads : slot_threads);
            },
            trial_file(o, job->trial, ".log"));
        running.push_back({*job, key, Clock::now(), no_log ? 0 : log_size});
      } catch (const std::exception& e) {
        if (!running.empty()) {
          refused.push_front(*job);
          break;
        }
        fail_trial(job->trial, std::string("could not be started: ") + e.what(), true);
      }
    }
    if (running.empty() && refused.empty() && halving.done()) break;
    // Nothing runs and nothing can (every slot server is gone): end with what is there. (Slot
    // servers that are only busy with another search's trials are waited for.)
    if (running.empty() && !runner->any_slots()) {
      no_slots = runner->why_no_slots();
      for (const HalvingJob& j : refused) fail_trial(j.trial, "never started: " + no_slots, false);
      refused.clear();
      halving.close();
      progress.print_line("tandem search: " + no_slots);
      break;
    }
    progress.update(status_line());
    const std::vector<SlotJobEnd> ended = runner->wait(50);
    close_if_due();
    for (const SlotJobEnd& end : ended) {
      const auto it = std::find_if(running.begin(), running.end(),
                                   [&](const RunningJob& r) { return r.key == end.job; });
      if (it == running.end()) continue;
      const RunningJob r = *it;
      running.erase(it);
      TrialRecord& rec = records[r.job.trial];
      if (end.retry && closed) {
        // Refused (busy) after the search closed: it will not be started again. Kept waiting,
        // it would keep the search from ever ending (nothing starts or stops it any more).
        cut_short(r.job.trial);
        continue;
      }
      if (end.retry) {
        refused.push_back(r.job);
        progress.print_line("trial " + std::to_string(r.job.trial) + ": " + end.how +
                            "; it waits for a free slot");
        continue;
      }
      rec.seconds += std::chrono::duration<double>(Clock::now() - r.start).count();
      for (const EpochResult& e : read_epochs(trial_file(o, r.job.trial, ".r" + std::to_string(r.job.rung) + ".jsonl")))
        rec.epochs.push_back(e);
      const bool clean = end.clean;
      const bool finished = clean && !rec.epochs.empty() && rec.epochs.back().epoch >= r.job.epochs;
      const std::string name = "trial " + std::to_string(r.job.trial) + " [" + rec.config.describe() + "]";
      if (finished) {
        // Ranked at its rung by the loss of the rung's last epoch: that is the state a promotion
        // resumes from (--keep last), so a trial whose best epoch came earlier and has got
        // worse since is not promoted on a state it no longer holds.
        halving.report(r.job.trial, rec.epochs.back().loss);
        if (best_trial < 0 || best_loss(r.job.trial) < best_loss(best_trial))
          best_trial = r.job.trial;
        progress.print_line(name + ": rung " + std::to_string(r.job.rung) + " (epoch " +
                            std::to_string(r.job.epochs) + "), best validation loss " +
                            fixed(best_loss(r.job.trial), 4) + "; " + status_line());
        // It finished just as the search closed: it goes no further (a promotion would never
        // start), but a last rung stays completed.
        if (closed && halving.status(r.job.trial) != TrialStatus::Completed) cut_short(r.job.trial);
      } else if (closed) {
        cut_short(r.job.trial);
        progress.print_line(name + ": stopped by " + closed_by + " after " +
                            std::to_string(rec.epochs.size()) + " epochs");
      } else {
        // Its log's last lines say why, when this job wrote any (a crash may leave none; a
        // promoted trial's log holds its earlier rungs' lines too, which are not this job's).
        const std::string tail = log_tail(trial_file(o, r.job.trial, ".log"), 3, r.log_from);
        fail_trial(r.job.trial,
                   (clean ? std::string("exited 0 without its epochs") : end.how) +
                       (tail.empty() ? " (it wrote nothing to its log)" : ": " + tail),
                   true);
      }
    }
  }
  progress.update(status_line());  // the end's counts: the line left on the terminal
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // The table: trials with results by best validation loss, then the ones without.
  std::vector<int> order(configs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  // Failed trials last, and before them those with no score (cut before their first epoch, or
  // diverged at every epoch: best_loss is infinite): order[0] has a best epoch whenever any
  // trial has one.
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const auto key = [&](int t) {
      return std::make_pair(halving.status(t) == TrialStatus::Failed, best_loss(t));
    };
    return key(a) < key(b);
  });
  nlohmann::json trials = nlohmann::json::array();
  std::ostringstream csv;
  csv << "rank,trial,status,rung,epochs,best_validation_loss,validation_accuracy,best_epoch,"
         "seconds,lr,hidden,batch,optimizer,seed,error,slot\n";
  int succeeded = 0;
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const int t = order[rank];
    const TrialRecord& rec = records[t];
    const EpochResult* b = rec.best();
    const std::string status = to_string(halving.status(t));
    if (halving.status(t) != TrialStatus::Failed && !rec.epochs.empty()) ++succeeded;
    nlohmann::json j{{"rank", rank + 1}, {"trial", t}, {"status", status},
                     {"rung", halving.rung(t)}, {"epochs", rec.epochs.size()},
                     {"seconds", rec.seconds}, {"config", rec.config.to_json()}};
    if (!rec.slot.empty()) j["slot"] = rec.slot;
    if (b) {
      j["best_validation_loss"] = b->loss;
      j["validation_accuracy"] = b->accuracy;
      j["best_epoch"] = b->epoch;
    }
    if (rec.cut && closed_by_signal) j["stopped_by_signal"] = closed_by;
    else if (rec.cut) j["stopped_by_time_budget"] = true;
    if (!rec.error.empty()) j["error"] = rec.error;
    trials.push_back(j);
    std::string error;  // a CSV field: quotes doubled
    for (const char c : rec.error) error += c == '"' ? std::string("\"\"") : std::string(1, c);
    const nlohmann::json c = rec.config.to_json();
    csv << rank + 1 << ',' << t << ',' << status << ',' << halving.rung(t) << ','
        << rec.epochs.size() << ',' << (b ? fixed(b->loss, 6) : "") << ','
        << (b ? fixed(b->accuracy, 4) : "") << ',' << (b ? std::to_string(b->epoch) : "") << ','
        << fixed(rec.seconds, 2) << ',' << c["lr"].dump() << ','
        << c["hidden"].get<std::string>() << ',' << rec.config.batch << ',' << rec.config.optimizer
        << ',' << rec.config.seed << ",\"" << error << "\"," << rec.slot << "\n";
  }
  nlohmann::json summary{{"data", o.data},
                         {"trials", configs.size()},
                         {"succeeded", succeeded},
                         {"failed", halving.count(TrialStatus::Failed)},
                         {"processes", remote ? slots_at_start : processes},
                         {"threads_per_trial", threads},
                         {"backend", o.backend},
                         {"precision", o.precision},
                         {"eta", o.eta},
                         {"rung_epochs", halving.rung_epochs()},
                         {"seconds", seconds},
                         {"trials_per_hour", seconds > 0 ? 3600.0 * static_cast<double>(configs.size()) / seconds : 0.0},
                         {"epochs_trained", 0}};
  size_t epochs_trained = 0;
  for (const TrialRecord& rec : records) epochs_trained += rec.epochs.size();
  summary["epochs_trained"] = epochs_trained;
  // (Trials that trained but never scored a finite validation loss succeed with no best.)
  const int best = succeeded > 0 && records[order[0]].best() ? order[0] : -1;
  if (succeeded > 0 && best < 0)
    std::fprintf(stderr, "tandem search: no trial scored a finite validation loss (each one "
                 "diverged): no best trial, no best.safetensors\n");
  // A failure to copy the best checkpoint (a full disk, a trial's unreadable file) loses none of
  // the results, written next: they say why, and so does the exit status.
  std::string best_checkpoint_error;
  if (best >= 0) {
    summary["best"] = trials[0];
    const fs::path ckpt = trial_file(o, best, ".safetensors");
    std::error_code no_file;
    if (fs::exists(ckpt, no_file)) {
      try {
        // The epoch the table reports, not necessarily the one the trial ended with.
        const Checkpoint kept = best_state(ckpt.string());
        save_checkpoint((fs::path(o.out) / "best.safetensors").string(), kept);
        summary["best_checkpoint"] = (fs::path(o.out) / "best.safetensors").string();
        summary["best_checkpoint_epoch"] = kept.epoch;
        if (kept.epoch != records[best].best()->epoch)  // (a trial killed between the writes)
          std::fprintf(stderr, "tandem search: trial %d's best epoch is %d, but its checkpoint "
                       "holds epoch %lld at best\n", best, records[best].best()->epoch,
                       static_cast<long long>(kept.epoch));
      } catch (const std::exception& e) {
        best_checkpoint_error = e.what();
        summary["best_checkpoint_error"] = best_checkpoint_error;
      }
    }
  }
  if (remote) summary["slot_servers"] = remote->endpoints();  // those that joined later too
  if (stop.load()) summary["stopped_by_signal"] = stop_signal_name();
  nlohmann::json results = summary;
  results["results"] = trials;
  write_text_atomic((fs::path(o.out) / "results.csv").string(), csv.str());
  write_text_atomic((fs::path(o.out) / "results.json").string(), json_text(results, 2) + "\n");

  if (o.json) {
    std::printf("%s\n", json_text(summary).c_str());
  } else {
    std::printf("%4s %5s %-9s %4s %6s %10s %8s  %s\n", "rank", "trial", "status", "rung", "epochs",
                "val loss", "val acc", "configuration");
    for (const nlohmann::json& j : trials) {
      // A trial stopped before it finished a rung has none ("-"; -1 in results.json).
      const int rung = j["rung"].get<int>();
      std::printf("%4d %5d %-9s %4s %6d %10s %8s  %s\n", j["rank"].get<int>(),
                  j["trial"].get<int>(), j["status"].get<std::string>().c_str(),
                  rung < 0 ? "-" : std::to_string(rung).c_str(), j["epochs"].get<int>(),
                  j.contains("best_validation_loss") ? fixed(j["best_validation_loss"].get<double>(), 4).c_str() : "-",
                  j.contains("validation_accuracy") ? fixed(j["validation_accuracy"].get<double>(), 4).c_str() : "-",
                  records[j["trial"].get<int>()].config.describe().c_str());
    }
    // (A rate of trials none of which trained, refused at once, say, would be a large number
    // that means nothing.)
    const std::string rate =
        epochs_trained == 0 ? std::string()
                            : ": " + fixed(summary["trials_per_hour"].get<double>(), 0) +
                                  " trials/hour";
    std::printf("%zu trials (%d failed) in %.1f s%s; %zu epochs trained; results in %s\n",
                configs.size(), halving.count(TrialStatus::Failed), seconds, rate.c_str(),
                epochs_trained, o.out.c_str());
    if (best >= 0)
      std::printf("best: trial %d [%s], validation loss %.4f, checkpoint %s\n", best,
                  records[best].config.describe().c_str(), best_loss(best),
                  summary.value("best_checkpoint", std::string("(none)")).c_str());
  }
  if (!best_checkpoint_error.empty())
    throw Error("search: trial " + std::to_string(best) + "'s checkpoint could not be copied to " +
                (fs::path(o.out) / "best.safetensors").string() + " (" + best_checkpoint_error +
                "); the results are in " + o.out);
  if (stop.load())
    throw Error(std::string("search: stopped by ") + stop_signal_name() +
                "; the results so far are in " + o.out);
  if (!no_slots.empty())
    throw Error("search: " + no_slots + "; the results so far are in " + o.out);
  const bool any_failed = std::any_of(order.begin(), order.end(), [&](int t) {
    return halving.status(t) == TrialStatus::Failed;
  });
  if (succeeded == 0 && closed && !any_failed)  // the budget ended them all first
    throw Error("search: the time budget ended every trial before its first epoch; the results "
                "are in " + o.out);
  if (succeeded == 0) throw Error("search: every trial failed; their logs are in " + o.out);
}

}  // namespace

void add_search_command(CLI::App& app) {
  auto o = std::make_shared<SearchOptions>();
  CLI::App* cmd = app.add_subcommand(
      "search", "Hyper-parameter search: trials in parallel processes, successive halving");
  cmd->add_option("--data", o->data, "Dataset store (tandem prepare) or directory of IDX files")
      ->capture_default_str();
  cmd->add_option("--grid", o->grid,
                  "Grid terms key=v1,v2,... (keys: lr, hidden as 100 or 256x128, batch, "
                  "optimizer, seed); the trials are their cartesian product");
  cmd->add_option("--trials", o->trials_file, "JSON file: a list of configurations")
      ->check(CLI::ExistingFile);
  cmd->add_option("--budget", o->budget, "Epochs the best trials train (the last rung)")
      ->check(positive_number())->capture_default_str();
  cmd->add_option("--budget-seconds", o->budget_seconds,
                  "Stop the whole search after this many seconds (0: no limit)")
      ->check(non_negative_number())->capture_default_str();
  cmd->add_option("--eta", o->eta, "Halving rate: rungs grow by eta, the top 1/eta go on")
      ->capture_default_str();
  cmd->add_option("--min-epochs", o->min_epochs, "Epochs of the first rung")->capture_default_str();
  cmd->add_option("--processes", o->processes, "Trials at once (0: one per core)")
      ->check(non_negative_number())->capture_default_str();
  add_slot_client_options(cmd, o->slots, "trials", "search", "--data and --out");
  cmd->add_option("--threads-per-trial", o->threads_per_trial,
                  "Threads per trial (0: cores / processes; with --slots, each server's own)")
      ->check(CLI::Range(0, ThreadPool::kMaxThreads))->capture_default_str();
  cmd->add_option("--backend", o->backend,
                  "Each trial's backend: cpu, cuda or auto (auto: the GPU where the trial runs "
                  "has one; trials on one GPU share it)")
      ->check(CLI::IsMember({"cpu", "cuda", "auto"}))->capture_default_str();
  cmd->add_option("--precision", o->precision,
                  "Each trial's CUDA matrix products: fp32, tf32 or bf16 (as tandem train's)")
      ->check(CLI::IsMember({"fp32", "tf32", "bf16"}))->capture_default_str();
  cmd->add_option("--out", o->out, "Directory for logs, checkpoints, results.csv and results.json")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary instead of the table");
  // Test hook: this trial's process is given an option `tandem train` rejects, so it crashes.
  cmd->add_option("--crash-trial", o->crash_trial)->group("");
  cmd->callback([o] { run_search(*o); });
}

}  // namespace tandem::cli
