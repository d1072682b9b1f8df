#!/usr/bin/env bash
# tandem predict --slots: the shares of a prediction on slot servers (tandem trial-slots), end to
# end on this machine (the prediction and the servers share the temporary directory):
#   - two servers (one slot on tcp, two on ipc) predict a split in three shares, from relative
#     paths in another working directory, bit for bit what one local process writes, with the
#     same accuracy, and the servers' logs removed after success;
#   - a rerun on the servers, found through the directory they list themselves in
#     (trial-slots --endpoint-dir, predict --slots DIR), skips every chunk; a stale entry (a
#     server killed outright) is left out; a server that stops takes its entry out; a prediction
#     started before its servers waits for them (--slots-expect);
#   - a server that goes silent mid-prediction (SIGSTOP) has its shares reported failed, naming
#     the rerun; let go on (SIGCONT), it reads the prediction's bye and ends those shares, which
#     leave no temporary file; the rerun on the other server finishes the missing chunks,
#     keeping the complete ones, and the output is again bit for bit the local one;
#   - a server bound to every interface gives the endpoint clients reach it by (--advertise);
#   - bad combinations and an endpoint nobody serves are refused.
# Usage: predict_slots_test.sh TANDEM_BINARY PYTHON
set -u
tandem=$(readlink -f "$1")
source "$(dirname "$0")/test_helpers.sh"
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
background=()
cleanup() {
  stop_background
  rm -rf "$dir"
}
trap cleanup EXIT

# The servers' heartbeat timeout and the prediction's --slots-timeout, in seconds (sanitized
# binaries run 5 to 20 times slower).
hb=2
if [ -n "${TANDEM_TEST_SLOW:-}" ]; then hb=4; fi

# (start_server NAME ARGS...: test_helpers.sh.)
same_output() {  # same_output A B: both predictions' arrays hold the same bytes
  diff -r "$1/classes" "$2/classes" >/dev/null && diff -r "$1/probabilities" "$2/probabilities" >/dev/null
}

# Two copies of Fashion-MNIST's training split in 3,000-row chunks: 110,000 rows, 37 chunks (an
# edge chunk of 2,000 rows last).
"$tandem" prepare --out "$dir/fm.zarr" --copies 2 --chunk-rows 3000 >/dev/null 2>&1
"$tandem" train --data "$dir/fm.zarr" --epochs 1 --checkpoint "$dir/m.safetensors" >/dev/null 2>&1
check "prepared a store and trained a model" test -s "$dir/m.safetensors"
local=$("$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/local.zarr" --backend cpu --json)
check "the local prediction for comparison" test -d "$dir/local.zarr/classes"

start_server a --slots 1 --endpoint-dir "$dir/slots"
start_server b --slots 2 --bind "ipc://$dir/b.sock" --endpoint-dir "$dir/slots"
check "two slot servers started" test -n "$a" -a -n "$b"

mkdir -p "$dir/elsewhere"
r1=$(cd "$dir/elsewhere" && "$tandem" predict --model ../m.safetensors --data ../fm.zarr \
    --split train --out ../remote.zarr --backend cpu --slots "$a,$b" --json 2>"$dir/err1")
check "predict --slots exits 0 ($(tail -c 300 "$dir/err1"))" test -n "$r1"
check "three shares, one per slot" test "$(json_field "$r1" processes)" = 3
check "every chunk written" test "$(json_field "$r1" chunks_written)/$(json_field "$r1" chunks)" = 37/37
check "the output is bit for bit the local prediction's" same_output "$dir/remote.zarr" "$dir/local.zarr"
check "the same accuracy as the local prediction" \
    test "$(json_field "$r1" correct)" = "$(json_field "$local" correct)"
check "the servers ran the shares (their logs name each job)" \
    grep -q "share-" "$dir/a.log" "$dir/b.log"
check "the shares' logs are removed after success" test ! -e "$dir/remote.zarr.logs"

check "both servers listed themselves" test "$(ls "$dir/slots" | grep -c '\.endpoint$')" = 2
r2=$("$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/remote.zarr" --backend cpu --slots "$dir/slots" --json 2>"$dir/err2")
check "a rerun on the servers of --slots DIR skips every chunk ($(tail -c 300 "$dir/err2"))" \
    test "$(json_field "$r2" chunks_written)/$(json_field "$r2" chunks_skipped)" = 0/37
