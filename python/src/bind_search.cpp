// The bookkeeping of asynchronous successive halving for Python: tandem._tandem._SuccessiveHalving,
// the class tandem search runs, so tandem.dask.search stops and promotes trials by the same rule.
// Pure logic, no threads: every call is quick and keeps the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "successive_halving.h"

namespace py = pybind11;
using namespace pybind11::literals;

namespace tandem::python {

void bind_search(py::module_& m) {
  py::class_<SuccessiveHalving>(
      m, "_SuccessiveHalving",
      "ASHA over a fixed list of trials (engine/src/successive_halving.h): rungs of "
      "min_epochs * eta^k epochs up to max_epochs; a trial goes on when it ranks in the top "
      "1/eta of its rung. Statuses: pending, running, waiting, stopped, completed, failed.")
      .def(py::init<int, int, int, int>(), "trials"_a, "min_epochs"_a, "max_epochs"_a, "eta"_a,
           "InputError for trials < 1, min_epochs < 1, max_epochs < min_epochs or eta < 2.")
      .def_property_readonly("rung_epochs", &SuccessiveHalving::rung_epochs,
                             "The epochs (in total) a trial has trained at the end of each rung.")
      .def_property_readonly("trials", &SuccessiveHalving::trials)
      .def(
          "next",
          [](SuccessiveHalving& h) -> py::object {
            const std::optional<HalvingJob> job = h.next();
            if (!job) return py::none();
            return py::make_tuple(job->trial, job->rung, job->epochs);
          },
          "The next job for a free slot, (trial, rung, epochs in total at its end), or None: wait "
          "for a running job, or everything is done.")
      .def("report", &SuccessiveHalving::report, "trial"_a, "loss"_a,
           "The trial's running job ended with this validation loss (lower is better; NaN ranks "
           "last).")
      .def("fail", &SuccessiveHalving::fail, "trial"_a, "The trial's running job crashed.")
      .def("stop", &SuccessiveHalving::stop, "trial"_a,
           "Ends the trial where it is: its last finished rung stands.")
      .def("close", &SuccessiveHalving::close,
           "No more jobs will start: pending and waiting trials are stopped.")
      .def("in_contention", &SuccessiveHalving::in_contention, "trial"_a,
           "Whether the trial could still go on: pending, or waiting at a rung that may still "
           "promote it (not a loser of a settled rung).")
      .def("done", &SuccessiveHalving::done,
           "Nothing running and nothing left to start; then the trials still waiting (the "
           "losers) are stopped: until then a trial that fails gives its places to the next "
           "in line.")
      .def(
          "status", [](const SuccessiveHalving& h, int trial) { return to_string(h.status(trial)); },
          "trial"_a)
      .def("rung", &SuccessiveHalving::rung, "trial"_a,
           "The highest rung the trial finished (-1: none).")
      .def("loss", &SuccessiveHalving::loss, "trial"_a, "The trial's loss at that rung.")
      .def(
          "count",
          [](const SuccessiveHalving& h, const std::string& status) {
            for (TrialStatus s : {TrialStatus::Pending, TrialStatus::Running, TrialStatus::Waiting,
                                  TrialStatus::Stopped, TrialStatus::Completed, TrialStatus::Failed})
              if (status == to_string(s)) return h.count(s);
            throw py::value_error("no trial status '" + status + "'");
          },
          "status"_a, "How many trials have this status.");
}

}  // namespace tandem::python
