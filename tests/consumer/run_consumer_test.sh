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

# Only the public API is exported: every name of namespace tandem an exported symbol is named
# by (each part of tandem::A::B) is declared in an installed header, and no function of a library
# it links is re-exported (those stay its own). (Instances of std templates may show in the
# table, with any type in their arguments: they are the standard library's vague linkage.)
lib=$(find "$work/prefix" -name libtandem.so | head -1)
exported=$(nm -DC --defined-only "$lib" | cut -d' ' -f3- |
           sed -E 's/^(typeinfo name for|typeinfo for|vtable for|VTT for|non-virtual thunk to) //')
bad=""
for name in $(printf '%s\n' "$exported" | grep -oE '^tandem::[A-Za-z_0-9:~]*' | sort -u); do
  for part in $(printf '%s\n' "${name#tandem::}" | tr -d '~' | tr -s ':' '\n'); do
    grep -rqw -- "$part" "$work/prefix/include/tandem" || { bad="$bad $name"; break; }
  done
done
if [ -n "$bad" ]; then
  echo "libtandem.so exports internal names:$bad" >&2
  exit 1
fi
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
