#!/usr/bin/env bash
# tandem predict killed for real: a run over Fashion-MNIST's training split (28 chunks) gets
# SIGKILL once some but not all of its chunks are complete; the rerun reports skipping exactly the
# chunks that were complete, redoes the rest, removes what the killed write left, and its output
# equals a clean run's byte for byte (every file, metadata included, but for the group's id).
# Fails, rather than passing vacuously, when the run ended before the kill could land. Then
# SIGTERM, to one process and to the parent of --processes 2: the run stops between chunks, says
# so, and leaves no temporary file; its rerun finishes the output. A share killed by SIGKILL
# fails its run, named. A run started with SIGHUP ignored (nohup) ignores it.
# usage: predict_kill_test.sh TANDEM
set -uo pipefail
tandem=$1
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null; rm -rf "$dir"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/test_helpers.sh" || exit 1

store=$dir/fm.zarr model=$dir/wide.safetensors chunks=28
# 55,000 training rows in chunks of 2,000 (the last an edge chunk of 1,000), through an untrained
# 784-1024-1024-10 model on one thread: a few seconds, 0.1 to 0.2 s a chunk on the development
# machine, so the kill lands long before the end.
"$tandem" prepare --out "$store" --chunk-rows 2000 >/dev/null 2>&1
"$tandem" train --data "$store" --epochs 0 --hidden 1024,1024 --checkpoint "$model" >/dev/null 2>&1
check "prepared a store and saved a wide model" test -s "$model"

# Two outputs alike, file for file and byte for byte, but for the group's output_id (made anew
# with every group, so that a writer can tell its group from one made again in its place).
same_output() {
  diff -r -x zarr.json "$1" "$2" &&
    diff "$1/classes/zarr.json" "$2/classes/zarr.json" &&
    diff "$1/probabilities/zarr.json" "$2/probabilities/zarr.json" &&
    diff <(grep -v '"output_id"' "$1/zarr.json") <(grep -v '"output_id"' "$2/zarr.json")
}

predict() {
  "$tandem" predict --model "$model" --data "$store" --split train --backend cpu --threads 1 \
    "$@"
}
# How many chunks have both files in place.
complete() {
  local n=0 c
  for ((c = 0; c < chunks; c++)); do chunk_done "$1" "$c" && n=$((n + 1)); done
  echo $n
}

clean=$(predict --out "$dir/clean.zarr" --json)
check "the clean run wrote all $chunks chunks ($(json_field "$clean" seconds) s)" \
  test "$(json_field "$clean" chunks_written)" = $chunks

out=$dir/killed.zarr
# The binary itself in the background (not through the function: that would be a subshell, and
# the kill would leave its tandem running).
"$tandem" predict --model "$model" --data "$store" --split train --backend cpu --threads 1 \
  --out "$out" >/dev/null 2>&1 &
