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

summarize() {
  echo "$passes passed, $failures failed"
  [ "$failures" -eq 0 ]
}
