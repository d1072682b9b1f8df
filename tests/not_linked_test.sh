#!/usr/bin/env bash
# Fails when one of FILES (programs, shared libraries) names a library matching PATTERN among
# those the dynamic loader loads with it (its NEEDED entries).
# usage: not_linked_test.sh PATTERN FILE...
pattern=$1; shift
for f in "$@"; do
  needed=$(readelf -d "$f") || { echo "FAIL: readelf cannot read $f"; exit 1; }
  grep -q NEEDED <<<"$needed" || { echo "FAIL: $f lists no NEEDED library at all"; exit 1; }
  if grep NEEDED <<<"$needed" | grep -q -- "$pattern"; then
    echo "FAIL: $f links $(grep NEEDED <<<"$needed" | grep -- "$pattern" | sed 's/.*\[//; s/\]//')"
    exit 1
  fi
  echo "ok: $f does not link $pattern"
done
