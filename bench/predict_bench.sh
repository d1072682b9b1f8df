#!/usr/bin/env bash
# tandem predict's throughput with 1 and 2 processes against tandem eval on the same split, in
# the same run (interleaved, best of REPEATS). Every figure is end to end: process start, model
# load, reading the split and, for predict, writing classes and probabilities (fresh output each
# time); eval only counts what it gets right.
# The training split is also predicted on two slot servers of one slot each (tandem trial-slots,
# on this machine: `predict --slots`), against --processes 2: what the slot protocol costs.
# usage: bench/predict_bench.sh TANDEM [STORE=/tmp/fm20.zarr] [REPEATS=3]
set -euo pipefail
tandem=$(readlink -f "$1") store=$(readlink -f "${2:-/tmp/fm20.zarr}") repeats=${3:-3}
work=$(mktemp -d)
servers=()
trap 'kill "${servers[@]}" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"' EXIT
for s in a b; do
  # (loopback tcp, as the figures in bench/RESULTS.md were measured: the default is now ipc)
  "$tandem" trial-slots --slots 1 --bind 'tcp://127.0.0.1:*' --any-peer \
    --endpoint-file "$work/$s.ep" >/dev/null 2>&1 &
  servers+=($!)
done
for _ in $(seq 100); do [ -s "$work/a.ep" ] && [ -s "$work/b.ep" ] && break; sleep 0.1; done
slots="$(cat "$work/a.ep"),$(cat "$work/b.ep")"
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
    measure "eval $split" "$n" "$tandem" eval --model "$work/m.safetensors" --data "$store" \
      --split "$split"
    for p in 1 2; do
      rm -rf "$work/out.zarr"
      measure "predict $split --processes $p" "$n" "$tandem" predict --model "$work/m.safetensors" \
        --data "$store" --split "$split" --out "$work/out.zarr" --processes "$p"
    done
    if [ "$split" = train ]; then
      rm -rf "$work/out.zarr"
      measure "predict $split --slots (2 x 1)" "$n" "$tandem" predict --model "$work/m.safetensors" \
        --data "$store" --split "$split" --out "$work/out.zarr" --slots "$slots"
    fi
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '| %-32s | %9s | %8s | %10s |\n' command rows "best s" "samples/s"
for key in "eval test" "predict test --processes 1" "predict test --processes 2" \
           "eval train" "predict train --processes 1" "predict train --processes 2" \
           "predict train --slots (2 x 1)"; do
  printf '| %-32s | %9s | %8s | %10.0f |\n' "$key" "${rows[$key]}" "${best[$key]}" \
    "$(awk -v n="${rows[$key]}" -v s="${best[$key]}" 'BEGIN{print n / s}')"
done
