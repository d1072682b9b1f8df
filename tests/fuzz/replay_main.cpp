// The fuzz targets' main() where libFuzzer is not linked in (a GCC build, CI): runs
// LLVMFuzzerTestOneInput once on each file named, or on each file under each directory named
// (the seed corpus and the inputs of crashes found and fixed), as libFuzzer does when it is given
// files. A crash or a failed property aborts; the exit status is 0 only when every input ran.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

void run_file(const std::filesystem::path& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  // Exactly the input's size, as libFuzzer gives: reading past it is an overflow that the address
  // sanitizer sees.
  std::vector<uint8_t> bytes(ec ? 0 : static_cast<size_t>(size));
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (ec || !in) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  LLVMFuzzerTestOneInput(bytes.empty() ? nullptr : bytes.data(), bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s FILE_OR_DIRECTORY...\n", argv[0]);
    return 2;
  }
  size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path path(argv[i]);
    if (std::filesystem::is_directory(path)) {
      std::vector<std::filesystem::path> files;
      for (const auto& entry : std::filesystem::recursive_directory_iterator(path))
        if (entry.is_regular_file()) files.push_back(entry.path());
      std::sort(files.begin(), files.end());  // a fixed order, for reproducible runs
      for (const auto& file : files) run_file(file), ++inputs;
    } else {
      run_file(path), ++inputs;
    }
  }
  if (inputs == 0) {
    std::fprintf(stderr, "no input files under the paths given\n");
    return 2;
  }
  std::printf("%zu inputs ran\n", inputs);
  return 0;
}
