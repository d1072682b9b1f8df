// Registration of the cluster subcommands: launch, coordinator, ps, worker, scorer, scores.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_cluster_commands(CLI::App& app);

}  // namespace tandem::cli
