#!/usr/bin/env bash
# The tandem command end to end: training, evaluation, checkpoints and resume on the installed
# Fashion-MNIST, and every bad input refused with a message that names it, a non-zero exit and
# no partial output.   usage: cli_test.sh TANDEM
set -uo pipefail
tandem=$1
real=/usr/share/datasets/fashion-mnist
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
trap 'rm -rf "$dir"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/test_helpers.sh" || exit 1

[ -d "$real" ] || { echo "Fashion-MNIST is not installed at $real (apt-get install dataset-fashion-mnist)"; exit 1; }

# The BLAS kernels: OpenBLAS's oldest ones (its choice on a CPU model newer than the library) are
# replaced by the best family kernels the CPU runs; a user's OPENBLAS_CORETYPE stands.
version=$(env -u OPENBLAS_CORETYPE "$tandem" --version)
kernels=$(sed -n 's/.*OpenBLAS \(.*\) kernels.*/\1/p' <<<"$version")
check "--version names the BLAS kernels (got '$version')" test -n "$kernels"
older_than_avx2="unknown katmai coppermine northwood prescott banias atom core2 penryn dunnington
  nehalem athlon opteron opteron(sse3) barcelona nano sandybridge bobcat bulldozer piledriver"
if grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo; then
  check "an AVX2 CPU runs AVX2 kernels or later (got '$kernels')" \
    bash -c '! grep -qwiF -- "${1,,}" <<<"$2"' _ "$kernels" "$older_than_avx2"
fi
chosen=$(OPENBLAS_CORETYPE=Prescott "$tandem" --version 2>&1)
check "OPENBLAS_CORETYPE stands (got '$chosen')" grep -q 'OpenBLAS Prescott kernels' <<<"$chosen"

# Training, checkpoint, metrics, evaluation.
out=$("$tandem" train --data "$real" --epochs 2 --batch 1000 --threads 2 --json --keep last \
      --checkpoint "$dir/model.safetensors" --metrics "$dir/metrics.jsonl" 2>"$dir/train.err")
check "train exits 0" test $? -eq 0
acc=$(grep -o '"test":{[^}]*}' <<<"$out" | grep -o '"accuracy":[0-9.]*' | cut -d: -f2)
check "two epochs reach test accuracy > 0.8 (got $acc)" awk -v a="$acc" 'BEGIN{exit !(a > 0.8)}'
check "kept the last epoch" test "$(json_field "$out" kept_epoch)" = 2
check "summary counts samples" test "$(json_field "$out" samples)" = 110000
check "checkpoint written" test -s "$dir/model.safetensors"
check "metrics: 110 step lines" test "$(grep -c '"type":"step"' "$dir/metrics.jsonl")" -eq 110
check "metrics: 2 epoch lines" test "$(grep -c '"type":"epoch"' "$dir/metrics.jsonl")" -eq 2
check "metrics: steps and epochs counted from 1 alike" \
  test "$(grep -o '"epoch":[0-9]*' "$dir/metrics.jsonl" | sort -u | tr '\n' ' ')" = \
  '"epoch":1 "epoch":2 '

check "no temporary files left" test "$(ls "$dir" | grep -c tmp)" -eq 0
ev=$("$tandem" eval --model "$dir/model.safetensors" --data "$real" --split test --json)
check "eval agrees with train's test accuracy" test "$(json_field "$ev" accuracy)" = "$acc"
check "eval counts 10000 test samples" test "$(json_field "$ev" samples)" = 10000
# No validation split (--validation-rows 0): null in the JSON summary. Its zeros once read as a
# perfect loss of 0.
unscored=$("$tandem" train --data "$real" --epochs 0 --validation-rows 0 --threads 2 --json \
           2>/dev/null)
check "train --json gives a split the data lacks as null" \
  grep -q '"validation":null' <<<"$unscored"
check "... and the one it has in full" grep -q '"test":{"accuracy":' <<<"$unscored" ||
  echo "$unscored"

# Same seed and threads: identical results; resume continues where the checkpoint stopped.
again=$("$tandem" train --data "$real" --epochs 2 --batch 1000 --threads 2 --json --keep last 2>/dev/null)
check "same seed, same test loss" \
  same_value "$(json_field "$again" loss)" "$(json_field "$out" loss)"
"$tandem" train --data "$real" --epochs 1 --batch 1000 --threads 2 --keep last --checkpoint "$dir/one.safetensors" \
  --metrics "$dir/resumed.jsonl" >/dev/null 2>&1
