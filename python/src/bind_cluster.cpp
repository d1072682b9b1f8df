// The cluster for Python: tandem.Coordinator, the roles (ParameterServerRole, WorkerRole,
// ScorerRole) each running its loop on a native thread with the GIL released, and
// tandem.scores(). A role's error is kept and raised by join() with the engine's message.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>
#include <unistd.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <future>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <thread>

#include "array_rows.h"
#include "gil.h"
#include "cluster_ranks.h"
#include "cluster_roles.h"
#include "cluster_run.h"
#include "coordinator.h"
#include "driven_coordinator.h"
#include "ps_client.h"
#include "py_json.h"
#include "score_subscriber.h"
#include "seconds_to_ms.h"
#include "tandem/tandem.h"

namespace py = pybind11;
using namespace pybind11::literals;
using json = nlohmann::json;

namespace tandem::python {

namespace {

// 0.5 as "0.5" (not std::to_string's "0.500000", nor int()'s "0").
std::string seconds_text(double seconds) {
  std::ostringstream text;
  text << seconds;
  return text.str();
}

// Waits by `attempt(ms)`, which waits up to ms without the GIL and says whether what it waits
// for has come, in slices of at most 100 ms: between them Ctrl-C reaches Python (raised as
// KeyboardInterrupt), which one long wait would hold off until its end. Negative or infinite
// timeout_s: no end. False once timeout_s has passed.
template <typename Attempt>
bool wait_in_slices(double timeout_s, Attempt attempt) {
  seconds_to_ms(timeout_s);  // refuses NaN (InputError: a ValueError too)
  const bool forever = timeout_s < 0 || timeout_s > 1e9;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(forever ? 0 : int64_t(timeout_s * 1000.0));
  for (;;) {
    int slice_ms = 100;
    if (!forever) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      slice_ms = int(std::clamp<int64_t>(left.count(), 0, 100));
    }
    if (without_gil([&] { return attempt(slice_ms); })) return true;
    if (PyErr_CheckSignals() != 0) throw py::error_already_set();
    if (!forever && std::chrono::steady_clock::now() >= deadline) return false;
  }
}

// The run's settings from a dict over the defaults (keys as in RunSettings' JSON: batch, lr,
// model "784-100-10", ps_mode, ...). An unknown key is an error naming the known ones.
RunSettings settings_from(const py::dict& given) {
  return run_settings_over_defaults(from_python(given));
}

ClusterPhase parse_phase(const std::string& text) {
  for (ClusterPhase p : {ClusterPhase::Starting, ClusterPhase::Training, ClusterPhase::Draining,
                         ClusterPhase::Done, ClusterPhase::Failed})
    if (text == to_string(p)) return p;
  throw InputError("phase must be starting, training, draining, done or failed, not '" + text + "'");
}

// A role's thread and what it shares with the role object, so either may go first.
struct RoleThreadState {
  RoleOptions options;
  std::mutex mutex;
  std::condition_variable changed;
  bool started = false, done = false;
  std::exception_ptr error;
};

// What ends before the interpreter does (end_cluster_threads_at_exit, the module's atexit
// hook): every coordinator and role thread this module started and that still runs. A thread left
// in the engine when the process exits meets libraries whose destructors have run (a worker in
// OpenBLAS's sgemm crashed on its freed buffers), and a role whose Python object is never
// destroyed (held by the frame of a daemon thread the exit ended) was left running.
struct RunningAtExit {
  std::mutex mutex;
  // Weak: an object gone (its thread joined, or a coordinator closed) is not kept for the exit.
  std::vector<std::weak_ptr<Coordinator>> coordinators;
  std::vector<std::weak_ptr<RoleThreadState>> roles;
  // The process that noted them: a child made by fork has their copies but not their threads
  // (joining a coordinator's thread there would wait for ever).
  pid_t owner = ::getpid();

