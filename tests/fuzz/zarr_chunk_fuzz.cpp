// Fuzz target: a stored Zarr chunk through each compressor's decoder. The input's first byte
// chooses the compressor, the next two the chunk's expected size (up to 64 KiB, little-endian);
// the rest is the stored chunk. The output buffer is exactly that size, so a decoder writing
// past it is an overflow the address sanitizer reports. A chunk that decodes must give exactly
// the bytes the same compressor's encoder round-trips.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <vector>

#include "fuzz_target.h"
#include "zarr/zarr_array.h"

namespace {

using tandem::zarr::Compressor;

const std::vector<Compressor>& compressors() {
  static const std::vector<Compressor> all = {
      Compressor::parse("none"),      Compressor::parse("zstd"),
      Compressor::parse("blosc-lz4"), Compressor::parse("blosc-zstd"),
      Compressor::parse("blosc-lz4hc"), Compressor::parse("blosc-blosclz"),
      Compressor::parse("blosc-zlib"), Compressor::parse("blosc-zstd-bitshuffle")};
  return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const Compressor& c = compressors()[data[0] % compressors().size()];
  const size_t out_size = size_t(data[1]) | size_t(data[2]) << 8;
  const uint8_t* stored = data + 3;
  const size_t stored_size = size - 3;
  std::vector<uint8_t> out(out_size);
  if (!tandem::fuzz::accepts([&] {
        tandem::zarr::decompress(c, stored, stored_size, out.data(), out.size(), "fuzz");
      }))
    return 0;
  if (c.kind == Compressor::Kind::None)
    FUZZ_CHECK(stored_size == out_size && std::equal(out.begin(), out.end(), stored));
  // What decoded re-encodes and decodes to the same bytes (the encoder's side of the codec).
  const std::vector<uint8_t> again = tandem::zarr::compress(c, out.data(), out.size(), 1);
  std::vector<uint8_t> back(out_size);
  FUZZ_CHECK(tandem::fuzz::accepts([&] {
    tandem::zarr::decompress(c, again.data(), again.size(), back.data(), back.size(), "fuzz");
  }));
  FUZZ_CHECK(back == out);
  return 0;
}
