# Shared by the shell tests (cli_test.sh, store_cli_test.sh); sourced, not run:
#   source "$(dirname "${BASH_SOURCE[0]}")/test_helpers.sh"
# Each check prints "ok: NAME" or "FAIL: NAME ..." and is counted; end the script with
# `summarize`, whose status (non-zero after any failure) becomes the script's exit status.
failures=0 passes=0

check() {  # check NAME CONDITION...: passes when the condition command succeeds.
  local name=$1; shift
  if "$@"; then passes=$((passes + 1)); echo "ok: $name"
  else failures=$((failures + 1)); echo "FAIL: $name"; fi
}

# failed_saying PID FILE TEXT: the background job PID exited non-zero by itself (within 120 s),
# and FILE (its stderr) holds TEXT.
failed_saying() {
  wait_within "$1" 120; local rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- "$3" "$2"
}

# wait_within PID SECONDS: the background job PID's exit status, as `wait` gives it; one still
# running after SECONDS is SIGKILLed and 124 returned, so a hang fails its own checks, named,
# instead of running into CTest's timeout for the whole script.
wait_within() {
  local pid=$1 seconds=$2
  for _ in $(seq $((seconds * 10))); do
    kill -0 "$pid" 2>/dev/null || { wait "$pid"; return; }
    sleep 0.1
  done
  echo "wait_within: pid $pid ($(ps -o args= -p "$pid" | cut -c1-80)) still running after $seconds s; killed"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 124
}

# expect_error NAME EXPECTED_TEXT COMMAND...: non-zero exit, stderr contains the text.
expect_error() {
  local name=$1 text=$2; shift 2
  local err rc
  err=$("$@" 2>&1 >/dev/null); rc=$?
  if [ $rc -ne 0 ] && grep -qF -- "$text" <<<"$err"; then passes=$((passes + 1)); echo "ok: $name"
  else failures=$((failures + 1)); echo "FAIL: $name (exit $rc): $err"; fi
}

# json_field JSON KEY: the first value of "KEY" in the JSON text, as written (up to a , or }).
json_field() { grep -o "\"$2\":[^,}]*" <<<"$1" | head -1 | cut -d: -f2; }

# done_chunk_ids OUT CHUNKS: "INODE PATH" of the files of each chunk of a tandem predict output
# whose classes and probabilities are both there (a chunk done), a file a line. A chunk written
# again is a new file renamed into place, with another inode: kept_files says whether it was.
done_chunk_ids() {
  local c
  for ((c = 0; c < $2; c++)); do
    if chunk_done "$1" "$c"; then
      stat -c '%i %n' "$1/classes/c/$c" "$1/probabilities/c/$c/0"
    fi
  done
}

# chunk_done OUT C: both files of prediction chunk C are in place (each appears whole: it is
# renamed into place). Builtins only: a loop polling a run in progress calls it per chunk.
chunk_done() { [ -e "$1/classes/c/$2" ] && [ -e "$1/probabilities/c/$2/0" ]; }

# kept_files IDS: every file IDS lists (done_chunk_ids' lines) is still the file it was.
kept_files() {
  local inode path
  [ -n "$1" ] || { echo "kept_files: no file listed"; return 1; }
  while read -r inode path; do
    [ "$(stat -c %i "$path" 2>/dev/null)" = "$inode" ] || { echo "written again: $path"; return 1; }
  done <<<"$1"
}

# same_value A B: A and B are the same and not empty. Two values read from the output of two
# runs that both failed are both empty, which is no agreement.
same_value() { [ -n "$1" ] && [ "$1" = "$2" ]; }

# start_server NAME ARGS...: a slot server (tandem trial-slots ARGS) in the background, for the
# --slots tests; uses $tandem, $dir, $hb (its heartbeat timeout) and the array `background` (the
# caller kills what is in it). Sets $NAME (its endpoint) and NAME_pid; its stderr is $dir/NAME.log.
start_server() {
  local name=$1; shift
  "$tandem" trial-slots --heartbeat-timeout "$hb" --endpoint-file "$dir/$name.ep" "$@" \
      >/dev/null 2>"$dir/$name.log" &
  local pid=$!
  background+=("$pid")
  eval "${name}_pid=$pid"
  for _ in $(seq 300); do [ -s "$dir/$name.ep" ] && break; sleep 0.1; done
  eval "$name=\$(cat \"$dir/$name.ep\")"
}

# stop_background: ends the processes in the array `background`: SIGTERM first (a slot server
# then removes its socket's private directory, in /tmp), SIGKILL what is left after 5 s.
stop_background() {
  local p alive
  for p in "${background[@]}"; do kill -CONT "$p" 2>/dev/null; kill -TERM "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${background[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${background[@]}"; do kill -9 "$p" 2>/dev/null; done
  wait 2>/dev/null
}

summarize() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