  // The lists of this process (a forked child's start empty), under `mutex`.
  void forget_another_process_locked() {
    if (owner == ::getpid()) return;
    coordinators.clear();
    roles.clear();
    owner = ::getpid();
  }
  template <typename T>
  void add(std::vector<std::weak_ptr<T>>& list, const std::shared_ptr<T>& item) {
    std::lock_guard<std::mutex> lock(mutex);
    forget_another_process_locked();
    list.erase(std::remove_if(list.begin(), list.end(), [](const auto& w) { return w.expired(); }),
               list.end());
    list.push_back(item);
  }
  void add(const std::shared_ptr<Coordinator>& c) { add(coordinators, c); }
  void add(const std::shared_ptr<RoleThreadState>& r) { add(roles, r); }
};
RunningAtExit& running_at_exit() {
  static RunningAtExit* running = new RunningAtExit;  // never destroyed: used at exit
  return *running;
}

class PyCoordinator {
 public:
  PyCoordinator(const py::dict& settings, int ps, int workers, int scorers, double target,
                int64_t max_epochs, double max_seconds, const std::string& bind,
                const std::string& scores_bind, const std::string& advertise_host,
                double startup_timeout_s, double heartbeat_timeout_s, bool resume)
      : settings_(settings_from(settings)) {
    // Sync mode aggregates one gradient per worker unless told otherwise (the seed's
    // replicas_to_aggregate = len(dask_spec['worker']); tandem launch's default too).
    if (!settings.contains("replicas_to_aggregate") || settings_.replicas_to_aggregate == 0)
      settings_.replicas_to_aggregate = workers;
    ClusterCoordinatorOptions shape;  // its settings string is not read: settings_ is the run's
    shape.ps = ps;
    shape.workers = workers;
    shape.scorers = scorers;
    shape.target = target;
    shape.max_epochs = max_epochs;
    shape.max_seconds = max_seconds;
    shape.bind = bind;
    shape.scores_bind = scores_bind;
    shape.advertise_host = advertise_host;
    shape.startup_timeout_s = startup_timeout_s;
    shape.heartbeat_timeout_s = heartbeat_timeout_s;
    shape.resume = resume;
    const DrivenCoordinator driven = driven_coordinator_options(settings_, shape, "resume=True");
    resumed_epochs_ = driven.options.first_epoch;
    coordinator_ = std::make_unique<Coordinator>(driven.options);
    running_at_exit().add(coordinator_);
    std::fputs(driven.resume_note.c_str(), stderr);
  }

  Coordinator& get() { return *shared(); }
  // The coordinator, kept alive by the copy: a wait without the GIL holds one, so close() from
  // another thread cannot destroy it under the wait (the wait then ends at its next slice).
  std::shared_ptr<Coordinator> shared() const {
    if (!coordinator_) throw Error("this coordinator is closed");
    return coordinator_;
  }
  // Whether close() was called: read without the GIL by waits, to end at their next slice.
  void check_open() const {
    if (closed_) throw Error("this coordinator was closed while waiting");
  }
  const RunSettings& settings() const { return settings_; }
  int64_t resumed_epochs() const { return resumed_epochs_; }


  void close() {
    std::shared_ptr<Coordinator> closing;
    closing.swap(coordinator_);  // with the GIL: no other call is between get() and its use
    closed_ = true;
    without_gil([&] { closing.reset(); });  // the serving thread is joined (by the last holder)
  }

 private:
  RunSettings settings_;
  int64_t resumed_epochs_ = 0;
  std::shared_ptr<Coordinator> coordinator_;
  std::atomic<bool> closed_{false};
};

// A role's loop on its own thread. The thread holds the shared state, so a role object that
// Python drops while its loop still runs (it ends when the coordinator says so, or has gone
// silent) can let go of the thread safely.
class PyRole {
 public:
  using Body = void (*)(const RoleOptions&);

  PyRole(Body body, RoleOptions options) : body_(body), state_(std::make_shared<State>()) {
    state_->options = std::move(options);
    state_->options.cancel = std::make_shared<std::atomic<bool>>(false);
  }
  virtual ~PyRole() {
    if (!thread_.joinable()) return;
    stop();
    if (state_->options.feed) state_->options.feed->close("the worker role object was dropped");
    const bool done = without_gil([&] {
      std::unique_lock<std::mutex> lock(state_->mutex);
      return state_->changed.wait_for(lock, std::chrono::seconds(2), [&] { return state_->done; });
    });
    if (done) thread_.join();
    else thread_.detach();  // stuck in a request: it ends at the request's timeout
  }

