// JSON documents (the engine's settings, states and specs) to and from Python objects, through
// Python's json module: exact for the numbers, strings, lists and dicts they hold.
#pragma once

#include <pybind11/pybind11.h>

#include <nlohmann/json.hpp>

namespace tandem::python {

inline pybind11::object to_python(const nlohmann::json& j) {
  return pybind11::module_::import("json").attr("loads")(j.dump());
}

inline nlohmann::json from_python(pybind11::handle object) {
  const std::string text = pybind11::module_::import("json").attr("dumps")(object).cast<std::string>();
  return nlohmann::json::parse(text);
}

}  // namespace tandem::python
