#!/usr/bin/env bash
# The cluster end to end on a prepared store (default: Fashion-MNIST x 20), measured in one run:
#   - the single-process trainer's samples/s over one epoch of the same store (the baseline);
#   - `tandem launch` with 1 parameter server, W workers (1, 2, 4 by default) and a scorer, to the
#     default target: time to target, samples/s, test accuracy, each against the baseline;
#   - the same 2-worker launch with worker1 SIGKILLed halfway to its expected time to target.
# Prints a markdown table (and writes the raw JSON lines to $OUT_DIR).
# usage: bench/cluster_bench.sh TANDEM STORE [WORKERS...]   (e.g. build/tools/tandem /tmp/fm20.zarr 1 2 4)
set -euo pipefail
tandem=$1
store=$2
shift 2
workers=("$@")
[ ${#workers[@]} -gt 0 ] || workers=(1 2 4)
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/bench_helpers.sh"

single=$("$tandem" train --data "$store" --epochs 1 --json 2>/dev/null)
echo "$single" >"$out/single.json"
base=$(field "$single" "j['samples_per_s']")
echo "| run | time to target (s) | samples/s | vs single process | steps | test accuracy |"
echo "|---|---:|---:|---:|---:|---:|"
printf "| single process, 1 epoch (%s) | | %.0f | 1.00 | %s | %s |\n" \
  "$(field "$single" "j['backend']")" "$base" "$(field "$single" "j['steps']")" \
  "$(field "$single" "round(j['test']['accuracy'], 4)")"
row() {  # row LABEL JSON
  printf "| %s | %.1f | %.0f | %.2f | %s | %.4f |\n" "$1" "$(field "$2" "j['seconds']")" \
    "$(field "$2" "j['samples_per_s']")" "$(field "$2" "j['samples_per_s'] / $base")" \
    "$(field "$2" "j['steps']")" "$(field "$2" "j['test']['accuracy']")"
}
declare -A seconds
for w in "${workers[@]}"; do
  j=$("$tandem" launch --data "$store" --run-dir "$out/run-$w" --workers "$w" --dashboard -1 --json 2>"$out/err-$w")
  echo "$j" >"$out/launch-$w.json"
  seconds[$w]=$(field "$j" "j['seconds']")
  row "launch, 1 ps, $w workers, 1 scorer ($(field "$j" "j['stop_reason']"))" "$j"
done
# A worker killed halfway (of the 2-worker run's time to target, or 3 s).
half=$(python3 -c "print(max(1.0, float('${seconds[2]:-6}') / 2))")
"$tandem" launch --data "$store" --run-dir "$out/run-kill" --workers 2 --dashboard -1 --json \
  >"$out/launch-kill.json" 2>"$out/err-kill" &
launcher=$!
for _ in $(seq 300); do grep -q '"type":"score"' "$out/run-kill/metrics.jsonl" 2>/dev/null && break; sleep 0.1; done
sleep "$half"
pkill -9 -P $launcher -f -- "--name worker1( |$)" || true
wait $launcher
row "launch, 2 workers, worker1 SIGKILLed after ${half} s ($(field "$(cat "$out/launch-kill.json")" "j['stop_reason']"))" \
  "$(cat "$out/launch-kill.json")"
echo
echo "raw results: $out"