  void start() {
    // (Not thread_.joinable(): join() joins it, and a second run would find done and the first
    // run's error still set.)
    if (state_->started) throw Error("this role has been started already; a role runs once");
    std::shared_ptr<State> state = state_;
    Body body = body_;
    thread_ = std::thread([state, body] {
      try {
        body(state->options);
      } catch (...) {
        state->error = std::current_exception();
        if (state->options.feed) state->options.feed->close("the worker stopped on an error");
      }
      std::lock_guard<std::mutex> lock(state->mutex);
      state->done = true;
      state->changed.notify_all();
    });
    running_at_exit().add(state);
    std::lock_guard<std::mutex> lock(state->mutex);
    state->started = true;  // once the thread exists: a role whose thread could not start can be
                            // started again
  }

  // True once the loop has ended (raising its error, if any); false after timeout_s.
  bool join(double timeout_s) {
    if (!state_->started) throw Error("this role has not been started");
    const bool done = wait_in_slices(timeout_s, [&](int ms) {
      std::unique_lock<std::mutex> lock(state_->mutex);
      return state_->changed.wait_for(lock, std::chrono::milliseconds(ms),
                                      [&] { return state_->done; });
    });
    if (!done) return false;
    if (thread_.joinable()) thread_.join();
    if (state_->error) std::rethrow_exception(state_->error);
    return true;
  }

  // Ends the role from this process, as if the run were over (see RoleOptions::cancel).
  void stop() { *state_->options.cancel = true; }

  bool running() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->started && !state_->done;
  }
  const RoleOptions& options() const { return state_->options; }

 private:
  using State = RoleThreadState;
  Body body_;
  std::shared_ptr<State> state_;
  std::thread thread_;
};

// For a run under CURVE: the coordinator's public key (Z85) and this side's key file (empty: a
// throwaway pair), checked.
transport::CurveClientKeys curve_keys(const std::string& server_key, const std::string& key_file) {
  return transport::curve_client_keys(server_key, key_file, "curve_server_key");
}

RoleOptions role_options(const std::string& coordinator, const std::string& name,
                         double coordinator_lost_s, const std::string& curve_server_key,
                         const std::string& curve_key_file) {
  RoleOptions o;
  o.coordinator = coordinator;
  o.name = name;
  o.coordinator_lost_ms = lost_after_to_ms(coordinator_lost_s, "coordinator_lost_s");
  o.coordinator_curve = curve_keys(curve_server_key, curve_key_file);
  return o;
}

class PyPsRole : public PyRole {
 public:
  PyPsRole(const std::string& coordinator, const std::string& name, const std::string& bind,
           const std::string& advertise, double coordinator_lost_s,
           const std::string& curve_server_key, const std::string& curve_key_file)
      : PyRole(&run_ps_role, [&] {
          RoleOptions o = role_options(coordinator, name, coordinator_lost_s, curve_server_key,
                                       curve_key_file);
          o.bind = bind;
          o.advertise = advertise;
          return o;
        }()) {}
};

class PyWorkerRole : public PyRole {
 public:
  PyWorkerRole(const std::string& coordinator, const std::string& name, size_t capacity,
               double coordinator_lost_s, const std::string& curve_server_key,
               const std::string& curve_key_file)
      : PyRole(&run_worker_role, [&] {
          RoleOptions o = role_options(coordinator, name, coordinator_lost_s, curve_server_key,
                                       curve_key_file);
          o.feed = std::make_shared<FeedQueue>(capacity);
          return o;
        }()) {}

  // Queues (images, labels) for training; the arrays are read where they lie when they can be.
  py::dict feed(py::handle images, py::handle labels, std::optional<double> timeout_s) {
    ArrayRows rows = array_rows(images, labels, true);
    const auto address = reinterpret_cast<uintptr_t>(rows.block.rows.pixels);
    const int64_t count = rows.block.rows.rows;
    FeedQueue& queue = *options().feed;
    // A copy each try (a view and a shared owner): a try that times out drops only its copy.
    const bool queued = wait_in_slices(timeout_s ? *timeout_s : -1.0,
                                       [&](int ms) { return queue.push(rows.block, ms); });
    if (!queued) {
      PyErr_SetString(PyExc_TimeoutError, "the worker's feed queue stayed full");
      throw py::error_already_set();
    }
    return py::dict("rows"_a = count, "pixels_copied"_a = rows.pixels_copied,
                    "labels_copied"_a = rows.labels_copied, "pixels_address"_a = address);
  }
  FeedQueue& queue() { return *options().feed; }
};

