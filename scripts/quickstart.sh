#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install, build, and train the seed's model on
# Fashion-MNIST with a local cluster (a coordinator, 1 parameter server, 2 workers, a scorer),
# printing the scores and the summary. Extra arguments go to `tandem launch`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
scripts/build.sh
exec build/tools/tandem launch "$@"
