#!/usr/bin/env bash
# tandem search --slots: trials on slot servers (tandem trial-slots) instead of local processes,
# end to end on this machine (the search and the servers share the temporary directory):
#   - the grid of search_cli_test.sh on two servers (one slot each; one on tcp, one on ipc) ranks
#     the trials as the local search does, stops the same ones, reports the crashing trial and
#     names each trial's server;
#   - a search killed with SIGKILL: the servers kill its trials within their heartbeat timeout
#     and keep serving (the comparison search runs on them afterwards); while it held a server's
#     only slot, another search's trials went to the other server, and a search on that server
#     alone waited for the slot;
#   - a search started into the --out of one just killed ends that one's trial first;
#   - a server killed with SIGKILL mid-search: its trial dies with it, is reported failed, and
#     the search ends with the other server's results;
#   - a server listed in the search's --slots directory after the start joins it and takes a
#     waiting trial; a stale entry listed meanwhile is left out;
#   - --budget-seconds cancels the remote trials and ends on time;
#   - a CURVE server admits a search that knows its public key and answers no other;
#   - the last server stopped (SIGTERM: it ends its trial, says so and exits 0): the search ends
#     with an error naming the server; an endpoint nobody serves is an error at once.
# Bad messages to a server are tested in trial_slots_test.cpp.
# Usage: search_slots_test.sh TANDEM_BINARY PYTHON
set -u
tandem=$(readlink -f "$1")
py=$2
source "$(dirname "$0")/test_helpers.sh"
dir=$(mktemp -d) || exit 1  # never an empty $dir: cleanup would act on "" and "/"
background=()
cleanup() {
  stop_background
  rm -rf "$dir"
}
trap cleanup EXIT
py_check() { "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if ($2) else 1)" "$1"; }

# The servers' heartbeat timeout and the search's --slots-timeout, in seconds; trials that run
# until killed; trials long enough for a kill mid-run. Sanitized binaries run 5 to 20 times slower.
hb=2 long=100000 epochs=15
if [ -n "${TANDEM_TEST_SLOW:-}" ]; then hb=4 epochs=6; fi

# (start_server NAME ARGS...: test_helpers.sh.)
# job_pids NAME: the pids of the trials server NAME started, oldest first.
job_pids() { sed -n 's/.* started: pid \([0-9]*\) .*/\1/p' "$dir/$1.log"; }
# wait_started NAME N: until server NAME has started N trials (60 s at most).
wait_started() {
  for _ in $(seq 600); do [ "$(job_pids "$1" | wc -l)" -ge "$2" ] && return 0; sleep 0.1; done
  echo "server $1 started no trial in time: $(tail -3 "$dir/$1.log")"; return 1
}
# running PID: the process exists and is not a zombie (an orphaned zombie may wait for a reaper).
running() { [ -e "/proc/$1" ] && ! grep -q ') Z ' "/proc/$1/stat" 2>/dev/null; }
# gone_within SECONDS PID...: every PID has ended within SECONDS.
gone_within() {
  local t=$1; shift
  for _ in $(seq $((t * 10))); do
    local any=0
    for p in "$@"; do running "$p" && any=1; done
    [ $any -eq 0 ] && return 0
    sleep 0.1
  done
  echo "still running after $t s: $*"; return 1
}

"$tandem" prepare --out "$dir/fm.zarr" >/dev/null 2>&1
check "prepared Fashion-MNIST" test -d "$dir/fm.zarr"
start_server A --slots 1 --endpoint-dir "$dir/slots"
start_server B --slots 1 --bind "ipc://$dir/b.sock" --endpoint-dir "$dir/slots"
# Without --bind, a socket in a directory only this user can enter: a tcp:// port on loopback
# let every user of the machine run jobs as this one.
check "slot server A listens on a socket of its own user's" \
  grep -q '^ipc://.*/tandem-slots-[0-9]*-[A-Za-z0-9]*/slots.sock$' "$dir/A.ep"
a_dir=$(dirname "$(sed 's|^ipc://||' "$dir/A.ep")")
check "... in a directory of mode 700" test "$(stat -c %a "$a_dir")" = 700
check "slot server B listens on ipc" test "$B" = "ipc://$dir/b.sock"

# 1. A search holds server A's only slot; a second search on A and B sees A busy (its hello
# answer) and runs its trials on B. Then the first search is killed outright: its trial must not outlive it
# by more than the servers' heartbeat timeout.
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$A" --slots-timeout $hb --out "$dir/killed" \
    >/dev/null 2>"$dir/killed.err" &
