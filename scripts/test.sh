#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install, build, create the tests' Python
# environment (Debian's torch and numpy, plus safetensors, selenium, scikit-build-core for the
# pip install test, and current dask, distributed and zarr 3 from PyPI; Debian's own dask
# 2022.12 and zarr 2.13 are tested through /usr/bin/python3), and run CTest.
# Extra arguments go to cmake (e.g. -DTANDEM_SANITIZE_THREAD=ON with TANDEM_BUILD_DIR set).
set -euo pipefail
# One run at a time in a checkout: a second would remake the venv and build into the same folder
# under the first. The lock is flock's own (-o): no process a test leaves behind inherits it.
if [ -z "${TANDEM_TEST_SH_LOCKED:-}" ]; then
  flock -n "$0" true || echo "scripts/test.sh: waiting for the other run in this checkout" >&2
  TANDEM_TEST_SH_LOCKED=1 exec flock -o "$0" bash "$0" "$@"
fi
unset TANDEM_TEST_SH_LOCKED  # a scripts/test.sh run from a test takes its own checkout's lock
cd "$(dirname "$0")/.."
scripts/install-deps.sh
venv=.venv-test
# numpy stays below 2: Debian's torch 1.13 and scipy are built against numpy 1.x. dask gets a
# floor, or pip would call Debian's dask 2022.12 (seen through the system site) good enough.
want='import safetensors.torch, torch, numpy, dask.array, distributed, zarr, selenium
import tensorboard.backend.event_processing.event_accumulator, scikit_build_core
assert zarr.__version__ >= "3" and dask.__version__ >= "2024" and numpy.__version__ < "2"
assert distributed.__version__ >= "2024"'
if ! missing=$("$venv/bin/python" -c "$want" 2>&1); then
  echo "scripts/test.sh: making $venv (${missing##*$'\n'})" >&2
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check \
    "numpy<2" "zarr>=3" "dask[array]>=2024.1" "distributed>=2024.1" safetensors selenium \
    tensorboard "scikit-build-core>=0.10"
  "$venv/bin/python" -c "$want"
fi
build=${TANDEM_BUILD_DIR:-build}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
# Everything on, explicitly: a ./build the quick start configured has tests, benchmarks and the
# Python module off.
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTANDEM_BUILD_TESTS=ON \
  -DTANDEM_BUILD_BENCH=ON -DTANDEM_BUILD_PYTHON=ON -DTANDEM_PYTHON="$PWD/$venv/bin/python" \
  "$@" | { grep '^-- Tandem:' || true; }  # what it builds: CUDA or not
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel 2
# The decoders of outside input (the parameter server's frames, chunk files, checkpoints, the
# coordinator's requests) again, under AddressSanitizer and UndefinedBehaviorSanitizer: their
# corpus and its random mutants, at every run rather than only when someone fuzzes. Only the
# fuzz targets are built (about 5 minutes on 2 cores); skipped when the caller's own cmake options
# build the whole suite with AddressSanitizer already.
args=" ${*,,} "  # CMake's true spellings, any case
if ! [[ "$args" =~ tandem_sanitize_address(:bool)?=(on|1|true|yes|y)\  ]]; then
  san=${TANDEM_FUZZ_ASAN_DIR:-${build%/}-fuzz-asan}
  generator=()
  [ -f "$san/CMakeCache.txt" ] || generator=(-G Ninja)
  cmake -S . -B "$san" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DTANDEM_CUDA=OFF \
    -DTANDEM_BUILD_TESTS=ON -DTANDEM_BUILD_BENCH=OFF -DTANDEM_BUILD_PYTHON=OFF \
    -DTANDEM_SANITIZE_ADDRESS=ON >/dev/null
  cmake --build "$san" --parallel "$(nproc)" --target tandem_fuzz_all
  # (A build that lost its sanitizer would pass as a plain replay: refuse it. nm, not ldd: clang
  # links the sanitizer's runtime statically.)
  asan_symbols=$(nm "$san/tests/fuzz/tandem_fuzz_wire_frames" | grep -c __asan_init || true)
  if [ "$asan_symbols" -eq 0 ]; then
    echo "scripts/test.sh: $san's fuzz targets are not built with AddressSanitizer" >&2
    exit 1
  fi
  ctest --test-dir "$san" --output-on-failure --parallel 2 --no-tests=error -R '^fuzz\.'
fi
