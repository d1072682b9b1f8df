#!/usr/bin/env bash
# Zarr stores written by dask/zarr-python are read by Tandem bit-exactly, and stores written by
# Tandem are read by zarr-python bit-exactly, for two Pythons:
#   Debian's /usr/bin/python3 (python3-dask 2022.12, python3-zarr 2.13: Zarr v2 only, blosc
#     default compressor), and
#   VENV_PYTHON (current dask and zarr 3 from PyPI: Zarr v3 by default with zstd, and v2).
# usage: zarr_interop_test.sh VENV_PYTHON ZARR_TOOL
# Exits non-zero if any store is read differently, naming each mismatch.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 VENV_PYTHON ZARR_TOOL" >&2
  exit 2
fi
venv_python=$1 tool=$2
debian_python=/usr/bin/python3
here=$(cd "$(dirname "$0")" && pwd)
script=$here/zarr_interop.py
dir=$(mktemp -d) || exit 1
trap 'rm -rf "$dir"' EXIT

# The Pythons must be the ones this test is about, or its conclusions would be about others.
zarr_major() { "$1" -c 'import zarr; print(zarr.__version__.split(".")[0])'; }
if [ "$(zarr_major "$debian_python")" != 2 ]; then
  echo "FAIL: $debian_python should see zarr 2.x (python3-zarr)" >&2
  exit 1
fi
if [ "$(zarr_major "$venv_python")" != 3 ]; then
  echo "FAIL: $venv_python should see zarr 3.x (pip install 'zarr>=3' dask)" >&2
  exit 1
fi
"$debian_python" "$script" versions
"$venv_python" "$script" versions 2>/dev/null

failures=0
n=0
run() {  # run LABEL COMMAND...: one case; its output is shown, a failure counted
  local label=$1
  shift
  echo "== $label"
  if "$@"; then
    echo "ok: $label"
  else
    echo "FAIL: $label"
    failures=$((failures + 1))
  fi
}

# Python writes with dask.array.to_zarr (defaults), Tandem dumps, Python compares.
python_to_tandem() {  # PYTHON EXPECTED_FORMAT [write options: --zarr-format N, --blosc-cname C]
  local python=$1 format=$2
  shift 2
  n=$((n + 1))
  local store=$dir/py$n
  "$python" "$script" write "$store" "$@" &&
    "$tool" dump "$store" >"$store.jsonl" &&
    "$python" "$script" check "$store" "$store.jsonl" --format "$format"
}

# Tandem writes, Tandem dumps, Python reads with zarr and compares.
tandem_to_python() {  # PYTHON FORMAT COMPRESSOR
  local python=$1 format=$2 compressor=$3
  n=$((n + 1))
  local store=$dir/tandem$n
  "$tool" write "$store" "$format" "$compressor" &&
    "$tool" dump "$store" >"$store.jsonl" &&
    "$python" "$script" check "$store" "$store.jsonl" --format "$format"
}

compressors="none zstd zstd:0 blosc-lz4 blosc-zstd:3 blosc-lz4-bitshuffle blosc-blosclz-noshuffle
  gzip gzip:0"
v2_only="zlib zlib:9"  # numcodecs' Zlib: Zarr v3 has no zlib codec

# (a) Debian's dask 2022.12 + zarr 2.13: Zarr v2.
run "dask 2022.12/zarr 2 writes v2 (defaults), Tandem reads" python_to_tandem "$debian_python" 2
# Debian's numcodecs has blosc-snappy, which Tandem reads but does not write (PyPI's numcodecs,
# zarr 3's, is built without it).
snappy_to_tandem() {  # and Tandem's dump must say that it read blosc-snappy
  python_to_tandem "$debian_python" 2 --blosc-cname snappy &&
    grep -q '"blosc-snappy' "$dir/py$n.jsonl"
}
run "dask 2022.12/zarr 2 writes v2 blosc-snappy, Tandem reads" snappy_to_tandem
deflate_to_tandem() {  # PYTHON FORMAT gzip|zlib [--zarr-format N]: the dump names the codec
  local python=$1 format=$2 codec=$3
  shift 3
  python_to_tandem "$python" "$format" --deflate "$codec" "$@" &&
    grep -q "\"$codec:" "$dir/py$n.jsonl"
}
for codec in gzip zlib; do
  run "dask 2022.12/zarr 2 writes v2 $codec, Tandem reads" deflate_to_tandem "$debian_python" 2 \
    "$codec"
done
for c in $compressors $v2_only; do
  run "Tandem writes v2 $c, zarr 2 reads" tandem_to_python "$debian_python" 2 "$c"
