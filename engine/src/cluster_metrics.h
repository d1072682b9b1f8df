// The coordinator's state (Coordinator::state(), the dashboard's document) as Prometheus text
// for the dashboard's /metrics: the cluster's phase and progress, the newest score, each role's
// liveness, each worker's rate and queue depth, each server's rates and staleness histogram.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace tandem {

std::string prometheus_from_state(const nlohmann::json& state);

}  // namespace tandem
