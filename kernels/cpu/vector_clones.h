// TANDEM_VECTOR_CLONES: a loop built for AVX-512, AVX2 and baseline x86-64 and picked at load
// time, so the binary stays portable while the sweep runs at the machine's vector width. Only
// with GCC on x86-64, and not in sanitizer builds. Used by the optimizer kernels and by the
// benchmark loops that must be built as they are (bench/kernels_cpu_bench.cpp).
#pragma once

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define TANDEM_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define TANDEM_VECTOR_CLONES
#endif
