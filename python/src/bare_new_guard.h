// Calling a bound class's __new__ alone (T.__new__(T), no __init__) must not crash the
// interpreter.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

namespace tandem::python {

// pybind11 2.10 (Debian 12's) hands a method an object whose C++ value was never constructed when
// it was made with T.__new__(T) alone: the method runs on raw memory and the process crashes
// (pybind/pybind11#6153; PyTorch's bound classes crash the same way). After this, T.__new__(T)
// raises a TypeError saying to call T(...), while T(...) makes its objects as before. A Python
// subclass of T is left to pybind11: Sub(...) is checked by its metaclass (__init__ must run),
// Sub.__new__(Sub) alone is not guarded. `types`: every bound class of the module, in one call
// (a subclass's tp_new is set back after its base's).
void refuse_bare_new(const std::vector<pybind11::handle>& types);

}  // namespace tandem::python
