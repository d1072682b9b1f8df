// The cluster dashboard, served over HTTP by the coordinator (like Dask's on :8787).
//
// Routes:
//   /            the dashboard page: one self-contained HTML document (inline CSS and JS, no
//                downloads) that polls /api/state every second and draws the role table, the
//                score curve, samples/s and queue depth per worker, push/pull rates per server
//                and the staleness histogram
//   /api/state   state(), as application/json
//   /metrics     metrics(), as text/plain; version=0.0.4 (Prometheus text exposition; build it
//                with PrometheusText, prometheus_text.h)
//   /healthz     200 "ok"
//   anything else 404. A callback that throws gives a 500 with the exception's message.
// Other methods are refused (405) before a body is read; a server bound to loopback refuses a
// Host header naming anything but a loopback name (403: DNS rebinding).
//
// The state document (the coordinator produces exactly this; the page reads nothing else):
//   {"cluster": {"run": "3f9c...", "state": "starting|training|draining|done|failed",
//                "elapsed_s": 12.3,
//                "epoch": 2, "step": 530, "target": 1700.0, "samples_per_s": 91000.0,
//                "scores_total": 41, "stop_reason": "target", "failure": ""},
//    "roles":   [{"role": "coordinator|ps|worker|scorer", "name": "ps0",
//                 "address": "tcp://127.0.0.1:40123",
//                 "state": "running|registered|starting|lost|stopped", "pid": 1234,
//                 "host": "node1", "last_seen_s": 0.4}],
//    "scores":  [{"t": 3.1, "step": 120, "loss": 2300.5, "accuracy": 0.83}],
//    "workers": [{"name": "worker0", "samples_per_s": 45000.0, "queue_depth": 2, "steps": 265,
//                 "batches_done": 265, "gradients_lost": 0, "idle": false}],
//    "servers": [{"name": "ps0", "pushes_per_s": 45.0, "pulls_per_s": 46.0, "version": 530,
//                 "staleness": {"0": 400, "1": 100, "2": 30, "3": 5, "4-7": 2, "8-15": 0,
//                               "16+": 0}}]}
// cluster.run is the run's id (32 hex characters; the page shows its first 8 and says when a
// later poll finds another); cluster.target is the score (loss) the run aims for (null or
// absent: none, no line drawn);
// scores holds at most 2,000 of the run's scores_total (the newest 1,000, and the older ones
// thinned evenly); failure says why a failed run failed;
// scores[].t and last_seen_s are seconds (since the start, and since the role was last heard);
// workers[].idle: the worker has no batch for now (the others are finishing the epoch);
// staleness maps a bucket of staleness in steps (its label: "0" to "3", "4-7", "8-15", "16+") to
// how many updates arrived that stale.
//
// Page element ids (the browser test finds these): status (the header: state, epoch, step,
// elapsed, newest score), st-run (the run id's first 8 characters), st-new-run (shown when the
// run is not the one the page first showed), roles (table, one <tr data-role="ROLE"
// data-name="NAME"> per role), score-curve (SVG, one <circle> per score and
// data-points="COUNT"), workers (table), servers (table), staleness (SVG, one <rect class="bar"
// data-staleness="LABEL"> per bucket, in order).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

namespace tandem {

struct DashboardOptions {
  std::string host = "127.0.0.1";
  int port = 8787;  // 0: any free port
};

class DashboardServer {
 public:
  // state(): the cluster's state as a JSON document (schema above), called per request from the
  // server's threads (the caller makes it thread-safe). metrics(): Prometheus text exposition,
  // called the same way. Serves from a thread of its own once constructed; throws tandem::Error
  // naming host:port and why when it cannot listen there (e.g. "Address already in use").
  DashboardServer(DashboardOptions options, std::function<std::string()> state,
                  std::function<std::string()> metrics);
  ~DashboardServer();  // stop()
  DashboardServer(const DashboardServer&) = delete;
  DashboardServer& operator=(const DashboardServer&) = delete;

  int port() const;         // the bound port
  std::string url() const;  // http://host:port/
  // For the end of a run: a page watching it (its last request for the state came within 3 s)
  // is given the final state before the server stops, which would otherwise leave it showing
  // "training" beside "disconnected". Waits until the state is asked for once more, at most
  // `at_most`; returns at once when no page is watching.
  void serve_the_end(std::chrono::milliseconds at_most);
  // Stops listening, waits for the requests in flight, and joins the server's threads. Idempotent.
  // Waits 3 s for the connections (and longer only behind a state or metrics callback still
  // running): one still busy then (a client trickling its request) is left to end with the
  // process, and the callbacks are not called again. Not for two threads at once.
  void stop();
  // How many servers stop() gave up on are still running (their clients not yet gone): each
  // frees itself when its last connection ends.
  static int abandoned_running();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;  // released to the server's thread when stop() gives up on it
  bool abandoned_ = false;  // stop() gave up: impl_ is no longer this object's to touch
  int port_ = 0;
  std::string url_;
};

}  // namespace tandem
