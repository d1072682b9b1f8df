#include "png_writer.h"

#include <fcntl.h>
#include <png.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "file_io.h"
#include "tandem/error.h"

namespace tandem {
namespace {

// libpng's own limit on image sides (png_set_user_limits' default); bigger images are refused.
constexpr int64_t kMaxSide = 1000000;

struct PngErrorState {
  char message[256];
};

void on_png_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<PngErrorState*>(png_get_error_ptr(png));
  if (state) std::snprintf(state->message, sizeof(state->message), "%s", message);
  png_longjmp(png, 1);
}

void on_png_warning(png_structp, png_const_charp) {}

// The libpng calls, kept free of C++ objects with destructors because an error longjmps out of
// them. Returns false with state->message set when libpng fails.
bool encode(FILE* file, const uint8_t* gray, int64_t height, int64_t width, int scale,
            uint8_t* row, PngErrorState* state) {
  png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, state, on_png_error,
                                            on_png_warning);
  if (png == nullptr) {
    std::snprintf(state->message, sizeof(state->message), "png_create_write_struct failed");
    return false;
  }
  png_infop info = png_create_info_struct(png);
  if (info == nullptr) {
    png_destroy_write_struct(&png, nullptr);
    std::snprintf(state->message, sizeof(state->message), "png_create_info_struct failed");
    return false;
  }
  if (setjmp(png_jmpbuf(png))) {
    png_destroy_write_struct(&png, &info);
    return false;
  }
  const auto out_width = static_cast<png_uint_32>(width * scale);
  const auto out_height = static_cast<png_uint_32>(height * scale);
  png_init_io(png, file);
  png_set_IHDR(png, info, out_width, out_height, 8, PNG_COLOR_TYPE_GRAY, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_write_info(png, info);
  for (int64_t y = 0; y < height; ++y) {
    const uint8_t* src = gray + y * width;
    for (int64_t x = 0; x < width; ++x) std::memset(row + x * scale, src[x], size_t(scale));
    for (int k = 0; k < scale; ++k) png_write_row(png, row);
  }
  png_write_end(png, info);
  png_destroy_write_struct(&png, &info);
  return true;
}

std::string errno_text(int err) { return std::strerror(err); }

template <typename T>
void write_png_impl(const std::string& path, const T* values, int64_t height, int64_t width,
                    const PngOptions& options) {
  if (height < 1 || width < 1 || options.scale < 1 || height * options.scale > kMaxSide ||
      width * options.scale > kMaxSide)
    throw InputError(path + ": cannot write a " + std::to_string(height) + "x" +
                     std::to_string(width) + " image at scale " + std::to_string(options.scale) +
                     "; expected sides >= 1, scale >= 1 and at most " + std::to_string(kMaxSide) +
                     " pixels a side after scaling");
  const size_t n = size_t(height) * size_t(width);
  double lo = options.lo, hi = options.hi;
  if (options.has_range) {
    if (!(std::isfinite(lo) && std::isfinite(hi) && lo <= hi))
      throw InputError(path + ": PNG value range [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "] is not a finite range with lo <= hi");
  } else {
    lo = INFINITY;
    hi = -INFINITY;
    for (size_t i = 0; i < n; ++i) {
      const double v = static_cast<double>(values[i]);
      if (!std::isfinite(v)) continue;
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    if (lo > hi) lo = hi = 0.0;  // nothing finite: all black
  }
  std::vector<uint8_t> gray(n);
  const double span = hi - lo;
  for (size_t i = 0; i < n; ++i) {
    const double v = static_cast<double>(values[i]);
    double level = 0.0;
    if (std::isnan(v) || span <= 0.0) level = 0.0;
    else level = std::round((v - lo) / span * 255.0);
    gray[i] = static_cast<uint8_t>(std::min(255.0, std::max(0.0, level)));
  }

  // As AtomicFile replaces: a link's file (the link kept), never a device or a FIFO, through
  // the same temporary name, so that what a killed write left (nothing else would remove it)
  // goes before this one.
  const std::string target = replacement_target(path);
  remove_unfinished_writes(parent_directory(target),
                           std::filesystem::path(target).filename().string() + ".tmp-", "tandem");
  const std::string tmp = temp_path(target);
  std::vector<uint8_t> row(size_t(width) * size_t(options.scale));
  Fd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666));
  if (fd.get() < 0) throw IoError(path + ": cannot create " + tmp + ": " + errno_text(errno));
  TempFileGuard guard(tmp);  // every failure below removes the temporary file
  FILE* file = fdopen(fd.get(), "wb");
  if (file == nullptr) {
    const int err = errno;
    throw IoError(path + ": fdopen failed: " + errno_text(err));
  }
  fd.release();  // fclose closes it now
  PngErrorState state{};
  const bool encoded = encode(file, gray.data(), height, width, options.scale, row.data(), &state);
  int err = 0;
  if (std::fflush(file) != 0 && err == 0) err = errno;
  if (encoded && err == 0 && ::fsync(fileno(file)) != 0) err = errno;
  if (std::fclose(file) != 0 && err == 0) err = errno;
  if (!encoded) throw IoError(path + ": libpng failed to write the image: " + state.message);
  if (err != 0) throw IoError(path + ": cannot write " + tmp + ": " + errno_text(err));
  if (std::rename(tmp.c_str(), target.c_str()) != 0) {
    err = errno;
    throw IoError(path + ": cannot rename " + tmp + " into place: " + errno_text(err));
  }
  guard.dismiss();
  fsync_parent_directory(target, "replacing");  // the rename itself survives a crash, as elsewhere
}

}  // namespace

void write_gray_png(const std::string& path, const double* values, int64_t height, int64_t width,
                    const PngOptions& options) {
  write_png_impl(path, values, height, width, options);
}

void write_gray_png(const std::string& path, const float* values, int64_t height, int64_t width,
                    const PngOptions& options) {
  write_png_impl(path, values, height, width, options);
}

}  // namespace tandem
