// Registration of the tandem subcommands. Each adds itself to the app with a callback that runs
// the job; errors are thrown as tandem::Error and reported by main().
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_train_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_search_command(CLI::App& app);
void add_trial_slots_command(CLI::App& app);
void add_predict_command(CLI::App& app);

}  // namespace tandem::cli
