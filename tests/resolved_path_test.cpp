// resolved_path: one spelling for every way of naming a file (locks, claims and the paths handed
// to slot servers are keyed on it).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "file_io.h"

namespace fs = std::filesystem;

namespace tandem {
namespace {

TEST(ResolvedPath, GivesOneSpellingForEveryNameOfAPath) {
  const fs::path dir = fs::temp_directory_path() / ("tandem-resolved-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "real" / "sub");
  fs::create_directory_symlink(dir / "real", dir / "link");
  const std::string real = fs::canonical(dir / "real" / "sub").string();
  // Through a symbolic link, "..", "." and a trailing slash: the same path.
  EXPECT_EQ(resolved_path((dir / "link" / "sub").string()), real);
  EXPECT_EQ(resolved_path((dir / "real" / "." / "sub" / ".." / "sub").string()), real);
  EXPECT_EQ(resolved_path((dir / "link" / "sub").string() + "/"), real);
  // A path not made yet: its existing part resolved, the rest kept, with no trailing slash (a
  // name made from it, PATH + ".logs", would land inside it).
  EXPECT_EQ(resolved_path((dir / "link" / "new.zarr").string() + "/"),
            fs::canonical(dir / "real").string() + "/new.zarr");
  // Relative to the working directory.
  const fs::path cwd = fs::current_path();
  fs::current_path(dir / "link");
  EXPECT_EQ(resolved_path("sub/"), real);
  fs::current_path(cwd);
  EXPECT_EQ(resolved_path("/"), "/");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace tandem
