#!/usr/bin/env bash
# Two builds of tandem compared on the same local cluster run, interleaved (A, B, A, B, ...) so
# that a change in the machine's load falls on both alike. Each run: `tandem launch` with 1
# parameter server, W workers and a scorer, for E epochs with no target (every run does the same
# steps), on Fashion-MNIST prepared once by B. Prints a markdown table of the training seconds
# and samples/s the launch summary reports, and B's speed-up over A per round.
# usage: bench/launch_ab.sh TANDEM_A TANDEM_B [ROUNDS=3] [EPOCHS=5] [WORKERS=2]
#   e.g. (A built from the commit before a change, B from the change)
#   bench/launch_ab.sh /tmp/tandem-before build/tools/tandem 5 5 2
# Raw summaries go to $OUT_DIR (default: a new temporary directory).
set -euo pipefail
[ $# -ge 2 ] || { sed -n 2,10p "$0" >&2; exit 2; }
a=$1
b=$2
rounds=${3:-3}
epochs=${4:-5}
workers=${5:-2}
for t in "$a" "$b"; do [ -x "$t" ] || { echo "launch_ab: $t is no executable" >&2; exit 2; }; done
out=${OUT_DIR:-$(mktemp -d)}
mkdir -p "$out"
source "$(dirname "${BASH_SOURCE[0]}")/bench_helpers.sh"

[ -d "$out/fm.zarr" ] || "$b" prepare --out "$out/fm.zarr" >/dev/null 2>"$out/prepare.err"
run() {  # run BINARY LABEL ROUND: prints the summary JSON
  local dir="$out/run-$2-$3"
  rm -rf "$dir"
  "$1" launch --data "$out/fm.zarr" --run-dir "$dir" --workers "$workers" --max-epochs "$epochs" \
    --target 0 --dashboard -1 --json 2>"$out/err-$2-$3" | tee "$out/launch-$2-$3.json"
}
echo "| round | A: s (samples/s) | B: s (samples/s) | B's speed-up | steps A / B |"
echo "|---|---:|---:|---:|---:|"
for r in $(seq "$rounds"); do
  ja=$(run "$a" a "$r")
  jb=$(run "$b" b "$r")
  sa=$(field "$ja" "j['seconds']")
  sb=$(field "$jb" "j['seconds']")
  printf "| %s | %.2f (%.0f) | %.2f (%.0f) | %.2fx | %s / %s |\n" "$r" \
    "$sa" "$(field "$ja" "j['samples_per_s']")" "$sb" "$(field "$jb" "j['samples_per_s']")" \
    "$(python3 -c "print($sa / $sb)")" "$(field "$ja" "j['steps']")" "$(field "$jb" "j['steps']")"
done
echo
echo "A: $a"
echo "B: $b"
echo "raw results: $out"
