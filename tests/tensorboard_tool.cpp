// Helper for tests/python/tensorboard_read_test.py: writes one TensorBoard event file with
// TensorBoardWriter and prints its path.
//   tensorboard_tool DIR [TAG STEP VALUE WALL_TIME]...
// VALUE (a float32) and WALL_TIME (a double) may be hexadecimal floats (Python's float.hex()),
// so they arrive bit-exact; VALUE also takes nan, inf and -inf. With no scalars given, writes
// one epoch's worth: validation/loss, validation/accuracy and train/samples_per_s at step 55.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "tensorboard_writer.h"

namespace {

// The whole of `text` as a number. strtof/strtod set ERANGE for subnormals too, which are wanted
// here, so only the end pointer decides.
float parse_float(const char* s, char** e) { return std::strtof(s, e); }
double parse_double(const char* s, char** e) { return std::strtod(s, e); }
long long parse_int(const char* s, char** e) { return std::strtoll(s, e, 10); }

template <typename T>
T number(const char* text, const char* what, T (*fn)(const char*, char**)) {
  char* end = nullptr;
  const T v = fn(text, &end);
  if (end == text || *end != '\0') {
    std::fprintf(stderr, "tensorboard_tool: bad %s '%s'\n", what, text);
    std::exit(2);
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || (argc - 2) % 4 != 0) {
    std::fprintf(stderr, "usage: %s DIR [TAG STEP VALUE WALL_TIME]...\n", argv[0]);
    return 2;
  }
  try {
    tandem::TensorBoardWriter writer(argv[1]);
    if (argc == 2) {
      writer.add_scalar("validation/loss", 55, 1865.6f);
      writer.add_scalar("validation/accuracy", 55, 0.8742f);
      writer.add_scalar("train/samples_per_s", 55, 488100.0f);
    }
    for (int i = 2; i + 3 < argc; i += 4) {
      const long long step = number(argv[i + 1], "step", parse_int);
      const float value = number(argv[i + 2], "value", parse_float);
      const double wall_time = number(argv[i + 3], "wall time", parse_double);
      writer.add_scalar(argv[i], step, value, wall_time);
    }
    writer.close();
    std::printf("%s\n", writer.path().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tensorboard_tool: %s\n", e.what());
    return 1;
  }
  return 0;
}
