#!/usr/bin/env bash
# tandem predict's throughput with 1 and 2 processes against tandem eval on the same split, in
# the same run (interleaved, best of REPEATS). Every figure is end to end: process start, model
# load, reading the split and, for predict, writing classes and probabilities (fresh output each
# time). tandem eval cannot read a store's training split (it loads a split into memory), so the
# train split is measured for predict alone.
# usage: bench/predict_bench.sh TANDEM [STORE=/tmp/fm20.zarr] [REPEATS=3]
set -euo pipefail
tandem=$1 store=${2:-/tmp/fm20.zarr} repeats=${3:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$tandem" train --epochs 1 --checkpoint "$work/m.safetensors" >/dev/null  # IDX files, 784-100-10
now() { date +%s.%N; }
declare -A best rows
measure() {  # measure KEY ROWS COMMAND...: best wall-clock seconds of KEY
  local key=$1; rows[$key]=$2; shift 2
  local t0 t1; t0=$(now); "$@" >/dev/null; t1=$(now)
  local s; s=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.3f", b - a}')
  if [ -z "${best[$key]:-}" ] || awk -v s="$s" -v b="${best[$key]}" 'BEGIN{exit !(s < b)}'; then
    best[$key]=$s
  fi
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < repeats; ++r)); do
  for split in test train; do
    n=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['attributes']['rows'][sys.argv[2]])" \
        "$store/zarr.json" "$split")  # a v3 store written by tandem prepare
    if [ "$split" = test ]; then
      measure "eval $split" "$n" "$tandem" eval --model "$work/m.safetensors" --data "$store" --split "$split"
    fi
    for p in 1 2; do
      rm -rf "$work/out.zarr"
      measure "predict $split --processes $p" "$n" "$tandem" predict --model "$work/m.safetensors" \
        --data "$store" --split "$split" --out "$work/out.zarr" --processes "$p"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-32s | %9s | %8s | %10s |\n' command rows "best s" "samples/s"
for key in "eval test" "predict test --processes 1" "predict test --processes 2" \
           "predict train --processes 1" "predict train --processes 2"; do
  printf '| %-32s | %9s | %8s | %10.0f |\n' "$key" "${rows[$key]}" "${best[$key]}" \
    "$(awk -v n="${rows[$key]}" -v s="${best[$key]}" 'BEGIN{print n / s}')"
done