done
# numcodecs' level -1 (zlib's default; Tandem writes 0 to 9 only) and attributes holding NaN
# and infinities, which Python's json writes as bare NaN, Infinity, -Infinity (not JSON): read.
nonfinite_to_tandem() {  # PYTHON FORMAT [gzip|zlib [--zarr-format N]]: level -1 with a codec
  if [ $# -gt 2 ]; then
    deflate_to_tandem "$@" --deflate-level -1 --nonfinite-attributes &&
      grep -q "\"$3:-1" "$dir/py$n.jsonl"  # the dump names the level read
  else
    python_to_tandem "$@" --nonfinite-attributes
  fi &&
    # Bare tokens as Python's json writes them (not the quoted "NaN" of a fill_value), and the
    # root group's attributes read by Tandem (the dump reads the arrays').
    grep -rqsE --include=.zattrs --include=zarr.json '(^|[:,[ ])-?(NaN|Infinity)([],} ]|$)' \
      "$dir/py$n" &&
    "$tool" group-attributes "$dir/py$n" | grep -qF '"stat":"NaN"'
}
run "zarr 2 writes v2 zlib level -1 and NaN attributes, Tandem reads" \
  nonfinite_to_tandem "$debian_python" 2 zlib

# (b) current dask + zarr 3: Zarr v3 by default, and v2.
run "dask/zarr 3 writes v3 (defaults), Tandem reads" python_to_tandem "$venv_python" 3
run "dask/zarr 3 writes v2 (zarr_format=2), Tandem reads" \
  python_to_tandem "$venv_python" 2 --zarr-format 2
run "zarr 3 writes v2 gzip level -1 and NaN attributes, Tandem reads" \
  nonfinite_to_tandem "$venv_python" 2 gzip --zarr-format 2
run "zarr 3 writes v3 with NaN attributes, Tandem reads" nonfinite_to_tandem "$venv_python" 3
# zarr 3's crc32c checksum codec after zstd: read, the checksum checked; one flipped byte in a
# chunk is refused naming it, not decompressed.
crc32c_to_tandem() {
  python_to_tandem "$venv_python" 3 --crc32c && grep -q 'zstd:0+crc32c' "$dir/py$n.jsonl"
}
run "dask/zarr 3 writes v3 zstd + crc32c, Tandem reads" crc32c_to_tandem
crc32c_corrupt_refused() {
  local chunk
  chunk=$(find "$dir/py$n" -path '*/c/*' -type f | sort | head -1)
  "$venv_python" -c "import sys; p = sys.argv[1]; b = bytearray(open(p, 'rb').read())
b[len(b) // 2] ^= 0xFF; open(p, 'wb').write(b)" "$chunk"
  ! "$tool" dump "$dir/py$n" >/dev/null 2>"$dir/crc.err" &&
    grep -q "crc32c checksum is" "$dir/crc.err"
}
run "... and a flipped byte in a checksummed chunk is refused" crc32c_corrupt_refused
run "dask/zarr 3 writes v3 gzip, Tandem reads" deflate_to_tandem "$venv_python" 3 gzip
for codec in gzip zlib; do
  run "dask/zarr 3 writes v2 $codec, Tandem reads" deflate_to_tandem "$venv_python" 2 "$codec" \
    --zarr-format 2
done
# zarr 3 writes sharded arrays (sharding_indexed; the index at either end), Tandem reads them;
# Tandem writes sharded arrays, zarr 3 reads them.
sharded_to_tandem() {  # INDEX_LOCATION COMPRESSOR: the dump shows the inner chunks
  n=$((n + 1))
  local store=$dir/py$n
  "$venv_python" "$script" write-sharded "$store" --index-location "$1" --compressor "$2" &&
    "$tool" dump "$store" >"$store.jsonl" &&
    grep -q '"inner_chunks"' "$store.jsonl" &&
    "$venv_python" "$script" check "$store" "$store.jsonl" --format 3
}
run "zarr 3 writes sharded v3 (zstd, index last), Tandem reads" sharded_to_tandem end zstd
run "zarr 3 writes sharded v3 (gzip, index first), Tandem reads" sharded_to_tandem start gzip
tandem_sharded_to_python() {  # COMPRESSOR
  n=$((n + 1))
  local store=$dir/tandem$n
  "$tool" write "$store" 3 "$1" sharded &&
    "$tool" dump "$store" >"$store.jsonl" &&
    "$venv_python" "$script" check "$store" "$store.jsonl" --format 3
}
for c in none zstd gzip blosc-lz4; do
  run "Tandem writes sharded v3 $c, zarr 3 reads" tandem_sharded_to_python "$c"
done
for format in 3 2; do
  extra=""
  [ "$format" = 2 ] && extra=$v2_only
  for c in $compressors $extra; do
    run "Tandem writes v$format $c, zarr 3 reads" tandem_to_python "$venv_python" "$format" "$c"
  done
done

if [ "$failures" -ne 0 ]; then
  echo "zarr interop: $failures case(s) FAILED" >&2
  exit 1
fi
echo "zarr interop: all cases passed"
