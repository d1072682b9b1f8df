#!/usr/bin/env bash
# `tandem search` throughput: trials per hour at a fixed budget, the same grid searched with
# --processes 1 and 2 (one thread per trial), and with one process of 2 threads (the other way
# to use two cores), in one run, REPEATS times each, interleaved so machine load hits all alike.
# Prints a markdown table (raw JSON summaries go to $OUT_DIR).
# usage: bench/search_bench.sh TANDEM STORE [REPEATS]   (e.g. build/tools/tandem /tmp/fm.zarr 3)
set -euo pipefail
tandem=$1
store=$2
repeats=${3:-3}
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
# 12 trials; rungs at 1 and 3 epochs, eta 3. The search promotes a trial as soon as it ranks in
# the top third of the trials its rung has seen so far (asynchronous successive halving), not
# once the rung is complete, so more than 4 trials may go on to 3 epochs (30 epochs in all in
# the recorded runs, not the 12 + 4 x 2 of a synchronous halving).
grid=(lr=0.0003,0.001,0.003 hidden=100,300 seed=1,2)
configs=("1 1" "2 1" "1 2")  # processes, threads per trial
for r in $(seq "$repeats"); do
  for c in "${configs[@]}"; do
    set -- $c
    "$tandem" search --data "$store" --grid "${grid[@]}" --budget 3 --eta 3 --processes "$1" \
      --threads-per-trial "$2" --out "$out/p$1-t$2-r$r" --json 2>/dev/null >"$out/p$1-t$2-r$r.json"
  done
done
python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
print("| processes x threads | trials | epochs trained | seconds (median) | trials/hour (median) | all runs (trials/hour) | best val loss |")
print("|---|---:|---:|---:|---:|---|---:|")
for p, t in [(1, 1), (2, 1), (1, 2)]:
    runs = [json.load(open(f"{out}/p{p}-t{t}-r{r}.json")) for r in range(1, repeats + 1)]
    tph = [j["trials_per_hour"] for j in runs]
    print(f"| {p} x {t} | {runs[0]['trials']} | {runs[0]['epochs_trained']} | "
          f"{statistics.median(j['seconds'] for j in runs):.1f} | {statistics.median(tph):.0f} | "
          f"{', '.join(f'{x:.0f}' for x in tph)} | {runs[0]['best']['best_validation_loss']:.4f} |")
PY
