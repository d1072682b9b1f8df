#!/usr/bin/env bash
# `pip install .` from the source tree through scikit-build-core, into a scratch directory (not
# the tests' venv), then the installed package imports, trains and runs a fed cluster.
# CPU-only (TANDEM_CUDA=OFF) to keep the suite's time down; the CUDA build is covered by CMake.
# Usage: pip_install_test.sh PYTHON SOURCE_DIR
set -euo pipefail
python=$1
source_dir=$2
scratch=$(mktemp -d) || exit 1
trap 'rm -rf "$scratch"' EXIT
# --no-build-isolation: scikit-build-core comes from the tests' venv (nothing downloaded here).
CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$python" -m pip install --quiet --disable-pip-version-check \
  --no-build-isolation --no-deps --target "$scratch/site" \
  --config-settings=build-dir="$scratch/build" \
  --config-settings=cmake.define.TANDEM_CUDA=OFF "$source_dir"
ls "$scratch/site/tandem"/_tandem*.so "$scratch/site/tandem/dask.py" >/dev/null
cd "$scratch"
PYTHONPATH="$scratch/site" "$python" - "$source_dir/tests/python" <<'PY'
import sys
sys.path.insert(1, sys.argv[1])
import tandem, tandem.dask
from synthetic_rows import make_rows
assert tandem.__file__.startswith(sys.path[0]), tandem.__file__  # the installed copy
# The distribution's version is CMakeLists.txt's (pyproject reads it), the module's too.
import importlib.metadata
dist = importlib.metadata.distribution("tandem")
assert str(dist.locate_file("")).startswith(sys.path[0]), dist.locate_file("")
assert dist.version == tandem.__version__, (dist.version, tandem.__version__)
x, y = make_rows(2000, 1)
model, summary = tandem.train((x, y), validation=make_rows(300, 2), layers=[784, 16, 10],
                              epochs=2, batch=100, backend="cpu", threads=1)
assert summary["validation"]["accuracy"] > 0.9, summary
c = tandem.Coordinator({"fed": True, "model": "784-16-10", "batch": 100, "score_interval_s": 0.1},
                       ps=1, workers=1, scorers=1, target=1e9)
roles = [tandem.ParameterServerRole(c.endpoint), tandem.WorkerRole(c.endpoint),
         tandem.ScorerRole(c.endpoint, validation=make_rows(100, 3))]
for r in roles:
    r.start()
assert c.wait_for("training", 30) == "training"
roles[1].feed(x, y)
assert c.wait_for("draining", 30) == "draining" and c.stop_reason == "target"
assert c.wait_workers_gone(30)
c.pull_model()
c.finish()
assert c.wait_servers_gone(30)
assert all(r.join(30) for r in roles)
print("pip install . works: tandem", tandem.__version__, "from", tandem.__file__)
PY
