// The metrics log's lines: every one valid JSON, whatever the numbers and text written.
#include <gtest/gtest.h>
#include <grp.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "metrics_log.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

std::vector<nlohmann::json> records_of(const std::string& path) {
  std::vector<nlohmann::json> records;
  std::istringstream lines(test::read_bytes(path));
  for (std::string line; std::getline(lines, line);) records.push_back(nlohmann::json::parse(line));
  return records;
}

// nlohmann writes NaN as null: a diverged loss read as a missing one.
TEST(MetricsLog, NonFiniteNumbersAreNamedNotNull) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsLog log(path, false);
    const double inf = std::numeric_limits<double>::infinity();
    log.write({{"loss", std::nan("")}, {"nested", {{"up", inf}, {"down", -inf}}},
               {"list", {1.5, -inf}}, {"fine", 0.25}});
    StepReport step;
    step.loss_sum = std::nan("");
    log.step(step);
  }
  const auto records = records_of(path);
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["loss"], "NaN");
  EXPECT_EQ(records[0]["nested"]["up"], "Infinity");
  EXPECT_EQ(records[0]["nested"]["down"], "-Infinity");
  EXPECT_EQ(records[0]["list"], nlohmann::json::parse("[1.5, \"-Infinity\"]"));
  EXPECT_EQ(records[0]["fine"], 0.25);
  EXPECT_EQ(records[1]["loss"], "NaN");
}

// An epoch without a validation split has no validation figures: it wrote a loss and an accuracy
// of 0, which read as a perfect model (a search ranking its trials by them, a plot).
TEST(MetricsLog, AnEpochWithoutValidationHasNoValidationFigures) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsLog log(path, false);
    EpochReport unscored;
    unscored.epoch = 1;
    log.epoch(unscored);
    EpochReport scored;
    scored.epoch = 2;
    scored.validation.samples = 100;
    scored.validation.loss_sum = 23.5;
    scored.validation.loss_mean = 0.235;
    scored.validation.accuracy = 0.9;
    log.epoch(scored);
  }
  const auto records = records_of(path);
  ASSERT_EQ(records.size(), 2u);
  for (const char* key : {"validation_loss", "validation_loss_mean", "validation_accuracy"}) {
    EXPECT_FALSE(records[0].contains(key)) << records[0].dump();
    EXPECT_TRUE(records[1].contains(key)) << records[1].dump();
  }
  EXPECT_EQ(records[1]["validation_loss"], 23.5);
  EXPECT_EQ(records[1]["validation_accuracy"], 0.9);
}

// Text that is not UTF-8 (a role's name, a path) made dump() throw: the record was lost.
TEST(MetricsLog, TextThatIsNotUtf8IsWrittenWithReplacementCharacters) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  {
    MetricsLog log(path, false);
    log.write({{"name", std::string("worker\xff") + "1"}});
  }
  const auto records = records_of(path);
  ASSERT_EQ(records.size(), 1u);
  EXPECT_EQ(records[0]["name"], "worker\xEF\xBF\xBD" "1");
}

// A file that is no metrics log (a data file, a model, notes: its first line no JSON record
// with a "type") is neither truncated nor appended to: `tandem train --metrics` on the data's
// label file once replaced it. An empty file, and a log, are taken.
TEST(MetricsLog, AFileThatIsNoLogIsNotWrittenOver) {
  test::TempDir dir;
  const std::string path = dir.file("labels");
  for (const std::string& other : {std::string("\0\0\x08\x01\0\0\0\x02\x07\x03", 10),
                                   std::string("notes\n{\"type\":\"step\"}\n"),
                                   std::string("{\"zarr_format\":3}\n"),
                                   std::string("[1, 2]\n")}) {
    test::write_bytes(path, other);
    for (const bool append : {false, true}) {
      const std::string e = test::error_of<InputError>([&] { MetricsLog log(path, append); });
      EXPECT_TRUE(test::contains(e, "metrics file " + path + " holds something other than a "
                                    "metrics log")) << e;
      EXPECT_EQ(test::read_bytes(path), other);
    }
  }
  test::write_bytes(path, std::string());
  { MetricsLog log(path); log.write({{"type", "epoch"}}); }
  { MetricsLog log(path); log.write({{"type", "step"}}); }  // a log is replaced
  EXPECT_EQ(test::read_bytes(path), "{\"type\":\"step\"}\n");
  // A resumed run's log whose one record was cut short (killed as it wrote it) is its own.
  test::write_bytes(path, std::string("{\"epoch\":1,\"lo"));
  { MetricsLog log(path, true); log.write({{"type", "step"}}); }
  EXPECT_EQ(test::read_bytes(path), "{\"epoch\":1,\"lo\n{\"type\":\"step\"}\n");
}

// A run killed in the middle of a long line leaves it without its newline; the resumed run
// appended its first record to it, one line no JSON reader takes. It starts a line of its own now
// (the cut line stays, as the record of what was written), and a whole file gets no blank line.
TEST(MetricsLog, AResumedLogStartsAfterALineCutShort) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  test::write_bytes(path, std::string("{\"type\":\"step\"}\n{\"type\":\"clu"));
  {
    MetricsLog log(path, true);
    log.write({{"type", "epoch"}});
  }
  EXPECT_EQ(test::read_bytes(path),
            "{\"type\":\"step\"}\n{\"type\":\"clu\n{\"type\":\"epoch\"}\n");
  {
    MetricsLog log(path, true);
    log.write({{"type", "epoch"}});
  }
  EXPECT_EQ(test::read_bytes(path), "{\"type\":\"step\"}\n{\"type\":\"clu\n{\"type\":\"epoch\"}\n"
                                    "{\"type\":\"epoch\"}\n");
}

