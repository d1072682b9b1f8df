// Helpers shared by the test programs: one tolerance check for every comparison, seeded random
// inputs that are never all zero, temporary directories, whole-file reads and writes, small
// synthetic data sets, and waiting for what another thread or process does.
#pragma once

#include <gtest/gtest.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tandem/dataset.h"
#include "tandem/model.h"

namespace tandem::test {

// |out - ref| <= atol + rtol * |ref| for every element; on failure names the worst element.
template <typename A, typename B>
::testing::AssertionResult all_close(const A* out, const B* ref, size_t n, double atol,
                                     double rtol) {
  size_t worst = 0;
  double worst_excess = -1.0;
  for (size_t i = 0; i < n; ++i) {
    const double o = static_cast<double>(out[i]), r = static_cast<double>(ref[i]);
    const double excess = std::fabs(o - r) - (atol + rtol * std::fabs(r));
    if (!(excess <= 0.0) && (std::isnan(excess) || excess > worst_excess)) {
      worst = i;
      worst_excess = std::isnan(excess) ? INFINITY : excess;
    }
  }
  if (worst_excess < 0.0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "element " << worst << " of " << n << ": got " << static_cast<double>(out[worst])
         << ", expected " << static_cast<double>(ref[worst]) << " (atol " << atol << ", rtol "
         << rtol << ")";
}

template <typename A, typename B>
::testing::AssertionResult all_close(const std::vector<A>& out, const std::vector<B>& ref,
                                     double atol, double rtol) {
  if (out.size() != ref.size())
    return ::testing::AssertionFailure() << "sizes differ: " << out.size() << " vs " << ref.size();
  return all_close(out.data(), ref.data(), out.size(), atol, rtol);
}

// Uniform values in [lo, hi) from a fixed seed; asserts the draw is not all zeros.
// Bit-for-bit equality (memcmp; an empty vector's null data is never passed to it).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// The tensors' values end to end, in order.
inline std::vector<float> flatten(const std::vector<NamedTensor>& tensors) {
  std::vector<float> flat;
  for (const auto& t : tensors) flat.insert(flat.end(), t.values.begin(), t.values.end());
  return flat;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  bool nonzero = false;
  for (auto& x : v) {
    x = dist(gen);
    nonzero |= x != 0.0f;
  }
  EXPECT_TRUE(n == 0 || nonzero) << "random input is all zeros (seed " << seed << ")";
  return v;
}

// A fresh directory under the system's temporary directory, removed with everything in it when
// the object goes.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

// A whole file's bytes as a std::string or a std::vector<uint8_t>; empty when it cannot be read.
template <typename Bytes = std::string>
Bytes read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), {});
}

// Creates or replaces the file at `path` holding exactly `bytes`; a failed write fails the test.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
  ASSERT_TRUE(out.good()) << path;
}

inline void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  write_bytes(path, std::string(bytes.begin(), bytes.end()));
}

// Linearly separable data: class c's rows are bright in feature block c and dark elsewhere,
// with noise. A 1-hidden-layer MLP reaches 100% accuracy on it quickly.
inline Dataset separable_dataset(int64_t rows, int64_t features, int classes, uint32_t seed) {
  Dataset data(PixelType::UInt8, rows, features, classes);
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> noise(0, 60);
  const int64_t block = features / classes;
  for (int64_t r = 0; r < rows; ++r) {
    const int label = static_cast<int>(r % classes);
    data.label_data()[r] = static_cast<uint8_t>(label);
    for (int64_t f = 0; f < features; ++f) {
      const bool lit = f / block == label;
      data.pixel_data()[r * features + f] = static_cast<uint8_t>(lit ? 255 - noise(gen) : noise(gen));
    }
  }
  return data;
}

// A store's three splits of separable_dataset with 40 features and 4 classes (a 40-16-4 model's
// data): `train_rows` training rows, `eval_rows` each for validation and test, seeds seed,
// seed + 1 and seed + 2.
inline DataSplits separable_splits(int64_t train_rows, int64_t eval_rows, uint32_t seed) {
  DataSplits splits;
  splits.train = separable_dataset(train_rows, 40, 4, seed);
  splits.validation = separable_dataset(eval_rows, 40, 4, seed + 1);
  splits.test = separable_dataset(eval_rows, 40, 4, seed + 2);
  splits.source = "synthetic";
  return splits;
}

// Random pixels and labels (uint8 or float32 pixels).
inline Dataset random_dataset(PixelType type, int64_t rows, int64_t features, int classes,
                              uint32_t seed) {
  Dataset data(type, rows, features, classes);
  std::mt19937 gen(seed);
  for (int64_t r = 0; r < rows; ++r) data.label_data()[r] = static_cast<uint8_t>(gen() % classes);
  if (type == PixelType::UInt8) {
    for (int64_t i = 0; i < rows * features; ++i) data.pixel_data()[i] = static_cast<uint8_t>(gen());
  } else {
    auto* px = reinterpret_cast<float*>(data.pixel_data());
    std::uniform_real_distribution<float> dist(0.0f, 1.0f);
    for (int64_t i = 0; i < rows * features; ++i) px[i] = dist(gen);
  }
  return data;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The id of a process that has ended (a child that exited at once, reaped): what a temporary
// file left by a killed writer names.
inline pid_t ended_process_id() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  int status = 0;
  ::waitpid(pid, &status, 0);
  return pid;
}

// Sets the modification time of `path` (of a link itself, not its file) `minutes` back.
inline void make_older(const std::string& path, int minutes) {
  const timespec then{::time(nullptr) - 60 * minutes, 0};
  const timespec times[2] = {then, then};
  ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), times, AT_SYMLINK_NOFOLLOW), 0) << path;
}

// Polls `done` every `poll_ms` until it is true or `timeout_ms` have passed; its last answer.
// For what another thread or process makes true in its own time (a message arriving, a file
// written), instead of assuming it after a fixed sleep.
template <typename F>
bool eventually(F&& done, int timeout_ms, int poll_ms = 5) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(poll_ms));
  }
  return true;
}

// The message of the E that f() throws; a test failure when it throws nothing or something else.
template <typename E, typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw another type: " << e.what();
    return {};
  }
  ADD_FAILURE() << "threw nothing";
  return {};
}

}  // namespace tandem::test
