#include "array_rows.h"

#include "gil.h"
#include "split_labels.h"
#include "tandem/error.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>

namespace py = pybind11;

namespace tandem::python {

namespace {

std::string shape_text(const py::array& a) {
  std::string text = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) text += (i ? ", " : "") + std::to_string(a.shape(i));
  return text + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_text(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

bool c_contiguous(const py::array& a) { return (a.flags() & py::array::c_style) != 0; }
bool aligned(const py::array& a) { return (a.flags() & kAlignedFlag) != 0; }

// By type number, not identity: an array that came through pickle (a Dask transfer) carries an
// equal dtype object that is not numpy's canonical one.
// The byte order too: '>f4' has float32's type number, and read in place its numbers would be
// the bytes reversed.
bool is_uint8(const py::array& a) { return a.dtype().num() == py::dtype::of<uint8_t>().num(); }
bool is_float32(const py::array& a) {
  return a.dtype().num() == py::dtype::of<float>().num() &&
         a.dtype().attr("isnative").cast<bool>();
}

std::string no_class(const std::string& value, py::ssize_t row, int limit) {
  return "label " + value + " at row " + std::to_string(row) + " names no class (class ids are " +
         "whole numbers from 0 to " + std::to_string(limit - 1) + ")";
}

}  // namespace

std::shared_ptr<void> hold_python(py::object object) {
  auto* held = new py::object(std::move(object));
  return std::shared_ptr<void>(held, [](void* p) {
    // Released by a worker thread once it has trained on the block, or by whoever drops it.
    // While the interpreter exits, taking the GIL would end this thread inside a noexcept
    // deleter (see gil.h): the arrays are left to the exiting process instead.
    with_gil_unless_exiting([p] { delete static_cast<py::object*>(p); });
  });
}

ClassIds class_ids(py::handle labels_in, py::ssize_t rows, int limit) {
  if (limit < 1 || limit > 256)
    throw InputError("a model has 1 to 256 classes, not " + std::to_string(limit));
  ClassIds out;
  py::array labels = py::array::ensure(labels_in);
  if (!labels) throw py::type_error("labels must be an array (anything numpy.asarray takes)");
  if (labels.ndim() < 1 || labels.shape(0) != rows)
    throw InputError("labels must have one entry per row of images (" + std::to_string(rows) +
                     "), not shape " + shape_text(labels));
  // A column [rows, 1] holds class ids (one column can be no one-hot row), as the store reads
  // one (engine/src/split_labels.h).
  if (labels.ndim() == 2 && labels.shape(1) == 1)
    labels = py::array::ensure(labels.attr("reshape")(rows));
  const char kind = labels.dtype().kind();
  if (labels.ndim() == 1 && kind == 'f') {
    // Class ids as whole numbers in floats (3.0), as pandas and NumPy often leave them.
    auto wide = py::array_t<double, kReadInPlace>::ensure(labels);
    py::array_t<uint8_t> ids(rows);
    const double* in = wide.data();
    uint8_t* ids_out = ids.mutable_data();
    for (py::ssize_t r = 0; r < rows; ++r) {
      if (!is_class_id(in[r], limit)) {
        char value[32];
        std::snprintf(value, sizeof value, "%.17g", in[r]);  // 2.9999998 is not "3"
        throw InputError(no_class(value, r, limit));
      }
      ids_out[r] = uint8_t(in[r]);
    }
    labels = ids;
    out.copied = true;
  } else if (labels.ndim() == 2 && (kind == 'f' || kind == 'u' || kind == 'i')) {
    // One-hot rows (the seed's labels, float; integer ones too), read by the stores' rule
    // (one_hot_row_class). (A column [rows, 1] was taken as class ids above.)
    const py::ssize_t classes = labels.shape(1);
    if (classes < 2 || classes > limit)
      throw InputError("one-hot labels need 2 to " + std::to_string(limit) + " columns, not " +
                       shape_text(labels) + " (class ids go in a 1-D array)");
    auto dense = py::array_t<double, kReadInPlace>::ensure(labels);
    py::array_t<uint8_t> ids(rows);
    const double* in = dense.data();
    uint8_t* ids_out = ids.mutable_data();
    for (py::ssize_t r = 0; r < rows; ++r) {
      const char* why = nullptr;
      const int64_t best = one_hot_row_class(in + r * classes, classes, &why);
      if (best < 0)
        throw InputError("one-hot label row " + std::to_string(r) + " names no class (" + why +
                         ")");
      ids_out[r] = uint8_t(best);
    }
    labels = ids;
    out.num_classes = int(classes);
    out.copied = true;
  } else if (labels.ndim() == 1 && (kind == 'u' || kind == 'i')) {
    if (!is_uint8(labels) || !c_contiguous(labels)) {
      auto wide = py::array_t<int64_t, kReadInPlace>::ensure(labels);
      py::array_t<uint8_t> ids(rows);
      const int64_t* in = wide.data();
      uint8_t* ids_out = ids.mutable_data();
      for (py::ssize_t r = 0; r < rows; ++r) {
        if (in[r] < 0 || in[r] >= limit)
          throw InputError(no_class(std::to_string(in[r]), r, limit));
        ids_out[r] = uint8_t(in[r]);
      }
      labels = ids;
      out.copied = true;
    }
  } else {
    throw py::type_error("labels must be class ids (rows,) or (rows, 1), or one-hot rows "
                         "(rows, classes), of a number type, not " + dtype_text(labels) + " " +
                         shape_text(labels));
  }
  if (out.num_classes == 0) {  // class ids: as many classes as the largest names
    const uint8_t* ids = static_cast<const uint8_t*>(labels.data());
    for (py::ssize_t r = 0; r < rows; ++r) {
      // (Ids copied above were checked as they were copied; ids read in place are checked here.)
      if (!out.copied && ids[r] >= limit)
        throw InputError(no_class(std::to_string(ids[r]), r, limit));
      out.num_classes = std::max(out.num_classes, ids[r] + 1);
    }
  }
  out.ids = labels;
  return out;
}

ArrayRows array_rows(py::handle images_in, py::handle labels_in, bool need_labels) {
  ArrayRows out;
  py::array images = py::array::ensure(images_in);
  if (!images) throw py::type_error("images must be an array (anything numpy.asarray takes)");
  if (images.ndim() < 2)
    throw py::value_error("images must have one row per sample: shape (rows, features) or "
                          "(rows, height, width), not " + shape_text(images));
  const py::ssize_t rows = images.shape(0);
  py::ssize_t features = 1;
  for (py::ssize_t i = 1; i < images.ndim(); ++i) features *= images.shape(i);
  const char kind = images.dtype().kind();
  PixelType pixel_type;
  if (is_uint8(images)) {
    pixel_type = PixelType::UInt8;
    if (!c_contiguous(images)) {
      images = py::array_t<uint8_t, py::array::c_style | py::array::forcecast>::ensure(images);
      out.pixels_copied = true;
    }
  } else if (kind == 'f') {
    pixel_type = PixelType::Float32;
    if (!is_float32(images) || !c_contiguous(images) || !aligned(images)) {
      images = py::array_t<float, kReadInPlace>::ensure(images);
      out.pixels_copied = true;
    }
  } else {
    throw py::type_error("images must be uint8 (scaled by 1/255, as stored) or floating point "
                         "(used as they are), not " + dtype_text(images));
  }

  const bool have_labels = !labels_in.is_none();
  ClassIds labels;
  if (have_labels) {
    labels = class_ids(labels_in, rows, 256);
    out.labels_copied = labels.copied;
  } else if (need_labels) {
    throw py::value_error("labels are needed here (training and scoring compare against them)");
  }

  DatasetView& v = out.block.rows;
  v.pixel_type = pixel_type;
  v.pixels = images.data();
  v.labels = have_labels ? static_cast<const uint8_t*>(labels.ids.data()) : nullptr;
  v.rows = rows;
  v.features = features;
  v.num_classes = labels.num_classes;
  out.block.owner = hold_python(
      py::make_tuple(images, have_labels ? py::object(labels.ids) : py::object(py::none())));
  return out;
}

}  // namespace tandem::python
