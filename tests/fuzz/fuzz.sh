#!/usr/bin/env bash
# Fuzzes one target with libFuzzer (Debian's clang), AddressSanitizer and UBSan:
#   bash tests/fuzz/fuzz.sh TARGET [SECONDS] [extra libFuzzer flags...]
# TARGET: zarr_metadata, zarr_chunk, wire_frames, slot_message, safetensors, checkpoint,
# trial_configs, idx_file, ps_shard or coordinator_requests.
# Builds into build-fuzz (CPU only), starts from tests/fuzz/corpus/TARGET and keeps what it
# finds in build-fuzz/fuzz-corpus/TARGET, so the repository's corpus stays the seeds and the
# fixed crashes. A crash or failed property stops it and writes the input to
# build-fuzz/fuzz-artifacts/TARGET/; once fixed, copy that file to tests/fuzz/corpus/TARGET/
# (named crash-WHAT) so that every build's replay test (fuzz.TARGET) keeps checking it.
set -euo pipefail
cd "$(dirname "$0")/../.."
target=${1:?usage: fuzz.sh TARGET [SECONDS] [libFuzzer flags...]}
seconds=${2:-300}
shift $(( $# >= 2 ? 2 : 1 ))
[ -d "tests/fuzz/corpus/$target" ] || { echo "no target '$target' (see tests/fuzz/corpus/)"; exit 2; }
build=build-fuzz
if [ ! -f "$build/CMakeCache.txt" ]; then
  CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DTANDEM_FUZZ=ON -DTANDEM_SANITIZE_ADDRESS=ON -DTANDEM_CUDA=OFF -DTANDEM_BUILD_PYTHON=OFF \
    -DTANDEM_BUILD_BENCH=OFF >/dev/null
fi
cmake --build "$build" --target "tandem_fuzz_$target" --parallel "$(nproc)"
mkdir -p "$build/fuzz-corpus/$target" "$build/fuzz-artifacts/$target"
# UBSan findings abort (the build sets -fno-sanitize-recover=undefined); 2 GiB of memory at most.
exec "$build/tests/fuzz/tandem_fuzz_$target" "$build/fuzz-corpus/$target" \
  "tests/fuzz/corpus/$target" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 \
  -artifact_prefix="$build/fuzz-artifacts/$target/" -print_final_stats=1 "$@"
