// The fuzz targets' main() where libFuzzer is not linked in (a GCC build, CI): runs
// LLVMFuzzerTestOneInput once on each file named, or on each file under each directory named
// (the seed corpus and the inputs of crashes found and fixed), as libFuzzer does when it is given
// files. A crash or a failed property aborts; the exit status is 0 only when every input ran.
//
// With --mutate N it then runs N mutants of each input as well (bit flips, interesting integers,
// bytes inserted, erased, repeated or taken from another input), drawn from a fixed seed
// (--seed S, default 1) so that a run is the same every time; --max-seconds T stops mutating
// after T seconds. This is the suite's bounded random-input test: no coverage guidance, unlike
// libFuzzer, but random bytes reach every decoder at every run. An input that crashes is
// written to the file $FUZZ_CRASH_FILE names (default: PROGRAM-crash-input in the working
// directory, PROGRAM this program's name) before the process dies.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

// The input being run, for the crash handler (which may only make async-signal-safe calls).
const uint8_t* g_current = nullptr;
size_t g_current_size = 0;
volatile bool g_running = false;  // an input is being run (an empty one included)
std::string g_crash_file;

void write_current_input(int signal_number) {
  if (g_running) {
    const int fd = ::open(g_crash_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      for (size_t done = 0; done < g_current_size;) {
        const ssize_t n = ::write(fd, g_current + done, g_current_size - done);
        if (n <= 0) break;
        done += size_t(n);
      }
      ::close(fd);
      const char* parts[] = {"fuzz replay: the crashing input is in ", g_crash_file.c_str(), "\n"};
      for (const char* part : parts) {
        [[maybe_unused]] const ssize_t ignored = ::write(2, part, std::strlen(part));
      }
    }
  }
  ::signal(signal_number, SIG_DFL);
  ::raise(signal_number);
}

void run(const std::vector<uint8_t>& bytes) {
  g_current = bytes.data();
  g_current_size = bytes.size();
  g_running = true;
  LLVMFuzzerTestOneInput(bytes.empty() ? nullptr : bytes.data(), bytes.size());
  g_running = false;
}

std::vector<uint8_t> read_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  // Exactly the input's size, as libFuzzer gives: reading past it is an overflow that the address
  // sanitizer sees (in a sanitized build).
  std::vector<uint8_t> bytes(ec ? 0 : static_cast<size_t>(size));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (ec || !in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  return bytes;
}

// One mutant of `in`: a few edits of the kinds that find decoder bugs, `other` the source of
// spliced bytes.
std::vector<uint8_t> mutate(std::vector<uint8_t> in, const std::vector<uint8_t>& other,
                            std::mt19937_64& random) {
  static const uint64_t kInteresting[] = {0,          1,          0x7f,       0x80,
                                          0xff,       0x7fff,     0x8000,     0xffff,
                                          0x7fffffff, 0x80000000, 0xffffffff, 0x7fffffffffffffff,
                                          ~0ull,      1ull << 32, 1ull << 31, 1ull << 63};
  auto below = [&](size_t n) { return n == 0 ? size_t{0} : size_t(random() % n); };
  const int edits = 1 + int(random() % 4);
  for (int e = 0; e < edits; ++e) {
    switch (random() % 7) {
      case 0:  // flip a bit
        if (!in.empty()) in[below(in.size())] ^= uint8_t(1u << (random() % 8));
        break;
      case 1: {  // an interesting integer, little-endian, 1 to 8 bytes
        const size_t width = size_t{1} << (random() % 4);
        if (in.size() < width) break;
        const size_t at = below(in.size() - width + 1);
        uint64_t v = kInteresting[random() % (sizeof kInteresting / sizeof *kInteresting)];
        if (random() % 2) v = v - 1 - random() % 2;  // one or two below it
        for (size_t b = 0; b < width; ++b) in[at + b] = uint8_t(v >> (8 * b));
        break;
      }
      case 2: {  // insert random bytes
        const size_t n = 1 + below(16);
        std::vector<uint8_t> bytes(n);
        for (uint8_t& b : bytes) b = uint8_t(random());
        in.insert(in.begin() + std::ptrdiff_t(below(in.size() + 1)), bytes.begin(), bytes.end());
        break;
      }
      case 3: {  // erase a range
        if (in.empty()) break;
        const size_t at = below(in.size());
        const size_t n = 1 + below(std::min<size_t>(in.size() - at, 64));
        in.erase(in.begin() + std::ptrdiff_t(at), in.begin() + std::ptrdiff_t(at + n));
        break;
      }
      case 4: {  // repeat a range
        if (in.empty() || in.size() > (1u << 20)) break;
        const size_t at = below(in.size());
        const size_t n = 1 + below(std::min<size_t>(in.size() - at, 64));
        const std::vector<uint8_t> copy(in.begin() + std::ptrdiff_t(at),
                                        in.begin() + std::ptrdiff_t(at + n));
        in.insert(in.begin() + std::ptrdiff_t(at), copy.begin(), copy.end());
        break;
      }
      case 5: {  // bytes of another input over these
        if (in.empty() || other.empty()) break;
        const size_t from = below(other.size()), at = below(in.size());
        const size_t n = 1 + below(std::min(other.size() - from, in.size() - at));
        std::copy_n(other.begin() + std::ptrdiff_t(from), n, in.begin() + std::ptrdiff_t(at));
        break;
      }
      default:  // cut short
        if (!in.empty()) in.resize(below(in.size()));
        break;
    }
  }
  return in;
}

}  // namespace