cp "$dir/one.safetensors" "$dir/one-copy.safetensors"
# --batch is not given again: a resumed run takes the checkpoint's batch (and seed, lr, ...).
resumed=$("$tandem" train --data "$real" --epochs 2 --threads 2 --json --keep last --resume "$dir/one.safetensors" \
          --metrics "$dir/resumed.jsonl" 2>"$dir/resumed.err")
check "resumed run does the one missing epoch" test "$(json_field "$resumed" epochs)" = 1
check "resumed run ends bit-identical" \
  same_value "$(json_field "$resumed" loss)" "$(json_field "$out" loss)"
check "resumed run appends to its metrics: epochs 1 and 2" \
  test "$(grep '"type":"epoch"' "$dir/resumed.jsonl" | grep -o '^{"epoch":[0-9]*' | cut -d: -f2 | tr '\n' ' ')" = "1 2 "
"$tandem" train --data "$real" --epochs 2 --batch 500 --threads 2 --keep last \
  --resume "$dir/one-copy.safetensors" >/dev/null 2>"$dir/differs.err"
check "a resumed run says when a given option differs from its checkpoint's" \
  grep -qF "resuming with --batch 500; the checkpoint's run used 1000" "$dir/differs.err"
# The validation split of IDX files is the training file's last --validation-rows rows: a resumed
# run takes the checkpoint's count (it trained on other rows with the default 5,000), ending
# bit-identical to the run it continues; a count given differently is said.
whole=$("$tandem" train --data "$real" --epochs 2 --threads 2 --json --keep last \
        --validation-rows 2000 2>/dev/null)
"$tandem" train --data "$real" --epochs 1 --threads 2 --keep last --validation-rows 2000 \
  --checkpoint "$dir/vr.safetensors" >/dev/null 2>&1
vr=$("$tandem" train --data "$real" --epochs 2 --threads 2 --json --keep last \
     --resume "$dir/vr.safetensors" 2>/dev/null)
check "a resumed run keeps its checkpoint's --validation-rows" \
  same_value "$(json_field "$vr" loss)" "$(json_field "$whole" loss)"
"$tandem" train --data "$real" --epochs 1 --threads 2 --validation-rows 3000 \
  --resume "$dir/vr.safetensors" >/dev/null 2>"$dir/vr.err"
check "... and says when another is given" \
  grep -qF "resuming with --validation-rows 3000; the checkpoint's run used 2000" "$dir/vr.err"

# SIGTERM ends a run between two steps, never inside a checkpoint's write: it exits non-zero
# saying so, no temporary file is left, and the checkpoint of the last epoch done resumes.
"$tandem" train --data "$real" --epochs 1000 --batch 1000 --threads 2 --keep last \
  --checkpoint "$dir/stopped.safetensors" >/dev/null 2>"$dir/stopped.err" &
trainer=$!
for _ in $(seq 1200); do [ -s "$dir/stopped.safetensors" ] && break; sleep 0.1; done
check "the run to stop wrote its first epoch's checkpoint" test -s "$dir/stopped.safetensors"
kill -TERM $trainer
wait $trainer; rc=$?
check "SIGTERM ends tandem train with a failure status (got $rc)" test $rc -eq 1
check "... saying the checkpoint holds the last epoch" \
  grep -q "stopped by SIGTERM; the checkpoint $dir/stopped.safetensors holds the last epoch" \
  "$dir/stopped.err"
check "... leaving no temporary file" test "$(ls "$dir" | grep -c 'stopped.safetensors.tmp')" -eq 0
out=$("$tandem" train --data "$real" --epochs 0 --threads 2 --resume "$dir/stopped.safetensors" \
      --json 2>/dev/null)
check "... and the checkpoint resumes" test -n "$(json_field "$out" kept_epoch)"
# Stopped before its first epoch, a run says nothing was saved, though a file is there by its
# --checkpoint's name (another run's, not this run's last epoch).
cp "$dir/stopped.safetensors" "$dir/stale.safetensors"
"$tandem" train --data "$real" --epochs 1000 --batch 1 --hidden 1000 --threads 1 --keep last \
  --checkpoint "$dir/stale.safetensors" --metrics "$dir/stale.jsonl" >/dev/null 2>"$dir/stale.err" &
