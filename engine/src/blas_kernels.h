// Which OpenBLAS kernels this process runs, and a switch to better ones where the library's own
// choice is poor.
//
// Why: OpenBLAS picks its kernels by CPU model when it loads, and a model newer than the library
// knows gets its oldest x86-64 kernels ("Prescott", SSE3). Debian 12's OpenBLAS 0.3.21 does that
// on a 5th-generation Xeon (family 6, model 207): one-thread sgemm ran 5x and training 1.8 to
// 3.7x slower there than with the SkylakeX kernels the same CPU runs (bench/RESULTS.md). OPENBLAS_CORETYPE names the kernels to load instead, but the library reads
// it when it loads, before main() for a program linked with it.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct BlasKernels {
  std::string loaded;  // the kernels OpenBLAS runs (its core name, such as "Prescott")
  // Kernels this CPU runs that are far faster, or empty: `loaded` is of AVX2's generation or
  // later (or a name this code does not know), or the CPU has nothing better.
  std::string better;
};

// What this process's OpenBLAS runs now, and what it could.
BlasKernels blas_kernels();

// Where the OpenBLAS library this process runs is mapped (its base address), or 0 when unknown:
// which mapping it is, whatever its file has been renamed or replaced by since.
uintptr_t blas_library_address();

// The `better` of blas_kernels() for OpenBLAS kernels named `loaded` on this CPU.
std::string better_blas_kernels(const std::string& loaded);

// For the entry points Tandem owns (the tandem binary's main, the benchmarks' mains), before
// anything calls BLAS: when OpenBLAS runs kernels far below the CPU and the user did not choose
// with OPENBLAS_CORETYPE, sets OPENBLAS_CORETYPE to the better ones (the processes this one
// starts load them at once) and has OpenBLAS choose again, through its run-time dispatch
// (gotoblas_dynamic_quit/init; a build without it has fixed kernels, left as they are). Not for
// the library on its own: the switch must not race a BLAS call on another thread (the table is
// empty in between), and only an entry point knows there is none. Python's import uses it only
// when Tandem loaded OpenBLAS itself (python/tandem/__init__.py). Returns a warning when the
// slow kernels stay (the library has none better), else "".
std::string use_better_blas_kernels();

}  // namespace tandem
