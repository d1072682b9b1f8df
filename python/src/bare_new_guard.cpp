#include "bare_new_guard.h"

#include <memory>
#include <set>
#include <string>

namespace py = pybind11;

namespace tandem::python {

static std::string public_name_of(py::handle type) {
  const std::string module = py::str(type.attr("__module__"));
  const std::string name = py::str(type.attr("__name__"));
  return (module == "tandem._tandem" ? "tandem" : module) + "." + name;
}

void refuse_bare_new(const std::vector<py::handle>& types) {
  // Any of them is refused, through whichever's __new__ (Role.__new__(WorkerRole) too).
  const auto refused = std::make_shared<std::set<PyObject*>>();
  for (const py::handle type : types) refused->insert(type.ptr());
  // Read before any is set below: a base's __new__ changes its subclasses' tp_new too.
  std::vector<newfunc> made_by;
  for (const py::handle type : types)
    made_by.push_back(reinterpret_cast<PyTypeObject*>(type.ptr())->tp_new);
  for (size_t i = 0; i < types.size(); ++i) {
    const py::handle type = types[i];
    py::cpp_function bare_new([refused, made_by = made_by[i]](
                                  py::handle cls, py::args args, py::kwargs kwargs) -> py::object {
      if (!PyType_Check(cls.ptr())) throw py::type_error("__new__(X): X must be a type");
      if (refused->count(cls.ptr()) != 0) {
        const std::string name = public_name_of(cls);
        // A class with a constructor has it as a method of its own; one without has only the
        // slot that says "No constructor defined!".
        const bool constructed = PyInstanceMethod_Check(cls.attr("__dict__")["__init__"].ptr());
        throw py::type_error(name + ".__new__ alone makes an object no method can use; " +
                             (constructed ? "call " + name + "(...)"
                                          : "get one from the calls that return one"));
      }
      PyObject* made =
          made_by(reinterpret_cast<PyTypeObject*>(cls.ptr()), args.ptr(), kwargs.ptr());
      if (made == nullptr) throw py::error_already_set();
      return py::reinterpret_steal<py::object>(made);
    });
    // Setting __new__ points the type's tp_new, and its subclasses', at it (slot_tp_new), for
    // T(...) too: below, once every type has its attribute, T(...) goes back to making objects
    // with pybind11's own tp_new (the attribute stays for T.__new__, a Python subclass's
    // __new__ included).
    type.attr("__new__") = py::staticmethod(bare_new);
  }
  for (size_t i = 0; i < types.size(); ++i) {
    auto* const t = reinterpret_cast<PyTypeObject*>(types[i].ptr());
    t->tp_new = made_by[i];
    PyType_Modified(t);
  }
}

}  // namespace tandem::python