trainer=$!
for _ in $(seq 600); do [ -s "$dir/stale.jsonl" ] && break; sleep 0.1; done
# A second run on the same --checkpoint is refused (both once wrote it, each saying it had).
expect_error "a second run on a --checkpoint in use is refused" \
  "--checkpoint $dir/stale.safetensors is in use by another run (process $trainer)" \
  "$tandem" train --data "$real" --epochs 1 --threads 1 --checkpoint "$dir/stale.safetensors"
kill -TERM $trainer
wait $trainer
check "a run stopped before its first epoch says nothing was saved, whatever file is there" \
  grep -q "stopped by SIGTERM; no epoch was completed, nothing was saved" "$dir/stale.err"
check "... and its checkpoint's lock file goes with it" test ! -e "$dir/stale.safetensors.lock"

# A bad command line said in the user's order, with the option meant: CLI11 listed unknown
# words last first, said a repeated option was "At Most 1 required but received 2", and a
# required option missing hid the mistyped one ("eval --modle x": "--model is required").
said="tandem train: error: not an option or argument of this command:"
expect_error "an unknown option is said in order, with the one meant" \
  "$said --epoch (did you mean --epochs?) 1" "$tandem" train --epoch 1
expect_error "an option given twice is said so" "--epochs is given 2 times: give it once" \
  "$tandem" train --epochs 1 --epochs 2
expect_error "a mistyped required option is said, not its absence" \
  "not an option or argument of this command: --modle (did you mean --model?) x" \
  "$tandem" eval --modle x

# A run that diverges (an absurd learning rate) fails instead of reporting a NaN model as done,
# and its checkpoint is refused by name.
expect_error "a diverged run exits non-zero" "training diverged" \
  "$tandem" train --data "$real" --epochs 1 --hidden 16 --threads 2 --lr 1e30 --checkpoint "$dir/nan.safetensors"
check "a diverged run writes no checkpoint (no reader would take it)" \
  test ! -e "$dir/nan.safetensors"
expect_error "a diverged run without a validation split fails by its test loss" \
  "training diverged: the parameters give a test loss" \
  "$tandem" train --data "$real" --epochs 1 --hidden 16 --threads 2 --lr 1e30 --validation-rows 0
# A result that cannot be written (a full disk) fails the command; it exited 0 before.
expect_error "output that cannot be written is an error" "cannot write the output" \
  bash -c '"$0" eval --model "$1" --data "$2" --threads 2 --json >/dev/full' \
  "$tandem" "$dir/model.safetensors" "$real"
# A NaN parameter (another program's file): the first float of the data section made NaN.
python3 -c 'import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
start = 8 + struct.unpack("<Q", data[:8])[0]
data[start:start + 4] = struct.pack("<f", float("nan"))
open(sys.argv[2], "wb").write(data)' "$dir/model.safetensors" "$dir/nan.safetensors"
expect_error "a diverged checkpoint is refused" "non-finite" "$tandem" eval --model "$dir/nan.safetensors" --data "$real"
# Finite parameters too large for the pixels (every hidden bias 3e38, every output weight 1):
# every logit overflows, and eval says so instead of reporting an accuracy for rows predict
# refuses.
python3 -c 'import json, struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
for name, value in (("hid_b", 3e38), ("sm_w", 1.0)):
    begin, end = header[name]["data_offsets"]
    count = (end - begin) // 4
    data[8 + n + begin:8 + n + end] = struct.pack("<%df" % count, *[value] * count)
open(sys.argv[2], "wb").write(data)' "$dir/model.safetensors" "$dir/big.safetensors"
expect_error "a model whose logits overflow: no accuracy" "is not finite (its logits overflow" \
  "$tandem" eval --model "$dir/big.safetensors" --data "$real"
expect_error "eval of an empty split says so" "the validation split of $real has no rows" \
  "$tandem" eval --model "$dir/model.safetensors" --data "$real" --split validation \
  --validation-rows 0
# A model trained without a validation split learned from the rows a default split holds out:
# eval takes the count from its checkpoint, and has no validation rows to score it on.
"$tandem" train --data "$real" --epochs 1 --threads 2 --validation-rows 0 \
  --checkpoint "$dir/v0.safetensors" >/dev/null 2>&1
expect_error "eval's validation split is the one the model was trained without" \
  "the validation split of $real has no rows" \
  "$tandem" eval --model "$dir/v0.safetensors" --data "$real" --split validation
# A count that says nothing of IDX files (the Python API's own validation arrays, a store's
# split; here the same file without tandem train's "validation_split"): the default 5000.
python3 -c 'import json, struct, sys
data = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", data[:8])[0]
header = json.loads(data[8:8 + n])
del header["__metadata__"]["validation_split"]
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])' \
  "$dir/v0.safetensors" "$dir/v0-python.safetensors"
