#!/usr/bin/env bash
# `tandem search` end to end on a Fashion-MNIST store: a grid where one learning rate is clearly
# better (1e-3 against 1e-5), trials as two parallel processes, successive halving (rungs at 1 and
# 3 epochs, eta 3: of the five trials that finish rung 0 only the best goes on), a trial made to
# crash (hidden --crash-trial: its process gets an option `tandem train` rejects) reported as
# failed while the others finish, and the results table, CSV, JSON and best checkpoint. Then a
# time budget, and SIGTERM, each ending a search with trials still running.
# Usage: search_cli_test.sh TANDEM_BINARY PYTHON FAIL_FILE_OPS_SHIM
set -u
tandem=$(readlink -f "$1")
py=$2
file_ops_shim=$(readlink -f "$3")
# with_shim VAR=SUFFIX COMMAND...: COMMAND with the shim failing that file operation. (Under
# AddressSanitizer the shim comes before its runtime in the library list, which it would refuse.)
with_shim() {
  env "ASAN_OPTIONS=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
      "LD_PRELOAD=$file_ops_shim" "$@"
}
source "$(dirname "$0")/test_helpers.sh"
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
trap 'rm -rf "$dir"' EXIT
# py_check FILE EXPR: EXPR (Python, over `r`, the parsed results.json) is true.
py_check() { "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; }

"$tandem" prepare --out "$dir/fm.zarr" >/dev/null 2>&1
check "prepared Fashion-MNIST" test -d "$dir/fm.zarr"

# Six trials: lr 1e-3 (trials 0-2) or 1e-5 (trials 3-5), three seeds each; trial 4 crashes. The
# 1e-3 trials finish rung 0 first, so ASHA's first promotion (the best of three) is already the
# best of rung 0: exactly one trial goes on to 3 epochs.
start=$(date +%s)
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,0.00001 seed=1,2,3 --budget 3 --eta 3 \
    --min-epochs 1 --processes 2 --threads-per-trial 1 --backend cpu --out "$dir/s1" --crash-trial 4 \
    >"$dir/out1" 2>"$dir/err1"; rc=$?
echo "search took $(( $(date +%s) - start )) s"
check "search exits 0 when some trials succeed" test $rc -eq 0
r="$dir/s1/results.json"
check "results.json written" test -s "$r"
check "results.csv: a header and six trials" test "$(wc -l <"$dir/s1/results.csv")" -eq 7
check "best trial has lr=0.001" py_check "$r" "r['best']['config']['lr'] == 0.001"
check "best trial trained the full budget (rung 1, 3 epochs, completed)" \
    py_check "$r" "r['best']['rung'] == 1 and r['best']['epochs'] == 3 and r['best']['status'] == 'completed'"
check "table sorted by validation loss" py_check "$r" \
    "[t['best_validation_loss'] for t in r['results'] if 'best_validation_loss' in t] == sorted(t['best_validation_loss'] for t in r['results'] if 'best_validation_loss' in t)"
check "halving: the four other finished trials stopped at rung 0 after 1 epoch" py_check "$r" \
    "sorted((t['status'], t['rung'], t['epochs']) for t in r['results'] if t['trial'] != 4 and t is not r['results'][0]) == [('stopped', 0, 1)] * 4"
check "the crashed trial is reported failed, last in the table" py_check "$r" \
    "r['results'][-1]['trial'] == 4 and r['results'][-1]['status'] == 'failed' and r['failed'] == 1 and 'exited with status' in r['results'][-1]['error']"
check "the crash is reported on stderr with its log" grep -q "trial 4 .*FAILED" "$dir/err1"
check "every lr=0.001 trial beats every lr=1e-5 trial" py_check "$r" \
    "max(t['best_validation_loss'] for t in r['results'] if t['config']['lr'] == 0.001) < min(t['best_validation_loss'] for t in r['results'] if t['config']['lr'] < 0.001 and 'best_validation_loss' in t)"
check "best checkpoint kept" test -s "$dir/s1/best.safetensors"
check "the table is printed" grep -q "best: trial" "$dir/out1"
check "--backend cpu in the summary" py_check "$r" "r['backend'] == 'cpu'"
check "... and the trials' precision" py_check "$r" "r['precision'] == 'fp32'"
# Every trial but the crashing one finished at least its first rung, whose tandem train says so.
check "--backend cpu reaches every trial's tandem train" \
    test "$(grep -l '"backend":"cpu"' "$dir"/s1/trial-{0,1,2,3,5}.log | wc -l)" -eq 5
# The kept checkpoint is a working model: tandem eval reads it.
check "tandem eval reads best.safetensors" "$tandem" eval --data "$dir/fm.zarr" --model "$dir/s1/best.safetensors"

# A trial that diverges (lr 1e30: NaN losses) is reported failed; the search goes on and ends
# with results, its best the trial that learned.
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,1e30 hidden=16 --budget 1 --min-epochs 1 \
    --processes 2 --threads-per-trial 1 --backend cpu --out "$dir/sd" >"$dir/outd" 2>"$dir/errd"
check "a search with a diverged trial exits 0" test $? -eq 0
check "the diverged trial is failed, saying so; the other is best" py_check "$dir/sd/results.json" \
    "r['failed'] == 1 and r['best']['config']['lr'] == 0.001 and r['results'][1]['status'] == 'failed' and 'training diverged' in r['results'][1]['error']"

# Started by a parent that ignores SIGCHLD (a daemon; Python's signal(SIGCHLD, SIG_IGN)), which
# exec passes on: the search still sees its trials end (it once waited for ever).
ignoring_sigchld="import os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])"
"$py" -c "$ignoring_sigchld" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 hidden=16 --budget 1 --min-epochs 1 \
    --processes 1 --threads-per-trial 1 --backend cpu --out "$dir/sg" >/dev/null 2>"$dir/errg" &
search=$!
wait_within $search 120; rc=$?
check "a search started with SIGCHLD ignored ends, its trial completed (status $rc)" \
    py_check "$dir/sg/results.json" "r['results'][0]['status'] == 'completed'"

# A JSON list of trials, and a time budget that ends the search with trials still running.
cat >"$dir/trials.json" <<'JSON'
[{"lr": 0.001, "hidden": "256x128", "batch": 100}, {"lr": 0.003, "hidden": [50], "optimizer": "adam"}]
JSON
# The budget leaves time for each trial's first epoch (its first score); sanitized binaries run
# 5 to 20 times slower (TANDEM_TEST_SLOW).
seconds=3 on_time=15
if [ -n "${TANDEM_TEST_SLOW:-}" ]; then seconds=15 on_time=45; fi
start=$(date +%s)
"$tandem" search --data "$dir/fm.zarr" --trials "$dir/trials.json" --budget 1000 \
    --budget-seconds $seconds --processes 2 --threads-per-trial 1 --backend cpu --out "$dir/s4" \
    --json >"$dir/out4" 2>"$dir/err4"; rc=$?
check "--trials with --budget-seconds exits 0" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$dir/err4"
check "--budget-seconds ends the search on time" test $(( $(date +%s) - start )) -lt $on_time
# Every trial is stopped, whether the budget ended it mid-rung ("stopped by the time budget"),
# just as it finished a rung (reported as finished, then stopped), or waiting for a promotion. A
# trial's messages tell which; the test once read them, and failed when the second case came.
all_stopped="all(t['status'] == 'stopped' for t in r['results'])"
check "--budget-seconds stops the running trials" py_check "$dir/s4/results.json" "$all_stopped"
if ! py_check "$dir/s4/results.json" "$all_stopped"; then
  echo "its messages:"
  tr '\r' '\n' <"$dir/err4" | tail -12
fi
check "--trials configurations used" py_check "$dir/s4/results.json" \
    "sorted(t['config']['hidden'] for t in r['results']) == ['256x128', '50'] and r['trials'] == 2"

# SIGTERM (or a terminal's SIGINT) closes the search as the time budget does, once both trials
# have scored an epoch of their single 1000-epoch rung: the running trials are stopped, the
# results so far written, and the search exits 1 naming the signal.
"$tandem" search --data "$dir/fm.zarr" --trials "$dir/trials.json" --budget 1000 --min-epochs 1000 \
    --processes 2 --threads-per-trial 1 --backend cpu --out "$dir/s8" --json >"$dir/out8" \
    2>"$dir/err8" &
search=$!
scored() { grep -q '"type":"epoch"' "$dir/s8/trial-$1.r0.jsonl" 2>/dev/null; }
for _ in $(seq 1200); do scored 0 && scored 1 && break; sleep 0.1; done
kill -TERM "$search"
wait_within "$search" 120; rc=$?
check "SIGTERM ends the search with an error (exit status $rc)" test $rc -eq 1
check "... naming the signal and where the results are" \
    grep -q "search: stopped by SIGTERM; the results so far are in" "$dir/err8"
check "... after stopping both running trials" grep -q "SIGTERM; stopping 2 running trial" "$dir/err8"
check "the results so far are written, each trial stopped by SIGTERM with its epochs" \
    py_check "$dir/s8/results.json" "r['stopped_by_signal'] == 'SIGTERM' and len(r['results']) == 2 \
    and all(t['stopped_by_signal'] == 'SIGTERM' and t['epochs'] >= 1 for t in r['results'])"
check "... and the best checkpoint kept" test -s "$dir/s8/best.safetensors"
check "no trial outlives the search" test -z "$(pgrep -f -- "$dir/s8/trial-")"
# The signal sent to the whole process group instead (a terminal's Ctrl-C, a batch system's
# cancel): it reaches the trials too, which die of it at once; they are stopped, not failed.
setsid "$tandem" search --data "$dir/fm.zarr" --trials "$dir/trials.json" --budget 1000 \
    --min-epochs 1000 --processes 2 --threads-per-trial 1 --backend cpu --out "$dir/s9" --json \
    >"$dir/out9" 2>"$dir/err9" &
group=$!
scored9() { grep -q '"type":"epoch"' "$dir/s9/trial-$1.r0.jsonl" 2>/dev/null; }
for _ in $(seq 1200); do scored9 0 && scored9 1 && break; sleep 0.1; done
kill -TERM -- -"$group"
wait_within "$group" 120; rc=$?
check "SIGTERM to the search's process group: exit status $rc, the trials stopped, not failed" \
    py_check "$dir/s9/results.json" "r['failed'] == 0 and len(r['results']) == 2 and \
    all(t['status'] == 'stopped' and t['stopped_by_signal'] == 'SIGTERM' for t in r['results'])"

# A trial stopped by the time budget long after its best epoch: best.safetensors holds that
# epoch's parameters, the ones the table reports, not those it was stopped with. 2,500 training
# rows and lr 0.03 overfit within a few epochs, and the budget leaves time for many more.
"$py" - "$dir" <<'PY'
import gzip, struct, sys
src, out, n = "/usr/share/datasets/fashion-mnist/", sys.argv[1], 3000
images = gzip.open(src + "train-images-idx3-ubyte.gz").read()
labels = gzip.open(src + "train-labels-idx1-ubyte.gz").read()
open(out + "/small-images", "wb").write(
    struct.pack(">IIII", 0x803, n, 28, 28) + images[16:16 + n * 784])
open(out + "/small-labels", "wb").write(struct.pack(">II", 0x801, n) + labels[8:8 + n])
PY
"$tandem" prepare --images "$dir/small-images" --labels "$dir/small-labels" --validation-rows 500 \
    --out "$dir/small.zarr" >/dev/null 2>&1
"$tandem" search --data "$dir/small.zarr" --grid lr=0.03 batch=100 --budget 1000 --min-epochs 1000 \
    --budget-seconds 3 --processes 1 --threads-per-trial 1 --backend cpu --out "$dir/s13" \
    --json >"$dir/out13" 2>"$dir/err13"
"$tandem" eval --model "$dir/s13/best.safetensors" --data "$dir/small.zarr" --split validation \
    --json >"$dir/eval13" 2>/dev/null
check "best.safetensors scores the reported best validation loss, not the last epoch's" "$py" -c "
import json, sys
r = json.load(open('$dir/s13/results.json')); e = json.load(open('$dir/eval13'))
best = r['best']
last = [j for j in map(json.loads, open('$dir/s13/trial-0.r0.jsonl')) if j['type'] == 'epoch'][-1]
reported = best['best_validation_loss']
print('reported', reported, 'at epoch', best['best_epoch'], 'kept', e['loss_mean'],
      'last epoch', last['epoch'], last['validation_loss_mean'])
sys.exit(0 if abs(e['loss_mean'] - reported) <= 1e-6 * reported
         and best['best_epoch'] < last['epoch'] else 1)"

# Trials the time budget kept from starting (one slot for three, a rung longer than the budget):
# stopped by the time budget as the running one is, not looking like the halving's losers.
"$tandem" search --data "$dir/small.zarr" --grid lr=0.03,0.01,0.003 batch=100 --budget 1000 \
    --min-epochs 1000 --budget-seconds 2 --processes 1 --threads-per-trial 1 --backend cpu \
    --out "$dir/s14" --json >"$dir/out14" 2>"$dir/err14"
check "trials never started are stopped by the time budget too" py_check "$dir/s14/results.json" \
    "len(r['results']) == 3 and sorted(t['epochs'] for t in r['results'])[:2] == [0, 0] and \
    all(t['status'] == 'stopped' and t.get('stopped_by_time_budget') for t in r['results'])"

# Every trial failing is an error; bad grids name the term.
expect_error "all trials failed -> error" "every trial failed" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --out "$dir/s2" --crash-trial 0
expect_error "--slots-timeout without --slots refused" "need --slots" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --slots-timeout 3 --out "$dir/s7"
expect_error "unknown backend refused" "backend" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --backend tpu --out "$dir/s5"
expect_error "a reduced precision on the CPU refused before the trials" \
    "search: --precision bf16 needs the CUDA backend" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --backend cpu --precision bf16 \
    --out "$dir/s5p"
check "... starting none" test ! -e "$dir/s5p/trial-0.log"
if ! nvidia-smi >/dev/null 2>&1; then
  # Refused once, before any trial (each trial's train refused it, and every trial failed).
  expect_error "--backend cuda without a device refused before the trials" \
      "search: --backend cuda needs a CUDA device, and none is usable here" \
      "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --backend cuda --out "$dir/s6"
  check "... starting none" test ! -e "$dir/s6/trial-0.log"
  expect_error "--precision bf16 with auto and no device refused before the trials" \
      "search: --precision bf16 needs a CUDA device, and none is usable here" \
      "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --precision bf16 \
      --out "$dir/s6p"
  check "... starting none" test ! -e "$dir/s6p/trial-0.log"
fi
# The best checkpoint's copy fails (a full disk, made by the shim): the results are written all
# the same, they say why there is no best.safetensors, and the search exits non-zero saying so.
with_shim TANDEM_TEST_FAIL_RENAME_TO=best.safetensors \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 hidden=16 --budget 1 --min-epochs 1 \
    --processes 1 --threads-per-trial 1 --backend cpu --out "$dir/sf" >/dev/null 2>"$dir/errf"
check "a failed copy of the best checkpoint fails the search" test $? -ne 0
check "... saying so" grep -q "trial 0's checkpoint could not be copied.*No space left" "$dir/errf"
check "... with the results written, naming the failure" py_check "$dir/sf/results.json" \
    "r['best']['trial'] == 0 and 'No space left' in r['best_checkpoint_error']"
check "... and no best.safetensors" test ! -e "$dir/sf/best.safetensors"
# A trial that cannot be started (here its old metrics cannot be removed) fails alone; the
# search goes on with the others and writes its results (it ended with none before).
with_shim TANDEM_TEST_FAIL_REMOVE_OF=trial-0.r0.jsonl \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,0.003 hidden=16 --budget 1 \
    --min-epochs 1 --processes 1 --threads-per-trial 1 --backend cpu --out "$dir/sr" \
    >/dev/null 2>"$dir/errr"
check "a trial that cannot start fails alone, the search exits 0" test $? -eq 0
check "... the trial failed, saying why; the other is best" py_check "$dir/sr/results.json" \
    "r['failed'] == 1 and r['best']['trial'] == 1 and 'could not be started' in [t for t in r['results'] if t['trial'] == 0][0]['error']"
expect_error "a trailing empty grid value refused" "lr=: expected a positive number" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001, --out "$dir/s3"
# Checked once, before any trial starts: data that is not there, and a store without a
# validation split (trials rank by its loss).
expect_error "missing data refused before the trials" "nothing-here: no such file or directory" \
    "$tandem" search --data "$dir/nothing-here" --grid lr=0.001,0.01 --out "$dir/s10"
check "... and nothing made: no --out, no lock in it" test ! -e "$dir/s10"
mkdir "$dir/empty-dir"
expect_error "a directory without IDX files names the file it misses" "missing data file" \
    "$tandem" search --data "$dir/empty-dir" --grid lr=0.001,0.01 --out "$dir/s10"
check "... and no trial started" test ! -e "$dir/s10/trial-0.log"
"$tandem" prepare --out "$dir/noval.zarr" --validation-rows 0 >/dev/null 2>&1
expect_error "a store without a validation split refused" "has no validation split" \
    "$tandem" search --data "$dir/noval.zarr" --grid lr=0.001 --out "$dir/s11"
check "... and the --out it made is gone again, lock and all" test ! -e "$dir/s11"
# One search per --out: a second one would delete the first one's checkpoints. An earlier
# search's results there are removed as it starts, before its first trial: left beside its logs,
# they read as its own if it is killed before it writes them.
mkdir -p "$dir/s12"
echo '{"results": []}' >"$dir/s12/results.json"
echo 'rank,trial' >"$dir/s12/results.csv"
# An earlier search of more trials: its trial 3 is none of this one's, and goes too (its log,
# model, a rung's metrics); files of the user's that only look alike stay (trial-12.notes went).
echo 'old log' >"$dir/s12/trial-3.log"
echo 'old model' >"$dir/s12/trial-3.safetensors"
echo 'old rung' >"$dir/s12/trial-3.r2.jsonl"
echo 'notes' >"$dir/s12/trial-notes.txt"
echo 'notes' >"$dir/s12/trial-12.notes"
echo 'notes' >"$dir/s12/trial-3.r2.jsonl.txt"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1000 --min-epochs 1000 \
    --processes 1 --threads-per-trial 1 --backend cpu --out "$dir/s12" >/dev/null 2>&1 &
first=$!
for _ in $(seq 300); do test -e "$dir/s12/trial-0.log" && break; sleep 0.1; done
check "an earlier search's results are gone once a search has started its trials" \
    test ! -e "$dir/s12/results.json" -a ! -e "$dir/s12/results.csv"
check "... and its trials' files too, those of trial numbers this search has not" \
    test ! -e "$dir/s12/trial-3.log" -a ! -e "$dir/s12/trial-3.safetensors" \
      -a ! -e "$dir/s12/trial-3.r2.jsonl"
check "... keeping the user's files named alike" test -e "$dir/s12/trial-notes.txt" \
    -a -e "$dir/s12/trial-12.notes" -a -e "$dir/s12/trial-3.r2.jsonl.txt"
expect_error "a second search on the same --out refused" "is in use by another run" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --out "$dir/s12"
kill -TERM "$first"; wait_within "$first" 120
echo notes >"$dir/notes.txt"
expect_error "an --out that is a file is refused naming the option" \
    "cannot create --out '$dir/notes.txt'" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --out "$dir/notes.txt"
expect_error "a dataset store as --out is refused" "is a dataset store" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --out "$dir/fm.zarr"
check "... leaving nothing in it" test ! -e "$dir/fm.zarr/lock" -a ! -e "$dir/fm.zarr/trial-0.log"
expect_error "unknown grid key named" "unknown key 'momentum'" \
    "$tandem" search --data "$dir/fm.zarr" --grid momentum=0.9 --out "$dir/s3"
expect_error "bad grid value named" "batch=ten" \
    "$tandem" search --data "$dir/fm.zarr" --grid batch=100,ten --out "$dir/s3"
# A directory of IDX files is written once as OUT/data.zarr and reused by later searches on the
# same --out; given other files, the store is prepared again from them (reused, it would train
# on the first files without a word).
real=/usr/share/datasets/fashion-mnist
for d in idx-a idx-b; do
  mkdir -p "$dir/$d"
  for f in t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do
    ln -s "$real/$f" "$dir/$d/$f"
  done
done
"$py" - "$dir" <<'PY'
import gzip, struct, sys
src, out, n = "/usr/share/datasets/fashion-mnist/", sys.argv[1], 6000
images = gzip.open(src + "train-images-idx3-ubyte.gz").read()
labels = gzip.open(src + "train-labels-idx1-ubyte.gz").read()
for d, first in (("idx-a", 0), ("idx-b", n)):
    open(f"{out}/{d}/train-images-idx3-ubyte", "wb").write(
        struct.pack(">IIII", 0x803, n, 28, 28) + images[16 + first * 784:16 + (first + n) * 784])
    open(f"{out}/{d}/train-labels-idx1-ubyte", "wb").write(
        struct.pack(">II", 0x801, n) + labels[8 + first:8 + first + n])
PY
small_search() {  # small_search IDX_DIR N: its stderr is $dir/err14-N, its exit status $search_rc
  "$tandem" search --data "$dir/$1" --grid lr=0.001 --budget 1 --processes 1 \
      --threads-per-trial 1 --backend cpu --out "$dir/s14" >/dev/null 2>"$dir/err14-$2"
  search_rc=$?
}
store_id() { stat -c %i "$dir/s14/data.zarr/zarr.json" 2>/dev/null; }
# reused N ID: search N succeeded without preparing, and the store is the one whose id was ID
# (a search that failed early prints no "preparing" either).
reused() {
  [ "$search_rc" -eq 0 ] && ! grep -q 'preparing' "$dir/err14-$1" && same_value "$(store_id)" "$2"
}
source_of() {
  "$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['attributes']['source'])" \
      "$dir/s14/data.zarr/zarr.json"
}
small_search idx-a 1
check "an IDX directory is prepared as OUT/data.zarr, recording where from" \
    test "$(source_of)" = "$(readlink -f "$dir/idx-a")"
id=$(store_id)
small_search idx-a 2
check "... reused by the next search on the same files" reused 2 "$id"
small_search idx-b 3
check "... and prepared again from other files, saying why" \
    grep -qF "(it was prepared from $(readlink -f "$dir/idx-a"))" "$dir/err14-3"
check "... recording the new files" test "$(source_of)" = "$(readlink -f "$dir/idx-b")"
# The same directory with other files in it (copied over the old ones): prepared again.
cp "$dir/idx-a/train-images-idx3-ubyte" "$dir/idx-a/train-labels-idx1-ubyte" "$dir/idx-b/"
small_search idx-b 4
check "... and again when the same directory's files have changed, saying so" \
    grep -qF "(its files have changed since it was prepared from them)" "$dir/err14-4"
id=$(store_id)
small_search idx-b 5
check "... then reused while they stay as they are" reused 5 "$id"
# A store the user made there (tandem prepare, with options of their own) is not replaced.
mkdir -p "$dir/s15"
"$tandem" prepare --out "$dir/s15/data.zarr" >/dev/null 2>&1
expect_error "a store prepared by the user from other files is refused, not replaced" \
    "holds a store prepared from /usr/share/datasets/fashion-mnist" \
    "$tandem" search --data "$dir/idx-a" --grid lr=0.001 --budget 1 --out "$dir/s15"
# Progress on a terminal (script(1) gives the search one): a status line redrawn in place.
if command -v script >/dev/null; then
  shown=$(script -qc "'$tandem' search --data '$dir/idx-a' --grid lr=0.001,0.002 --budget 1 \
    --processes 1 --threads-per-trial 1 --backend cpu --out '$dir/s16'" /dev/null </dev/null |
    tr '\r' '\n')
  check "search draws its progress on a terminal" \
    grep -q $'^\033\\[Krunning [0-9]  queued [0-9]  waiting [0-9]  done [0-9]/2  failed 0' \
    <<<"$shown"
  counts=$(grep -o 'running [0-9]  queued [0-9]  waiting [0-9]  done [0-9]/2' <<<"$shown")
  check "... counting the trial not started yet as queued" \
    grep -q "running 1  queued 1  waiting 0  done 0/2" <<<"$counts"
  check "... and ending on the end's counts" \
    test "$(tail -1 <<<"$counts")" = "running 0  queued 0  waiting 0  done 2/2"
else
  echo "skipped: search's progress on a terminal (no script(1) here)"
fi

summarize