class PyScorerRole : public PyRole {
 public:
  PyScorerRole(const std::string& coordinator, const std::string& name, py::object validation,
               double coordinator_lost_s, const std::string& curve_server_key,
               const std::string& curve_key_file)
      : PyRole(&run_scorer_role, [&] {
          RoleOptions o = role_options(coordinator, name, coordinator_lost_s, curve_server_key,
                                       curve_key_file);
          if (!validation.is_none()) {
            py::tuple pair = validation.cast<py::tuple>();
            if (pair.size() != 2) throw py::value_error("validation must be (images, labels)");
            o.validation = std::make_shared<const FedBlock>(array_rows(pair[0], pair[1], true).block);
            // (As the role would, at its start: said here, where the rows are given.)
            if (o.validation->rows.rows == 0)
              throw InputError("validation: no rows (images of shape (0, ...)): no loss can be "
                               "scored on them, and a loss of 0 would meet any target");
          }
          return o;
        }()) {}
};

class ScoreStream {
 public:
  ScoreStream(const std::string& coordinator, bool follow, std::optional<double> timeout_s,
              const transport::CurveClientKeys& curve, double lost_after_s)
      : follow_(follow), timeout_s_(timeout_s ? *timeout_s : (follow ? -1.0 : 1.0)) {
    seconds_to_ms(timeout_s_);  // refuses NaN (InputError: a ValueError too)
    if (!follow && timeout_s_ < 0)
      throw InputError("timeout_s must be >= 0 with follow=False (how long the stream lasts), "
                       "got " + std::to_string(timeout_s_));
    without_gil([&] {
      subscriber_ = std::make_unique<ScoreSubscriber>(coordinator, context_, 5000, curve);
      if (follow) subscriber_->fail_when_coordinator_lost(lost_after_s);
    });
    // The stream's length counts from here: asking the coordinator for the channel's address
    // (a round trip, which may take up to 5 s to a slow or distant one) is not part of it.
    subscribed_ = std::chrono::steady_clock::now();
  }

  py::object next() {
    // One reader at a time (checked under the GIL, as a generator is): the subscriber's socket
    // is read without the GIL, and two threads reading it at once crashed the process.
    if (reading_) throw std::runtime_error("this score stream is being read by another thread");
    reading_ = true;
    const struct Done {
      bool& reading;
      ~Done() { reading = false; }
    } done{reading_};
    // follow: timeout_s is the longest gap between two scores; otherwise the whole stream's
    // length from the subscription (the replayed history comes at once).
    const auto started = follow_ ? std::chrono::steady_clock::now() : subscribed_;
    for (;;) {
      if (subscriber_->ended()) throw py::stop_iteration();
      const std::optional<json> m = without_gil([&] { return subscriber_->next(100); });
      // A score that came is returned (Ctrl-C is raised at Python's next instruction): raised
      // here, it would be lost to a caller that catches KeyboardInterrupt and reads on.
      if (!m && PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (m) {
        if (is_end_message(*m)) {
          end_reason_ = end_reason_of(*m);
          throw py::stop_iteration();
        }
        return to_python(*m);
      }
      const double waited =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      if (timeout_s_ >= 0 && waited >= timeout_s_) {
        if (!follow_) throw py::stop_iteration();
        PyErr_SetString(PyExc_TimeoutError,
                        ("no score came for " + seconds_text(timeout_s_) + " s").c_str());
        throw py::error_already_set();
      }
    }
  }
  const std::string& end_reason() const { return end_reason_; }

 private:
  zmq::context_t context_{1};
  std::unique_ptr<ScoreSubscriber> subscriber_;
  std::chrono::steady_clock::time_point subscribed_;  // once the subscriber is made
  bool follow_;
  double timeout_s_;
  std::string end_reason_;
  bool reading_ = false;  // a thread is in next()
};

}  // namespace