ev=$("$tandem" eval --model "$dir/v0-python.safetensors" --data "$real" --split validation --json)
check "... but only a count tandem train split off IDX files" \
  test "$(json_field "$ev" samples)" = 5000
# A checkpoint that cannot be written is refused before the first step, not after an epoch.
expect_error "an unwritable --checkpoint is refused at once" \
  "cannot write '$dir/absent/c.safetensors'" \
  "$tandem" train --data "$real" --epochs 1 --threads 2 --checkpoint "$dir/absent/c.safetensors"
# A resumed run keeps what its checkpoint's run kept: a --keep last run resumed without --keep
# once kept the best epoch (the default).
"$tandem" train --data "$real" --epochs 1 --hidden 16 --threads 2 --keep last \
  --checkpoint "$dir/keep.safetensors" >/dev/null 2>&1
out=$("$tandem" train --data "$real" --epochs 2 --threads 2 --resume "$dir/keep.safetensors" 2>&1)
check "a resumed --keep last run keeps the last epoch without being told again" \
  grep -q "kept the parameters of epoch 2 (the last)" <<<"$out"
# A --checkpoint or --metrics naming a file that is no checkpoint or log (here a copy of the
# data's labels) is refused, the file kept: both once wrote over it, exit 0.
cp "$real/t10k-labels-idx1-ubyte.gz" "$dir/labels.gz"
expect_error "a --checkpoint that is no checkpoint is refused" \
  "--checkpoint $dir/labels.gz exists and is not a Tandem checkpoint" \
  "$tandem" train --data "$real" --epochs 1 --threads 2 --checkpoint "$dir/labels.gz"
expect_error "a --metrics file that is no log is refused" \
  "metrics file $dir/labels.gz holds something other than a metrics log" \
  "$tandem" train --data "$real" --epochs 1 --threads 2 --metrics "$dir/labels.gz"
check "... and the file is kept" cmp -s "$real/t10k-labels-idx1-ubyte.gz" "$dir/labels.gz"

# Bad data: each refused, naming the file; no checkpoint or metrics left behind.
mkdir "$dir/bad"
for f in train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz; do ln -s "$real/$f" "$dir/bad/$f"; done
zcat "$real/train-images-idx3-ubyte.gz" | head -c 1000000 > "$dir/bad/train-images-idx3-ubyte"
expect_error "truncated images file" "$dir/bad/train-images-idx3-ubyte" \
  "$tandem" train --data "$dir/bad" --checkpoint "$dir/bad.safetensors" --metrics "$dir/bad.jsonl"
check "no checkpoint after a failed run" test ! -e "$dir/bad.safetensors"
check "no metrics after a failed run" test ! -e "$dir/bad.jsonl"
{ printf '\x00\x00\x08\x03\x00\x00\xea\x60\x00\x00\x00\x1c\x00\x00\x00\x1c'; zcat "$real/train-images-idx3-ubyte.gz" | tail -c +17; printf 'extra'; } > "$dir/bad/train-images-idx3-ubyte"
expect_error "trailing bytes" "trailing" "$tandem" train --data "$dir/bad"
printf 'PK\x03\x04 not an idx file at all' > "$dir/bad/train-images-idx3-ubyte"
expect_error "wrong magic" "magic" "$tandem" train --data "$dir/bad"
rm "$dir/bad/train-images-idx3-ubyte"
zcat "$real/t10k-images-idx3-ubyte.gz" > "$dir/bad/train-images-idx3-ubyte"
expect_error "label/image count mismatch" "60000" "$tandem" train --data "$dir/bad"
expect_error "missing directory" "$dir/nowhere" "$tandem" train --data "$dir/nowhere"

# Bad options and checkpoints.
expect_error "batch 0" "batch" "$tandem" train --data "$real" --batch 0
# A batch past the rows is one batch: rows + batch - 1 overflowed near 2^63 into no steps per
# epoch, a division by zero (SIGFPE).
out=$("$tandem" train --data "$real" --epochs 1 --batch 9223372036854775807 --threads 2 --json \
      2>/dev/null)
check "a batch of 2^63-1 trains one step an epoch" test "$(json_field "$out" steps)" = 1
expect_error "unknown backend" "backend" "$tandem" train --data "$real" --backend tpu
expect_error "bad hidden widths" "'100y' is not a whole number" \
  "$tandem" train --data "$real" --hidden 100y
