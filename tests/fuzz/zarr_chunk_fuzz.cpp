// Fuzz target: a stored Zarr chunk through each compressor's decoder. The input's first byte
// chooses the compressor (its low 3 bits, and bit 5 for the ones after the eighth), whether the
// chunk ends with Zarr v3's crc32c checksum (bit 3) and whether this target appends the right
// checksum to the rest (bit 4: random bytes then reach the decoder behind the check); the next
// two bytes give the chunk's expected size (up to 64 KiB, little-endian); the rest is the stored
// chunk. The output buffer is that size and followed by a guard of known bytes: a decoder
// writing past the size changes the guard, which is checked in every build (the address
// sanitizer sees only writes made through calls it intercepts, not those inside Debian's
// uninstrumented libzstd and libblosc). A chunk that decodes must give exactly the bytes the
// same compressor's encoder round-trips.
// With bit 6 the rest is instead a shard (Zarr v3's sharding_indexed codec) of an 8 x 8 uint8
// chunk in inner chunks of 4 x 4 (the size's low bit 0) or 2 x 8 (1), compressed as chosen; bit
// 3 then says the index ends with its checksum, bit 4 that this target writes the right one in
// its place, and bit 7 that the index comes first.
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <vector>

#include "crc32c.h"
#include "fuzz_target.h"
#include "zarr/zarr_array.h"
#include "zarr/zarr_stored_chunks.h"

namespace {

using tandem::zarr::Compressor;

const std::vector<Compressor>& compressors() {
  static const std::vector<Compressor> all = {
      Compressor::parse("none"),      Compressor::parse("zstd"),
      Compressor::parse("blosc-lz4"), Compressor::parse("blosc-zstd"),
      Compressor::parse("blosc-lz4hc"), Compressor::parse("blosc-blosclz"),
      Compressor::parse("blosc-zlib"), Compressor::parse("blosc-zstd-bitshuffle"),
      Compressor::parse("gzip"),      Compressor::parse("zlib")};
  return all;
}

// A shard through the shard decoder: accepted, it must re-encode to a shard that decodes to the
// same chunk.
void fuzz_shard(const uint8_t* data, size_t size, Compressor c) {
  tandem::zarr::ArrayMeta meta;
  meta.dtype = tandem::zarr::DType::UInt8;
  meta.shape = meta.chunks = {8, 8};
  meta.inner_chunks = (data[1] & 1) ? std::vector<int64_t>{2, 8} : std::vector<int64_t>{4, 4};
  meta.compressor = c;
  meta.compressor.crc32c = false;
  meta.shard_index_crc32c = (data[0] & 0x08) != 0;
  meta.shard_index_at_start = (data[0] & 0x80) != 0;
  std::vector<uint8_t> stored(data + 3, data + size);
  const size_t entries = 4 * 16;
  if (meta.shard_index_crc32c && (data[0] & 0x10) != 0 && stored.size() >= entries + 4) {
    const size_t at = meta.shard_index_at_start ? 0 : stored.size() - entries - 4;
    const uint32_t sum = tandem::crc32c(stored.data() + at, entries);
    for (int b = 0; b < 4; ++b) stored[at + entries + size_t(b)] = uint8_t(sum >> (8 * b));
  }
  // The chunk, then a guard of known bytes that a decoder writing past it would change (as in
  // the compressed mode below).
  constexpr size_t kGuard = 64;
  constexpr uint8_t kGuardByte = 0xA5;
  std::vector<uint8_t> out(meta.chunk_bytes() + kGuard, kGuardByte), back(meta.chunk_bytes());
  const bool accepted = tandem::fuzz::accepts([&] {
    tandem::zarr::detail::decode_stored_chunk(meta, stored.data(), stored.size(), out.data(),
                                              "fuzz");
  });
  FUZZ_CHECK(std::all_of(out.begin() + std::ptrdiff_t(meta.chunk_bytes()), out.end(),
                         [](uint8_t b) { return b == kGuardByte; }));
  if (!accepted) return;
  out.resize(meta.chunk_bytes());
  const std::vector<uint8_t> again = tandem::zarr::detail::encode_stored_chunk(meta, out.data());
  FUZZ_CHECK(tandem::fuzz::accepts([&] {
    tandem::zarr::detail::decode_stored_chunk(meta, again.data(), again.size(), back.data(),
                                              "fuzz");
  }));
  FUZZ_CHECK(back == out);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t selected = (data[0] & 0x07) | (data[0] & 0x20) >> 2;  // 0 to 15
  Compressor c = compressors()[selected % compressors().size()];
  if ((data[0] & 0x40) != 0) {
    fuzz_shard(data, size, c);
    return 0;
  }
  c.crc32c = (data[0] & 0x08) != 0;
  const bool append_checksum = (data[0] & 0x10) != 0;
  const size_t out_size = size_t(data[1]) | size_t(data[2]) << 8;
  std::vector<uint8_t> stored(data + 3, data + size);
  if (c.crc32c && append_checksum) {
    const uint32_t sum = tandem::crc32c(stored.data(), stored.size());
    for (int b = 0; b < 4; ++b) stored.push_back(uint8_t(sum >> (8 * b)));
  }
  constexpr size_t kGuard = 64;
  constexpr uint8_t kGuardByte = 0xA5;
  std::vector<uint8_t> out(out_size + kGuard, kGuardByte);
  const bool accepted = tandem::fuzz::accepts([&] {
    tandem::zarr::decompress(c, stored.data(), stored.size(), out.data(), out_size, "fuzz");
  });
  FUZZ_CHECK(std::all_of(out.begin() + std::ptrdiff_t(out_size), out.end(),
                         [](uint8_t b) { return b == kGuardByte; }));
  if (!accepted) return 0;
  out.resize(out_size);
  const size_t payload = stored.size() - (c.crc32c ? 4 : 0);  // accepted: the checksum was there
  if (c.kind == Compressor::Kind::None)
    FUZZ_CHECK(payload == out_size && std::equal(out.begin(), out.end(), stored.begin()));
  // What decoded re-encodes and decodes to the same bytes (the encoder's side of the codec; it
  // writes no checksum).
  c.crc32c = false;
  const std::vector<uint8_t> again = tandem::zarr::compress(c, out.data(), out.size(), 1);
  std::vector<uint8_t> back(out_size);
  FUZZ_CHECK(tandem::fuzz::accepts([&] {
    tandem::zarr::decompress(c, again.data(), again.size(), back.data(), back.size(), "fuzz");
  }));
  FUZZ_CHECK(back == out);
  return 0;
}
