#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: install, build, create the tests' Python
# environment (Debian's torch and numpy plus safetensors from PyPI), and run CTest.
# Extra arguments go to cmake (e.g. -DTANDEM_SANITIZE_THREAD=ON with TANDEM_BUILD_DIR set).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
venv=.venv-test
if ! "$venv/bin/python" -c "import safetensors, torch, numpy" 2>/dev/null; then
  rm -rf "$venv"
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check safetensors
fi
build=${TANDEM_BUILD_DIR:-build}
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DTANDEM_PYTHON="$PWD/$venv/bin/python" "$@" >/dev/null
cmake --build "$build" --parallel "$(nproc)"
ctest --test-dir "$build" --output-on-failure --parallel 2