# A search's grid writes widths with an x between layers ("hidden=256x128"): train takes that too.
"$tandem" train --data "$real" --epochs 1 --hidden 32x16 --threads 2 \
  --checkpoint "$dir/widths.safetensors" >/dev/null 2>&1
check "--hidden 32x16 trains a 784-32-16-10 model" \
  grep -aq '"layers":"784-32-16-10"' <(head -c 4096 "$dir/widths.safetensors")
# Refused as the command line is read, naming the command and the option (as launch's --lr).
expect_error "lr infinite" "tandem train: error: --lr: must be a number above 0, got 'inf'" \
  "$tandem" train --data "$real" --lr inf
expect_error "lr zero, printed as given" "--lr: must be a number above 0, got '0'" \
  "$tandem" train --data "$real" --lr 0
expect_error "a fraction for a whole-number option says one is expected" \
  "tandem train: error: Could not convert: --epochs = 2.5 (a whole number is expected" \
  "$tandem" train --data "$real" --epochs 2.5
# IDX files are read into memory whole: a read-ahead budget means nothing there.
expect_error "--memory-budget with IDX files is refused" \
  "--memory-budget is for a dataset store (its chunks are read ahead)" \
  "$tandem" train --data "$real" --memory-budget 64 --epochs 1
expect_error "--memory-budget past 2^30 MiB is refused" \
  "--memory-budget: must be a number at least 1" \
  "$tandem" train --data "$real" --memory-budget 99999999999
expect_error "negative seed" "--seed: must be a whole number from 0 to 18446744073709551615" \
  "$tandem" train --data "$real" --seed -1
expect_error "seed overflow" "--seed" "$tandem" train --data "$real" --seed 18446744073709551616
expect_error "too many threads" "above the limit of 1024" "$tandem" train --data "$real" --threads 2000
expect_error "batch out of range" "--batch: must be a number above 0, got '1e400'" "$tandem" train --data "$real" --batch 1e400
"$tandem" train --data "$real" --no-such-option >/dev/null 2>&1
check "a bad command line exits 1" test $? -eq 1
# Bad input found once the command runs (here a directory without IDX files): status 1 too,
# said naming the command.
"$tandem" train --data "$dir" --epochs 1 >/dev/null 2>"$dir/bad-input.err"
check "bad input exits 1" test $? -eq 1
check "... saying so as tandem train" grep -q "^tandem train: error: missing data file" \
  "$dir/bad-input.err"
expect_error "resume into another shape" "784-100-10" \
  "$tandem" train --data "$real" --hidden 64 --resume "$dir/one.safetensors"
# --epochs the resumed run has reached already: nothing to train (a requeued job's rerun of a
# finished run), said, and the checkpoint evaluated.
"$tandem" train --data "$real" --epochs 1 --threads 2 --resume "$dir/one-copy.safetensors" \
  >/dev/null 2>"$dir/reached.err"
check "--epochs the resumed run has reached: exits 0" test $? -eq 0
check "... saying there is nothing to train" grep -qF "the run in $dir/one-copy.safetensors \
is at epoch 1, and --epochs 1 counts the run's epochs in all: nothing to train" "$dir/reached.err"
expect_error "a mistyped command named" "unknown command 'trian'" "$tandem" trian
expect_error "--init and --resume together" "not both" \
  "$tandem" train --data "$real" --init "$dir/one.safetensors" --resume "$dir/one.safetensors"
head -c 5000 "$dir/model.safetensors" > "$dir/cut.safetensors"
expect_error "truncated checkpoint" "$dir/cut.safetensors" "$tandem" eval --model "$dir/cut.safetensors" --data "$real"
printf 'garbage' > "$dir/garbage.safetensors"
expect_error "garbage checkpoint" "$dir/garbage.safetensors" "$tandem" eval --model "$dir/garbage.safetensors" --data "$real"
# By the binary's own count (nvidia-smi may see a GPU this process cannot use: a driver older than
# the runtime, CUDA_VISIBLE_DEVICES empty).
version=$("$tandem" --version)
check "--version says what CUDA it has" \
  grep -qE "CUDA: (no usable device|not in this build|[0-9]+ devices?: )" <<<"$version"
if grep -qE "CUDA: (no usable device|not in this build)" <<<"$version"; then
  expect_error "cuda without a device" "cuda" "$tandem" train --data "$real" --backend cuda
fi

summarize