search=$!
background+=("$search")
wait_started A 1
apid=$(job_pids A | head -1)
check "the first search's trial runs on server A" running "$apid"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 seed=1,2 --budget 1 --threads-per-trial 1 \
    --slots "$A,$B" --slots-timeout $hb --out "$dir/busy" >/dev/null 2>"$dir/busy.err"; rc=$?
check "a second search on a busy server and a free one exits 0" test $rc -eq 0
check "... its trials ran on the free server" py_check "$dir/busy/results.json" \
    "[(t['slot'], t['status']) for t in r['results']] == [('$B', 'completed')] * 2"
# A search on the busy server alone waits for its slot.
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --threads-per-trial 1 \
    --slots "$A" --slots-timeout $hb --out "$dir/wait" >/dev/null 2>"$dir/wait.err" &
waiter=$!
background+=("$waiter")
sleep 1
check "a search on a busy server waits for it" running "$waiter"
{ kill -9 $search; wait $search; } 2>/dev/null
check "the servers kill a SIGKILLed search's trial within the heartbeat timeout" \
    gone_within $((hb + 3)) "$apid"
check "server A says the search went silent" grep -q "silent for .* ending its 1 job" "$dir/A.log"
check "both servers still run" running "$A_pid"
check "... (B too)" running "$B_pid"
wait_within $waiter 120; rc=$?
check "the waiting search runs its trial on A once A's slot is free" test $rc -eq 0
check "... there" py_check "$dir/wait/results.json" \
    "[(t['slot'], t['status']) for t in r['results']] == [('$A', 'completed')]"

# 1b. A search killed outright and another started at once into the same --out: the new one
# claims the directory, and server A ends the killed search's trial first (it went on writing
# the trial's files there until A found its search silent).
before=$(job_pids A | wc -l)
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$A" --slots-timeout 30 --out "$dir/reused" \
    >/dev/null 2>"$dir/reused1.err" &
first=$!
background+=("$first")
wait_started A $((before + 1))
old=$(job_pids A | tail -1)
{ kill -9 $first; wait $first; } 2>/dev/null
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --threads-per-trial 1 \
    --slots "$A" --slots-timeout $hb --out "$dir/reused" >/dev/null 2>"$dir/reused2.err"; rc=$?
check "a search into the --out of one just killed exits 0" test $rc -eq 0
check "... having ended the killed search's trial first" \
    grep -q "ended 1 trial(s) of an earlier search, still running into $dir/reused" \
    "$dir/reused2.err"
check "... which server A says" grep -q "writing into $dir/reused: its client is silent" \
    "$dir/A.log"
check "... and which is gone" gone_within 1 "$old"

# 2. The grid of search_cli_test.sh, locally and on the two servers (found through the directory
# they list themselves in: --endpoint-dir, --slots DIR) (which keep serving after
# the killed search): the same ranking, the same stopped trials, the same losses.
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,0.00001 seed=1,2,3 --budget 3 --eta 3 \
    --min-epochs 1 --processes 2 --threads-per-trial 1 --out "$dir/local" --crash-trial 4 \
    >"$dir/local.out" 2>"$dir/local.err"
check "local search exits 0" test $? -eq 0
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,0.00001 seed=1,2,3 --budget 3 --eta 3 \
    --min-epochs 1 --threads-per-trial 1 --out "$dir/remote" --crash-trial 4 --slots "$dir/slots" \
    --slots-timeout $hb >"$dir/remote.out" 2>"$dir/remote.err"; rc=$?
check "search on the slot servers exits 0" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$dir/remote.err"
r="$dir/remote/results.json"
check "the same ranking, statuses, rungs, epochs and losses as the local search" \
    "$py" -c "
import json, sys
local, remote = (json.load(open(f'$dir/{d}/results.json'))['results'] for d in ('local', 'remote'))
key = lambda r: [(t['trial'], t['status'], t['rung'], t['epochs'], t.get('best_validation_loss')) for t in r]
sys.exit(0 if key(local) == key(remote) else 1)"
check "best trial has lr=0.001 and the full budget" py_check "$r" \
    "r['best']['config']['lr'] == 0.001 and r['best']['rung'] == 1 and r['best']['epochs'] == 3"