pid=$!
while [ "$(complete "$out")" -lt 2 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
kill -9 "$pid" 2>/dev/null
{ wait "$pid"; } 2>/dev/null; status=$?
pid=
check "the run was killed by SIGKILL while running (exit status $status, 137 expected)" \
  test "$status" -eq 137
done_before=$(complete "$out")
check "some but not all chunks complete after the kill ($done_before of $chunks)" \
  test "$done_before" -ge 2 -a "$done_before" -lt $chunks
echo "left by the kill: $(find "$out" -name '*.tmp-*' | wc -l) temporary file(s)"

again=$(predict --out "$out" --json)
check "the rerun skipped the $done_before complete chunks ($(json_field "$again" chunks_skipped))" \
  test "$(json_field "$again" chunks_skipped)" = "$done_before"
check "the rerun wrote the other $((chunks - done_before))" \
  test "$(json_field "$again" chunks_written)" = $((chunks - done_before))
check "the rerun's accuracy is the clean run's" \
  same_value "$(json_field "$again" correct)" "$(json_field "$clean" correct)"
text=$(predict --out "$out")
check "a third run reports every chunk already done: $text" \
  grep -q "$chunks chunks, 0 written, $chunks already done" <<<"$text"
check "no temporary file left" test -z "$(find "$out" -name '*.tmp-*')"
check "the output equals the clean run's, file for file and byte for byte" \
  same_output "$dir/clean.zarr" "$out"
check "... with every chunk file there" \
  test "$(find "$out" -type f | wc -l)" -eq $((2 * chunks + 3))

# SIGTERM (what a shell's kill, a batch system or a slot server sends) stops the run between two
# chunks instead: the chunks in flight are finished, so it leaves no temporary file. Once in one
# process, once through --processes 2, whose parent passes the signal on to its children.
for how in "one process" "--processes 2"; do
  out=$dir/term-${how// /-}.zarr
  extra=()
  [ "$how" = "--processes 2" ] && extra=(--processes 2)
  "$tandem" predict --model "$model" --data "$store" --split train --backend cpu --threads 2 \
    --out "$out" "${extra[@]}" >/dev/null 2>"$dir/term.err" &
  pid=$!
  while [ "$(complete "$out")" -lt 2 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
  kill -TERM "$pid" 2>/dev/null
  { wait_within "$pid" 120; } 2>/dev/null; status=$?
  pid=
  done_before=$(complete "$out")
  check "$how: SIGTERM ends the run with an error (exit status $status)" test "$status" -eq 1
  check "$how: ... that names the signal and the rerun ($(tail -1 "$dir/term.err"))" \
    grep -q "prediction stopped by SIGTERM.*rerun to finish the missing chunks" "$dir/term.err"
  check "$how: some but not all chunks complete ($done_before of $chunks)" \
    test "$done_before" -ge 2 -a "$done_before" -lt $chunks
  check "$how: no temporary file left" test -z "$(find "$out" -name '*.tmp-*')"
  ids_before=$(done_chunk_ids "$out" "$chunks")
  again=$(predict --out "$out" --json)
  check "$how: the rerun skipped the $done_before complete chunks and wrote the rest" \
    test "$(json_field "$again" chunks_skipped)/$(json_field "$again" chunks_written)" = \
    "$done_before/$((chunks - done_before))"
  check "$how: ... left those chunks' files as they were" kept_files "$ids_before"
  check "$how: ... and the output equals the clean run's" same_output "$dir/clean.zarr" "$out"
done

# A share of --processes 2 killed outright (what the kernel's out-of-memory killer does) while its
# parent lives: the parent waits for the other share, fails naming the killed one and the rerun
# (not "errors above": a share killed so printed none), and the rerun finishes the output.
out=$dir/share-killed.zarr
"$tandem" predict --model "$model" --data "$store" --split train --backend cpu --threads 2 \
  --out "$out" --processes 2 >/dev/null 2>"$dir/share.err" &
pid=$!
while [ "$(complete "$out")" -lt 2 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
victim=$(pgrep -P "$pid" -f -- '--chunks 1/2')
check "share 1/2 was running when it was to be killed" test -n "$victim"
[ -n "$victim" ] && kill -9 "$victim"
{ wait_within "$pid" 120; } 2>/dev/null; status=$?
pid=
check "a share killed by SIGKILL fails the run (exit status $status)" test "$status" -eq 1
said="prediction processes failed: share 1/2 killed by signal 9 (out of memory? see dmesg); "
check "... naming it and the rerun ($(tail -1 "$dir/share.err"))" grep -qF \
  "${said}rerun to finish the missing chunks" "$dir/share.err"
check "... after share 0 finished its half" test "$(complete "$out")" -ge $((chunks / 2))
predict --out "$out" --json >/dev/null
check "the rerun completes it, equal to the clean run" same_output "$dir/clean.zarr" "$out"

# Started with SIGHUP ignored (nohup), a run keeps ignoring it: a closed terminal does not stop it.
out=$dir/nohup.zarr
(trap '' HUP; exec "$tandem" predict --model "$model" --data "$store" --split train --backend cpu \
  --threads 1 --out "$out") >/dev/null 2>&1 &
pid=$!
while [ "$(complete "$out")" -lt 2 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
kill -HUP "$pid" 2>/dev/null
{ wait_within "$pid" 120; } 2>/dev/null; status=$?
pid=
check "nohup: SIGHUP stays ignored; the run finishes (exit status $status, $(complete "$out") chunks)" \
  test "$status" -eq 0 -a "$(complete "$out")" -eq $chunks
summarize
