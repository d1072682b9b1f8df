// Registration of the dataset store subcommands: `tandem prepare` writes a Zarr dataset store
// from MNIST-format IDX files, `tandem inspect` writes its sample/mean/variance images and
// statistics.
#pragma once

#include <CLI/CLI.hpp>

namespace tandem::cli {

void add_prepare_command(CLI::App& app);
void add_inspect_command(CLI::App& app);

}  // namespace tandem::cli
