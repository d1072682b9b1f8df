#!/usr/bin/env bash
# `tandem prepare --copies N` against the same preparation in Dask (bench/dask_prepare.py), in one
# run: wall time and peak memory of each, uncompressed Zarr v3, chunks of 10,000 rows.
# usage: bench/prepare_compare.sh [COPIES] [PYTHON]   (PYTHON: one with dask and zarr 3, default .venv-test)
set -euo pipefail
cd "$(dirname "$0")/.."
copies=${1:-20} python=${2:-.venv-test/bin/python}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; copies $copies"
for round in 1 2; do
  /usr/bin/time -f "tandem prepare: wall %e s, peak RSS %M KB" \
    build/tools/tandem prepare --out "$dir/t$round.zarr" --copies "$copies" >/dev/null
  /usr/bin/time -f "dask to_zarr:   wall %e s, peak RSS %M KB" \
    "$python" bench/dask_prepare.py "$dir/d$round.zarr" "$copies" >/dev/null
  rm -rf "$dir"/*.zarr
done