check "halving: the four other finished trials stopped at rung 0" py_check "$r" \
    "sorted((t['status'], t['rung'], t['epochs']) for t in r['results'][1:] if t['trial'] != 4) == [('stopped', 0, 1)] * 4"
check "the crashing remote trial is reported failed with its exit status" py_check "$r" \
    "r['results'][-1]['trial'] == 4 and r['results'][-1]['status'] == 'failed' and 'exited with status' in r['results'][-1]['error']"
check "the crash is on stderr" grep -q "trial 4 .*FAILED" "$dir/remote.err"
check "--slots DIR found both servers; results.json names each trial's server, and both ran trials" \
    py_check "$r" "{t['slot'] for t in r['results']} == {'$A', '$B'} and sorted(r['slot_servers']) == sorted(['$A', '$B']) and r['processes'] == 2"
check "results.csv has a slot column naming the servers" \
    grep -q "^1,0,completed,.*,\(tcp://127.0.0.1:[0-9]*\|ipc://.*\)$" "$dir/remote/results.csv"
check "local results say local" py_check "$dir/local/results.json" \
    "{t['slot'] for t in r['results']} == {'local'}"
check "best checkpoint kept" test -s "$dir/remote/best.safetensors"

# 3. A server killed (SIGKILL) mid-search: its trial dies with it and is reported failed; the
# others finish on the remaining server.
start_server C --slots 1
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 seed=1,2,3 --budget $epochs \
    --min-epochs $epochs --threads-per-trial 1 --slots "$A,$C" --slots-timeout $hb \
    --out "$dir/lost" >"$dir/lost.out" 2>"$dir/lost.err" &
search=$!
background+=("$search")
wait_started C 1
cpid=$(job_pids C | head -1)
check "a trial runs on server C" running "$cpid"
{ kill -9 "$C_pid"; wait "$C_pid"; } 2>/dev/null
check "the killed server's trial dies with it" gone_within 3 "$cpid"
wait_within $search 300; rc=$?
check "the search goes on without the lost server and exits 0" test $rc -eq 0
[ $rc -eq 0 ] || tail -5 "$dir/lost.err"
check "the lost server's trial failed, naming it" py_check "$dir/lost/results.json" \
    "[(t['slot'], t['status']) for t in r['results'] if t['status'] == 'failed'] == [('$C', 'failed')] and 'slot server $C stopped answering' in r['results'][-1]['error']"
check "the other trials completed on server A" py_check "$dir/lost/results.json" \
    "[(t['slot'], t['status'], t['epochs']) for t in r['results'][:-1]] == [('$A', 'completed', $epochs)] * 2"
check "stderr says the search goes on" grep -q "slot server $C stopped answering.*going on with the others" "$dir/lost.err"

# 3b. Servers listed in the --slots directory after the search started join it (the search reads
# the directory again every 2 s): E, started once D's only slot is taken, runs the waiting trial;
# a stale entry that appears meanwhile is left out, named. Trials run until the search is ended
# with SIGTERM, so each server's part is certain.
start_server D --slots 1 --endpoint-dir "$dir/later"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 seed=1,2 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$dir/later" --slots-timeout $hb --out "$dir/joined" \
    >"$dir/joined.out" 2>"$dir/joined.err" &
search=$!
background+=("$search")
wait_started D 1
echo "ipc://$dir/nobody.sock" >"$dir/later/ghost-1.endpoint"
start_server E --slots 1 --endpoint-dir "$dir/later"
wait_started E 1
for _ in $(seq 300); do grep -q "left out slot server ipc://$dir/nobody.sock" "$dir/joined.err" && break; sleep 0.1; done
kill -TERM "$search"
wait_within $search 60; rc=$?
check "a server listed after the start joins the search, said on stderr" \
    grep -q "slot server $E joined with 1 slot(s)" "$dir/joined.err"
check "... and runs the trial that was waiting" py_check "$dir/joined/results.json" \
    "sorted(t['slot'] for t in r['results']) == sorted(['$D', '$E'])"
check "... and is among the search's slot servers" py_check "$dir/joined/results.json" \
    "r['slot_servers'] == ['$D', '$E']"
check "a stale entry listed meanwhile is left out, named" \
    grep -q "left out slot server ipc://$dir/nobody.sock, listed in a --slots directory: did not answer" \
    "$dir/joined.err"
check "SIGTERM ended that search (exit status $rc), its trials stopped" py_check \
    "$dir/joined/results.json" "all(t['stopped_by_signal'] == 'SIGTERM' for t in r['results'])"
{ kill -TERM "$D_pid" "$E_pid"; wait "$D_pid" "$E_pid"; } 2>/dev/null