void end_cluster_threads_at_exit() {
  std::vector<std::shared_ptr<RoleThreadState>> roles;
  std::vector<std::shared_ptr<Coordinator>> coordinators;
  {
    RunningAtExit& running = running_at_exit();
    std::lock_guard<std::mutex> lock(running.mutex);
    running.forget_another_process_locked();
    for (const auto& w : running.roles)
      if (auto role = w.lock()) roles.push_back(std::move(role));
    for (const auto& w : running.coordinators)
      if (auto coordinator = w.lock()) coordinators.push_back(std::move(coordinator));
  }
  for (const auto& role : roles) {  // as stop() and dropping a worker's object do
    *role->options.cancel = true;
    if (role->options.feed) role->options.feed->close("Python is exiting");
  }
  constexpr int kWaitSeconds = 30;  // a worker may be in a request to a server that is gone
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(kWaitSeconds);
  size_t still_running = 0;
  without_gil([&] {  // the roles' last releases of fed arrays take the GIL
    for (const auto& role : roles) {
      std::unique_lock<std::mutex> lock(role->mutex);
      if (!role->changed.wait_until(lock, deadline, [&] { return role->done; })) ++still_running;
    }
    // Roles first: a role whose coordinator went silent would wait for it (coordinator_lost_s).
    for (const auto& coordinator : coordinators) coordinator->stop_serving();
  });
  if (still_running > 0)
    std::fprintf(stderr,
                 "tandem: %zu role thread%s still running %d s after Python began to exit: the "
                 "process may end abruptly\n",
                 still_running, still_running == 1 ? "" : "s", kWaitSeconds);
}

