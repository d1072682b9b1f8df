// Grayscale PNG images of arrays (a sample, a mean or a variance image), written with libpng.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

struct PngOptions {
  int scale = 10;  // each value becomes a scale x scale block (nearest neighbour): 28x28 -> 280x280
  // Values at `lo` are black and at `hi` white. Without a range the image's own finite minimum and
  // maximum are used (as matplotlib's imshow does); a constant image is black.
  bool has_range = false;
  double lo = 0.0;
  double hi = 1.0;
};

// Writes `values` (height x width, row-major) as an 8-bit grayscale PNG at `path`, through a
// temporary file beside it and a rename, so `path` is either the old file or the complete new one.
// NaN values are black. Throws InputError for a bad size, scale or range and IoError naming the
// file when it cannot be written.
void write_gray_png(const std::string& path, const double* values, int64_t height, int64_t width,
                    const PngOptions& options = {});
void write_gray_png(const std::string& path, const float* values, int64_t height, int64_t width,
                    const PngOptions& options = {});

}  // namespace tandem
