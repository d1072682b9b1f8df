// tandem predict's output for Python: tandem._tandem._Predictions writes a dask array's blocks
// (tandem.dask.predict) as the chunks of the same Zarr group `tandem predict` writes, through the
// engine's own writer (engine/src/predictor.h): the same metadata, the same chunk files, each
// written through a temporary file and a rename, and the same resume rule.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

#include "array_rows.h"
#include "gil.h"
#include "predictor.h"
#include "py_json.h"
#include "run_dir_lock.h"
#include "tandem/tandem.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace tandem::python {

namespace {

PredictionsLayout layout_of(int format, int64_t rows, int64_t chunk_rows, int64_t classes,
                            const std::string& fingerprint) {
  if (format != 2 && format != 3)
    throw InputError("zarr_format must be 2 or 3, not " + std::to_string(format));
  PredictionsLayout l;
  l.format = format == 2 ? zarr::Format::V2 : zarr::Format::V3;
  l.rows = rows;
  l.chunk_rows = chunk_rows;
  l.classes = classes;
  l.fingerprint = fingerprint;
  l.input_digests = true;  // a dask array has no files to fingerprint: its blocks are hashed
  return l;
}

}  // namespace

py::tuple predict_with_probabilities(const Model& model, py::handle images, int threads) {
  const ArrayRows rows = array_rows(images, py::none(), false);
  const DatasetView& view = rows.block.rows;
  const int64_t classes = model.config().classes();
  py::array_t<uint8_t> ids(py::ssize_t(view.rows));
  py::array_t<float> probabilities({py::ssize_t(view.rows), py::ssize_t(classes)});
  uint8_t* id_data = ids.mutable_data();
  float* p_data = probabilities.mutable_data();
  // Ctrl-C is looked at between two blocks of rows, as train does between steps.
  computing_without_gil([&] {
    predict_in_blocks(model, view, threads, id_data, p_data, look_at_signals_from_the_engine);
  });
  return py::make_tuple(ids, probabilities);
}