check "--slots DIR found both servers' three slots" test "$(json_field "$r2" processes)" = 3
# A server killed outright leaves its entry: a listed server that does not answer is left out.
echo "ipc://$dir/ghost.sock" >"$dir/slots/ghost-1.endpoint"
rg=$("$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/remote.zarr" --backend cpu --slots "$dir/slots" --slots-timeout $hb --json \
    2>"$dir/err_ghost")
check "a stale entry is left out and the listed servers that answer do the work" \
    test "$(json_field "$rg" chunks_skipped)/$(json_field "$rg" processes)" = 37/3
check "... the stale entry is named on stderr" \
    grep -q "left out slot server ipc://$dir/ghost.sock" "$dir/err_ghost"
check "... and not in the results" test -z "$(grep -o ghost <<<"$rg")"
rm "$dir/slots/ghost-1.endpoint"
mkdir -p "$dir/ghosts"
echo "ipc://$dir/ghost.sock" >"$dir/ghosts/ghost-1.endpoint"
expect_error "a directory whose listed servers all stay silent is an error naming them" \
    "no listed slot server answered: ipc://$dir/ghost.sock" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "$dir/ghosts" --slots-timeout 1

# Server b stops answering while its shares run: frozen as soon as the shares are handed out
# (their log directory appears first). Its jobs are separate processes and may still finish
# their chunks, but b cannot report them: after --slots-timeout they count as failed. The
# prediction says bye to b as it gives it up; b, let go on, reads the bye after any start still
# queued to it, and ends those shares (SIGTERM: a share finishes the chunk it is writing).
"$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/cut.zarr" --backend cpu --slots "$a,$b" --slots-timeout $hb --json \
    >"$dir/out3" 2>"$dir/err3" &
predict_pid=$!
for _ in $(seq 1000); do [ -d "$dir/cut.zarr.logs" ] && break; sleep 0.01; done
kill -STOP "$b_pid"
wait_within "$predict_pid" 120; rc=$?
b_lines=$(wc -l <"$dir/b.log")
kill -CONT "$b_pid"
check "a silent server's shares fail the prediction" test $rc -ne 0
check "the error names the rerun and keeps the logs" \
    grep -q "rerun to finish the missing chunks" "$dir/err3"
check "the failed shares' logs are kept" test -d "$dir/cut.zarr.logs"
said_bye() { tail -n +"$((b_lines + 1))" "$dir/b.log" | grep -q "said bye"; }
for _ in $(seq 500); do said_bye && break; sleep 0.02; done
check "the server, let go on, reads the prediction's bye ($(tail -n +"$((b_lines + 1))" \
    "$dir/b.log" | grep -o 'said bye.*'))" said_bye
for _ in $(seq 500); do [ -z "$(pgrep -P "$b_pid")" ] && break; sleep 0.02; done
check "... and ends the shares it was given" test -z "$(pgrep -P "$b_pid")"
check "... which leave no temporary file" test -z "$(find "$dir/cut.zarr" -name '*.tmp-*')"
rm -f "$dir/cut.zarr/classes/c/5"  # a chunk the rerun must write
done_before=$(done_chunk_ids "$dir/cut.zarr" 37)
r4=$("$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/cut.zarr" --backend cpu --slots "$a" --json 2>"$dir/err4")
check "the rerun on the other server succeeds" test -n "$r4"
check "the rerun wrote only what was missing ($(json_field "$r4" chunks_written) written)" \
    test "$(( $(json_field "$r4" chunks_written) + $(json_field "$r4" chunks_skipped) ))" -eq 37 \
    -a "$(json_field "$r4" chunks_skipped)" -gt 0 -a "$(json_field "$r4" chunks_written)" -gt 0
check "... and left the chunks done before as they were" kept_files "$done_before"
check "after the rerun the output is bit for bit the local one" same_output "$dir/cut.zarr" "$dir/local.zarr"

expect_error "--processes with --slots refused" "with --slots the servers' slots set the shares" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "$a" --processes 2
expect_error "--slots-timeout without --slots refused" "need --slots" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots-timeout 3
mkdir -p "$dir/no-servers"
expect_error "--slots with a directory where no server is listed is refused" \
    "no *.endpoint files there" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "$dir/no-servers"
expect_error "--slots with neither an endpoint nor a directory is refused" \
    "neither an endpoint" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "$dir/not-there"
