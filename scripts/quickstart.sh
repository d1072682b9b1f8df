#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, and train the seed's model on
# Fashion-MNIST with a local cluster (a coordinator, 1 parameter server, 2 workers, a scorer),
# printing the scores and the summary. Extra arguments go to `tandem launch`.
# Only the library and the command are installed for and built (no tests, benchmarks or Python
# module: scripts/test.sh adds them to the same ./build later).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --runtime
scripts/build.sh -DTANDEM_BUILD_TESTS=OFF -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_PYTHON=OFF
exec build/tools/tandem launch "$@"
