// A split's labels as the engine trains on them, one class index per row, from any layout a
// store may hold: class indices [rows] or [rows, 1] (integers, as `tandem prepare` writes them,
// or whole numbers in a float array, as pandas and NumPy pipelines often leave them), or one-hot
// rows [rows, classes >= 2] of any number type (the seed's layout: float32 rows from
// TensorFlow's reader, persisted by Dask as it is), each row's class its largest entry.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zarr/zarr_array.h"

namespace tandem {

// The most classes a one-hot labels array may have: class indices are bytes.
constexpr int64_t kMaxOneHotClasses = 256;

// The classes a one-hot labels array spells out (its second dimension, 2 or more), or 0 for
// class indices.
int64_t one_hot_classes(const zarr::ArrayMeta& labels);

// What makes `labels` no labels for `rows` images ("" when it is fine): neither layout, another
// number of rows, or one-hot rows wider than kMaxOneHotClasses.
std::string labels_layout_problem(const zarr::ArrayMeta& labels, int64_t rows);

// Every label as a class byte, each below `num_classes`. InputError naming `what`, the array and
// the row for a label out of range or a one-hot row that names no class (NaN, nothing above 0).
std::vector<uint8_t> read_class_labels(const zarr::Array& labels, int num_classes,
                                       const std::string& what);

}  // namespace tandem
