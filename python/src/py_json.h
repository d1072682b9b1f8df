// JSON documents (the engine's settings, states and specs) to and from Python objects, through
// Python's json module: exact for the numbers, strings, lists and dicts they hold.
#pragma once

#include <pybind11/pybind11.h>

#include <cmath>
#include <string>

#include <nlohmann/json.hpp>

#include "tandem/error.h"

namespace tandem::python {

inline pybind11::object to_python(const nlohmann::json& j) {
  return pybind11::module_::import("json").attr("loads")(j.dump());
}

// NumPy scalars (np.float32(0.01) from a grid of hyperparameters) are taken as the Python
// numbers they hold. NaN and infinity, which JSON cannot spell, are refused as InputError (a
// ValueError too), naming the key where it is a dict's own, instead of failing as a parse error;
// so is any other value json cannot write, with json's reason.
inline nlohmann::json from_python(pybind11::handle object) {
  namespace py = pybind11;
  if (py::isinstance<py::dict>(object))
    for (const auto& [key, given] : object.cast<py::dict>()) {
      py::object value = py::reinterpret_borrow<py::object>(given);
      if (!py::isinstance<py::float_>(value) && py::hasattr(value, "item")) {
        try {
          value = value.attr("item")();  // np.float32('nan') is checked as the float it holds
        } catch (py::error_already_set&) {
          continue;  // an array: json.dumps says what is wrong with it
        }
      }
      if (py::isinstance<py::float_>(value) && !std::isfinite(value.cast<double>()))
        throw InputError("'" + py::str(key).cast<std::string>() +
                         "' must be a finite number, got " + py::repr(value).cast<std::string>());
    }
  const py::cpp_function as_number([](py::handle o) -> py::object {
    if (py::hasattr(o, "item")) return o.attr("item")();
    throw py::type_error("Object of type " +
                         py::str(py::type::handle_of(o).attr("__name__")).cast<std::string>() +
                         " is not JSON serializable");
  });
  std::string text;
  try {
    text = py::module_::import("json")
               .attr("dumps")(object, py::arg("allow_nan") = false, py::arg("default") = as_number)
               .cast<std::string>();
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_ValueError) && !e.matches(PyExc_TypeError)) throw;
    const std::string why = py::str(e.value()).cast<std::string>();  // without the traceback
    throw InputError(why.find("Out of range float") != std::string::npos
                         ? "NaN and infinity are not values the settings take (" + why + ")"
                         : "a value the settings cannot take: " + why);
  }
  return nlohmann::json::parse(text);
}

}  // namespace tandem::python
