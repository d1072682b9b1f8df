// tandem search: a hyper-parameter search over a grid or a list of configurations. Each trial is
// an independent `tandem train` run of this binary on the same data (a dataset store is streamed
// through the page cache, so its chunks are shared between the trial processes, not copied), up
// to --processes at once. Asynchronous successive halving (successive_halving.h) decides which
// trials go on to more epochs: a promotion reruns the trial with --resume and a larger --epochs.
// A trial whose process crashes is reported, with the tail of its log, and the search goes on.
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>

#include "commands.h"
#include "progress_line.h"
#include "search_space.h"
#include "successive_halving.h"
#include "tandem/tandem.h"

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
  std::string out = "search";
  bool json = false;
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
  bool cut = false;  // stopped by --budget-seconds while running
  const EpochResult* best() const {
    const EpochResult* b = nullptr;
    for (const EpochResult& e : epochs)
      if (!b || e.loss < b->loss) b = &e;
    return b;
  }
};

struct RunningJob {
  HalvingJob job;
  pid_t pid = 0;
  Clock::time_point start;
};

std::string self_path() {
  std::error_code ec;
  const fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("search: cannot find this program's path (/proc/self/exe): " + ec.message());
  return p.string();
}

std::string trial_file(const SearchOptions& o, int trial, const std::string& suffix) {
  return (fs::path(o.out) / ("trial-" + std::to_string(trial) + suffix)).string();
}

// Starts `tandem train` for the job, its stdout and stderr appended to the trial's log.
pid_t spawn_trial(const std::string& self, const SearchOptions& o, const TrialConfig& config,
                  const HalvingJob& job, int threads) {
  std::vector<std::string> args{self, "train", "--data", o.data};
  for (const std::string& a : config.train_args()) args.push_back(a);
  args.insert(args.end(), {"--epochs", std::to_string(job.epochs), "--threads",
                           std::to_string(threads), "--checkpoint",
                           trial_file(o, job.trial, ".safetensors"), "--metrics",
                           trial_file(o, job.trial, ".r" + std::to_string(job.rung) + ".jsonl"),
                           "--json"});
  // Between rungs the checkpoint must hold the last epoch, which --resume continues; the last
  // rung keeps the trial's best epoch, the one the search reports.
  args.insert(args.end(), {"--keep", job.epochs == o.budget ? "best" : "last"});
  if (job.rung > 0) args.insert(args.end(), {"--resume", trial_file(o, job.trial, ".safetensors")});
  if (job.trial == o.crash_trial) args.push_back("--search-test-crash");
  const std::string log = trial_file(o, job.trial, ".log");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) throw Error("search: cannot start trial " + std::to_string(job.trial) + ": fork: " +
                           std::strerror(errno));
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // trials die with the search, however it ends
    if (getppid() != parent) _exit(1);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    execv(argv[0], argv.data());
    std::fprintf(stderr, "tandem search: cannot run %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  return pid;
}

// The epoch records of one job's metrics file (missing or partial files give what is there).
std::vector<EpochResult> read_epochs(const std::string& path) {
  std::vector<EpochResult> out;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("type", "") != "epoch") continue;
    EpochResult e;
    e.epoch = j.value("epoch", 0);
    e.loss = j.value("validation_loss_mean", std::numeric_limits<double>::quiet_NaN());
    if (!std::isfinite(e.loss)) e.loss = std::numeric_limits<double>::infinity();
    e.accuracy = j.value("validation_accuracy", 0.0);
    out.push_back(e);
  }
  return out;
}

std::string log_tail(const std::string& path, size_t lines) {
  std::ifstream in(path);
  std::vector<std::string> all;
  std::string line;
  while (std::getline(in, line)) all.push_back(line);
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
  return "exited with status " + std::to_string(WEXITSTATUS(status));
}

std::string fixed(double x, int digits) {
  if (!std::isfinite(x)) return "inf";
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, x);
  return text;
}

