#include "tandem/dataset.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <new>
#include <stdexcept>

#include "idx_reader.h"
#include "tandem/error.h"

namespace tandem {
namespace {

constexpr int kMnistClasses = 10;

// `dir/name` if it exists, else `dir/name.gz`; the raw file wins because it skips decompression.
std::string find_idx_file(const std::string& dir, const std::string& name) {
  const std::string raw = (std::filesystem::path(dir) / name).string();
  const std::string gz = raw + ".gz";
  std::error_code ec;
  if (std::filesystem::exists(raw, ec)) return raw;
  if (std::filesystem::exists(gz, ec)) return gz;
  throw InputError("missing data file: neither " + raw + " nor " + gz + " exists");
}

IdxArray read_images(const std::string& path) {
  IdxArray a = read_idx(path);
  if (a.type != IdxType::UInt8 || a.dims.size() != 3)
    throw InputError(path + ": images are " + idx_type_name(a.type) + " with " +
                     std::to_string(a.dims.size()) +
                     " dimensions, expected uint8 with 3 dimensions (count, rows, cols)");
  return a;
}

// Copies rows [begin, end) of a checked image/label pair into a new Dataset.
Dataset copy_rows(const IdxArray& images, const IdxArray& labels, int64_t begin, int64_t end) {
  const int64_t features = images.dims[1] * images.dims[2];
  Dataset d(PixelType::UInt8, end - begin, features, kMnistClasses);
  std::copy(images.data.begin() + begin * features, images.data.begin() + end * features,
            d.pixel_data());
  std::copy(labels.data.begin() + begin, labels.data.begin() + end, d.label_data());
  return d;
}

}  // namespace

DatasetView DatasetView::slice(int64_t begin, int64_t end) const {
  if (begin < 0 || end < begin || end > rows)
    throw InputError("DatasetView::slice: rows [" + std::to_string(begin) + ", " +
                     std::to_string(end) + ") are outside a view of " + std::to_string(rows) +
                     " rows; expected 0 <= begin <= end <= rows");
  DatasetView v = *this;
  v.pixels = static_cast<const uint8_t*>(pixels) + begin * features * int64_t(pixel_bytes());
  v.labels = labels ? labels + begin : nullptr;
  v.rows = end - begin;
  return v;
}

Dataset::Dataset(PixelType type, int64_t rows, int64_t features, int num_classes)
    : type_(type), rows_(rows), features_(features), num_classes_(num_classes) {
  if (rows < 0 || features < 0 || num_classes < 1)
    throw InputError("Dataset: rows " + std::to_string(rows) + ", features " +
                     std::to_string(features) + ", classes " + std::to_string(num_classes) +
                     "; expected rows >= 0, features >= 0, classes >= 1");
  // Engine errors, as error.h promises, where the memory is not there (std::bad_alloc).
  const size_t pixel_bytes = type == PixelType::UInt8 ? 1 : 4;
  const std::string what = "Dataset: " + std::to_string(rows) + " rows of " +
                           std::to_string(features) + " pixels";
  if (features > 0 && size_t(rows) > std::numeric_limits<size_t>::max() / size_t(features) /
                                         pixel_bytes)
    throw InputError(what + " are more bytes than this machine addresses");
  try {
    pixels_.resize(size_t(rows) * size_t(features) * pixel_bytes);
    labels_.resize(size_t(rows));
  } catch (const std::bad_alloc&) {
    throw Error(what + ": cannot allocate their memory");
  } catch (const std::length_error&) {
    throw Error(what + ": more than a vector holds");
  }
}

DatasetView Dataset::view() const {
  DatasetView v;
  v.pixel_type = type_;
  v.pixels = pixels_.data();
  v.labels = labels_.data();
  v.rows = rows_;
  v.features = features_;
  v.num_classes = num_classes_;
  return v;
}

std::string default_data_dir() { return "/usr/share/datasets/fashion-mnist"; }

DataSplits load_mnist_splits(const std::string& dir, int64_t validation_rows) {
  // A mistyped path said "missing data file: neither PATH/train-images-idx3-ubyte nor ...".
  std::error_code ec;
  const auto status = std::filesystem::status(dir, ec);  // (not found is no error here)
  if (ec || !std::filesystem::is_directory(status))
    throw InputError(dir + ": " +
                     (ec ? ec.message()
                         : std::filesystem::exists(status) ? "not a directory"
                                                           : "no such file or directory") +
                     " (expected a directory of MNIST-format IDX files)");
  const std::string train_images_path = find_idx_file(dir, "train-images-idx3-ubyte");
  const std::string train_labels_path = find_idx_file(dir, "train-labels-idx1-ubyte");
  const std::string test_images_path = find_idx_file(dir, "t10k-images-idx3-ubyte");
  const std::string test_labels_path = find_idx_file(dir, "t10k-labels-idx1-ubyte");

  const IdxArray train_images = read_images(train_images_path);
  const IdxArray train_labels = read_idx_labels(train_labels_path);
  check_label_classes(train_labels_path, train_labels, kMnistClasses);
  check_label_count(train_images_path, train_images.dims[0], train_labels_path, train_labels);
  const int64_t n = train_images.dims[0];
  if (validation_rows < 0 || validation_rows >= n)
    throw InputError("validation rows " + std::to_string(validation_rows) +
                     " to split off the training set: expected 0 <= validation rows < " +
                     std::to_string(n) + " (the training rows in " + train_images_path + ")");

  DataSplits s;
  s.train = copy_rows(train_images, train_labels, 0, n - validation_rows);
  s.validation = copy_rows(train_images, train_labels, n - validation_rows, n);
  const IdxArray test_images = read_images(test_images_path);
  const IdxArray test_labels = read_idx_labels(test_labels_path);
  check_label_classes(test_labels_path, test_labels, kMnistClasses);
  check_label_count(test_images_path, test_images.dims[0], test_labels_path, test_labels);
  // A model trained on one image size cannot be tested on another.
  if (test_images.dims[1] != train_images.dims[1] || test_images.dims[2] != train_images.dims[2])
    throw InputError(test_images_path + ": images are " + std::to_string(test_images.dims[1]) +
                     "x" + std::to_string(test_images.dims[2]) + ", expected " +
                     std::to_string(train_images.dims[1]) + "x" +
                     std::to_string(train_images.dims[2]) + " as in " + train_images_path);
  s.test = copy_rows(test_images, test_labels, 0, test_images.dims[0]);
  s.source = dir;
  return s;
}

}  // namespace tandem