// A run killed after its checkpoint at step 20 logged steps 30 and 40, which its resumption
// trains again, and a last line it cut short: they are dropped, so that no step is in the log
// twice with two losses, and a record says where the run resumed and how many records went.
// Each is overwritten by {"type":"dropped"} and spaces, as long as it was; every other line
// stays as it was: a cluster's score of step 15 logged after a record of step 30 (its scorer
// pulled before), records without a step, a blank line, lines longer than a read (64 KiB). In
// place: the file keeps its inode (a hard link, `tail -f`, see the new content), and its mode.
TEST(MetricsLog, AResumedLogDropsTheRecordsPastItsCheckpoint) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  const std::string long_text(100000, 'x');
  const std::string long_kept = "{\"type\":\"note\",\"step\":5,\"text\":\"" + long_text + "\"}";
  const std::string long_gone = "{\"type\":\"note\",\"step\":35,\"text\":\"" + long_text + "\"}";
  const std::string before = "{\"type\":\"step\",\"step\":10}\n{\"type\":\"cluster\"}\n" +
                             long_kept + "\n{\"type\":\"epoch\",\"step\":20}\n";
  const std::string step_30 = "{\"type\":\"step\",\"step\":30}";
  const std::string score_15 = "{\"type\":\"score\",\"step\":15}\n";
  const std::string step_40 = "{\"type\":\"step\",\"step\":40.0}";
  const std::string cut = "{\"type\":\"step\",\"st";
  test::write_bytes(path, before + step_30 + "\n" + score_15 + long_gone + "\n" + step_40 +
                              "\n\n" + cut);
  ASSERT_EQ(::chmod(path.c_str(), 0640), 0);
  ASSERT_EQ(::link(path.c_str(), dir.file("linked.jsonl").c_str()), 0);
  {
    MetricsLog log(path, true, 20);
    log.write({{"type", "step"}, {"step", 21}});
  }
  const auto dropped = [](const std::string& line) {
    return "{\"type\":\"dropped\"}" + std::string(line.size() - 18, ' ');
  };
  const std::string expected =
      before + dropped(step_30) + "\n" + score_15 + dropped(long_gone) + "\n" + dropped(step_40) +
      "\n\n" + dropped(cut) + "\n{\"dropped_records\":4,\"step\":20,\"type\":\"resume\"}\n"
      "{\"step\":21,\"type\":\"step\"}\n";
  EXPECT_EQ(test::read_bytes(path), expected);
  EXPECT_EQ(test::read_bytes(dir.file("linked.jsonl")), expected);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  // Nothing past the step: nothing dropped.
  {
    MetricsLog log(path, true, 21);
  }
  const std::string none_dropped = "{\"dropped_records\":0,\"step\":21,\"type\":\"resume\"}\n";
  EXPECT_EQ(test::read_bytes(path), expected + none_dropped);
}

// A log that cannot be written is refused before anything is dropped from it (it was rewritten,
// then refused).
TEST(MetricsLog, AResumedLogThatCannotBeWrittenIsLeftAsItWas) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  const std::string before = "{\"type\":\"step\",\"step\":30}\n";
  test::write_bytes(path, before);
  ASSERT_EQ(::chmod(path.c_str(), 0444), 0);
  if (::geteuid() != 0) {
    EXPECT_THROW(MetricsLog(path, true, 20), IoError);
    EXPECT_EQ(test::read_bytes(path), before);
    return;
  }
  // Root writes a read-only file (and CI runs as root): the check runs in a child that is
  // "nobody", its outcome its exit status.
  ASSERT_EQ(::chmod(dir.path().c_str(), 0755), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(3);
    if (test::read_bytes(path) != before) ::_exit(5);  // the temporary directory is closed to it
    try {
      MetricsLog log(path, true, 20);
      ::_exit(1);
    } catch (const IoError&) {
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(test::read_bytes(path) == before ? 0 : 2);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  // (A container without the right to change users, or a private TMPDIR: nothing to check.)
  if (WEXITSTATUS(status) == 3) GTEST_SKIP() << "root here cannot become nobody (65534)";
  if (WEXITSTATUS(status) == 5) GTEST_SKIP() << "nobody cannot read " << path;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "1: not refused, 2: the file changed, 4: an error other "
                                       "than IoError";
}

// Two runs given the same file interleaved their records and cut each other's lines: the
// second is refused while the first has it open, its records (and a resumed run's drops) left
// alone; once the first is done the file can be written again. /dev/null is not locked. The
// file is made as the umask says (0644 once, whatever the umask: a group's run directory).
TEST(MetricsLog, ASecondWriterOfTheSameFileIsRefused) {
  test::TempDir dir;
  const std::string path = dir.file("metrics.jsonl");
  const mode_t mask = ::umask(002);  // a group's: the old 0644 would not pass for it
  {
    MetricsLog first(path);
    first.write({{"type", "step"}, {"step", 1}});
    for (const bool append : {false, true}) {
      const std::string why =
          test::error_of<IoError>([&] { MetricsLog second(path, append, append ? 0 : -1); });
      EXPECT_NE(why.find("metrics file " + path + " is open for writing already"),
                std::string::npos)
          << why;
    }
    first.write({{"type", "step"}, {"step", 2}});
    MetricsLog null_a("/dev/null"), null_b("/dev/null");
  }
  EXPECT_EQ(records_of(path).size(), 2u);
  ::umask(mask);
  struct stat st {};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0664u);
  MetricsLog again(path, true);
  again.write({{"type", "step"}, {"step", 3}});
  EXPECT_EQ(records_of(path).size(), 3u);
}

}  // namespace
}  // namespace tandem
