#!/usr/bin/env bash
# The GPU check: one call on a lent GPU machine (an H200 here) that runs every GPU test and
# benchmark and prints a short table last. The device call brings back at most 8 files from
# $OUT, so $OUT holds five: gpu_check.log (everything printed, in order), device.txt, table.md,
# gpu_tests.xml and results.tgz, which packs every result (the same three, and):
#   gpu_tests.xml       GoogleTest results of tandem_cuda_tests (every kernel vs its CPU twin,
#                       the CUDA backend vs the CPU backend)
#   gpu_predict_tests.xml, gpu_stream_tests.xml
#                       the GPU tests of tandem_predict_tests and tandem_tests (predict on the
#                       GPU against the CPU; the chunk manager's stream feeding the GPU)
#   kernels_cuda.json   Google Benchmark: ceilings (device copy, cuBLAS SGEMM) and each kernel
#   tandem_steps.json   whole training steps of the CUDA backend (batch 1,000 / 10,000 / 60,000)
#   torch_steps.json    the same steps in PyTorch eager and torch.compile, in the same run
#   torch_steps_tf32_bf16.json  PyTorch at float32 matmul precision high and medium (both
#                       TF32 on CUDA), beside Tandem's tf32 and bf16 steps
#   feed.json           the chunk manager feeding the GPU from a store: pinned H2D bandwidth,
#                       stream-to-device bandwidth, steps fed by the stream vs resident data
#   cluster_*.json      tandem launch with 1, 2, 4 CUDA workers and the single-process trainer
#   search_*_p*.json    tandem search with trials on the GPU and on the CPU, 1 and 2 at a time
#   predict.json        tandem predict on the GPU and the CPU (1 and 2 processes) and tandem eval
#   group_step.json     a worker group of one GPU (NCCL; host-staged) against the plain worker
#   sanitizer.txt       compute-sanitizer memcheck over the kernel tests
# results.tgz is rewritten at the start of every stage, so a run cut short still brings back
# what the stages before it measured.
#
# The device machine has CUDA, PyTorch and CMake but none of the Debian packages the engine
# builds against, so the build happens where they are: `bash bench/gpu_check_prepare.sh` on the
# development machine builds for sm_90 and packs the binaries and their non-CUDA libraries into
# .gpu-carry/carry.tar.gz; the device call carries .gpu-carry and runs
#   bash bench/gpu_check.sh
# which unpacks that build, links it against the device's own cuBLAS/cuDNN and runs it. It ends
# within GPU_CHECK_SECONDS (default 480; give the device call a timeout_s of 540): each stage has
# its own time limit, cut to what is left, so one hang cannot eat the lease or the summary (and
# `timeout -k 5`: a stage whose program ignores SIGTERM, waiting on a hung child, is killed);
# once less than 5 s is left, every command after is skipped, saying so.
# It stops within a minute, exit status 2, when Tandem cannot use the GPU (a library it cannot
# load, a driver it cannot talk to): one kernel test runs first, with TANDEM_REQUIRE_CUDA=1 so
# that no usable device is an error that says why rather than a skip. The exit status is not 0
# when a GPU test failed or was skipped unexpectedly; the last lines say so in one verdict line.
# GPU_CHECK_DRY_RUN=1 runs every stage on a machine without a GPU (no gate, no
# TANDEM_REQUIRE_CUDA), to try the script itself where its failures cost no device time.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-check-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
log_pid=$!
exec 3>&1  # the log, for what run_for says while a command's output goes to a file
started=$(date +%s)
# Every result goes to $res; pack copies the headline files to $OUT and packs the whole folder.
res=/tmp/tandem-gpu-results
rm -rf "$res" && mkdir -p "$res"
summarize() {  # the summary table from what the stages so far wrote (gpu_table.py; ~0.1 s)
  "${py_env[@]}" python3 bench/gpu_table.py --kernels "$res/kernels_cuda.json" \
    --tandem "$res/tandem_steps.json" --torch "$res/torch_steps.json" \
    --torch-other "$res/torch_steps_tf32_bf16.json" --feed "$res/feed.json" \
    --group "$res/group_step.json" --search-dir "$res" --markdown "$res/table.md" "$@"
}
pack() {  # every stage leaves an up-to-date table.md, so a run cut short still has one
  local f
  [ -n "${py_env+set}" ] && summarize >/dev/null 2>&1
  for f in device.txt table.md gpu_tests.xml; do [ -f "$res/$f" ] && cp "$res/$f" "$OUT/"; done
  tar -czf "$OUT/results.tgz.part" -C "$res" . && mv "$OUT/results.tgz.part" "$OUT/results.tgz"
}
finish() {  # on any exit: pack, then let tee write the log's last lines before the call returns
  pack
  exec >&- 2>&- 3>&-
  wait "$log_pid" 2>/dev/null
}
trap finish EXIT
stage() { pack; echo; echo "=== $1 ($(( $(date +%s) - started )) s) ==="; }
# Every stage's time limit is cut to what is left of GPU_CHECK_SECONDS (default 480, leaving
# the device call's start and a margin inside the 15 minutes a task is lent), keeping 15 s for
# the summary: a slow stage costs the stages after it, never the summary. Stages run most
# wanted first. Past the deadline the ~30 commands of the later stages are skipped, not started
# with a second each: started, each would cost its start and up to 5 s of kill grace, minutes in
# all, past the device call's limit, and the summary would be lost.
deadline=$(( started + ${GPU_CHECK_SECONDS:-480} ))
skipped=200  # run_for's status for a command it skipped (timeout's own are 124 to 127 and 137)
seconds_left() { echo $(( deadline - $(date +%s) - 15 )); }
run_for() {  # run_for SECONDS COMMAND...: within SECONDS or what is left; killed 5 s after SIGTERM
  local seconds=$1 left
  shift
  left=$(seconds_left)
  if [ "$left" -lt 5 ]; then
    local words=() word
    for word in "$@"; do  # named by its program and first arguments, past env and its settings
      case $word in env|-u|LD_LIBRARY_PATH|*=*) [ ${#words[@]} -eq 0 ] && continue ;; esac
      words+=("$word")
    done
    echo "skipped, no time left: $(basename "${words[0]}") ${words[*]:1:3}" >&3
    return "$skipped"
  fi
  [ "$left" -lt "$seconds" ] && seconds=$left
  # Tandem's carried libraries for this command only (tandem_env): tar, grep and the script's
  # other tools keep the machine's libraries. (compute-sanitizer, run through here, gets them
  # too: the tests it starts need them.)
  timeout -k 5 "$seconds" "${tandem_env[@]}" "$@"
}

stage "device"
{
  nvidia-smi || echo "nvidia-smi failed"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem,power.limit --format=csv || true
} | tee "$res/device.txt"

stage "unpack the carried build"
work=/tmp/tandem-gpu-check
rm -rf "$work" && mkdir -p "$work"
if [ ! -f .gpu-carry/carry.tar.gz ]; then
  echo "no .gpu-carry/carry.tar.gz: run bench/gpu_check_prepare.sh on the development machine" \
       "and name .gpu-carry in the device call's carry"
  exit 1
fi
tar -xzf .gpu-carry/carry.tar.gz -C "$work" || exit 1  # gzip: xz may not be installed there
cat "$work/BUILD_INFO" | tee -a "$res/device.txt"

# The CUDA libraries the binaries and benchmarks link against or load (cuBLASLt: dlopen at the
# first GPU dense layer, so ldd below does not see it), wherever this machine keeps them (the
# toolkit, or the pip wheels PyTorch brought).
lib_dirs=("$work/lib")
for lib in libcublasLt.so.13 libcublas.so.13 libcudnn.so.9 libnccl.so.2; do
  found=""
  for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
             $(python3 -c 'import site, glob
for s in site.getsitepackages(): print(*glob.glob(s + "/nvidia/*/lib"))' 2>/dev/null); do
    if [ -e "$dir/$lib" ]; then found=$dir; break; fi
  done
  if [ -z "$found" ]; then
    anywhere=$(timeout 15 find / -xdev -name "$lib*" 2>/dev/null | head -1)
    [ -z "$anywhere" ] || found=$(dirname "$anywhere")  # (dirname of nothing is ".")
  fi
  echo "$lib: ${found:-NOT FOUND}"
  [ -n "$found" ] && lib_dirs+=("$found")
  [ -n "$found" ] || [ "$lib" != libcublasLt.so.13 ] || cublaslt_missing=1
done
# The carried libraries (Debian 12's zlib, OpenSSL, zstd, OpenBLAS) and the toolkit's go first
# for Tandem's binaries only, through tandem_env (run_for puts it before every command it runs,
# compute-sanitizer's included, and the processes they start inherit it): this script's own
# tools, Python and PyTorch keep this machine's libraries (py_env, inside a run_for, puts them
# back).
if [ -n "${LD_LIBRARY_PATH+set}" ]; then py_env=(env "LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
else py_env=(env -u LD_LIBRARY_PATH); fi
tandem_libs=$(IFS=:; echo "${lib_dirs[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
tandem_env=(env "LD_LIBRARY_PATH=$tandem_libs")
dry_run=${GPU_CHECK_DRY_RUN:-0}
[ "$dry_run" = 1 ] || export TANDEM_REQUIRE_CUDA=1
bin=$work/bin
unloadable=0
if [ "${cublaslt_missing:-0}" = 1 ]; then
  echo "libcublasLt.so.13 is not on this machine: the GPU dense layers load it"; unloadable=1
fi
for b in "$bin"/*; do
  # A library, a symbol version (glibc >= 2.34) or, with -r, a symbol the binary needs.
  missing=$("${tandem_env[@]}" ldd -r "$b" 2>&1 | grep -E "not found|undefined symbol")
  [ -z "$missing" ] || { echo "$(basename "$b") is missing: $missing"; unloadable=1; }
done

stage "gate: one kernel test on the GPU"
# Before anything spends the machine's time: Tandem loads, finds the GPU and runs a kernel on it.
run_for 60 "$bin/tandem_cuda_tests" --gtest_filter=CudaKernels.BiasReluIsExact \
  --gtest_brief=0 2>&1 | tail -15
gate=${PIPESTATUS[0]}
if [ "$dry_run" != 1 ] && { [ "$gate" -ne 0 ] || [ "$unloadable" -ne 0 ]; }; then
  echo "GATE FAILED (kernel test exit status $gate, unloadable binaries $unloadable): Tandem" \
       "cannot use this GPU; stopping here rather than spending the machine's time"
  echo "gpu_check verdict: gate failed"
  exit 2
fi

stage "GPU tests"
run_for 150 "$bin/tandem_cuda_tests" --gtest_output="xml:$res/gpu_tests.xml" 2>&1 | \
  grep -v -E '^\[ +(RUN|OK) +\]' | tail -60
tests_status=${PIPESTATUS[0]}
echo "tandem_cuda_tests exit status $tests_status"
# The GPU tests of two other binaries: tandem predict's (the predictions on the GPU against the
# CPU) and the chunk manager's stream feeding the CUDA backend from page-locked slots.
run_for 60 "$bin/tandem_predict_tests" --gtest_filter='Predictor.OnTheGpu*' \
  --gtest_output="xml:$res/gpu_predict_tests.xml" 2>&1 | tail -5
predict_status=${PIPESTATUS[0]}
echo "tandem_predict_tests (GPU) exit status $predict_status"
run_for 60 "$bin/tandem_tests" --gtest_filter='ChunkManager.TrainingFromTheStreamOnTheGpu*' \
  --gtest_output="xml:$res/gpu_stream_tests.xml" 2>&1 | tail -5
stream_status=${PIPESTATUS[0]}
echo "tandem_tests (GPU stream) exit status $stream_status"
# A test that skips on a GPU machine passes silently: name every skip, and warn about those that
# should have run on one GPU (only the ones needing two GPUs may skip here).
python3 - "$res/gpu_tests.xml" "$res/gpu_predict_tests.xml" "$res/gpu_stream_tests.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = []
for path in sys.argv[1:]:
    try:
        cases += list(ET.parse(path).getroot().iter("testcase"))
    except Exception as e:
        print("no GPU test results in %s (%s)" % (path, e))
if not cases:
    sys.exit("no GPU test results to read")
skipped = [c.get("classname") + "." + c.get("name") for c in cases if c.find("skipped") is not None]
failed = [c for c in cases if c.find("failure") is not None or c.find("error") is not None]
two_gpus = {"NcclCollective.EveryVisibleGpuSumsAndBroadcasts",
            "NcclCollective.ARankThatNeverCallsIsNamedAfterTheTimeout",
            "WorkerGroupNccl.TwoGpusSumLikeOneBackendOverTheCombinedBatch"}
print("skipped %d GPU tests: %s" % (len(skipped), ", ".join(skipped) or "none"))
unexpected = [n for n in skipped if n not in two_gpus]
if unexpected:
    print("WARNING: skipped on this GPU machine, expected to run: " + ", ".join(unexpected))
verdict = "%d passed, %d failed, %d skipped (%d unexpectedly)" % (
    len(cases) - len(failed) - len(skipped), len(failed), len(skipped), len(unexpected))
print("GPU tests: " + verdict)
open(sys.argv[1] + ".verdict", "w").write(verdict + "\n")  # (gpu_tests.xml.verdict)
sys.exit(1 if unexpected else 0)
PY
skips_status=$?

stage "whole training steps: tandem"
run_for 90 "$bin/tandem_train_step_cuda_bench" --batches 1000,10000,60000 --seconds 0.5 \
  --repeats 3 --precisions fp32,tf32,bf16 --eager --json "$res/tandem_steps.json"
echo "exit status $?"

stage "whole training steps: PyTorch eager and torch.compile"
run_for 170 "${py_env[@]}" PYTHONUNBUFFERED=1 python3 bench/torch_gpu_bench.py \
  --batches 1000,10000,60000 \
  --seconds 0.5 --repeats 3 --impls eager,eager_fused,graph,compile --json "$res/torch_steps.json"
echo "exit status $?"

stage "whole training steps: PyTorch in tf32 and bf16, against Tandem's (no goal)"
# Tandem's --precision tf32 is PyTorch's float32 matmul precision "high", like for like. PyTorch
# has no bfloat16 products for float32 tensors on CUDA ("medium" runs TF32 there), so Tandem's
# bf16 steps are set beside PyTorch's TF32 ones: the table says so. The same 0.5 s a timed loop
# as Tandem's steps above.
run_for 80 "${py_env[@]}" PYTHONUNBUFFERED=1 python3 bench/torch_gpu_bench.py \
  --batches 1000,10000,60000 --seconds 0.5 --repeats 3 --impls eager_fused,graph \
  --precisions tf32,bf16 --json "$res/torch_steps_tf32_bf16.json"
echo "exit status $?"

stage "kernels and ceilings"
# Two calls, ceilings first: Google Benchmark writes its JSON file only as it exits, so a second
# call cut short by its time limit loses its kernels, not the ceilings they are judged against.
run_for 40 "$bin/tandem_kernels_cuda_bench" --benchmark_min_time=0.05 \
  --benchmark_filter='^ceiling/' --benchmark_out="$res/kernels_ceilings.json" \
  --benchmark_out_format=json 2>&1 | tail -8
echo "exit status ${PIPESTATUS[0]}"
run_for 100 "$bin/tandem_kernels_cuda_bench" --benchmark_min_time=0.05 \
  --benchmark_filter='-^ceiling/' --benchmark_out="$res/kernels_only.json" \
  --benchmark_out_format=json 2>&1 | tail -80
echo "exit status ${PIPESTATUS[0]}"
python3 - "$res" <<'PY'  # one file for gpu_table.py: the ceilings' context, both lists
import json, sys
res, merged = sys.argv[1], None
for name in ("kernels_ceilings.json", "kernels_only.json"):
    try:
        doc = json.load(open(f"{res}/{name}"))
    except Exception as e:
        print(f"{name}: unreadable ({e})")
        continue
    if merged is None:
        merged = doc
    else:
        merged["benchmarks"] = merged.get("benchmarks", []) + doc.get("benchmarks", [])
if merged is not None:
    json.dump(merged, open(f"{res}/kernels_cuda.json", "w"), indent=1)
PY

stage "worker group of one GPU (NCCL, host-staged) against the plain GPU worker"
run_for 60 "$bin/tandem_group_step_cuda_bench" --batches 1000,10000 --seconds 0.3 --repeats 5 \
  --json "$res/group_step.json"
echo "exit status $?"

stage "data feed: chunk manager -> GPU"
# A synthetic MNIST-format data set (the device machine has no Debian packages, so no
# Fashion-MNIST), prepared as uncompressed stores: 4 copies (220,000 training rows: prepare holds
# 5,000 of the 60,000 out for validation) for the stages after this one, and 16 copies (880,000
# rows, 690 MB) for the feed, so that an epoch at batch 60,000 is 15 batches, not 4, and the
# epoch's start weighs little in the streaming figures.
feed_dir=/tmp/tandem-feed
rm -rf "$feed_dir" && mkdir -p "$feed_dir/idx"
python3 - "$feed_dir/idx" <<'PY'
import random, struct, sys
out = sys.argv[1]
rng = random.Random(5)
for name, rows in (("train", 60000), ("t10k", 10000)):
    with open(f"{out}/{name}-images-idx3-ubyte", "wb") as f:
        f.write(struct.pack(">IIII", 0x803, rows, 28, 28))
        f.write(rng.randbytes(rows * 784))
    with open(f"{out}/{name}-labels-idx1-ubyte", "wb") as f:
        f.write(struct.pack(">II", 0x801, rows))
        f.write(bytes(rng.randrange(10) for _ in range(rows)))
PY
run_for 60 "$bin/tandem" prepare --data "$feed_dir/idx" --out "$feed_dir/store.zarr" --copies 4 \
  --compressor none
run_for 60 "$bin/tandem" prepare --data "$feed_dir/idx" --out "$feed_dir/feed16.zarr" \
  --copies 16 --compressor none && \
run_for 90 "$bin/tandem_train_step_cuda_bench" --batches 10000,60000 --seconds 0.5 --repeats 3 \
  --store "$feed_dir/feed16.zarr" --readers 4 --assemblers 6 --epochs 3 --json "$res/feed.json"
echo "exit status $?"
rm -rf "$feed_dir/feed16.zarr"

stage "search and predict: GPU against CPU (issue 7)"
# tandem search on a one-copy store of the same synthetic data (8 trials, rungs at 1 and 3
# epochs), trials on the GPU or the CPU, 1 and 2 at a time; tandem predict of the test split and
# the 4-copy training split on the GPU and the CPU with 1 and 2 processes, against tandem eval
# (CPU) of the test split, end to end (process start, model load, output written), best of 2.
sp_dir=/tmp/tandem-search-predict
rm -rf "$sp_dir" && mkdir -p "$sp_dir"
run_for 60 "$bin/tandem" prepare --data "$feed_dir/idx" --out "$sp_dir/one.zarr" \
  --compressor none >/dev/null
for backend in cuda cpu; do
  for p in 1 2; do
    run_for 120 "$bin/tandem" search --data "$sp_dir/one.zarr" --grid lr=0.001,0.003 \
      hidden=100,300 seed=1,2 --budget 3 --eta 3 --processes "$p" --threads-per-trial 2 \
      --backend "$backend" --out "$sp_dir/search-$backend-$p" --json \
      >"$res/search_${backend}_p$p.json" 2>"$sp_dir/search-$backend-$p.err"
    echo "search --backend $backend --processes $p: exit status $?"
  done
done
run_for 60 "$bin/tandem" train --data "$sp_dir/one.zarr" --backend auto --epochs 1 \
  --checkpoint "$sp_dir/m.safetensors" >/dev/null
echo "model for predict: exit status $?"
timings=$res/predict_timings.tsv
: >"$timings"
timed() {  # timed COMMAND BACKEND PROCESSES SPLIT ARGS...: "COMMAND BACKEND PROCESSES SPLIT SECONDS STATUS"
  local command=$1 backend=$2 processes=$3 split=$4; shift 4
  local t0 t1; t0=$(date +%s.%N); run_for 120 "$@" >/dev/null 2>"$sp_dir/last.err"; local rc=$?
  t1=$(date +%s.%N)
  echo "$command $backend $processes $split $(python3 -c "print(f'{$t1 - $t0:.3f}')") $rc" >>"$timings"
  [ $rc -eq 0 ] || [ $rc -eq "$skipped" ] || {  # (run_for said so)
    echo "$command --backend $backend x$processes $split failed ($rc):"
    tail -3 "$sp_dir/last.err"
  }
}
for round in 1 2; do
  timed eval cpu 1 test "$bin/tandem" eval --model "$sp_dir/m.safetensors" --data "$feed_dir/store.zarr" \
    --split test
  for split in test train; do
    for backend in cuda cpu; do
      for p in 1 2; do
        rm -rf "$sp_dir/out.zarr"
        timed predict "$backend" "$p" "$split" "$bin/tandem" predict --model "$sp_dir/m.safetensors" \
          --data "$feed_dir/store.zarr" --split "$split" --out "$sp_dir/out.zarr" \
          --backend "$backend" --processes "$p"
      done
    done
  done
done
# predict.json, for the summary (gpu_table.py): the best of the two rounds of each.
python3 - "$res" "$feed_dir/store.zarr" <<'PY'
import json, sys
out, store = sys.argv[1], sys.argv[2]
rows = json.load(open(f"{store}/zarr.json"))["attributes"]["rows"]
best = {}
for line in open(f"{out}/predict_timings.tsv"):
    command, backend, processes, split, seconds, rc = line.split()
    if rc == "0":
        key = (command, backend, int(processes), split)
        best[key] = min(best.get(key, float("inf")), float(seconds))
json.dump([{"command": c, "backend": b, "processes": p, "split": s, "rows": rows[s],
            "best_seconds": t, "samples_per_s": rows[s] / t}
           for (c, b, p, s), t in sorted(best.items())], open(f"{out}/predict.json", "w"), indent=1)
PY
echo "exit status $?"

stage "cluster: 1, 2 and 4 GPU workers (processes sharing the GPU) against the single process"
# Same synthetic store; no scorer and no target (random labels): two epochs each, samples/s.
cluster_dir=/tmp/tandem-cluster
rm -rf "$cluster_dir"
run_for 60 "$bin/tandem" train --data "$feed_dir/store.zarr" --backend cuda --epochs 2 --json \
  >"$res/cluster_single.json"
for w in 1 2 4; do
  run_for 90 "$bin/tandem" launch --data "$feed_dir/store.zarr" --backend cuda --workers "$w" \
    --scorer 0 --max-epochs 2 --target 0 --dashboard -1 --run-dir "$cluster_dir/run-$w" --json \
    >"$res/cluster_$w.json"
done
python3 - "$res" <<'PY'
import json, sys
out = sys.argv[1]
try:
    single = json.load(open(f"{out}/cluster_single.json"))["samples_per_s"]
    print(f"single process: {single:,.0f} samples/s")
except Exception as e:
    sys.exit(f"single process: no result ({e})")
for w in (1, 2, 4):
    try:
        j = json.load(open(f"{out}/cluster_{w}.json"))
        print(f"launch, {w} workers: {j['samples_per_s']:,.0f} samples/s ({j['samples_per_s'] / single:.2f} of single)")
    except Exception as e:
        print(f"launch, {w} workers: no result ({e})")
PY
echo "exit status $?"

stage "compute-sanitizer: memcheck over the kernel tests, racecheck over the shared-memory kernels"
# Last: it finds out-of-bounds accesses and shared-memory races in kernels that passed their
# tests above, and its results matter less than the figures if time runs short.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
kernel_tests='CudaKernels.*:SoftmaxXentCuda.*:ColumnStatsCuda.*:CudaBackendTest.FiftyTrainingSteps*'
{
  run_for 90 "$sanitizer" --tool memcheck --error-exitcode 99 \
    "$bin/tandem_cuda_tests" --gtest_filter="$kernel_tests" --gtest_brief=1
  memcheck=$?
  echo "memcheck exit status $memcheck"
  run_for 45 "$sanitizer" --tool racecheck --error-exitcode 99 \
    "$bin/tandem_cuda_tests" --gtest_filter='SoftmaxXentCuda.*:ColumnStatsCuda.*' --gtest_brief=1
  racecheck=$?
  echo "racecheck exit status $racecheck"
} >"$res/sanitizer.txt" 2>&1
[ "$memcheck" != "$skipped" ] || memcheck="skipped (no time left)"
[ "$racecheck" != "$skipped" ] || racecheck="skipped (no time left)"
grep -E "ERROR SUMMARY|exit status|Invalid|Race|FAILED" "$res/sanitizer.txt" | head -40

stage "summary"
summarize
# One line the device call's output tail always holds: did the GPU tests pass?
verdict="GPU tests: $(cat "$res/gpu_tests.xml.verdict" 2>/dev/null || echo "no results")"
verdict+="; tandem_cuda_tests $tests_status, predict on the GPU $predict_status"
verdict+=", stream to the GPU $stream_status"
verdict+="; memcheck ${memcheck:-not run}, racecheck ${racecheck:-not run}"
echo "gpu_check verdict: $verdict"
echo "gpu_check: done in $(( $(date +%s) - started )) s"
[ "$tests_status" -eq 0 ] && [ "$predict_status" -eq 0 ] && [ "$stream_status" -eq 0 ] &&
  [ "$skips_status" -eq 0 ]
