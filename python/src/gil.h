// Leaving and taking back the GIL around the engine's blocking calls, in a way that survives the
// interpreter's exit. A thread that takes the GIL back while Python finalizes is ended with
// pthread_exit, a forced unwind; through a noexcept frame (py::gil_scoped_release's destructor,
// a shared_ptr deleter) that unwind is std::terminate. So the GIL is taken back here from a
// destructor that may throw, and a release that runs during finalization does not take it.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
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

// The gate engine threads pass to take the GIL where the thread's end cannot be survived (a
// shared_ptr deleter is noexcept). python_finalizing() alone left a window: a thread that found
// the interpreter alive could be ended taking the GIL a moment later, once finalizing had begun.
// The module closes the gate from an atexit hook (close_exit_gate), which runs before
// finalizing begins, and waits there, without the GIL, for the threads already inside.
struct ExitGate {
  std::atomic<int> inside{0};
  std::atomic<bool> closed{false};
  // The thread that closed it (PyThread_get_thread_ident), the one exiting: what it runs in a
  // later atexit hook goes on as before (parked, it would hang the exit).
  std::atomic<unsigned long> exiting_thread{0};
};
inline ExitGate exit_gate;

// Whether the gate is closed to this thread: closed, and this is not the exiting thread.
inline bool exit_gate_closed_here() {
  return exit_gate.closed.load() &&
         PyThread_get_thread_ident() != exit_gate.exiting_thread.load();
}

// Runs f() under the GIL from any thread, unless the interpreter is exiting: false then, and f
// is not run (what it would release is left to the exiting process).
template <typename F>
bool with_gil_unless_exiting(F&& f) {
  struct Inside {  // counted out however f ends (it may throw, as a Ctrl-C check does)
    Inside() { exit_gate.inside.fetch_add(1); }  // before looking at closed: see close_exit_gate
    ~Inside() { exit_gate.inside.fetch_sub(1); }
  } inside;
  if (exit_gate_closed_here() || python_finalizing()) return false;
  pybind11::gil_scoped_acquire gil;
  std::forward<F>(f)();
  return true;
}

// The engine's computations that Python threads run without the GIL (train, predict, evaluate):
// counted, so that the atexit hook waits for them. A daemon thread still in one when the process
// exits crashed in OpenBLAS, whose memory the exit's library destructors had freed under it.
struct EngineWork {
  std::atomic<int> running{0};
};
inline EngineWork engine_work;
inline thread_local bool in_engine_work = false;  // this thread is counted in engine_work

// In a child of fork() only the forking thread goes on: the parent's other threads' counts
// would have its exit wait 30 s for computations that are not there (registered at import).
inline void forget_other_threads_work_after_fork() {
  engine_work.running.store(in_engine_work ? 1 : 0);
}

// For a thread of the caller's in the engine (tandem.train on a daemon thread) that finds
// Python exiting: it waits here for the process to end, out of the engine, no longer counted as
// running there. Training on crashed in OpenBLAS once the exit had run the libraries'
// destructors; an exception ending it aborted the process once it reached Python.
[[noreturn]] inline void wait_for_the_exit() {
  if (in_engine_work) {
    in_engine_work = false;
    engine_work.running.fetch_sub(1);
  }
  for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
}

// Looks at Ctrl-C (the signals Python handles) from a thread in the engine, between two steps
// or blocks of its work: a handler's exception (KeyboardInterrupt) is thrown from here and ends
// the engine's call. Not while Python exits: the thread waits for the exit here instead.
inline void look_at_signals_from_the_engine() {
  const bool looked = with_gil_unless_exiting([] {
    if (PyErr_CheckSignals() != 0) throw pybind11::error_already_set();
  });
  if (!looked) wait_for_the_exit();
}

// The atexit hook (called with the GIL): no thread enters the gate after it, and the threads
// inside finish first. (With the sequentially consistent order, a thread either sees the gate
// closed or is counted inside before the count is read here.) Bounded: a thread inside that
// never finishes (or a count copied from a parent process by fork) does not hold the exit.
inline void close_exit_gate() {
  exit_gate.exiting_thread.store(PyThread_get_thread_ident());  // before the gate shuts
  exit_gate.closed.store(true);
  PyThreadState* state = PyEval_SaveThread();  // the threads inside need the GIL
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (exit_gate.inside.load() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // Then the computations still running finish, or wait for the exit (tandem.train between two
  // steps). Bounded as the roles' wait is: a prediction of more rows than 30 s takes is left to
  // the exit, said.
  constexpr int kComputeSeconds = 30;
  const auto computed = std::chrono::steady_clock::now() + std::chrono::seconds(kComputeSeconds);
  while (engine_work.running.load() > 0 && std::chrono::steady_clock::now() < computed)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  if (const int left = engine_work.running.load(); left > 0)
    std::fprintf(stderr,
                 "tandem: %d computation%s (train, predict, evaluate) still running %d s after "
                 "Python began to exit: the process may end abruptly\n",
                 left, left == 1 ? "" : "s", kComputeSeconds);
  PyEval_RestoreThread(state);
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

// without_gil for the engine's computations: counted in engine_work while they run. One that
// a thread other than the exiting one would start once the exit has begun waits for the exit
// instead (the libraries it needs go with it), unless it is nested in one already counted (an
// on_epoch callback's predict), which the exit hook waits for anyway.
template <typename F>
decltype(auto) computing_without_gil(F&& f) {
  return without_gil([&]() -> decltype(auto) {
    struct Counted {  // counted before the gate is looked at, as in with_gil_unless_exiting
      const bool outermost = !in_engine_work;
      Counted() {
        if (!outermost) return;
        in_engine_work = true;
        engine_work.running.fetch_add(1);
      }
      ~Counted() {
        if (!outermost || !in_engine_work) return;
        in_engine_work = false;
        engine_work.running.fetch_sub(1);
      }
    } counted;
    if (counted.outermost && exit_gate_closed_here()) wait_for_the_exit();
    return std::forward<F>(f)();
  });
}

}  // namespace tandem::python