void bind_predict(py::module_& m) {
  m.def(
      "_class_ids",
      [](py::handle labels, py::ssize_t rows, int classes) {
        try {
          return class_ids(labels, rows, classes).ids;
        } catch (const py::type_error& e) {  // text or objects: bad input all the same
          throw InputError(e.what());
        }
      },
      "labels"_a, "rows"_a, "classes"_a,
      "Labels of `rows` images as uint8 class ids of a model of `classes` classes, checked as "
      "Model.evaluate checks them (tandem.dask.predict's accuracy): InputError naming the first "
      "label that names no class.");
  // tandem predict's OUT.lock, for tandem.dask.predict: one prediction at a time per output.
  struct OutputLock {
    std::unique_ptr<PredictionOutputLock> lock;
  };
  py::class_<OutputLock>(m, "_OutputLock",
                         "One prediction at a time per output: the lock tandem predict holds on "
                         "its --out (OUT.lock beside it), held until release() or the with "
                         "block's end.")
      .def(py::init([](const std::string& out) {
             return OutputLock{std::make_unique<PredictionOutputLock>(out, "out")};
           }),
           "out"_a)
      .def("release", [](OutputLock& l) { l.lock.reset(); })
      .def("__enter__", [](OutputLock& l) -> OutputLock& { return l; },
           py::return_value_policy::reference)
      .def("__exit__", [](OutputLock& l, py::args) { l.lock.reset(); });
  py::class_<PredictionsOutput>(
      m, "_Predictions",
      "A predictions group as tandem predict writes it (used by tandem.dask.predict).")
      .def(py::init([](const std::string& out, int format, int64_t rows, int64_t chunk_rows,
                       int64_t classes, const std::string& fingerprint,
                       const std::string& overwrite_hint, const std::string& output_id) {
             return PredictionsOutput(out, layout_of(format, rows, chunk_rows, classes,
                                                     fingerprint),
                                      overwrite_hint, output_id);
           }),
           "out"_a, "zarr_format"_a, "rows"_a, "chunk_rows"_a, "classes"_a, "fingerprint"_a,
           "overwrite_hint"_a, "output_id"_a = "",
           "Opens a prepared group; InputError when it is missing or was made for another "
           "layout or fingerprint. With output_id (what prepare returned to this run), Error "
           "when another run has taken the group over since.")
      .def_static(
          "prepare",
          [](const std::string& out, int format, int64_t rows, int64_t chunk_rows,
             int64_t classes, const std::string& fingerprint, py::dict attributes,
             bool overwrite, const std::string& overwrite_hint) {
            const PredictionsLayout layout =
                layout_of(format, rows, chunk_rows, classes, fingerprint);
            const nlohmann::json a = from_python(attributes);
            std::string id;
            without_gil([&] {
              id = prepare_predictions_output(out, layout, a, overwrite, overwrite_hint);
            });
            return id;
          },
          "out"_a, "zarr_format"_a, "rows"_a, "chunk_rows"_a, "classes"_a, "fingerprint"_a,
          "attributes"_a, "overwrite"_a, "overwrite_hint"_a,
          "Creates the group, or checks the one there (taking it over: earlier runs' writers "
          "stop) and removes an interrupted run's temporary files. Returns the output id this "
          "run's writers open the group with.")
      .def_static(
          "remove",
          [](const std::string& out) { without_gil([&] { remove_predictions_output(out); }); },
          "out"_a,
                  "Removes the predictions group at out (InputError if something else is "
                  "there).")
      .def_property_readonly("chunks", [](const PredictionsOutput& o) { return o.layout().chunks(); })
      .def("chunk_done", &PredictionsOutput::chunk_done, "chunk"_a,
           "Every file of the chunk exists at full size.")
      .def(
          "input_digest",
          [](const PredictionsOutput& o, int64_t chunk) -> py::object {
            std::string digest(PredictionsLayout::kDigestBytes, '\0');
            if (!o.read_input_digest(chunk, reinterpret_cast<uint8_t*>(digest.data())))
              return py::none();
            return py::bytes(digest);
          },
          "chunk"_a, "The digest recorded for the chunk's input rows (bytes), or None.")
      .def(
          "predict_chunk",
          [](const PredictionsOutput& o, int64_t chunk, const Model& model, py::handle images,
             const std::string& input_digest, int threads) {
            const PredictionsLayout& l = o.layout();
            if (chunk < 0 || chunk >= l.chunks())
              throw InputError("no chunk " + std::to_string(chunk) + " in predictions of " +
                               l.describe());
            const ArrayRows rows = array_rows(images, py::none(), false);
            const DatasetView& view = rows.block.rows;
            if (view.rows != l.rows_in_chunk(chunk))
              throw InputError("chunk " + std::to_string(chunk) + " of predictions of " +
                               l.describe() + " has " + std::to_string(l.rows_in_chunk(chunk)) +
                               " rows; the block given has " + std::to_string(view.rows));
            if (input_digest.size() != PredictionsLayout::kDigestBytes)
              throw InputError("the digest of chunk " + std::to_string(chunk) + "'s input has " +
                               std::to_string(input_digest.size()) + " bytes, not " +
                               std::to_string(PredictionsLayout::kDigestBytes));
            if (model.config().classes() != l.classes)
              throw InputError("model " + model.config().describe() + " has " +
                               std::to_string(model.config().classes()) +
                               " outputs; the predictions have " + std::to_string(l.classes) +
                               " classes");
            computing_without_gil([&] {
              // Zeros beyond the rows of an edge chunk, as tandem predict writes them.
              std::vector<uint8_t> ids(size_t(l.chunk_rows), 0);
              std::vector<float> probabilities(size_t(l.chunk_rows * l.classes), 0.0f);
              predict_in_blocks(model, view, threads, ids.data(), probabilities.data(), {},
                                chunk * l.chunk_rows);
              o.write_chunk(chunk, ids.data(), probabilities.data(),
                            reinterpret_cast<const uint8_t*>(input_digest.data()));
            });
            return view.rows;
          },
          "chunk"_a, "model"_a, "images"_a, "input_digest"_a, "threads"_a = 1,
          "Predicts the rows of chunk `chunk` and writes its files, the input's digest (32 "
          "bytes) first; returns the rows.")
      .def("classes",
           [](const PredictionsOutput& o) {
             const PredictionsLayout& l = o.layout();
             py::array_t<uint8_t> out(py::ssize_t(l.rows));
             uint8_t* data = out.mutable_data();
             without_gil([&] {
               std::vector<uint8_t> ids(size_t(l.chunk_rows));
               for (int64_t c = 0; c < l.chunks(); ++c) {
                 if (!o.read_classes(c, ids.data()))
                   throw InputError(o.path() + ": chunk " + std::to_string(c) +
                                  " of the classes is missing");
                 std::copy(ids.begin(), ids.begin() + l.rows_in_chunk(c),
                           data + c * l.chunk_rows);
               }
             });
             return out;
           },
           "Every row's class, read back from the chunk files.");
}

}  // namespace tandem::python
