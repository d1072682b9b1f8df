#include "blas_kernels.h"

#include <dlfcn.h>
#include <strings.h>

#include <cstdlib>

// OpenBLAS's own, declared here rather than through its cblas.h: all this file needs of it.
extern "C" char* openblas_get_corename(void);

namespace tandem {

namespace {

// OpenBLAS's x86 kernels older than AVX2 (its core names, as openblas_get_corename() gives them).
// A name not listed (a newer kernel, or one this list does not know) is left alone.
bool older_than_avx2(const std::string& core) {
  static const char* const kOld[] = {
      "unknown", "katmai",   "coppermine", "northwood",     "prescott",   "banias",
      "atom",    "core2",    "penryn",     "dunnington",    "nehalem",    "athlon",
      "opteron", "opteron(sse3)", "barcelona", "nano",      "sandybridge", "bobcat",
      "bulldozer", "piledriver"};
  for (const char* old : kOld)
    if (::strcasecmp(core.c_str(), old) == 0) return true;
  return false;
}

// The best of OpenBLAS's x86-64 kernels for a whole CPU family that this CPU runs, or "".
std::string kernels_for_this_cpu() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512cd") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

}  // namespace

std::string better_blas_kernels(const std::string& loaded) {
  return older_than_avx2(loaded) ? kernels_for_this_cpu() : "";
}

uintptr_t blas_library_address() {
  Dl_info info{};
  if (::dladdr(reinterpret_cast<void*>(&openblas_get_corename), &info) == 0) return 0;
  return reinterpret_cast<uintptr_t>(info.dli_fbase);
}

BlasKernels blas_kernels() {
  BlasKernels k;
  const char* name = openblas_get_corename();
  k.loaded = name == nullptr ? "unknown" : name;
  k.better = better_blas_kernels(k.loaded);
  return k;
}

std::string use_better_blas_kernels() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";  // the user's choice stands
  const BlasKernels before = blas_kernels();
  if (before.better.empty()) return "";
  ::setenv("OPENBLAS_CORETYPE", before.better.c_str(), /*overwrite=*/1);
  // The run-time dispatch of a DYNAMIC_ARCH build (Debian's): quit forgets the kernel table,
  // init picks one again, reading OPENBLAS_CORETYPE. Looked up rather than linked, so that a
  // build without them still loads.
  using Hook = void (*)();
  const auto quit = reinterpret_cast<Hook>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_quit"));
  const auto init = reinterpret_cast<Hook>(::dlsym(RTLD_DEFAULT, "gotoblas_dynamic_init"));
  if (quit == nullptr || init == nullptr) {  // a build for one CPU: its kernels are fixed
    ::unsetenv("OPENBLAS_CORETYPE");
    return "";
  }
  quit();
  init();
  const BlasKernels after = blas_kernels();
  if (after.better.empty()) return "";
  ::unsetenv("OPENBLAS_CORETYPE");  // it did nothing here: the processes started load as before
  return "OpenBLAS runs its '" + after.loaded + "' kernels, several times slower than its '" +
         after.better + "' ones this CPU runs, and has no such kernels to switch to (an " +
         "OpenBLAS built with more targets would)";
}

}  // namespace tandem
