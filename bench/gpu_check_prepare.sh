#!/usr/bin/env bash
# Prepares the GPU check (bench/gpu_check.sh) on a machine without a GPU: builds the GPU tests,
# the benchmarks and the CLI for sm_90, and packs them, with the shared libraries the device
# machine lacks (OpenBLAS, zstd, blosc, libpng, Google Benchmark: Debian packages it does not
# have), into .gpu-carry/carry.tar.gz (gzip: the device machine may lack xz). The device run then
# names .gpu-carry in `carry`.
#
# The binaries need glibc 2.34 or newer and GLIBCXX_3.4.30 (what Debian 12's toolchain built them
# against; the device machine's own glibc and libstdc++ serve them); the CUDA libraries
# (cuBLAS, cuBLASLt, cuDNN) are NOT packed: they are hundreds of megabytes, and the device
# machine has its own (gpu_check.sh finds them).
#
#   bash bench/gpu_check_prepare.sh            # uses ./build (TANDEM_BUILD_DIR to change)
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x /usr/local/cuda/bin/nvcc ] && export PATH=/usr/local/cuda/bin:$PATH
build=${TANDEM_BUILD_DIR:-build}
generator=()
[ -f "$build/CMakeCache.txt" ] || generator=(-G Ninja)
# The device is Hopper (sm_90). A folder the user configured for other GPUs is not rewritten.
archs=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
if [ -n "$archs" ] && [ "$archs" != 90 ]; then
  echo "gpu_check_prepare: $build is configured for CUDA architectures $archs, the device needs" \
       "90; run with TANDEM_BUILD_DIR=build-gpu (a folder of its own)" >&2
  exit 1
fi
# Tests, benchmarks and CUDA on, whatever an earlier configure of the same folder chose (the
# quick start's turns tests and benchmarks off).
if ! cmake -S . -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90 -DTANDEM_CUDA=ON -DTANDEM_BUILD_TESTS=ON \
       -DTANDEM_BUILD_BENCH=ON -DTANDEM_BUILD_TOOLS=ON >"$build.configure.log" 2>&1; then
  cat "$build.configure.log"
  exit 1
fi
if ! grep -q "Tandem: CUDA ON" "$build.configure.log"; then
  grep -E "CUDA|cuDNN|NCCL" "$build.configure.log"
  echo "gpu_check_prepare: CMake found no usable CUDA toolkit; nothing to carry to a GPU" >&2
  exit 1
fi
rm -f "$build.configure.log"
targets=(tandem_cuda_tests tandem_predict_tests tandem_tests tandem_kernels_cuda_bench
         tandem_train_step_cuda_bench tandem_group_step_cuda_bench tandem_cli)
cmake --build "$build" --parallel "$(nproc)" --target "${targets[@]}"

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
cp "$build/tests/tandem_cuda_tests" "$build/tests/tandem_predict_tests" \
   "$build/tests/tandem_tests" \
   "$build/bench/tandem_kernels_cuda_bench" \
   "$build/bench/tandem_train_step_cuda_bench" "$build/bench/tandem_group_step_cuda_bench" \
   "$build/tools/tandem" "$stage/bin/"
strip --strip-unneeded "$stage"/bin/*
for binary in "$stage"/bin/*; do
  ldd "$binary" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    # glibc and the compiler runtime are on every Linux (newer there, which is fine); CUDA's
    # libraries come from the device machine. All of glibc's own libraries stay home: one built
    # against this glibc's private symbols (libresolv, reached through libzmq's Kerberos) would
    # be loaded against the device machine's glibc and could fail to load there.
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libstdc++.so*|libgcc_s.so*) ;;
    libresolv.so*|libnsl.so*|libutil.so*|libanl.so*|libnss_*|libthread_db.so*|libBrokenLocale*) ;;
    libcublas*|libcudnn*|libcudart*|libcuda.so*) ;;
    libnccl*) ;;  # 218 MB, over the carry's limit; PyTorch's wheels bring one (nvidia/nccl)
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
{
  echo "commit $(git rev-parse HEAD)"
  echo "uncommitted changes: $(git status --porcelain --untracked-files=no | wc -l) files"
  echo "built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME"), $(nvcc --version | tail -1)"
} > "$stage/BUILD_INFO"
mkdir -p .gpu-carry
rm -f .gpu-carry/carry.tar.xz  # (an older prepare's)
tar -C "$stage" -czf .gpu-carry/carry.tar.gz .
echo "packed .gpu-carry/carry.tar.gz ($(du -h .gpu-carry/carry.tar.gz | cut -f1)):"
tar -tzf .gpu-carry/carry.tar.gz | sed 's/^/  /'
