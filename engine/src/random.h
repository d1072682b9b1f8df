// Seeded randomness whose values are the same with every compiler and standard library
// (std::normal_distribution and std::shuffle are not), so a seed names one run everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace tandem {

// SplitMix64: small, fast, and good enough for initialisation and shuffling.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  // Seeds a stream from a run seed and a stream id (a tensor index, an epoch number). Both are
  // hashed into the starting state: SplitMix64 only adds a constant per step, so states that
  // differ by a multiple of it (seed ^ constant * (stream + 1), as this was) start one
  // sequence a few steps further on. Then each weight tensor of a model was a scaled, shifted
  // copy of another, and epochs' shuffles were correlated.
  Rng(uint64_t seed, uint64_t stream)
      : state_(mix(seed ^ mix(stream + 0x632BE59BD9B4E019ull))) {}

  uint64_t next() { return mix(state_ += 0x9E3779B97F4A7C15ull); }
  // Uniform in (0, 1): never 0, so log() is safe.
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
  // Uniform integer in [0, n), n > 0 (Lemire's multiply-shift; the bias is below 2^-32 here).
  uint64_t below(uint64_t n) {
    return static_cast<uint64_t>((static_cast<unsigned __int128>(next()) * n) >> 64);
  }
  double normal() {
    // Box-Muller; one value per call keeps the stream simple to reason about.
    const double r = std::sqrt(-2.0 * std::log(uniform()));
    return r * std::cos(6.283185307179586 * uniform());
  }
  // TensorFlow's truncated normal: values beyond two standard deviations are drawn again.
  double truncated_normal(double stddev) {
    for (;;) {
      const double x = normal();
      if (std::fabs(x) <= 2.0) return x * stddev;
    }
  }

 private:
  // SplitMix64's output function (a bijection of 64-bit words).
  static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t state_;
};

// A permutation of [0, n) by Fisher-Yates, the same for the same (seed, stream), written into
// `order` (its capacity is reused: a reader that builds one per band allocates once).
inline void fill_seeded_permutation(std::vector<int32_t>& order, int64_t n, uint64_t seed,
                                    uint64_t stream) {
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  Rng rng(seed, stream);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(rng.below(static_cast<uint64_t>(i + 1)));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
}

inline std::vector<int32_t> seeded_permutation(int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<int32_t> order;
  fill_seeded_permutation(order, n, seed, stream);
  return order;
}

}  // namespace tandem
