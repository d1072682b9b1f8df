// Reading and writing IDX files, the format of the MNIST family of data sets.
//
// On disk: two zero bytes, a type code, the number of dimensions; each dimension as a big-endian
// uint32; then the elements, big-endian and row-major. Files may be gzip-compressed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem {

enum class IdxType : uint8_t {
  UInt8 = 0x08,
  Int8 = 0x09,
  Int16 = 0x0B,
  Int32 = 0x0C,
  Float32 = 0x0D,
  Float64 = 0x0E
};

// An IDX array in memory. `data` holds element_count() elements in HOST byte order.
struct IdxArray {
  IdxType type = IdxType::UInt8;
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;

  size_t element_size() const;
  int64_t element_count() const;  // product of dims (1 for no dims)
};

// Reads a raw or gzip-compressed IDX file (gzip is recognised by its 1f 8b magic). Throws
// InputError for a missing or malformed file and IoError when the system fails to read it.
IdxArray read_idx(const std::string& path);

// Writes `a` big-endian, gzip-compressed when `gzip` is set. Throws InputError when `a` is not a
// valid IDX array (dims, data size) and IoError when the file cannot be written.
void write_idx(const std::string& path, const IdxArray& a, bool gzip);

// Whether `dir` holds MNIST-format training images (train-images-idx3-ubyte, raw or .gz): a
// directory of IDX files, whatever else lies beside them.
bool holds_idx_images(const std::string& dir);

// "uint8", "int8", "int16", "int32", "float32", "float64"; "unknown" for other codes.
const char* idx_type_name(IdxType type);

// MNIST-family label files, checked alike (and worded alike) by the engine's loader and by
// `tandem prepare`; each failure is an InputError naming the file.
// Reads a label file: uint8 with one dimension.
IdxArray read_idx_labels(const std::string& path);
// Every label in `labels` (read from `path`) is below `num_classes`.
void check_label_classes(const std::string& path, const IdxArray& labels, int num_classes);
// One label per image: `image_count` images in `images_path`, labels.dims[0] in `labels_path`.
void check_label_count(const std::string& images_path, int64_t image_count,
                       const std::string& labels_path, const IdxArray& labels);

}  // namespace tandem