# 3c. A server killed outright and started again at the same endpoint (its old entry left
# behind) joins the search again under its new entry and runs the trial that was waiting.
start_server G --slots 1 --endpoint-dir "$dir/again"
start_server F --slots 1 --bind "ipc://$dir/f.sock" --endpoint-dir "$dir/again"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 seed=1,2,3 --budget $long \
    --min-epochs $long --threads-per-trial 1 --slots "$dir/again" --slots-timeout $hb \
    --out "$dir/again-out" >/dev/null 2>"$dir/again.err" &
search=$!
background+=("$search")
wait_started F 1 && wait_started G 1
{ kill -9 "$F_pid"; wait "$F_pid"; } 2>/dev/null
for _ in $(seq 300); do
  grep -q "slot server $F stopped answering" "$dir/again.err" && break
  sleep 0.1
done
start_server F2 --slots 1 --bind "ipc://$dir/f.sock" --endpoint-dir "$dir/again"
check "a server started again at a dropped server's endpoint runs the waiting trial" \
    wait_started F2 1
kill -TERM "$search"
wait_within $search 60
check "... having joined the search, said on stderr" \
    grep -q "slot server $F joined with 1 slot(s)" "$dir/again.err"
check "... and its trial is the third, on that endpoint" py_check "$dir/again-out/results.json" \
    "sorted(t['slot'] for t in r['results']) == sorted(['$F', '$F', '$G'])"
{ kill -TERM "$G_pid" "$F2_pid"; wait "$G_pid" "$F2_pid"; } 2>/dev/null

# 4. --budget-seconds cancels the remote trials (SIGTERM through the server) and ends on time.
seconds=3 on_time=15
if [ -n "${TANDEM_TEST_SLOW:-}" ]; then seconds=15 on_time=45; fi
before=$(job_pids A | wc -l)
start=$(date +%s)
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$A" --slots-timeout $hb --budget-seconds $seconds \
    --out "$dir/budget" >/dev/null 2>"$dir/budget.err"; rc=$?
check "--budget-seconds with --slots exits 0 on time" test $rc -eq 0 -a $(( $(date +%s) - start )) -lt $on_time
check "... the remote trial is stopped by the time budget" grep -q "stopped by the time budget" "$dir/budget.err"
# (tandem train ends between two steps on SIGTERM, exit status 1; before its first step the
# signal's default action ends it.)
check "... the server ended it with SIGTERM" grep -qE "job trial-0.r0 \(pid $(job_pids A | \
    sed -n "$((before + 1))p")\) (killed by signal 15|exited with status 1)" "$dir/A.log"

# 4b. A server of two slots, one held by another search: a search of two trials starts both there
# and is closed by its time budget (30 ms: after the starts, before the refusal is read, which
# comes after a 50 ms wait) before the refusal of the second comes. That trial was kept
# waiting for a slot nothing would start any more, and the search never ended (nor on SIGTERM).
start_server H --slots 2
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$H" --slots-timeout $hb --out "$dir/holder" \
    >/dev/null 2>"$dir/holder.err" &
holder=$!
background+=("$holder")
wait_started H 1
timeout -s KILL 60 "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001,0.002 --budget 1 \
    --threads-per-trial 1 --slots "$H" --slots-timeout $hb --budget-seconds 0.03 \
    --out "$dir/closed" >/dev/null 2>"$dir/closed.err"; rc=$?
# (Trial 0 may finish its one epoch before the cancel reaches it: exit 0; or not: exit 1, and the
# search says the budget ended every trial.)
check "a search closed before a busy server's refusal came ends (exit status $rc)" \
    test $rc -eq 0 -o $rc -eq 1
check "... none of its trials failed" py_check "$dir/closed/results.json" \
    "all(t['status'] in ('stopped', 'completed') for t in r['results'])"
{ kill -9 "$holder"; wait "$holder"; kill -TERM "$H_pid"; wait "$H_pid"; } 2>/dev/null

