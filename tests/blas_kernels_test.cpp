// The OpenBLAS kernel choice: which names count as too old for this CPU, and what replaces them.
// (The switch itself is checked end to end by cli_test.sh, on the tandem binary: switching here
// would change the kernels under the other tests of this binary.)
#include "blas_kernels.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace {

// The CPU's feature flags as the kernel reports them: a second opinion on the compiler's CPUID.
std::set<std::string> cpu_flags() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    std::set<std::string> flags;
    for (std::string w; words >> w;) flags.insert(w);
    return flags;
  }
  return {};
}

TEST(BlasKernels, OldKernelsGetTheBestFamilyKernelsThisCpuRuns) {
  const std::set<std::string> f = cpu_flags();
  if (f.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags";
  const auto has = [&](const char* flag) { return f.count(flag) > 0; };
  std::string expected;
  if (has("avx512f") && has("avx512cd") && has("avx512bw") && has("avx512dq") && has("avx512vl"))
    expected = "SkylakeX";
  else if (has("avx2") && has("fma"))
    expected = "Haswell";
  for (const char* old : {"Prescott", "prescott", "Core2", "Nehalem", "Sandybridge", "unknown"})
    EXPECT_EQ(tandem::better_blas_kernels(old), expected) << old;
}

TEST(BlasKernels, KernelsOfAvx2OrLaterAndUnknownNamesStay) {
  for (const char* fine : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids",
                           "Excavator", "a name from a newer OpenBLAS", ""})
    EXPECT_EQ(tandem::better_blas_kernels(fine), "") << fine;
}

TEST(BlasKernels, NamesWhatTheLibraryRuns) {
  const tandem::BlasKernels k = tandem::blas_kernels();
  EXPECT_FALSE(k.loaded.empty());
  // What would replace old kernels is not itself old (this program does not switch them).
  if (!k.better.empty()) {
    EXPECT_NE(k.better, k.loaded);
    EXPECT_EQ(tandem::better_blas_kernels(k.better), "") << k.loaded << " -> " << k.better;
  }
}

}  // namespace
