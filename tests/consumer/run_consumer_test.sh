#!/usr/bin/env bash
# Installs the build into a fresh prefix, then builds and runs an outside program against it,
# once through find_package(Tandem) and once through pkg-config. The program trains on one thread,
# then runs small parameter-server clusters through tandem/cluster.h (a few seconds each).
# usage: run_consumer_test.sh BUILD_DIR CONSUMER_SOURCE_DIR CMAKE [CXXFLAGS]
set -euo pipefail
build=$1 source=$2 cmake=$3 flags=${4:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$cmake" --install "$build" --prefix "$work/prefix" >/dev/null
test -f "$work/prefix/include/tandem/tandem.h"
test ! -e "$work/prefix/include/tandem/cpu_backend.h"   # internals stay internal
test ! -e "$work/prefix/include/tandem/coordinator.h"
test -f "$work/prefix/include/tandem/cluster.h"
# The public headers stand alone: no ZeroMQ, JSON or HTTP library is needed to build against them.
if grep -rnE '#include *[<"](zmq|nlohmann|httplib|nccl)' "$work/prefix/include/tandem"; then
  echo "a public header includes a private dependency" >&2
  exit 1
fi

# Only the public API is exported: the library's tandem:: symbols are exactly those listed in
# exports.txt (a change to the public API changes the list, on purpose: diff it, bump the
# version when the ABI breaks), and no function of a library it links is re-exported (those stay
# its own). Instances of std templates may show in the table too, with any type in their
# arguments: the standard library's vague linkage, not the API.
lib=$(find "$work/prefix" -name libtandem.so | head -1)
exported=$(nm -DC --defined-only "$lib" | cut -d' ' -f3-)
prefixes='^((typeinfo name for|typeinfo for|vtable for|VTT for|non-virtual thunk to) )?'
ours="${prefixes}tandem::[A-Za-z_0-9:~=]*(\[abi:cxx11\])?(\(|$)"  # (not std:: returning ours)
if ! diff -u "$source/exports.txt" <(printf '%s\n' "$exported" | grep -E "$ours" |
                                     LC_ALL=C sort -u); then
  echo "libtandem.so's tandem:: exports differ from $source/exports.txt (- listed, + exported)" >&2
  exit 1
fi
exported=$(printf '%s\n' "$exported" | sed -E "s/$prefixes//")
linked='^(nlohmann|zmq_|httplib|cuda|cublas|nccl|blosc|ZSTD_|png_|cblas_|openblas)'
if printf '%s\n' "$exported" | grep -E "$linked"; then
  echo "libtandem.so re-exports a library it links" >&2
  exit 1
fi
echo "exports: $(printf '%s\n' "$exported" | grep -c '^tandem::') tandem:: symbols," \
  "$(printf '%s\n' "$exported" | wc -l) in all"

echo "== find_package(Tandem)"
"$cmake" -S "$source" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$work/prefix" \
  -DCMAKE_CXX_FLAGS="$flags" >/dev/null
"$cmake" --build "$work/cmake-build" >/dev/null
(cd "$work" && "$work/cmake-build/consumer" "$work/a.safetensors")

echo "== pkg-config"
pc_dir=$(dirname "$(find "$work/prefix" -name tandem.pc | head -1)")
pc_flags=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --cflags --libs tandem)
libdir=$(PKG_CONFIG_PATH="$pc_dir" pkg-config --variable=libdir tandem)
g++ -std=c++17 $flags "$source/consumer.cpp" $pc_flags -o "$work/consumer-pc"
LD_LIBRARY_PATH="$libdir" "$work/consumer-pc" "$work/b.safetensors"
echo "outside consumer: ok"
