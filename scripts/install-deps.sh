#!/usr/bin/env bash
# Installs what Tandem needs from Debian 12, and nothing when it is all there (idempotent).
# The CUDA toolkit is not a Debian package: when /usr/local/cuda exists the build compiles the
# CUDA code with it, otherwise it builds the CPU backend only.
# usage: install-deps.sh [--runtime]   (--runtime: only what the library and the tandem command
# need, and the data set: the quick start's set, without the tests' and benchmarks' packages)
set -euo pipefail
packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev zlib1g-dev libzstd-dev libblosc-dev libpng-dev libcli11-dev nlohmann-json3-dev
  libzmq3-dev cppzmq-dev  # the parameter server's transport
  libcpp-httplib-dev  # the coordinator's dashboard (HTTP)
  dataset-fashion-mnist
)
if [ "${1:-}" != "--runtime" ]; then
  packages+=(
    git libgtest-dev libbenchmark-dev
    chromium chromium-driver  # the dashboard's browser test (headless, through Selenium)
    python3-dev pybind11-dev  # the Python module tandem._tandem
    python3 python3-venv python3-numpy python3-torch python3-dask python3-zarr  # tests, benchmarks
  )
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]}"
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null || { echo "install-deps: run as root (or install sudo): missing ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
