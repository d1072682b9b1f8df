// Reads of a mapped file cut short after it was mapped: an error under a guard, the process's
// old fate (death by SIGBUS) anywhere else.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "file_io.h"
#include "mapped_read_guard.h"
#include "tandem/error.h"
#include "test_support.h"

namespace tandem {
namespace {

const size_t kPage = static_cast<size_t>(::sysconf(_SC_PAGESIZE));

// A file of `pages` pages of byte 0xAB, mapped.
MappedFile mapped_file(const std::string& path, size_t pages) {
  test::write_bytes(path, std::string(pages * kPage, '\xAB'));
  return MappedFile::map_if_exists(path);
}

// Every byte of the mapping read, through volatile so no read is left out.
size_t count_bytes_of_ab(const MappedFile& mapped) {
  size_t count = 0;
  const volatile uint8_t* p = mapped.data();
  for (size_t i = 0; i < mapped.size(); ++i) count += p[i] == 0xAB;
  return count;
}

TEST(MappedReadGuard, AFileCutShortReadsZerosPastItsEndAndCheckSaysSo) {
  test::TempDir dir;
  const std::string path = dir.file("chunk");
  const MappedFile mapped = mapped_file(path, 3);
  std::filesystem::resize_file(path, kPage);  // in place, as cp onto the file would
  const MappedReadGuard guard(mapped);
  EXPECT_EQ(count_bytes_of_ab(mapped), kPage);  // the page still in the file, then zeros
  EXPECT_TRUE(guard.faulted());
  try {
    guard.check("zarr store 's', chunk 'c/0/0'");
    FAIL() << "expected an error";
  } catch (const InputError& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("zarr store 's', chunk 'c/0/0': the file '" + path + "' shrank"),
              std::string::npos) << text;
    EXPECT_NE(text.find(std::to_string(3 * kPage) + " mapped bytes"), std::string::npos) << text;
  }
}

// Cut inside its only page, the file faults nowhere: past the cut the page reads zeros. check()
// asks the file.
TEST(MappedReadGuard, ACutInsideAPageIsSeenWithoutAFault) {
  test::TempDir dir;
  const std::string path = dir.file("chunk");
  const MappedFile mapped = mapped_file(path, 1);
  std::filesystem::resize_file(path, 100);
  const MappedReadGuard guard(mapped);
  EXPECT_EQ(count_bytes_of_ab(mapped), 100u);
  EXPECT_FALSE(guard.faulted());
  EXPECT_THROW(guard.check("chunk"), InputError);
}

TEST(MappedReadGuard, AWholeFileReadsWholeAndChecksClean) {
  test::TempDir dir;
  const MappedFile mapped = mapped_file(dir.file("chunk"), 2);
  const MappedReadGuard guard(mapped);
  EXPECT_EQ(count_bytes_of_ab(mapped), 2 * kPage);
  EXPECT_FALSE(guard.faulted());
  EXPECT_NO_THROW(guard.check("chunk"));
}

TEST(MappedReadGuard, AFaultInTheOuterGuardsFileMarksTheOuterGuard) {
  test::TempDir dir;
  const MappedFile outer_file = mapped_file(dir.file("outer"), 2);
  const MappedFile inner_file = mapped_file(dir.file("inner"), 2);
  std::filesystem::resize_file(dir.file("outer"), 0);
  const MappedReadGuard outer(outer_file);
  {
    const MappedReadGuard inner(inner_file);
    EXPECT_EQ(count_bytes_of_ab(outer_file), 0u);
    EXPECT_EQ(count_bytes_of_ab(inner_file), 2 * kPage);
    EXPECT_FALSE(inner.faulted());
  }
  EXPECT_TRUE(outer.faulted());
}

// The handler, once installed, claims only its guards' faults: reading a cut-short mapping that
// no guard covers still ends the process (by SIGBUS, or by a sanitizer's report of it).
TEST(MappedReadGuardDeathTest, AFaultNoGuardCoversStillEndsTheProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  test::TempDir dir;
  const MappedFile guarded = mapped_file(dir.file("guarded"), 1);
  const MappedFile unguarded = mapped_file(dir.file("unguarded"), 2);
  std::filesystem::resize_file(dir.file("unguarded"), 0);
  const MappedReadGuard guard(guarded);  // installs the handler, guards another file
  EXPECT_DEATH(count_bytes_of_ab(unguarded), "");
  EXPECT_FALSE(guard.faulted());
}

}  // namespace
}  // namespace tandem
