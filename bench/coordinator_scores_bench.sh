#!/usr/bin/env bash
# A coordinator's CPU time while it waits, with few scores and with a long run's worth: the
# process does the same work ten times a second however many scores it holds, so the two
# figures should be alike (a tick that copied the score log once made a coordinator with 500,000
# scores, days of a run, spend a tenth of a core doing nothing). The coordinator is the CLI's
# (`tandem coordinator`, its progress and metrics ticks included), waiting for roles that never
# come; tandem_coordinator_scores_flood gives it the scores, as a registered scorer.
# usage: bench/coordinator_scores_bench.sh TANDEM FLOOD [MANY=500000] [WINDOW_S=20]
set -euo pipefail
tandem=$(readlink -f "$1") flood=$(readlink -f "$2") many=${3:-500000} window=${4:-20}
work=$(mktemp -d) || exit 1
coordinator=
finish() { [ -z "$coordinator" ] || kill "$coordinator" 2>/dev/null || true; wait; rm -rf "$work"; }
trap finish EXIT
"$tandem" prepare --out "$work/data.zarr" >/dev/null
"$tandem" coordinator --data "$work/data.zarr" --run-dir "$work/run" --target 0 --max-epochs 0 \
  --startup-timeout 36000 --dashboard 0 --quiet >/dev/null 2>"$work/coordinator.err" &
coordinator=$!
for _ in $(seq 100); do grep -q "coordinator at" "$work/coordinator.err" && break; sleep 0.1; done
address=$(sed -n 's/^coordinator at \([^,]*\),.*/\1/p' "$work/coordinator.err" | head -1)
gone() { echo "the coordinator $1:" >&2; cat "$work/coordinator.err" >&2; exit 1; }
[ -n "$address" ] || gone "did not start"

ticks_per_s=$(getconf CLK_TCK)
cpu_ticks() { awk '{print $14 + $15}' "/proc/$coordinator/stat"; }  # utime + stime
# cpu_percent: the coordinator's CPU time over the next $window seconds, in % of one core.
cpu_percent() {
  local a b; a=$(cpu_ticks); sleep "$window"; b=$(cpu_ticks)
  awk -v a="$a" -v b="$b" -v hz="$ticks_per_s" -v w="$window" \
    'BEGIN{printf "%.2f", 100 * (b - a) / hz / w}'
}
rss_mib() { awk '/^VmRSS/{printf "%.0f", $2 / 1024}' "/proc/$coordinator/status"; }

echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$flood" "$address" 2000
sleep 2
few=$(cpu_percent) few_rss=$(rss_mib)
"$flood" "$address" $((many - 2000))
sleep 2
lots=$(cpu_percent) lots_rss=$(rss_mib)
kill -0 "$coordinator" || gone "ended"
printf '%-10s %12s %10s\n' scores "CPU % (${window} s)" "RSS MiB"
printf '%-10s %12s %10s\n' 2000 "$few" "$few_rss" "$many" "$lots" "$lots_rss"
awk -v a="$few" -v b="$lots" -v m="$many" \
  'BEGIN{printf "CPU with %d scores / with 2000: %.2f\n", m, (a > 0 ? b / a : 0)}'
