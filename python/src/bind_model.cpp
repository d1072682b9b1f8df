// Models, checkpoints and single-process training for Python: tandem.Model, tandem.load,
// tandem.train. Arrays come in through array_rows (read in place when the engine can), and the
// GIL is released while the engine computes.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <optional>
#include <string_view>

#include "array_rows.h"
#include "fit_divergence.h"
#include "gil.h"
#include "parameters_only.h"
#include "predictor.h"
#include "resumed_settings.h"
#include "tandem/tandem.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace tandem::python {

// bind_predict.cpp: (classes, probabilities) of every row, as tandem predict computes them.
py::tuple predict_with_probabilities(const Model& model, py::handle images, int threads);

namespace {

// A resumed run continues the state's (as tandem train --resume, resumed_settings.h): the
// settings not given come from it (layers, optimizer with its betas and epsilon, learning rate,
// batch, seed, shuffle), so that resume=state alone goes on as the uninterrupted run would, and
// one given differently is warned of, since the run then no longer goes on as it would have.
void continue_resumed_run(const Checkpoint& state, const GivenSettings& given, bool layers_given,
                          TrainConfig& config) {
  if (!layers_given) config.model = state.model.config();
  for (DifferentSetting& d : take_checkpointed_settings(state, given, "resume state", config)) {
    if (d.name == "shuffle") {
      d.given = d.given == "on" ? "True" : "False";
      d.theirs = d.theirs == "on" ? "True" : "False";
    }
    if (d.name == "keep") {
      d.name = "keep_best";
      d.given = d.given == "best" ? "True" : "False";
      d.theirs = d.theirs == "best" ? "True" : "False";
    }
    const std::string text = "resuming with " + d.name + "=" + d.given +
                             "; the state's run used " + d.theirs;
    // Level 1: tandem.train is the native function itself, so the caller's line is blamed.
    if (PyErr_WarnEx(PyExc_UserWarning, text.c_str(), 1) != 0) throw py::error_already_set();
  }
}

ModelConfig model_config(const std::vector<int64_t>& layers) {
  ModelConfig c;
  c.layers = layers;
  c.validate();
  return c;
}

py::dict eval_dict(const EvalResult& e) {
  return py::dict("loss_sum"_a = e.loss_sum, "loss_mean"_a = e.loss_mean, "accuracy"_a = e.accuracy,
                  "correct"_a = e.correct, "samples"_a = e.samples);
}

// An evaluation of no rows (no validation or test split was given, or one of no rows) is None,
// not a row of zeros that reads as a perfect loss.
py::object eval_or_none(const EvalResult& e) {
  if (e.samples == 0) return py::none();
  return eval_dict(e);
}

py::dict parameters_dict(const Model& model) {
  py::dict out;
  for (const NamedTensor& t : model.parameters()) {
    py::array_t<float> a(t.shape);
    std::copy(t.values.begin(), t.values.end(), a.mutable_data());
    out[py::str(t.name)] = a;
  }
  return out;
}

void set_parameters(Model& model, const py::dict& values) {
  // Every value is checked before any is set: a refused call leaves the model as it was.
  std::vector<std::pair<NamedTensor*, py::array_t<float, kReadInPlace>>> checked;
  for (auto [key, value] : values) {
    const std::string name = py::str(key);
    NamedTensor* target = nullptr;
    for (NamedTensor& t : model.parameters())
      if (t.name == name) target = &t;
    if (!target) throw InputError("model " + model.config().describe() + " has no parameter '" + name + "'");
    auto a = py::array_t<float, kReadInPlace>::ensure(value);
    if (!a) throw py::type_error("parameter '" + name + "' must be an array of numbers");
    std::vector<int64_t> shape(a.shape(), a.shape() + a.ndim());
    if (shape != target->shape)
      throw InputError("parameter '" + name + "' has the wrong shape for model " +
                       model.config().describe());
    // No model holds NaN or infinity: predict would blame a diverged run, and a checkpoint of it
    // (save) would be refused by every reader (load, --init).
    const float* begin = a.data();
    const float* bad =
        std::find_if(begin, begin + a.size(), [](float x) { return !std::isfinite(x); });
    if (bad != begin + a.size())
      throw InputError("parameter '" + name + "' holds a value that is not finite (" +
                       std::to_string(*bad) + " at flat index " + std::to_string(bad - begin) +
                       "); a model's parameters are finite numbers");
    checked.emplace_back(target, std::move(a));
  }
  for (auto& [target, a] : checked)
    std::copy(a.data(), a.data() + a.size(), target->values.begin());
}

py::dict summary_dict(const TrainSummary& s) {
  return py::dict("backend"_a = s.backend, "threads"_a = s.threads, "epochs"_a = s.epochs,
                  "kept_epoch"_a = s.kept_epoch, "steps"_a = s.steps, "samples"_a = s.samples,
                  "seconds"_a = s.seconds, "samples_per_s"_a = s.samples_per_s,
                  "train_loss_mean"_a = s.train_loss_mean,
                  "validation"_a = eval_or_none(s.validation), "test"_a = eval_or_none(s.test));
}

}  // namespace