listed() { ls "$dir/slots"/*-"$1".endpoint >/dev/null 2>&1; }  # listed PID
check "server a is listed while it runs" listed "$a_pid"
kill -TERM "$a_pid"
wait_within "$a_pid" 60 2>/dev/null
check "a server stopped by SIGTERM takes its entry out of the directory" \
    test "$(ls "$dir/slots")" = "$(basename "$(ls "$dir/slots"/*-"$b_pid".endpoint)")"
check "... and removes its --endpoint-file (a later client read a server gone)" \
    test ! -e "$dir/a.ep" -a -e "$dir/b.ep"
kill -HUP "$b_pid"
wait_within "$b_pid" 60 2>/dev/null
check "so does a server stopped by SIGHUP (its terminal gone)" test -z "$(ls "$dir/slots")"

# A prediction started with its servers (as in one batch script): --slots-expect waits for them.
"$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/remote.zarr" --backend cpu --slots "$dir/later" --slots-expect 2 --slots-timeout 20 \
    --json >"$dir/out_later" 2>"$dir/err_later" &
later=$!
background+=("$later")
sleep 1
start_server d --slots 1 --endpoint-dir "$dir/later"
start_server e --slots 1 --bind "ipc://$dir/e.sock" --endpoint-dir "$dir/later"
wait_within "$later" 120; rc=$?
check "--slots-expect 2 waited for two servers that started after it ($(tail -c 300 "$dir/err_later"))" \
    test $rc -eq 0 -a "$(json_field "$(cat "$dir/out_later")" processes)" = 2
expect_error "--slots-expect with fewer servers listed is an error saying how many came" \
    "--slots-expect 3: only 2 server(s) listed after 1 s" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "$dir/later" --slots-expect 3 --slots-timeout 1
# A server that serves other machines runs jobs for whoever reaches it: refused unless it admits
# only known keys or is told --any-peer (it once served every interface without a word).
expect_error "a slot server bound to every interface without an allowed-keys list is refused" \
    "is reached by other machines, and whoever reaches it runs tandem jobs as this user" \
    "$tandem" trial-slots --bind "tcp://0.0.0.0:*"
# Bound to every interface, a server gives its endpoint by name (--advertise), as clients reach it.
start_server c --slots 1 --bind "tcp://0.0.0.0:*" --any-peer --advertise 127.0.0.1
check "a server bound to 0.0.0.0 gives the advertised host ($c)" \
    grep -qE '^tcp://127\.0\.0\.1:[0-9]+$' "$dir/c.ep"
r5=$("$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
    --out "$dir/remote.zarr" --backend cpu --slots "$c" --json 2>"$dir/err5")
check "... and is reached there ($(tail -c 300 "$dir/err5"))" \
    test "$(json_field "$r5" chunks_skipped)" = 37
# --backend cuda is the servers' to resolve: a client without a GPU sends the shares (it once
# refused at once, with no device of its own), and here the servers, without one either, fail.
if ! nvidia-smi >/dev/null 2>&1; then
  expect_error "--backend cuda with --slots goes to the servers, which say they have no GPU" \
      "prediction shares on slot servers failed" \
      "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --split train \
      --out "$dir/cuda.zarr" --backend cuda --slots "$c"
fi
expect_error "--advertise without a wildcard bind is refused" "--advertise is for a server bound" \
    "$tandem" trial-slots --advertise 127.0.0.1
expect_error "an endpoint nobody serves is named" "ipc://$dir/nobody" \
    "$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/x.zarr" \
    --slots "ipc://$dir/nobody" --slots-timeout 1
# A server whose --root the output lies outside refuses the shares: they never ran, so the error
# names no logs (it named a log directory with none in it, left behind) and no rerun (one is
# refused the same way).
mkdir -p "$dir/root"
start_server r --slots 1 --root "$dir/root"
"$tandem" predict --model "$dir/m.safetensors" --data "$dir/fm.zarr" --out "$dir/rooted.zarr" \
    --slots "$r" --slots-timeout $hb >/dev/null 2>"$dir/rooted.err"; rc=$?
check "shares a server refuses under its --root fail the prediction (status $rc)" test $rc -ne 0
check "... said as refused, with no rerun offered" grep -qF \
    "the servers refused them, and refuse a rerun the same way until that changes" "$dir/rooted.err"
check "... naming the refusal" grep -q "refused it: job share-0 refused:" "$dir/rooted.err"
check "... and leaving no empty log directory" test ! -e "$dir/rooted.zarr.logs"
summarize
