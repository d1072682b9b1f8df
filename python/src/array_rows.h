// NumPy arrays as rows the engine reads: images (N, features) or (N, H, W) as uint8 (scaled by
// 1/255 when read, as the engine's stores) or float32 (used as they are), and labels as class
// ids (N,) or one-hot rows (N, classes), the seed's format. What the engine can read in place is
// not copied: C-contiguous uint8 or float32 pixels (the float32 ones aligned) and C-contiguous
// uint8 labels. Anything else (another float type, misaligned float32, one-hot or wider integer
// labels) is converted once, and the result says so.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>

#include "feed_queue.h"

namespace tandem::python {

// The requirements on an array the engine reads in place as T: C order, of T's dtype (converted
// otherwise), and aligned for T (NPY_ARRAY_ALIGNED: a buffer taken at any offset,
// np.frombuffer(offset=1) or one a Dask worker received, can hold values at an address that is
// no multiple of their size). An array that misses one is copied by array_t<T, kReadInPlace>.
constexpr int kAlignedFlag = pybind11::detail::npy_api::NPY_ARRAY_ALIGNED_;
constexpr int kReadInPlace = pybind11::array::c_style | pybind11::array::forcecast | kAlignedFlag;

struct ArrayRows {
  FedBlock block;  // the view, and an owner holding the arrays it points into
  bool pixels_copied = false;
  bool labels_copied = false;
};

// Labels as uint8 class ids, read in place when they already are (C-contiguous uint8): class
// ids (rows,) or (rows, 1), integers or whole floats, or one-hot rows (rows, classes) by the
// stores' rule (one_hot_row_class). Every id must name one of `limit` classes (at most 256).
// Throws tandem::InputError naming the first bad row, TypeError for a type that holds no ids.
struct ClassIds {
  pybind11::array ids;  // uint8 [rows]
  int num_classes = 0;  // one-hot columns, or the largest id + 1
  bool copied = false;
};
ClassIds class_ids(pybind11::handle labels, pybind11::ssize_t rows, int limit);

// Throws InputError/ValueError/TypeError (through pybind11) naming the bad shape or dtype.
// `labels` may be None when `need_labels` is false. Must be called with the GIL held; the owner
// takes the GIL when it is released, from whichever thread.
ArrayRows array_rows(pybind11::handle images, pybind11::handle labels, bool need_labels);

// A Python object kept alive by a shared_ptr that takes the GIL to release it.
std::shared_ptr<void> hold_python(pybind11::object object);

}  // namespace tandem::python
