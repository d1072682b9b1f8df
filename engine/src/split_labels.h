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

// The rules both readers of labels follow, the stores' (read_class_labels) and the Python
// package's for rows it is fed (python/src/array_rows.cpp):
// - a one-hot row's class is its largest entry (the first of equals), so smoothed labels (0.9
//   among 0.011) name their class too; a row holding NaN, or nothing above 0, names none: -1,
//   and *why says which;
int64_t one_hot_row_class(const double* row, int64_t classes, const char** why);
// - a class id stored as a number is a whole number in [0, limit) (3.0, not 3.5 or NaN).
bool is_class_id(double value, int64_t limit);

// Every label as a class byte, each below `num_classes`. InputError naming `what`, the array and
// the row for a label out of range or a one-hot row that names no class (NaN, nothing above 0).
// With `every_chunk_written` (a store `tandem prepare` wrote), a missing chunk is an InputError
// too, not labels of class 0.
std::vector<uint8_t> read_class_labels(const zarr::Array& labels, int num_classes,
                                       const std::string& what,
                                       bool every_chunk_written = false);

}  // namespace tandem
