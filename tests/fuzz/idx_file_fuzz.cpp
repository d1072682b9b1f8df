// Fuzz target: an IDX file (the MNIST family's format, what `tandem prepare --images/--labels`
// reads), raw or gzip-compressed, through read_idx. The input is written to a scratch file,
// since read_idx reads files. Malformed files are InputErrors, and a header claiming more data
// than the file holds must be refused before anything that size is allocated (libFuzzer's
// memory limit sees it otherwise). An accepted array written back reads as the same array.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz_target.h"
#include "idx_reader.h"

namespace {

std::string scratch(const char* what) {
  return (std::filesystem::temp_directory_path() /
          ("tandem-fuzz-idx-" + std::to_string(getpid()) + "-" + what))
      .string();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string input = scratch("input"), again = scratch("again");
  {
    std::ofstream out(input, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  tandem::IdxArray a;
  const bool ok = tandem::fuzz::accepts([&] { a = tandem::read_idx(input); });
  std::remove(input.c_str());
  if (!ok) return 0;
  FUZZ_CHECK(a.data.size() == static_cast<size_t>(a.element_count()) * a.element_size());
  for (const bool gzip : {false, true}) {
    tandem::IdxArray b;
    FUZZ_CHECK(tandem::fuzz::accepts([&] {
      tandem::write_idx(again, a, gzip);
      b = tandem::read_idx(again);
    }));
    std::remove(again.c_str());
    FUZZ_CHECK(b.type == a.type && b.dims == a.dims && b.data == a.data);
  }
  return 0;
}
