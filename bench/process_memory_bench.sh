#!/usr/bin/env bash
# The resident memory of Tandem's processes, two builds side by side (alternating, ROUNDS
# rounds): the peak of `tandem --version`, of `prepare --copies 20` and of `inspect` over what it
# wrote, and the memory of a whole `tandem launch` (launcher, coordinator, server, workers and
# scorer, as processes) summed over its processes 4 s into a run on Fashion-MNIST. Written to
# compare a build that linked cuBLASLt with one that loads it only where a GPU dense layer needs
# it; any two tandem binaries will do.
# usage: bench/process_memory_bench.sh TANDEM_A TANDEM_B [ROUNDS=2]
set -euo pipefail
a=$(readlink -f "$1") b=$(readlink -f "$2") rounds=${3:-2}
work=$(mktemp -d) || exit 1
trap 'pkill -f "$work/" 2>/dev/null || true; rm -rf "$work"' EXIT
echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores"
echo "A: $a"
echo "B: $b"
peak() {  # peak LABEL BINARY ARGS...: the peak resident set of one command, in MB
  local label=$1; shift
  /usr/bin/time -f "%M" -o "$work/time" "$@" >/dev/null 2>&1
  printf '%-34s %8.0f MB\n' "$label" "$(awk '{print $1 / 1024}' "$work/time")"
}
tree() { local p; echo "$1"; for p in $(pgrep -P "$1"); do tree "$p"; done; }
launch_rss() {  # launch_rss LABEL BINARY: the summed resident set of a launch's processes
  local label=$1 bin=$2
  "$bin" launch --run-dir "$work/run" --target 0 --max-seconds 8 --dashboard -1 --quiet \
    >/dev/null 2>&1 &
  local pid=$! total=0 n=0 p rss
  sleep 4
  for p in $(tree "$pid"); do
    rss=$(awk '/^VmRSS/{print $2}' "/proc/$p/status" 2>/dev/null || true)
    total=$((total + ${rss:-0}))  # (none for a process that has just ended)
    n=$((n + 1))
  done
  wait "$pid" || true
  printf '%-34s %8.0f MB (%d processes)\n' "$label" \
    "$(awk -v t="$total" 'BEGIN{print t / 1024}')" "$n"
  rm -rf "$work/run"
}
for ((r = 1; r <= rounds; r++)); do
  for which in A B; do
    bin=$a; [ "$which" = B ] && bin=$b
    peak "$which round $r: --version" "$bin" --version
    peak "$which round $r: prepare --copies 20" "$bin" prepare --out "$work/s.zarr" --copies 20
    peak "$which round $r: inspect" "$bin" inspect "$work/s.zarr" --out "$work/png"
    rm -rf "$work/s.zarr" "$work/png"
    launch_rss "$which round $r: launch, all processes" "$bin"
  done
done