void bind_cluster(py::module_& m) {
  py::class_<PyCoordinator>(m, "Coordinator",
                            "The cluster's coordinator: registers the roles, hands out the run's "
                            "settings, hosts the scores channel and applies the stop rule. "
                            "resume=True continues the run whose parameter servers' checkpoints "
                            "are in the settings' checkpoint_dir (read in this process), with the "
                            "epoch after those they come after; without it a checkpoint_dir "
                            "holding them is refused (the servers would start from them while "
                            "the epochs counted from the first). A fed run has no epochs: its "
                            "servers start from the checkpoints there either way.")
      .def(py::init<const py::dict&, int, int, int, double, int64_t, double, const std::string&,
                    const std::string&, const std::string&, double, double, bool>(),
           "settings"_a = py::dict(), "ps"_a = 1, "workers"_a = 1, "scorers"_a = 1,
           "target"_a = 0.0, "max_epochs"_a = 0, "max_seconds"_a = 0.0,
           "bind"_a = "tcp://127.0.0.1:*", "scores_bind"_a = "", "advertise_host"_a = "",
           "startup_timeout_s"_a = 60.0, "heartbeat_timeout_s"_a = 3.0, "resume"_a = false)
      .def_property_readonly("endpoint", [](PyCoordinator& c) { return c.get().endpoint(); })
      .def_property_readonly("scores_endpoint", [](PyCoordinator& c) { return c.get().scores_endpoint(); })
      .def_property_readonly(
          "curve_public_key", [](PyCoordinator& c) { return c.settings().curve_server_public; },
          "The run's CURVE public key (Z85) when its settings have curve_secret_file, else \"\": "
          "roles and tandem.scores() joining it pass it as curve_server_key.")
      .def_property_readonly("phase", [](PyCoordinator& c) { return std::string(to_string(c.get().phase())); })
      .def_property_readonly("settings", [](PyCoordinator& c) { return to_python(to_json(c.settings())); })
      .def_property_readonly("stop_reason", [](PyCoordinator& c) { return c.get().stop_reason(); })
      .def_property_readonly(
          "resumed_epochs", &PyCoordinator::resumed_epochs,
          "With resume=True: the epochs the servers' checkpoints in the settings' checkpoint_dir "
          "came after, where training went on (0 otherwise).")
      .def_property_readonly("failure", [](PyCoordinator& c) { return c.get().failure(); })
      .def("state", [](PyCoordinator& c) { return to_python(c.get().state()); },
           "The dashboard's document: cluster, roles, scores, workers, servers.")
      .def("spec", [](PyCoordinator& c) { return to_python(c.get().spec()); })
      .def("training_spec", [](PyCoordinator& c) { return to_python(c.get().training_spec()); })
      .def("scores",
           [](PyCoordinator& c) {
             py::list out;
             for (const ScoreRecord& s : c.get().scores())
               out.append(py::dict("seq"_a = s.seq, "t"_a = s.t, "step"_a = s.step, "loss"_a = s.loss,
                                   "loss_mean"_a = s.loss_mean, "accuracy"_a = s.accuracy,
                                   "samples"_a = s.samples));
             return out;
           })
      .def("wait_for",
           [](PyCoordinator& c, const std::string& phase, double timeout_s) {
             const ClusterPhase wanted = parse_phase(phase);
             const std::shared_ptr<Coordinator> co = c.shared();
             ClusterPhase now = ClusterPhase::Starting;
             wait_in_slices(timeout_s, [&](int ms) {
               c.check_open();
               now = co->wait_for(wanted, ms);
               return now == ClusterPhase::Failed || int(now) >= int(wanted);
             });
             return std::string(to_string(now));
           },
           "phase"_a, "timeout_s"_a,
           "Waits until the phase is at least `phase` (negative timeout: no end); returns the "
           "phase.")
      .def("request_stop", [](PyCoordinator& c, const std::string& reason) { c.get().request_stop(reason); },
           "reason"_a = "requested")
      .def("fail", [](PyCoordinator& c, const std::string& why) { c.get().fail(why); }, "why"_a)
      .def("expect",
           [](PyCoordinator& c, const std::string& name, const std::string& where) {
             c.get().expect(name, where);
           },
           "name"_a, "where"_a, "Names where role `name` should come from, for start-up errors.")
      .def("wait_workers_gone",
           [](PyCoordinator& c, double timeout_s) {
             const std::shared_ptr<Coordinator> co = c.shared();
             return wait_in_slices(timeout_s, [&](int ms) {
               c.check_open();
               return co->wait_workers_gone(ms);
             });
           }, "timeout_s"_a)
      .def("finish", [](PyCoordinator& c) { c.get().finish(); },
           "Draining -> done: the parameter servers exit; the scores channel ends.")
      .def("wait_servers_gone",
           [](PyCoordinator& c, double timeout_s) {
             const std::shared_ptr<Coordinator> co = c.shared();
             return wait_in_slices(timeout_s, [&](int ms) {
               c.check_open();
               return co->wait_servers_gone(ms);
             });
           }, "timeout_s"_a)
      .def("pull_model",
           [](PyCoordinator& c) -> std::optional<Model> {
             // Pulled on a thread of its own while this one looks at Ctrl-C: a server that does
             // not answer would otherwise hold the caller for the whole request timeout.
             const auto cancel = std::make_shared<std::atomic<bool>>(false);
             std::future<Model> pulled =
                 std::async(std::launch::async, [co = c.shared(), settings = c.settings(), cancel] {
                   return pull_cluster_model(*co, settings, cancel);
                 });
             try {
               wait_in_slices(-1, [&](int ms) {
                 return pulled.wait_for(std::chrono::milliseconds(ms)) ==
                        std::future_status::ready;
               });
             } catch (...) {  // Ctrl-C: the pull gives up within about 100 ms
               cancel->store(true);
               without_gil([&] { pulled.wait(); });
               throw;
             }
             try {
               return pulled.get();
             } catch (const ServerError& e) {
               if (e.not_initialised()) return std::nullopt;
               throw;
             }
           },
           "The parameters the servers hold now; None before the chief worker initialised "
           "them (a run stopped right after it started).")
      .def("close", &PyCoordinator::close)
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyCoordinator& c, py::args) { c.close(); });

  py::class_<PyRole>(m, "Role",
                     "A cluster role running on a native thread. Each role's constructor takes "
                     "curve_server_key (the coordinator's curve_public_key) and curve_key_file "
                     "(this role's key file, tandem.keygen's PREFIX.key_secret; default: a "
                     "throwaway key) to join a run under CURVE.")
      .def("start", &PyRole::start)
      .def("join", [](PyRole& r, std::optional<double> timeout_s) { return r.join(timeout_s ? *timeout_s : -1.0); },
           "timeout_s"_a = py::none(),
           "Waits for the role's loop to end: True when it has (raising its error, if it failed), "
           "False after timeout_s.")
      .def("stop", &PyRole::stop,
           "Ends the role from this process without waiting for the coordinator, as if the run "
           "were over (a parameter server writes its last checkpoint). join() to wait for it.")
      .def_property_readonly("running", &PyRole::running);

  py::class_<PyPsRole, PyRole>(m, "ParameterServerRole",
                               "A parameter server: joins the coordinator, serves its shard at "
                               "`bind` (tcp://127.0.0.1:* unless told) until the run is done.")
      .def(py::init<const std::string&, const std::string&, const std::string&, const std::string&,
                    double, const std::string&, const std::string&>(),
           "coordinator"_a, "name"_a = "", "bind"_a = "", "advertise"_a = "",
           "coordinator_lost_s"_a = 15.0, "curve_server_key"_a = "", "curve_key_file"_a = "");

  py::class_<PyWorkerRole, PyRole>(m, "WorkerRole",
                                   "A worker of a fed run: trains on the blocks fed to it, cut "
                                   "into batches of the run's batch size, until the run stops.")
      .def(py::init<const std::string&, const std::string&, size_t, double, const std::string&,
                    const std::string&>(),
           "coordinator"_a, "name"_a = "", "capacity"_a = 0, "coordinator_lost_s"_a = 15.0,
           "curve_server_key"_a = "", "curve_key_file"_a = "")
      .def("feed", &PyWorkerRole::feed, "images"_a, "labels"_a, "timeout_s"_a = py::none(),
           "Queues a block for training: uint8 or float32 C-contiguous images are read in place "
           "(kept alive until trained on), as are uint8 class ids; other dtypes and one-hot labels "
           "are converted once. Returns {rows, pixels_copied, labels_copied, pixels_address}.")
      .def_property_readonly("queue_depth", [](PyWorkerRole& r) { return r.queue().depth(); })
      .def_property_readonly("rows_fed", [](PyWorkerRole& r) { return r.queue().rows_fed(); },
                             "Rows queued by feed() so far (a block dropped untrained when the "
                             "worker stopped among them)")
      .def_property_readonly("blocks_fed", [](PyWorkerRole& r) { return r.queue().blocks_fed(); },
                             "Blocks queued by feed() so far")
      .def("close_feed",
           [](PyWorkerRole& r) { r.queue().end_input("its feed was closed: no more blocks"); },
           "No more blocks for this worker: feed() raises from now on; the worker trains the "
           "blocks still queued, then leaves the run (the others go on).");

  py::class_<PyScorerRole, PyRole>(m, "ScorerRole",
                                   "The scorer: every score_interval_s evaluates the validation "
                                   "rows (given here, or the store's) and sends the score.")
      .def(py::init<const std::string&, const std::string&, py::object, double, const std::string&,
                    const std::string&>(),
           "coordinator"_a, "name"_a = "", "validation"_a = py::none(),
           "coordinator_lost_s"_a = 15.0, "curve_server_key"_a = "", "curve_key_file"_a = "");

  py::class_<ScoreStream>(m, "ScoreStream")
      .def("__iter__", [](py::object self) { return self; })
      .def("__next__", &ScoreStream::next)
      .def_property_readonly("end_reason", &ScoreStream::end_reason);
  m.def(
      "keygen",
      [](const std::filesystem::path& prefix, bool overwrite) {  // str or os.PathLike
        const transport::CurveKeyPair pair = transport::generate_curve_keypair();
        transport::write_curve_key_files(prefix.string(), pair, overwrite);
        return pair.public_key;
      },
      "prefix"_a, "overwrite"_a = false,
      "Writes a CURVE key pair as `tandem keygen --out PREFIX` does: PREFIX.key (the public key, "
      "to give the other side) and PREFIX.key_secret (mode 0600). Returns the public key (Z85). "
      "An existing pair is replaced only with overwrite=True (ValueError otherwise).");
  m.def(
      "scores",
      [](const std::string& coordinator, bool follow, std::optional<double> timeout_s,
         const std::string& curve_server_key, const std::string& curve_key_file,
         double lost_after_s) {
        lost_after_to_ms(lost_after_s, "lost_after_s");
        return std::make_unique<ScoreStream>(coordinator, follow, timeout_s,
                                             curve_keys(curve_server_key, curve_key_file),
                                             lost_after_s);
      },
      "coordinator"_a, "follow"_a = true, "timeout_s"_a = py::none(), "curve_server_key"_a = "",
      "curve_key_file"_a = "", "lost_after_s"_a = 30.0,
      "Iterates over a cluster's scores: the newest 10 at once, then each new one. follow=True "
      "runs until the run ends (TimeoutError after timeout_s without a score; tandem.Error when "
      "the coordinator has not answered for lost_after_s, a run gone without ending, as a "
      "killed coordinator's is); follow=False stops "
      "timeout_s (default 1 s) after subscribing. For a run under CURVE: curve_server_key (the "
      "coordinator's curve_public_key) and this side's key file, curve_key_file (default: a "
      "throwaway key, admitted only by a run without curve_allowed_path).");
}

}  // namespace tandem::python
