#!/usr/bin/env bash
# tandem predict end to end: Fashion-MNIST's test split through a freshly trained model with two
# processes; accuracy equal to tandem eval's; the output read by zarr-python (its classes are the
# arg-max of its probabilities); a lost chunk redone alone on a rerun; bad input refused; the
# backend choice (auto is the CPU without a GPU, where --backend cuda is refused naming CUDA).
# usage: predict_cli_test.sh TANDEM PYTHON
set -uo pipefail
tandem=$1 python=$2
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/test_helpers.sh" || exit 1

store=$dir/fm.zarr model=$dir/m.safetensors out=$dir/pred.zarr
# 3000-row chunks: the 10000-row test split ends in an edge chunk of 1000.
"$tandem" prepare --out "$store" --chunk-rows 3000 >/dev/null 2>&1
"$tandem" train --data "$store" --epochs 1 --checkpoint "$model" >/dev/null 2>&1
check "prepared a store and trained a model" test -s "$model"

# --backend cpu: bit for bit what tandem eval (always the CPU) counts, whatever devices exist.
pr=$("$tandem" predict --model "$model" --data "$store" --split test --out "$out" --processes 2 \
  --backend cpu --json)
check "predict ran on the CPU" test "$(json_field "$pr" backend)" = '"cpu"'
ev=$("$tandem" eval --model "$model" --data "$store" --split test --json)
check "predict wrote all 4 chunks" test "$(json_field "$pr" chunks_written)" = 4
check "predict's accuracy equals eval's ($(json_field "$pr" accuracy))" \
  same_value "$(json_field "$pr" correct)" "$(json_field "$ev" correct)"
# The training split: eval streams it from the store; both count the same rows right.
pt=$("$tandem" predict --model "$model" --data "$store" --split train --out "$dir/train.zarr" \
  --processes 2 --backend cpu --json)
et=$("$tandem" eval --model "$model" --data "$store" --split train --json)
check "eval streams a store's training split: 55000 rows" test "$(json_field "$et" samples)" = 55000
check "... counting what predict counts ($(json_field "$et" accuracy))" \
  same_value "$(json_field "$pt" correct)" "$(json_field "$et" correct)"

check "zarr-python reads the output; classes = arg-max of probabilities" "$python" - "$out" "$store" <<'PY'
import sys, numpy as np, zarr
out, store = sys.argv[1], sys.argv[2]
g = zarr.open_group(out, mode="r")
c, p = g["classes"][:], g["probabilities"][:]
assert c.dtype == np.uint8 and c.shape == (10000,), (c.dtype, c.shape)
assert p.dtype == np.float32 and p.shape == (10000, 10), (p.dtype, p.shape)
assert g["classes"].chunks == (3000,) and g["probabilities"].chunks == (3000, 10)
assert (np.argmax(p, axis=1) == c).all(), "arg-max differs"
assert np.allclose(p.sum(axis=1), 1.0, atol=1e-6)
assert g.attrs["split"] == "test" and g.attrs["created_by"] == "tandem predict"
labels = zarr.open_group(store, mode="r")["test/labels"][:]
print("accuracy from zarr-python:", (labels == c).mean())
PY

rm "$out/classes/c/2"
before=$(done_chunk_ids "$out" 4)
touch "$out/probabilities/c/1/0.tmp-1-1"   # a temporary file a killed run left
again=$("$tandem" predict --model "$model" --data "$store" --split test --out "$out" \
  --backend cpu --json)
check "a rerun redoes only the lost chunk" test "$(json_field "$again" chunks_written)/$(json_field "$again" chunks_skipped)" = 1/3
check "a rerun keeps the same accuracy" \
  same_value "$(json_field "$again" correct)" "$(json_field "$ev" correct)"
check "done chunks untouched (their files are the same files)" kept_files "$before"
check "stray temporary file removed" test ! -e "$out/probabilities/c/1/0.tmp-1-1"

