// tandem launch's role processes (tools/tandem/process_launcher.h), started for real: each "role"
// is a small shell script standing in for the tandem binary, so how it exits is up to the test.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "bare_coordinator.h"
#include "process_launcher.h"
#include "run_dir_lock.h"
#include "test_support.h"

namespace tandem {
namespace {

// A script run as `SCRIPT KIND --coordinator ADDR --name NAME`: the role named `failing` says
// why and exits with status 3 at once; every other one sleeps until it is stopped. A role starts
// with the stop signals blocked and unblocks them once its handlers are in (process_launcher.h);
// the sleeper unblocks them too, so that the launcher's SIGTERM ends it as it ends a role (a
// plain `sleep` kept them blocked, and every stop waited out the 2 s grace for its SIGKILL).
std::string role_script(const test::TempDir& dir, const std::string& failing) {
  const std::string path = dir.file("role.sh");
  test::write_bytes(path, "#!/bin/sh\n"
                          "if [ \"$5\" = " + failing + " ]; then\n"
                          "  echo \"$5: cannot start\" >&2\n"
                          "  exit 3\n"
                          "fi\n"
                          "exec python3 -c 'import signal, time\n"
                          "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, "
                          "signal.SIGINT, signal.SIGHUP})\n"
                          "time.sleep(60)'\n");
  chmod(path.c_str(), 0755);
  return path;
}

// The run waits for both workers; a worker process that exits before the run starts can never
// register (launch does not restart workers), so the run fails at once, naming the worker and how
// its process ended, instead of waiting out the start-up timeout to call it "not registered".
TEST(ProcessLauncher, AWorkerThatExitsBeforeTheRunStartsFailsItAtOnce) {
  test::TempDir dir;
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.expected_workers = 2;
  o.startup_timeout_ms = 60000;
  Coordinator coordinator(o);
  cli::ProcessLauncher launcher(role_script(dir, "worker1"));
  launcher.start("worker", "worker0", coordinator.endpoint());
  launcher.start("worker", "worker1", coordinator.endpoint());
  const auto start = std::chrono::steady_clock::now();
  test::eventually([&] {
    launcher.watch(coordinator);  // what launch's run loop does every tick
    return coordinator.phase() != ClusterPhase::Starting;
  }, 20000, 20);
  EXPECT_EQ(coordinator.phase(), ClusterPhase::Failed);
  const std::string why = coordinator.failure();
  EXPECT_TRUE(test::contains(why, "worker1 (process ")) << why;
  EXPECT_TRUE(test::contains(why, ") exited with status 3 before the run started")) << why;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  // worker0 still runs (launch's stop_all ends it); worker1 is gone.
  const auto pids = launcher.pids();
  EXPECT_EQ(pids.count("worker0"), 1u);
  EXPECT_EQ(pids.count("worker1"), 0u);
  launcher.stop_all(0);
  EXPECT_TRUE(launcher.pids().empty());
}

// A parameter server that keeps exiting is restarted up to the launcher's limit (at once, then
// after 0.5 s), then fails the run at once, naming it: it was left dead without a word, and the
// run failed minutes later blaming the workers.
TEST(ProcessLauncher, AServerOutOfRestartsFailsTheRunNamingIt) {
  test::TempDir dir;
  zmq::context_t context(1);
  CoordinatorOptions o = test::bare_coordinator_options(context);
  o.startup_timeout_ms = 60000;
  Coordinator coordinator(o);
  cli::ProcessLauncher launcher(role_script(dir, "ps0"), {}, /*max_restarts=*/2);
  launcher.start("ps", "ps0", coordinator.endpoint());
  const auto start = std::chrono::steady_clock::now();
  test::eventually([&] {
    launcher.watch(coordinator);
    return coordinator.phase() == ClusterPhase::Failed;
  }, 20000, 20);
  EXPECT_EQ(coordinator.phase(), ClusterPhase::Failed);
  const std::string why = coordinator.failure();
  EXPECT_TRUE(test::contains(why, "ps0 (process ")) << why;
  EXPECT_TRUE(test::contains(why, "exited with status 3 after 2 restarts: no restart left"))
      << why;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
  launcher.stop_all(0);
  EXPECT_TRUE(launcher.pids().empty());
}

// A scorer out of restarts leaves a run with a target and no other stop rule nothing to stop it:
// it trained for ever ("the run goes on without scores"). It fails now, saying why; a run that
// has max_seconds (or max_epochs) goes on to it.
TEST(ProcessLauncher, AScorerOutOfRestartsFailsARunOnlyItsScoresWouldStop) {
  for (const double max_seconds : {0.0, 600.0}) {
    test::TempDir dir;
    zmq::context_t context(1);
    CoordinatorOptions o = test::bare_coordinator_options(context);
    o.startup_timeout_ms = 60000;
    o.target = 0.5;
    o.max_seconds = max_seconds;
    Coordinator coordinator(o);
    ASSERT_EQ(coordinator.wait_for(ClusterPhase::Training, 5000), ClusterPhase::Training);
    cli::ProcessLauncher launcher(role_script(dir, "scorer0"), {}, /*max_restarts=*/1);
    launcher.start("scorer", "scorer0", coordinator.endpoint());
    const bool settled = test::eventually([&] {
      launcher.watch(coordinator);
      return coordinator.phase() == ClusterPhase::Failed || launcher.pids().empty();
    }, 20000, 20);
    EXPECT_TRUE(settled) << "the scorer still restarting after 20 s (max_seconds " << max_seconds
                         << ")";
    if (max_seconds == 0) {
      EXPECT_EQ(coordinator.phase(), ClusterPhase::Failed);
      EXPECT_TRUE(test::contains(coordinator.failure(),
                                 "without scores nothing would stop this run"))
          << coordinator.failure();
    } else {
      // The scorer out of restarts, the run going on to its max_seconds.
      EXPECT_TRUE(launcher.pids().empty());
      EXPECT_EQ(coordinator.phase(), ClusterPhase::Training) << coordinator.failure();
    }
    launcher.stop_all(0);
  }
}

// One run per run directory: a second lock on it is refused, naming the holder's pid, until the
// first is released; a program the holder starts does not keep the lock after the holder lets go
// (launch's role processes outlive nothing of it).
TEST(RunDirLock, ASecondRunOnTheDirectoryIsRefusedUntilTheFirstEnds) {
  test::TempDir dir;
  {
    RunDirLock first(dir.path().string());
    const std::string why =
        test::error_of<InputError>([&] { RunDirLock second(dir.path().string()); });
    EXPECT_TRUE(test::contains(why, "is in use by another run (process " +
                                        std::to_string(getpid()) + ")"))
        << why;
    // A child started now (its shell, then sleep) inherits no descriptor of the lock file.
    ASSERT_EQ(std::system("sleep 2 </dev/null >/dev/null 2>&1 &"), 0);
  }
  RunDirLock after(dir.path().string());
  // A file of the user's where the lock file would be is left as it is, and the run refused
  // (predict's OUT.lock beside a --out OUT: a notes.lock for --out notes was overwritten).
  const std::string notes = dir.file("notes.lock");
  test::write_bytes(notes, "my notes\n");
  const std::string refused = test::error_of<InputError>(
      [&] { RunDirLock lock(dir.path().string(), "--out", notes); });
  EXPECT_TRUE(test::contains(refused, notes + " is there and is not a lock file")) << refused;
  EXPECT_EQ(test::read_bytes(notes), "my notes\n");
  const std::string missing = (dir.path() / "absent").string();
  const std::string why = test::error_of<IoError>([&] { RunDirLock lock(missing); });
  EXPECT_TRUE(test::contains(why, "cannot open " + missing + "/lock")) << why;
}

// A run that takes a directory it used before removes the temporary files of writes a killed
// run left there (cluster.json, a search's results), and not those of a process still running.
TEST(LockedOutputDirectory, TakingADirectoryRemovesWhatKilledWritesLeftInIt) {
  test::TempDir dir;
  const std::string killed =
      dir.file("cluster.json.tmp-" + std::to_string(test::ended_process_id()) + "-3");
  const std::string alive = dir.file("results.csv.tmp-" + std::to_string(getpid()) + "-3");
  // A file of the user's with a name like a temporary file's, of a name the run does not write.
  const std::string users = dir.file("report.tmp-2024-01");
  for (const std::string& f : {killed, alive, users}) {
    test::write_bytes(f, "{");
    test::make_older(f, 5);
  }
  {
    LockedOutputDirectory taken(dir.path().string(), "--run-dir", {"cluster.json", "results.csv"});
    taken.keep();
  }
  EXPECT_FALSE(std::filesystem::exists(killed));
  EXPECT_TRUE(std::filesystem::exists(alive));
  EXPECT_TRUE(std::filesystem::exists(users));
}

}  // namespace
}  // namespace tandem
