// Leaving and taking back the GIL around the engine's blocking calls, in a way that survives the
// interpreter's exit. A thread that takes the GIL back while Python finalizes is ended with
// pthread_exit, a forced unwind; through a noexcept frame (py::gil_scoped_release's destructor,
// a shared_ptr deleter) that unwind is std::terminate. So the GIL is taken back here from a
// destructor that may throw, and a release that runs during finalization does not take it.
#pragma once

#include <pybind11/pybind11.h>

#include <utility>

namespace tandem::python {

// True once the interpreter has started to finalize (or has finished).
inline bool python_finalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return !Py_IsInitialized() || Py_IsFinalizing();
#else
  return !Py_IsInitialized() || _Py_IsFinalizing();
#endif
}

// Runs f() without the GIL (the caller holds it) and returns its result.
template <typename F>
decltype(auto) without_gil(F&& f) {
  struct Retake {
    PyThreadState* state;
    ~Retake() noexcept(false) { PyEval_RestoreThread(state); }
  } retake{PyEval_SaveThread()};
  return std::forward<F>(f)();
}

}  // namespace tandem::python
