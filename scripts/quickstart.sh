#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, and train the seed's model on
# Fashion-MNIST, printing the summary. Extra arguments go to `tandem train`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/tools/tandem train "$@"
