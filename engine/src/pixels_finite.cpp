#include "pixels_finite.h"

#include <cstring>

#include "tandem/error.h"

namespace tandem {

void check_pixels_finite(const DatasetView& view, int64_t first_row, const std::string& what,
                         const char* consequence) {
  if (view.pixel_type != PixelType::Float32) return;  // uint8 pixels are finite
  const auto* row = static_cast<const unsigned char*>(view.pixels);
  const size_t row_bytes = size_t(view.features) * sizeof(float);
  for (int64_t r = 0; r < view.rows; ++r, row += row_bytes) {
    // The exponent bits all set (NaN or infinity), tested on the bits: a loop the compiler
    // vectorises (std::isfinite's was about 1.7x slower), with no early exit within a row.
    bool bad = false;
    for (size_t k = 0; k < row_bytes; k += sizeof(float)) {
      uint32_t bits;
      std::memcpy(&bits, row + k, sizeof bits);
      bad |= (bits & 0x7f800000u) == 0x7f800000u;
    }
    if (bad)
      throw InputError(what + ": row " + std::to_string(first_row + r) +
                       " holds a pixel that is not finite (NaN or infinity); " + consequence);
  }
}

}  // namespace tandem
