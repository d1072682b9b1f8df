// Decoding a shard (Zarr v3's sharding_indexed codec) against decoding the same chunk stored
// whole, in the same run: what a shard's inner chunks cost beyond their codec's own work. A
// 10,000 x 784 uint8 chunk (the default store's band) in shards of inner chunks of
// `inner_rows` rows, with no compressor and with zstd.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "zarr/zarr_array.h"
#include "zarr/zarr_stored_chunks.h"

namespace {

using namespace tandem::zarr;

constexpr int64_t kRows = 10000, kFeatures = 784;

// Pixel-like bytes: mostly small runs, so zstd has something to do, as with image data.
std::vector<uint8_t> chunk_bytes() {
  std::vector<uint8_t> data(size_t(kRows * kFeatures));
  std::mt19937 rng(7);
  for (size_t i = 0; i < data.size(); ++i) data[i] = (rng() % 4 == 0) ? uint8_t(rng()) : 0;
  return data;
}

ArrayMeta meta_of(int64_t inner_rows, bool zstd) {
  ArrayMeta m;
  m.format = Format::V3;
  m.dtype = DType::UInt8;
  m.shape = {kRows, kFeatures};
  m.chunks = {kRows, kFeatures};
  if (inner_rows > 0) m.inner_chunks = {inner_rows, kFeatures};
  m.compressor.kind = zstd ? Compressor::Kind::Zstd : Compressor::Kind::None;
  return m;
}

// Arguments: inner rows (0: the chunk stored whole, the reference), zstd (0 or 1).
void BM_DecodeStoredChunk(benchmark::State& state) {
  const ArrayMeta meta = meta_of(state.range(0), state.range(1) != 0);
  const std::vector<uint8_t> data = chunk_bytes();
  const std::vector<uint8_t> stored = detail::encode_stored_chunk(meta, data.data());
  std::vector<uint8_t> out(data.size());
  const std::string what = "bench chunk";
  for (auto _ : state) {
    detail::decode_stored_chunk(meta, stored.data(), stored.size(), out.data(), what);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  if (out != data) state.SkipWithError("decoded bytes differ from the chunk's");
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(data.size()));
}
BENCHMARK(BM_DecodeStoredChunk)
    ->ArgNames({"inner_rows", "zstd"})
    ->ArgsProduct({{0, 1000, 100, 10, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