# The backend: auto takes a usable GPU, else the CPU (the same bits as --backend cpu there).
chunk_bytes() { cat "$1"/classes/c/* "$1"/probabilities/c/*/* | md5sum; }
expect_error "--threads past the limit refused with the number given" \
  "thread count 5000 is above the limit" "$tandem" predict --model "$model" --data "$store" \
  --out "$dir/threads.zarr" --processes 2 --threads 5000
check "... before the output is made" test ! -e "$dir/threads.zarr/zarr.json"
au=$("$tandem" predict --model "$model" --data "$store" --out "$dir/auto.zarr" --json)
if [ "$(json_field "$au" backend)" = '"cpu"' ]; then
  check "auto without a GPU: the CPU's output" test "$(chunk_bytes "$dir/auto.zarr")" = "$(chunk_bytes "$out")"
  expect_error "--backend cuda without a GPU refused, naming CUDA" "CUDA" \
    "$tandem" predict --model "$model" --data "$store" --out "$dir/cuda.zarr" --backend cuda
  # Refused before the output is made: an empty group tied to this model refused the next run
  # of another one.
  check "nothing made by the refused run" test ! -e "$dir/cuda.zarr/zarr.json"
  expect_error "--backend cuda --processes 2 without a GPU refused" "CUDA" \
    "$tandem" predict --model "$model" --data "$store" --out "$dir/cuda.zarr" --backend cuda \
    --processes 2
  check "... nothing made by it either" test ! -e "$dir/cuda.zarr/zarr.json"
else
  check "auto with a GPU runs on it" test "$(json_field "$au" backend)" = '"cuda"'
  # float32 sums in another order: a near-tie may flip on a row or two of 10000.
  gp=$("$tandem" predict --model "$model" --data "$store" --out "$dir/cuda.zarr" --backend cuda \
    --processes 2 --json)
  for run in "$au" "$gp"; do
    d=$(( $(json_field "$run" correct) - $(json_field "$ev" correct) ))
    check "the GPU's accuracy is eval's but for near-ties ($d)" test "${d#-}" -le 2
  done
fi
expect_error "unknown backend refused" "--backend" \
  "$tandem" predict --model "$model" --data "$store" --out "$dir/x.zarr" --backend gpu

expect_error "missing model" "no model checkpoint" \
  "$tandem" predict --model "$dir/none.safetensors" --data "$store" --out "$dir/nodir/x.zarr"
expect_error "missing store" "no dataset store" \
  "$tandem" predict --model "$model" --data "$dir/none.zarr" --out "$dir/nodir/x.zarr"
check "... refused before the output's directory and lock are made" test ! -e "$dir/nodir"
expect_error "out holds something else" "holds something other" \
  "$tandem" predict --model "$model" --data "$store" --out "$store" --overwrite
check "... which leaves no lock file beside it" test ! -e "$store.lock"
mkdir -p "$dir/mine" && echo "my data" >"$dir/mine/data.txt"
expect_error "a directory of the user's refused" "holds something other" \
  "$tandem" predict --model "$model" --data "$store" --out "$dir/mine" --processes 2
check "... left as it was, with no lock file beside it" \
  test "$(ls "$dir/mine")" = "data.txt" -a ! -e "$dir/mine.lock"
"$tandem" train --data "$store" --epochs 1 --seed 2 --checkpoint "$dir/m2.safetensors" >/dev/null 2>&1
expect_error "another model's output refused" "--overwrite" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$out"
check "--overwrite replaces it" "$tandem" predict --model "$dir/m2.safetensors" --data "$store" \
  --out "$out" --overwrite --processes 2
# OUT.lock is predict's own: a file of the user's by that name is neither overwritten nor used.
echo "my notes" >"$dir/notes.lock"
expect_error "a file of the user's at OUT.lock refused" \
  "notes.lock is there and is not a lock file" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$dir/notes"
check "... and left as it was" test "$(cat "$dir/notes.lock")" = "my notes"
# One prediction per --out: while another run holds it (here this script, by flock(1) on
# OUT.lock, the lock tandem predict takes), a second is refused.
exec 9>"$out.lock"
flock 9
expect_error "a second prediction on a busy --out refused" "--out $out is in use by another run" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$out"
# ... also through a symbolic link to it (the lock is taken by the output's real path).
ln -s "$out" "$dir/link-to-out.zarr"
expect_error "... and through a symbolic link to it" "is in use by another run" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$dir/link-to-out.zarr"
exec 9>&-
check "... and runs once it is free" "$tandem" predict --model "$dir/m2.safetensors" \
  --data "$store" --out "$out"
