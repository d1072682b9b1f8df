#!/usr/bin/env bash
# Training fed from Dask (tandem.dask, the Python package) against `tandem launch` on the same
# Fashion-MNIST rows, same model, batch and ps mode, W = 1 and 2 workers, measured in one run
# (interleaved, REPEATS times): samples/s and the time to the first score, with the ratios.
# See bench/dask_feed_bench.py for the definitions. Extra arguments go to it (e.g. --seconds 30
# --ps-mode async --epochs-per-feed 4).
# usage: bench/dask_feed_bench.sh BUILD_DIR PYTHON [STORE] [ARGS...]
#        (e.g. bench/dask_feed_bench.sh build .venv-test/bin/python /tmp/fm.zarr)
set -euo pipefail
build=$1 python=$2
store=${3:-/tmp/fm.zarr}
shift $(( $# < 3 ? $# : 3 ))
here=$(cd "$(dirname "$0")" && pwd)
[ -d "$store" ] || "$build/tools/tandem" prepare --out "$store" >/dev/null  # 55,000 training rows
PYTHONPATH="$build/python" exec "$python" "$here/dask_feed_bench.py" --tandem "$build/tools/tandem" \
  --store "$store" "$@"