# 5. CURVE: a server with a secret key serves only searches that know its public key (and, with
#    --curve-allowed, hold an admitted key); the others are told why they get no answer.
"$tandem" keygen --out "$dir/slots" >/dev/null
"$tandem" keygen --out "$dir/searcher" >/dev/null
start_server K --slots 1 --curve-secret "$dir/slots.key_secret"
start_server KA --slots 1 --curve-secret "$dir/slots.key_secret" --curve-allowed "$dir/searcher.key"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --threads-per-trial 1 --slots "$K" \
    --slots-curve-server "$dir/slots.key" --out "$dir/curve" >/dev/null 2>"$dir/curve.err"
check "CURVE: a search with the server's public key runs its trial there" py_check \
    "$dir/curve/results.json" "r['results'][0]['status'] == 'completed' and r['results'][0]['slot'] == '$K'"
expect_error "CURVE: a search without the key gets no answer, and is told why" \
    "the server may be under CURVE, and this client has no key for it" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --slots "$K" --slots-timeout 1 \
    --out "$dir/curve2"
expect_error "CURVE: a search whose key the server does not admit is told so" \
    "CURVE authentication failed: the server refused this client's key" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --slots "$KA" --slots-timeout 1 \
    --slots-curve-server "$dir/slots.key" --out "$dir/curve3"
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --budget 1 --threads-per-trial 1 \
    --slots "$KA" --slots-curve-server "$dir/slots.key" --slots-curve-client \
    "$dir/searcher.key_secret" --out "$dir/curve4" >/dev/null 2>"$dir/curve4.err"
check "CURVE: a search with an admitted key runs its trial there" py_check \
    "$dir/curve4/results.json" "r['results'][0]['status'] == 'completed' and r['results'][0]['slot'] == '$KA'"

# 6. The last server stopped with SIGTERM: it ends its trial and exits 0; the search ends with
# an error naming it (and writes what it has).
before=$(job_pids B | wc -l)  # counted before the search starts one more
"$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 seed=1,2 --budget $long --min-epochs $long \
    --threads-per-trial 1 --slots "$B" --slots-timeout $hb --out "$dir/none" \
    >"$dir/none.out" 2>"$dir/none.err" &
search=$!
background+=("$search")
wait_started B $((before + 1))
bpid=$(job_pids B | tail -1)
kill -TERM "$B_pid"
wait_within "$B_pid" 30; rc=$?
check "SIGTERM: the slot server exits 0" test $rc -eq 0
check "SIGTERM: its trial is ended" gone_within 3 "$bpid"
wait_within $search 120; rc=$?
check "with no server left the search fails" test $rc -ne 0
# (It says so to its clients: a search waited out --slots-timeout, taking it for a silent one.)
check "... naming the server, which said it shut down" \
    grep -qF "every slot server is gone ($B shut down (it said so)" "$dir/none.err"
check "... and still writes results.json" test -s "$dir/none/results.json"

expect_error "an endpoint nobody serves" "did not answer within" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --slots "ipc://$dir/nobody.sock" \
    --slots-timeout 0.5 --out "$dir/nobody"
expect_error "--processes with --slots" "--processes is for local trials" \
    "$tandem" search --data "$dir/fm.zarr" --grid lr=0.001 --slots "$A" --processes 2 --out "$dir/x"
kill -TERM "$A_pid"
wait_within "$A_pid" 30
check "server A exits 0 on SIGTERM" test $? -eq 0
check "... its socket's directory gone with it" test ! -e "$a_dir"
# A server killed outright leaves its socket's directory: the next of this user's servers there
# removes it (its pid has ended), and leaves a live server's.
mkdir -m 700 "$dir/run"
sleep 0 & dead=$!; wait $dead
mkdir -m 700 "$dir/run/tandem-slots-$dead-AbCdEf" "$dir/run/tandem-slots-$$-AbCdEf"
touch "$dir/run/tandem-slots-$dead-AbCdEf/slots.sock"
XDG_RUNTIME_DIR="$dir/run" start_server Z --slots 1
check "a killed server's socket directory is removed by the next server" \
  test ! -e "$dir/run/tandem-slots-$dead-AbCdEf"
check "... a live one's left" test -d "$dir/run/tandem-slots-$$-AbCdEf"
check "... and the new one made in \$XDG_RUNTIME_DIR" \
  grep -q "^ipc://$dir/run/tandem-slots-" "$dir/Z.ep"
# A tcp:// port is reached by every user of the machine: refused without an allowed-keys list or
# --any-peer, even on loopback.
expect_error "a slot server on a loopback tcp port without --curve-allowed is refused" \
    "is reached by every user of this machine" "$tandem" trial-slots --bind "tcp://127.0.0.1:*"
summarize
