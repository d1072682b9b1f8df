// Where the chunk manager's shuffled copy spends its time, on one thread: 44 bands of
// 10,000 x 784 bytes copied into a ring of three batch buffers, four ways, in one run:
//   memcpy      the whole band at once (the sequential ceiling)
//   gather      rows in shuffled order (what a shuffled batch asks for)
//   prefetch    the gather, prefetching rows four ahead
//   scatter-nt  the band read in storage order, rows scattered to their shuffled places with
//               non-temporal stores (what the chunk manager does for large batches)
//
//   tandem_row_copy_bench
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

int main() {
  constexpr size_t kRows = 10000, kRowBytes = 784, kBand = kRows * kRowBytes;
  constexpr int kBands = 44, kRepeats = 2;
  std::vector<std::vector<uint8_t>> bands(kBands, std::vector<uint8_t>(kBand));
  std::mt19937 rng(1);
  for (auto& b : bands)
    for (auto& x : b) x = static_cast<uint8_t>(rng());
  std::vector<std::vector<uint8_t>> ring(3, std::vector<uint8_t>(kBand + 64));
  std::vector<int> order(kRows), where(kRows);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  for (size_t i = 0; i < kRows; ++i) where[static_cast<size_t>(order[i])] = static_cast<int>(i);
  auto aligned = [](std::vector<uint8_t>& v) {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(v.data()) + 63) / 64 * 64);
  };
  const char* names[] = {"memcpy", "gather", "prefetch", "scatter-nt"};
  for (int mode = 0; mode < 4; ++mode) {
    const auto start = std::chrono::steady_clock::now();
    for (int rep = 0; rep < kRepeats; ++rep)
      for (int b = 0; b < kBands; ++b) {
        uint8_t* d = aligned(ring[static_cast<size_t>(b) % 3]);
        const uint8_t* s = bands[static_cast<size_t>(b)].data();
        if (mode == 0) {
          std::memcpy(d, s, kBand);
        } else if (mode == 3) {
          for (size_t j = 0; j < kRows; ++j)
            for (size_t k = 0; k < kRowBytes; k += 16)
              _mm_stream_si128(reinterpret_cast<__m128i*>(d + static_cast<size_t>(where[j]) * kRowBytes + k),
                               _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + j * kRowBytes + k)));
          _mm_sfence();
        } else {
          for (size_t i = 0; i < kRows; ++i) {
            if (mode == 2 && i + 4 < kRows)
              for (size_t k = 0; k < kRowBytes; k += 64)
                __builtin_prefetch(s + static_cast<size_t>(order[i + 4]) * kRowBytes + k);
            std::memcpy(d + i * kRowBytes, s + static_cast<size_t>(order[i]) * kRowBytes, kRowBytes);
          }
        }
      }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%-10s %6.2f GB/s\n", names[mode], double(kRepeats) * kBands * kBand / seconds / 1e9);
  }
  return 0;
}