void run_search(SearchOptions& o) {
  if (o.grid.empty() == o.trials_file.empty())
    throw InputError("search: give either --grid terms or --trials FILE.json");
  const std::vector<TrialConfig> configs =
      o.trials_file.empty() ? parse_grid(o.grid) : load_trial_file(o.trials_file);
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int processes = o.processes > 0 ? o.processes : cores;
  const int threads = o.threads_per_trial > 0 ? o.threads_per_trial : std::max(1, cores / processes);
  SuccessiveHalving halving(static_cast<int>(configs.size()), o.min_epochs, o.budget, o.eta);
  const std::string self = self_path();
  fs::create_directories(o.out);
  fs::remove(fs::path(o.out) / "best.safetensors");  // an earlier search's
  for (size_t i = 0; i < configs.size(); ++i)  // logs and metrics of an earlier search
    for (const auto& entry : fs::directory_iterator(o.out)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("trial-" + std::to_string(i) + ".", 0) == 0) fs::remove(entry.path());
    }

  std::vector<TrialRecord> records(configs.size());
  for (size_t i = 0; i < configs.size(); ++i) records[i].config = configs[i];
  std::string rungs_text;
  for (int r : halving.rung_epochs()) rungs_text += (rungs_text.empty() ? "" : ", ") + std::to_string(r);
  std::fprintf(stderr,
               "tandem search: %zu trials on %s, %d processes x %d threads, rungs at %s epochs "
               "(eta %d)%s\n",
               configs.size(), o.data.c_str(), processes, threads, rungs_text.c_str(), o.eta,
               o.budget_seconds > 0 ? (", at most " + fixed(o.budget_seconds, 0) + " s").c_str() : "");

  ProgressLine progress;
  const auto start = Clock::now();
  std::vector<RunningJob> running;
  bool closed = false;
  int best_trial = -1;
  auto best_loss = [&](int t) {
    const EpochResult* b = records[t].best();
    return b ? b->loss : std::numeric_limits<double>::infinity();
  };
  auto status_line = [&] {
    const int done = halving.count(TrialStatus::Completed) + halving.count(TrialStatus::Stopped);
    std::string line = "running " + std::to_string(running.size()) + "  waiting " +
                       std::to_string(halving.count(TrialStatus::Waiting)) + "  done " +
                       std::to_string(done) + "/" + std::to_string(configs.size()) + "  failed " +
                       std::to_string(halving.count(TrialStatus::Failed));
    if (best_trial >= 0)
      line += "  best " + fixed(best_loss(best_trial), 4) + " (trial " + std::to_string(best_trial) + ")";
    line += "  " + fixed(std::chrono::duration<double>(Clock::now() - start).count(), 0) + " s";
    return line;
  };

  while (true) {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    if (o.budget_seconds > 0 && elapsed >= o.budget_seconds && !closed) {
      // The time budget is spent: start nothing more, end the running trials where they are.
      closed = true;
      halving.close();
      for (RunningJob& r : running) kill(r.pid, SIGTERM);
      progress.print_line("tandem search: --budget-seconds reached; stopping " +
                          std::to_string(running.size()) + " running trial(s)");
    }
    while (!closed && static_cast<int>(running.size()) < processes) {
      const std::optional<HalvingJob> job = halving.next();
      if (!job) break;
      running.push_back({*job, spawn_trial(self, o, configs[job->trial], *job, threads), Clock::now()});
    }
    if (running.empty()) break;
    progress.update(status_line());
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (size_t i = 0; i < running.size();) {
      int status = 0;
      if (waitpid(running[i].pid, &status, WNOHANG) != running[i].pid) {
        ++i;
        continue;
      }
      const RunningJob r = running[i];
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      TrialRecord& rec = records[r.job.trial];
      rec.seconds += std::chrono::duration<double>(Clock::now() - r.start).count();
      for (const EpochResult& e : read_epochs(trial_file(o, r.job.trial, ".r" + std::to_string(r.job.rung) + ".jsonl")))
        rec.epochs.push_back(e);
      const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0;
      const std::string name = "trial " + std::to_string(r.job.trial) + " [" + rec.config.describe() + "]";
      if (closed) {
        rec.cut = true;
        halving.stop(r.job.trial);
        progress.print_line(name + ": stopped by the time budget after " +
                            std::to_string(rec.epochs.size()) + " epochs");
      } else if (!clean || rec.epochs.empty() || rec.epochs.back().epoch < r.job.epochs) {
        rec.error = (clean ? std::string("exited 0 without its epochs") : describe_exit(status)) +
                    ": " + log_tail(trial_file(o, r.job.trial, ".log"), 3);
        halving.fail(r.job.trial);
        progress.print_line(name + ": FAILED, " + rec.error);
      } else {
        halving.report(r.job.trial, best_loss(r.job.trial));
        if (best_trial < 0 || best_loss(r.job.trial) < best_loss(best_trial)) best_trial = r.job.trial;
        progress.print_line(name + ": rung " + std::to_string(r.job.rung) + " (epoch " +
                            std::to_string(r.job.epochs) + "), best validation loss " +
                            fixed(best_loss(r.job.trial), 4) + "; " + status_line());
      }
    }
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // The table: trials with results by best validation loss, then the ones without.
  std::vector<int> order(configs.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    const bool fa = halving.status(a) == TrialStatus::Failed, fb = halving.status(b) == TrialStatus::Failed;
    if (fa != fb) return fb;
    return best_loss(a) < best_loss(b);
  });
  nlohmann::json trials = nlohmann::json::array();
  std::ofstream csv(fs::path(o.out) / "results.csv");
  csv << "rank,trial,status,rung,epochs,best_validation_loss,validation_accuracy,best_epoch,"
         "seconds,lr,hidden,batch,optimizer,seed,error\n";
  int succeeded = 0;
  for (size_t rank = 0; rank < order.size(); ++rank) {
    const int t = order[rank];
    const TrialRecord& rec = records[t];
    const EpochResult* b = rec.best();
    const std::string status = to_string(halving.status(t));
    if (halving.status(t) != TrialStatus::Failed && b) ++succeeded;
    nlohmann::json j{{"rank", rank + 1}, {"trial", t}, {"status", status},
                     {"rung", halving.rung(t)}, {"epochs", rec.epochs.size()},
                     {"seconds", rec.seconds}, {"config", rec.config.to_json()}};
    if (b) {
      j["best_validation_loss"] = b->loss;
      j["validation_accuracy"] = b->accuracy;
      j["best_epoch"] = b->epoch;
    }
    if (rec.cut) j["stopped_by_time_budget"] = true;
    if (!rec.error.empty()) j["error"] = rec.error;
    trials.push_back(j);
    std::string error = rec.error;
    std::replace(error.begin(), error.end(), '"', '\'');
    const nlohmann::json c = rec.config.to_json();
    csv << rank + 1 << ',' << t << ',' << status << ',' << halving.rung(t) << ','
        << rec.epochs.size() << ',' << (b ? fixed(b->loss, 6) : "") << ','
        << (b ? fixed(b->accuracy, 4) : "") << ',' << (b ? std::to_string(b->epoch) : "") << ','
        << fixed(rec.seconds, 2) << ',' << c["lr"].dump() << ','
        << c["hidden"].get<std::string>() << ',' << rec.config.batch << ',' << rec.config.optimizer
        << ',' << rec.config.seed << ",\"" << error << "\"\n";
  }
  nlohmann::json summary{{"data", o.data},
                         {"trials", configs.size()},
                         {"succeeded", succeeded},
                         {"failed", halving.count(TrialStatus::Failed)},
                         {"processes", processes},
                         {"threads_per_trial", threads},
                         {"eta", o.eta},
                         {"rung_epochs", halving.rung_epochs()},
                         {"seconds", seconds},
                         {"trials_per_hour", seconds > 0 ? 3600.0 * static_cast<double>(configs.size()) / seconds : 0.0},
                         {"epochs_trained", 0}};
  size_t epochs_trained = 0;
  for (const TrialRecord& rec : records) epochs_trained += rec.epochs.size();
  summary["epochs_trained"] = epochs_trained;
  const int best = succeeded > 0 ? order[0] : -1;
  if (best >= 0) {
    summary["best"] = trials[0];
    const fs::path ckpt = trial_file(o, best, ".safetensors");
    if (fs::exists(ckpt)) {
      fs::copy_file(ckpt, fs::path(o.out) / "best.safetensors", fs::copy_options::overwrite_existing);
      summary["best_checkpoint"] = (fs::path(o.out) / "best.safetensors").string();
    }
  }
  nlohmann::json results = summary;
  results["results"] = trials;
  std::ofstream(fs::path(o.out) / "results.json") << results.dump(2) << "\n";

  if (o.json) {
    std::printf("%s\n", summary.dump().c_str());
  } else {
    std::printf("%4s %5s %-9s %4s %6s %10s %8s  %s\n", "rank", "trial", "status", "rung", "epochs",
                "val loss", "val acc", "configuration");
    for (const nlohmann::json& j : trials) {
      std::printf("%4d %5d %-9s %4d %6d %10s %8s  %s\n", j["rank"].get<int>(), j["trial"].get<int>(),
                  j["status"].get<std::string>().c_str(), j["rung"].get<int>(), j["epochs"].get<int>(),
                  j.contains("best_validation_loss") ? fixed(j["best_validation_loss"].get<double>(), 4).c_str() : "-",
                  j.contains("validation_accuracy") ? fixed(j["validation_accuracy"].get<double>(), 4).c_str() : "-",
                  records[j["trial"].get<int>()].config.describe().c_str());
    }
    std::printf("%zu trials (%d failed) in %.1f s: %.0f trials/hour; %zu epochs trained; results in %s\n",
                configs.size(), halving.count(TrialStatus::Failed), seconds,
                summary["trials_per_hour"].get<double>(), epochs_trained, o.out.c_str());
    if (best >= 0)
      std::printf("best: trial %d [%s], validation loss %.4f, checkpoint %s\n", best,
                  records[best].config.describe().c_str(), best_loss(best),
                  summary.value("best_checkpoint", std::string("(none)")).c_str());
  }
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
      ->check(CLI::PositiveNumber)->capture_default_str();
  cmd->add_option("--budget-seconds", o->budget_seconds,
                  "Stop the whole search after this many seconds (0: no limit)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--eta", o->eta, "Halving rate: rungs grow by eta, the top 1/eta go on")
      ->capture_default_str();
  cmd->add_option("--min-epochs", o->min_epochs, "Epochs of the first rung")->capture_default_str();
  cmd->add_option("--processes", o->processes, "Trials at once (0: one per core)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--threads-per-trial", o->threads_per_trial, "Threads per trial (0: cores / processes)")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_option("--out", o->out, "Directory for logs, checkpoints, results.csv and results.json")
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print a one-line JSON summary instead of the table");
  // Test hook: this trial's process is given an option `tandem train` rejects, so it crashes.
  cmd->add_option("--crash-trial", o->crash_trial)->group("");
  cmd->callback([o] { run_search(*o); });
}

}  // namespace tandem::cli
