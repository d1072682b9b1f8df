#include "cluster_metrics.h"

#include <cmath>

#include "prometheus_text.h"

namespace tandem {

using nlohmann::json;

std::string prometheus_from_state(const json& state) {
  PrometheusText t;
  const json& c = state.at("cluster");
  const std::string phase = c.value("state", std::string());
  for (const char* p : {"starting", "training", "draining", "done", "failed"})
    t.gauge("tandem_cluster_phase", "1 for the cluster's current phase", phase == p ? 1 : 0,
            {{"phase", p}});
  t.gauge("tandem_cluster_elapsed_seconds", "Seconds since the coordinator started",
          c.value("elapsed_s", 0.0));
  t.gauge("tandem_cluster_epochs_completed", "Epochs whose every batch is trained",
          double(c.value("epoch", int64_t{0})));
  t.counter("tandem_cluster_batches_total", "Batches finished (trained, or their gradients lost)",
            double(c.value("batches_done", int64_t{0})));
  t.counter("tandem_cluster_gradients_lost_total",
            "Batches whose gradients were lost: never answered by a parameter server, or "
            "dropped as stale",
            double(c.value("gradients_lost", int64_t{0})));
  t.gauge("tandem_cluster_step", "Optimizer steps on the parameter servers (global_step)",
          double(c.value("step", int64_t{0})));
  t.gauge("tandem_cluster_samples_per_second", "Samples per second over all workers",
          c.value("samples_per_s", 0.0));
  const json& scores = state.at("scores");
  // The state shows a long run's older scores thinned out; scores_total counts them all.
  t.counter("tandem_scores_total", "Scores published",
            double(c.value("scores_total", int64_t(scores.size()))));
  if (!scores.empty()) {
    t.gauge("tandem_score_loss", "Newest validation loss (summed over the split)",
            scores.back().value("loss", 0.0));
    t.gauge("tandem_score_accuracy", "Newest validation accuracy", scores.back().value("accuracy", 0.0));
  }
  for (const json& r : state.at("roles")) {
    const PrometheusLabels labels{{"role", r.value("role", std::string())},
                                  {"name", r.value("name", std::string())}};
    const std::string s = r.value("state", std::string());
    t.gauge("tandem_role_up", "1 while the role is alive", s == "running" || s == "registered" ? 1 : 0,
            labels);
    t.gauge("tandem_role_last_seen_seconds", "Seconds since the role was last heard from",
            r.value("last_seen_s", 0.0), labels);
  }
  for (const json& w : state.at("workers")) {
    const PrometheusLabels labels{{"worker", w.value("name", std::string())}};
    t.gauge("tandem_worker_samples_per_second", "Samples per second of one worker",
            w.value("samples_per_s", 0.0), labels);
    t.gauge("tandem_worker_queue_depth", "Batches ready in the worker's chunk-manager ring",
            double(w.value("queue_depth", 0)), labels);
    t.counter("tandem_worker_steps_total", "Gradients the worker pushed",
              double(w.value("steps", int64_t{0})), labels);
  }
  for (const json& s : state.at("servers")) {
    const std::string name = s.value("name", std::string());
    t.gauge("tandem_ps_pushes_per_second", "Pushes per second", s.value("pushes_per_s", 0.0),
            {{"server", name}});
    t.gauge("tandem_ps_pulls_per_second", "Pulls per second", s.value("pulls_per_s", 0.0),
            {{"server", name}});
    t.gauge("tandem_ps_version", "The server's global_step", double(s.value("version", int64_t{0})),
            {{"server", name}});
    // A server's histogram as it reported it: a count that is not a number a counter can take
    // is left out (it failed the whole scrape, on every scrape, while it stood).
    if (s.contains("staleness") && s["staleness"].is_object())
      for (const auto& [bucket, count] : s["staleness"].items())
        if (count.is_number() && std::isfinite(count.get<double>()) && count.get<double>() >= 0)
          t.counter("tandem_ps_pushes_by_staleness_total",
                    "Pushes by staleness bucket (versions behind)", count.get<double>(),
                    {{"server", name}, {"staleness", bucket}});
  }
  return t.str();
}

}  // namespace tandem
