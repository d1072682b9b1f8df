#!/usr/bin/env bash
# Configures and builds Tandem (Release) into ./build; extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
generator=()
[ -f build/CMakeCache.txt ] || generator=(-G Ninja)
cmake -S . -B build "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "$@" |
  { grep '^-- Tandem:' || true; }  # what it builds: CUDA or not
cmake --build build --parallel "$(nproc)"
