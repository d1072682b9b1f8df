// The `tandem._tandem` extension: the engine for Python. The package `tandem` (python/tandem/)
// re-exports it and adds `tandem.dask`. Engine errors arrive as tandem.Error (a RuntimeError) or,
// for bad input, tandem.InputError (also a ValueError), carrying the engine's own message.
#include <pybind11/pybind11.h>

#include <pthread.h>

#include "bare_new_guard.h"
#include "blas_kernels.h"
#include "gil.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace py = pybind11;

namespace tandem::python {
void bind_model(py::module_& m);
void bind_cluster(py::module_& m);
void bind_predict(py::module_& m);
void bind_search(py::module_& m);
void end_cluster_threads_at_exit();  // bind_cluster.cpp
}  // namespace tandem::python

PYBIND11_MODULE(_tandem, m) {
  m.doc() = "Tandem: train models with parameter servers, on CPUs and GPUs (native engine)";
  m.attr("__version__") = TANDEM_VERSION;
  // Before the interpreter finalizes: the cluster's threads end (a thread left in the engine
  // when the process exits meets libraries whose destructors have run), then engine threads
  // stop taking the GIL (gil.h).
  ::pthread_atfork(nullptr, nullptr, &tandem::python::forget_other_threads_work_after_fork);
  py::module_::import("atexit").attr("register")(py::cpp_function([] {
    try {
      tandem::python::end_cluster_threads_at_exit();
    } catch (...) {  // the gate closes whatever happened before it
      tandem::python::close_exit_gate();
      throw;
    }
    tandem::python::close_exit_gate();
  }));

  // The package's __init__ chooses the BLAS kernels (python/tandem/__init__.py): it knows
  // whether another library loaded OpenBLAS first.
  m.def("_blas_kernels", [] {
    const tandem::BlasKernels k = tandem::blas_kernels();
    return py::make_tuple(k.loaded, k.better);
  }, "The OpenBLAS kernels this process runs, and far faster ones the CPU runs (or \"\").");
  m.def("_blas_library", &tandem::blas_library_address,
        "Where the OpenBLAS library Tandem runs is mapped (its base address), or 0.");
  m.def("_use_better_blas_kernels", &tandem::use_better_blas_kernels,
        "Switches OpenBLAS to the better kernels (blas_kernels.h); a warning, or \"\".");

  // Created by hand: InputError is both a tandem.Error and a ValueError.
  static PyObject* error = PyErr_NewExceptionWithDoc(
      "tandem.Error", "An engine error; the message names what failed and where.",
      PyExc_RuntimeError, nullptr);
  py::tuple input_bases = py::make_tuple(py::handle(error), py::handle(PyExc_ValueError));
  static PyObject* input_error = PyErr_NewExceptionWithDoc(
      "tandem.InputError", "Bad input: a file, shape, value or setting the engine cannot take.",
      input_bases.ptr(), nullptr);
  m.attr("Error") = py::handle(error);
  m.attr("InputError") = py::handle(input_error);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const tandem::InputError& e) {
      PyErr_SetString(input_error, e.what());
    } catch (const tandem::Error& e) {
      PyErr_SetString(error, e.what());
    }
  });

  tandem::python::bind_model(m);
  tandem::python::bind_cluster(m);
  tandem::python::bind_predict(m);
  tandem::python::bind_search(m);
  // Every class bound above (the exceptions are Python's own).
  std::vector<py::handle> bound;
  for (const auto& entry : m.attr("__dict__").cast<py::dict>())
    if (PyType_Check(entry.second.ptr()) &&
        py::detail::get_type_info(reinterpret_cast<PyTypeObject*>(entry.second.ptr())))
      bound.push_back(entry.second);
  tandem::python::refuse_bare_new(bound);
}