# Written where the link points: an --overwrite through it replaces the output there, not the
# link (which left the output as it was, and a new directory in the link's place).
output_id() {
  "$python" -c "import sys, zarr; print(zarr.open_group(sys.argv[1], mode='r').attrs['output_id'])"\
    "$1"
}
before=$(output_id "$out")
check "an --overwrite through a symbolic link to the output" "$tandem" predict --model "$model" \
  --data "$store" --out "$dir/link-to-out.zarr" --overwrite
check "... replaces the output it points to" test "$(output_id "$out")" != "$before"
check "... and leaves the link a link" test -L "$dir/link-to-out.zarr"
# "link/" names the target already: remove_all() of it emptied the target, then failed.
before=$(output_id "$out")
check "... also given with a trailing slash" "$tandem" predict --model "$dir/m2.safetensors" \
  --data "$store" --out "$dir/link-to-out.zarr/" --overwrite
check "... replacing the output it points to" test "$(output_id "$out")" != "$before"
# A share names its run's output id (--output-id, hidden): one of a run that another has since
# taken the output over from (a child or slot share that started late) writes nothing there.
expect_error "a share of an earlier run refused" "taken over by another run" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$out" --chunks 0/1 \
  --output-id an-earlier-run
expect_error "... and --output-id without --chunks" "--output-id is for a share" \
  "$tandem" predict --model "$dir/m2.safetensors" --data "$store" --out "$out" --output-id x
# An --out in directories not made yet, given with a trailing slash: made, locked beside it.
check "an --out under new directories, with a trailing slash" "$tandem" predict \
  --model "$dir/m2.safetensors" --data "$store" --out "$dir/new/dirs/p.zarr/"
check "... its lock beside the output, not in it" test -e "$dir/new/dirs/p.zarr.lock" -a \
  ! -e "$dir/new/dirs/p.zarr/.lock"
# A label naming no class: the predictions are written, the accuracy is refused (as eval's is).
cp -r "$store" "$dir/badlabel.zarr"
"$python" -c "import sys, zarr; zarr.open_group(sys.argv[1], mode='r+')['test/labels'][7] = 12" \
  "$dir/badlabel.zarr"
expect_error "a label outside the classes is refused, naming its row" \
  "label at index 7 is 12, expected a class in [0, 10)" \
  "$tandem" predict --model "$model" --data "$dir/badlabel.zarr" --out "$dir/badlabel-out.zarr"
check "... after the predictions were written" test -e "$dir/badlabel-out.zarr/classes/c/0"
# New images to classify come without labels: predicted all the same, with no accuracy; other
# commands still need the labels and say which array is missing.
cp -r "$store" "$dir/nolabel.zarr"
rm -r "$dir/nolabel.zarr/test/labels"
nolabel=$("$tandem" predict --model "$model" --data "$dir/nolabel.zarr" \
  --out "$dir/nolabel-out.zarr" --processes 2 --json)
check "a split without labels is predicted, with no accuracy" \
  "$python" -c "import json, sys; j = json.loads(sys.argv[1]); \
sys.exit(0 if j['rows_predicted'] > 0 and 'accuracy' not in j else 1)" "$nolabel"
check "... the same classes as with its labels" "$python" -c "
import sys, numpy, zarr
a, b = (zarr.open_group(p, mode='r')['classes'][:] for p in sys.argv[1:])
sys.exit(0 if a.shape == b.shape and (a == b).all() else 1)" \
  "$dir/nolabel-out.zarr" "$dir/badlabel-out.zarr"
expect_error "eval of a split without labels names the missing array" "nolabel.zarr/test/labels" \
  "$tandem" eval --model "$model" --data "$dir/nolabel.zarr" --split test
summarize