void bind_model(py::module_& m) {
  py::class_<Model>(m, "Model", "A model's parameters: dense+ReLU layers and a softmax output.")
      .def(py::init([](const std::vector<int64_t>& layers) { return Model(model_config(layers)); }),
           "layers"_a = std::vector<int64_t>{784, 100, 10},
           "Zero parameters for layer widths from input to output (784-100-10: the seed's).")
      .def_static("initialized",
                  [](const std::vector<int64_t>& layers, uint64_t seed) {
                    const ModelConfig config = model_config(layers);
                    // Seconds for a large model: other Python threads go on meanwhile.
                    return computing_without_gil([&] { return Model::initialized(config, seed); });
                  },
                  "layers"_a = std::vector<int64_t>{784, 100, 10}, "seed"_a = 1,
                  "TensorFlow's initialisers; the same seed gives the same parameters everywhere.")
      .def_property_readonly("layers", [](const Model& model) { return model.config().layers; })
      .def("parameters", &parameters_dict, "The parameters by name (copies, float32).")
      .def("set_parameters", &set_parameters, "values"_a, "Replaces the named parameters.")
      .def("evaluate",
           [](const Model& model, py::handle images, py::handle labels, int threads) {
             const ArrayRows rows = array_rows(images, labels, true);
             // Zeros would read as a perfect loss (tandem eval refuses an empty split too).
             if (rows.block.rows.rows == 0)
               throw InputError("evaluate: no rows to score (images of shape (0, ...))");
             const EvalResult result = computing_without_gil(
                 [&] { return evaluate_model(model, rows.block.rows, threads); });
             // A NaN or infinite pixel is named (as tandem eval does), not taken for a model
             // that diverged.
             if (!std::isfinite(result.loss_sum))
               check_pixels_finite(rows.block.rows, 0, "images", kNoLossScored);
             return eval_dict(result);
           },
           "images"_a, "labels"_a, "threads"_a = 0,
           "Summed (the seed's score) and mean loss, and accuracy, on the CPU.")
      .def("predict",
           [](const Model& model, py::handle images, int threads,
              bool probabilities) -> py::object {
             if (probabilities) return predict_with_probabilities(model, images, threads);
             const ArrayRows rows = array_rows(images, py::none(), false);
             py::array_t<uint8_t> out(py::ssize_t(rows.block.rows.rows));
             uint8_t* classes = out.mutable_data();
             // Ctrl-C is looked at between two blocks of rows, as train does between steps.
             computing_without_gil([&] {
               predict_in_blocks(model, rows.block.rows, threads, classes, nullptr,
                                 look_at_signals_from_the_engine);
             });
             return std::move(out);
           },
           "images"_a, "threads"_a = 0, "probabilities"_a = false,
           "The predicted class of every row; with probabilities=True, (classes, "
           "probabilities): float32 [rows, classes], the logits' softmax as tandem predict "
           "writes it, whose first maximum is the class. InputError naming the first row that "
           "has no class: a NaN or infinite pixel, or pixels so large that its logits are not "
           "finite.")
      .def("save",
           [](const Model& model, const std::filesystem::path& path) {  // str or os.PathLike
             const std::string file = path.string();
             without_gil([&] {
               Checkpoint c;
               c.model = model;
               mark_parameters_only(c);
               c.extra["source"] = "tandem (Python)";
               save_checkpoint(file, c);
             });
           },
           "path"_a, "Writes the parameters as a safetensors checkpoint (atomically).")
      // Pickled (so a model travels to Dask workers: tandem.dask.predict) as a call of the
      // package's _model_from_state, not as Model.__new__ and a state: __new__ alone is refused
      // (bare_new_guard.h).
      .def("__reduce__",
           [](const Model& model) {
             return py::make_tuple(py::module_::import("tandem").attr("_model_from_state"),
                                   py::make_tuple(model.config().layers, parameters_dict(model)));
           })
      .def("__repr__", [](const Model& model) {
        return "tandem.Model(" + model.config().describe() + ", " +
               std::to_string(model.parameter_count()) + " parameters)";
      });

  m.def("load",
        [](const std::filesystem::path& path) {
          const std::string file = path.string();
          return without_gil([&] { return load_checkpoint(file).model; });
        },
        "path"_a,
        "The model of a checkpoint (tandem train, tandem launch, Model.save).");

  m.def(
      "train",
      [](py::object train_pair, py::object validation, py::object test,
         std::optional<std::vector<int64_t>> layers, int epochs, std::optional<int64_t> batch,
         std::optional<float> learning_rate, std::optional<std::string> optimizer,
         const std::string& backend, int threads, std::optional<uint64_t> seed,
         std::optional<bool> shuffle, std::optional<bool> keep_best,
         std::optional<std::function<void(py::dict)>> on_epoch, py::object resume,
         bool return_state, py::object init) -> py::tuple {
        // (images, labels) as a tuple, a list or any other sequence of two.
        auto pair = [](const py::object& o, const char* what) -> std::optional<ArrayRows> {
          if (o.is_none()) return std::nullopt;
          if (!PySequence_Check(o.ptr()) || PySequence_Size(o.ptr()) != 2)
            throw py::value_error(std::string(what) + " must be (images, labels)");
          const py::sequence t = o.cast<py::sequence>();
          return array_rows(t[0], t[1], true);
        };
        if (train_pair.is_none()) throw py::value_error("train must be (images, labels)");
        const ArrayRows train_rows = *pair(train_pair, "train");
        const std::optional<ArrayRows> val_rows = pair(validation, "validation");
        const std::optional<ArrayRows> test_rows = pair(test, "test");
        if (!init.is_none() && !resume.is_none())
          throw InputError("init and resume: give one, not both");
        std::optional<Checkpoint> resumed;
        if (!resume.is_none()) {
          if (!PyObject_CheckBuffer(resume.ptr()) || PyUnicode_Check(resume.ptr()))
            throw py::type_error(
                "resume must be the bytes of a training state (return_state=True)");
          const py::buffer_info state = resume.cast<py::buffer>().request();
          if (state.itemsize != 1 || state.ndim != 1 || state.strides[0] != 1)
            throw py::type_error("resume must be a contiguous bytes-like object");
          resumed = without_gil([&] {
            return decode_checkpoint(static_cast<const uint8_t*>(state.ptr),
                                     static_cast<size_t>(state.size), "resume state");
          });
        }
        TrainConfig config;
        config.epochs = epochs;
        config.backend = parse_backend(backend);
        config.threads = threads;
        config.keep_best = keep_best.value_or(true);
        config.model = model_config(layers ? *layers : std::vector<int64_t>{784, 100, 10});
        if (optimizer) config.optimizer.kind = parse_optimizer(*optimizer);
        if (learning_rate) config.optimizer.learning_rate = *learning_rate;
        if (batch) config.batch = *batch;
        if (seed) config.seed = *seed;
        if (shuffle) config.shuffle = *shuffle;
        if (resumed) {
          GivenSettings given;
          given.optimizer = optimizer.has_value();
          given.learning_rate = learning_rate.has_value();
          given.batch = batch.has_value();
          given.seed = seed.has_value();
          given.shuffle = shuffle.has_value();
          given.keep = keep_best.has_value();
          continue_resumed_run(*resumed, given, layers.has_value(), config);
        }
        if (!init.is_none()) {
          // As --init: a checkpoint file's parameters, the optimizer afresh (a file of
          // parameters alone, Model.save's or a cluster run's, cannot be resumed).
          // A training state's bytes given here (they read as a path cut at their first NUL:
          // "cannot open '") are said to go to resume=.
          const bool path_bytes = PyBytes_Check(init.ptr()) &&
                                  std::string_view(PyBytes_AS_STRING(init.ptr()),
                                                   size_t(PyBytes_GET_SIZE(init.ptr())))
                                          .find('\0') == std::string_view::npos;
          if (PyObject_CheckBuffer(init.ptr()) && !path_bytes)
            throw py::type_error("init takes the path of a checkpoint file; a training state's "
                                 "bytes (return_state=True) are resumed with resume=");
          config.init_path = py::module_::import("os").attr("fspath")(init).cast<std::string>();
        }
        config.validate();
        // Building the trainer (its parameters initialised), decoding a state to resume and
        // encoding the one returned take seconds for a large model: without the GIL, as the
        // training itself, so that other Python threads go on.
        const std::unique_ptr<Trainer> trainer_owned =
            computing_without_gil([&] { return std::make_unique<Trainer>(config); });
        Trainer& trainer = *trainer_owned;
        if (resumed) {
          computing_without_gil([&] { trainer.resume(*resumed, "resume state"); });
          resumed.reset();  // the trainer holds what it needs of it
        }
        if (on_epoch) {
          trainer.on_epoch = [cb = *on_epoch](const EpochReport& r) {
            // Not while Python exits: the thread waits for the exit there (gil.h).
            const bool called = with_gil_unless_exiting([&] {
              cb(py::dict("epoch"_a = r.epoch, "step"_a = r.step,
                          "train_loss_mean"_a = r.train_loss_mean,
                          "samples_per_s"_a = r.samples_per_s, "seconds"_a = r.seconds,
                          "validation"_a = eval_or_none(r.validation)));
            });
            if (!called) wait_for_the_exit();
          };
        }
        // Ctrl-C reaches Python only when the GIL is taken, which training in C++ would not do
        // without an on_epoch, and then only once an epoch. Signals are looked at every 100 ms.
        trainer.between_steps = [last = std::chrono::steady_clock::now()]() mutable {
          const auto now = std::chrono::steady_clock::now();
          if (now - last < std::chrono::milliseconds(100)) return;
          last = now;
          look_at_signals_from_the_engine();
        };
        const TrainSummary summary = computing_without_gil([&] {
          return trainer.fit(train_rows.block.rows, val_rows ? val_rows->block.rows : DatasetView{},
                             test_rows ? test_rows->block.rows : DatasetView{});
        });
        // NaN parameters are no model, and their state no resume (`tandem train` exits 1).
        if (const std::string why = why_diverged(summary); !why.empty())
          throw InputError("training diverged: " + why + " (try a lower learning_rate; or the "
                           "data holds NaN or infinite values)");
        if (!return_state) return py::make_tuple(trainer.model(), summary_dict(summary));
        const std::vector<uint8_t> state =
            computing_without_gil([&] { return encode_checkpoint(trainer.resume_state()); });
        return py::make_tuple(trainer.model(), summary_dict(summary),
                              py::bytes(reinterpret_cast<const char*>(state.data()), state.size()));
      },
      "train"_a, "validation"_a = py::none(), "test"_a = py::none(),
      "layers"_a = py::none(), "epochs"_a = 15, "batch"_a = py::none(),
      "learning_rate"_a = py::none(), "optimizer"_a = py::none(), "backend"_a = "auto",
      "threads"_a = 0, "seed"_a = py::none(), "shuffle"_a = py::none(),
      "keep_best"_a = py::none(),
      "on_epoch"_a = py::none(),
      "resume"_a = py::none(), "return_state"_a = false, "init"_a = py::none(),
      "Trains in this process (tandem train's engine) on (images, labels) arrays; returns "
      "(model, summary). Settings left as None take tandem train's defaults (layers [784, 100, "
      "10], batch 1000, learning_rate 0.01, optimizer 'adam', seed 1, shuffle True, keep_best "
      "True: the epoch of the lowest validation loss when validation is given), or with "
      "resume the state's run's. on_epoch(report) is called after every epoch. A report's and the "
      "summary's validation (and the summary's test) is None when no such split was given (or "
      "it has no rows). Raises InputError when training diverged (a NaN loss: judged by the "
      "kept parameters' validation loss, else the test loss, else the last epoch's training "
      "loss, summary['train_loss_mean']), as tandem train exits 1.\n\n"
      "return_state=True returns (model, summary, state): state is the run's whole training "
      "state (parameters, optimizer moments, step, epochs done; the kept epoch's with "
      "keep_best) as the bytes of a tandem checkpoint (safetensors). resume=state continues that "
      "run (tandem train --resume): epochs counts the total, so only the missing epochs train; "
      "the settings not given are the state's (a UserWarning says which given ones differ), and "
      "with the same threads the result is the uninterrupted run's, bit for bit on the CPU "
      "backend. Bytes travel anywhere a Python object does (pickle, Dask).\n\n"
      "init=PATH starts from the parameters of a checkpoint file, the optimizer afresh "
      "(tandem train --init): the way to go on from Model.save's file or a cluster run's "
      "model, which hold parameters alone (resume refuses them).");
}

}  // namespace tandem::python