int main(int argc, char** argv) {
  long mutants = 0;
  uint64_t seed = 1;
  double max_seconds = 0;
  std::vector<std::filesystem::path> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if ((arg == "--mutate" || arg == "--seed" || arg == "--max-seconds") && i + 1 < argc) {
      const std::string value = argv[++i];
      char* end = nullptr;
      if (arg == "--mutate") mutants = std::strtol(value.c_str(), &end, 10);
      if (arg == "--seed") seed = std::strtoull(value.c_str(), &end, 10);
      if (arg == "--max-seconds") max_seconds = std::strtod(value.c_str(), &end);
      if (end == nullptr || *end != '\0' || mutants < 0 || max_seconds < 0) {
        std::fprintf(stderr, "%s: bad value '%s'\n", arg.c_str(), value.c_str());
        return 2;
      }
    } else {
      paths.emplace_back(arg);
    }
  }
  if (paths.empty()) {
    std::fprintf(stderr,
                 "usage: %s [--mutate N [--seed S] [--max-seconds T]] FILE_OR_DIRECTORY...\n",
                 argv[0]);
    return 2;
  }
  const char* crash_file = std::getenv("FUZZ_CRASH_FILE");
  g_crash_file = crash_file != nullptr && *crash_file
                     ? std::string(crash_file)
                     : std::filesystem::path(argv[0]).filename().string() + "-crash-input";
  // (Under the address sanitizer its own handlers report faults; only an abort is caught here.)
#if defined(__SANITIZE_ADDRESS__)
  for (int signal_number : {SIGABRT})
#else
  for (int signal_number : {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL})
#endif
    ::signal(signal_number, write_current_input);

  std::vector<std::vector<uint8_t>> inputs;
  for (const auto& path : paths) {
    std::vector<std::filesystem::path> files;
    if (std::filesystem::is_directory(path)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());  // a fixed order, for reproducible runs
    } else {
      files.push_back(path);
    }
    for (const auto& file : files) inputs.push_back(read_file(file));
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no input files under the paths given\n");
    return 2;
  }
  for (const auto& input : inputs) run(input);
  std::printf("%zu inputs ran\n", inputs.size());
  std::fflush(stdout);
  if (mutants == 0) return 0;

  std::printf("mutating with seed %llu\n", static_cast<unsigned long long>(seed));
  std::fflush(stdout);  // said before a crash can end the program
  std::mt19937_64 random(seed);
  const auto start = std::chrono::steady_clock::now();
  long ran = 0;
  bool out_of_time = false;
  for (long round = 0; round < mutants && !out_of_time; ++round) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      run(mutate(inputs[i], inputs[random() % inputs.size()], random));
      ++ran;
      if (max_seconds > 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                           start).count() >= max_seconds) {
        out_of_time = true;
        break;
      }
    }
  }
  std::printf("%ld mutants ran (seed %llu)%s\n", ran, static_cast<unsigned long long>(seed),
              out_of_time ? ", stopped by --max-seconds" : "");
  return 0;
}
