#include "split_labels.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "array_stats.h"
#include "dataset_store.h"
#include "tandem/error.h"
#include "zarr/zarr_metadata.h"

namespace tandem {
namespace {

template <typename T>
double element(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return static_cast<double>(v);
}

double element_as_double(zarr::DType type, const uint8_t* p) {
  switch (type) {
    case zarr::DType::UInt8: return element<uint8_t>(p);
    case zarr::DType::Int8: return element<int8_t>(p);
    case zarr::DType::UInt16: return element<uint16_t>(p);
    case zarr::DType::Int16: return element<int16_t>(p);
    case zarr::DType::UInt32: return element<uint32_t>(p);
    case zarr::DType::Int32: return element<int32_t>(p);
    case zarr::DType::UInt64: return element<uint64_t>(p);
    case zarr::DType::Int64: return element<int64_t>(p);
    case zarr::DType::Float32: return element<float>(p);
    case zarr::DType::Float64: return element<double>(p);
  }
  return NAN;
}

// One-hot rows [n, classes] of `type` at `src` to class bytes (one_hot_row_class); `first` is
// the first row's index.
void one_hot_to_classes(zarr::DType type, const uint8_t* src, int64_t n, int64_t classes,
                        uint8_t* dst, int64_t first, int num_classes, const std::string& what,
                        const std::string& path) {
  const size_t item = zarr::dtype_size(type);
  std::vector<double> row(static_cast<size_t>(classes));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t c = 0; c < classes; ++c)
      row[size_t(c)] = element_as_double(type, src + size_t(r * classes + c) * item);
    const char* why = nullptr;
    const int64_t best = one_hot_row_class(row.data(), classes, &why);
    if (best < 0)
      throw InputError(what + ": one-hot label row " + std::to_string(first + r) +
                       " names no class (" + why + ") (" + path + ")");
    if (best >= num_classes)
      throw InputError(what + ": one-hot label row " + std::to_string(first + r) + " is class " +
                       std::to_string(best) + ", expected a class in [0, " +
                       std::to_string(num_classes) + ") (" + path + ")");
    dst[r] = static_cast<uint8_t>(best);
  }
}

// Class indices stored as floats: each a whole number in range (3.0, not 3.5 or NaN).
void float_labels_to_classes(zarr::DType type, const uint8_t* src, int64_t n, uint8_t* dst,
                             int64_t first, int num_classes, const std::string& what,
                             const std::string& path) {
  const size_t item = zarr::dtype_size(type);
  for (int64_t i = 0; i < n; ++i) {
    const double v = element_as_double(type, src + size_t(i) * item);
    if (!is_class_id(v, num_classes)) {
      char value[32];
      std::snprintf(value, sizeof value, "%.17g", v);  // 2.9999998 is not "3"
      throw InputError(what + ": label at index " + std::to_string(first + i) + " is " + value +
                       ", expected a class in [0, " + std::to_string(num_classes) + ") (" +
                       path + ")" + kMoreClassesHint);
    }
    dst[i] = static_cast<uint8_t>(v);
  }
}

bool is_float(zarr::DType type) {
  return type == zarr::DType::Float32 || type == zarr::DType::Float64;
}

}  // namespace

int64_t one_hot_row_class(const double* row, int64_t classes, const char** why) {
  int64_t best = 0;
  bool nan = false;
  for (int64_t c = 0; c < classes; ++c) {
    nan = nan || std::isnan(row[c]);
    if (row[c] > row[best]) best = c;
  }
  if (nan || classes == 0 || !(row[best] > 0)) {
    *why = nan ? "it holds NaN" : "no entry above 0";
    return -1;
  }
  return best;
}

bool is_class_id(double value, int64_t limit) {
  return value >= 0 && value < double(limit) && value == std::floor(value);
}

int64_t one_hot_classes(const zarr::ArrayMeta& labels) {
  return labels.shape.size() == 2 && labels.shape[1] >= 2 ? labels.shape[1] : 0;
}

std::string labels_layout_problem(const zarr::ArrayMeta& labels, int64_t rows) {
  const int64_t classes = one_hot_classes(labels);
  const std::string found = std::string(zarr::dtype_name(labels.dtype)) + " with shape " +
                            zarr::detail::dims_text(labels.shape);
  const bool indices = labels.shape.size() == 1 ||
                       (labels.shape.size() == 2 && labels.shape[1] == 1);
  if (!indices && classes == 0)
    return found + ", expected class indices [rows] or [rows, 1], or one-hot rows [rows, classes]";
  if (classes > kMaxOneHotClasses)
    return found + ": one-hot rows of " + std::to_string(classes) + " classes, expected at most " +
           std::to_string(kMaxOneHotClasses);
  if (labels.shape[0] != rows)
    return std::to_string(labels.shape[0]) + " labels for " + std::to_string(rows) + " images";
  return "";
}

std::vector<uint8_t> read_class_labels(const zarr::Array& labels, int num_classes,
                                       const std::string& what, bool every_chunk_written) {
  const zarr::ArrayMeta& meta = labels.meta();
  const int64_t rows = meta.shape.empty() ? 0 : meta.shape[0];
  const int64_t classes = one_hot_classes(meta);
  const std::string problem = labels_layout_problem(meta, rows);
  if (!problem.empty())
    throw InputError(what + ": labels: " + problem + " (" + labels.path() + ")");
  if (classes > 0 && classes != num_classes)
    throw InputError(what + ": one-hot labels of " + std::to_string(classes) +
                     " classes, but the store has " + std::to_string(num_classes) + " (" +
                     labels.path() + ")");
  std::vector<uint8_t> out(static_cast<size_t>(rows));
  const int64_t width = std::max<int64_t>(classes, 1);
  const int64_t band_rows = meta.chunks[0];
  std::vector<uint8_t> band(static_cast<size_t>(band_rows * width) * zarr::dtype_size(meta.dtype));
  std::vector<uint8_t> scratch;
  for (int64_t b = 0; b * band_rows < rows; ++b) {
    if (!read_row_band(labels, b, width, band.data(), scratch) && every_chunk_written)
      throw InputError(what + ": labels: " +
                       missing_chunk_message(labels, "a chunk of row band " + std::to_string(b)));
    const int64_t first = b * band_rows, n = std::min(band_rows, rows - first);
    uint8_t* const dst = out.data() + first;
    if (classes > 0)
      one_hot_to_classes(meta.dtype, band.data(), n, classes, dst, first, num_classes, what,
                         labels.path());
    else if (is_float(meta.dtype))
      float_labels_to_classes(meta.dtype, band.data(), n, dst, first, num_classes, what,
                              labels.path());
    else
      labels_to_classes(meta.dtype, band.data(), n, dst, first, num_classes, what, labels.path());
  }
  return out;
}

}  // namespace tandem
