// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of TFRecord files (the
// framing of TensorBoard event files), and TFRecord's "masked" form of it. Table-driven
// (slicing-by-8) everywhere; on x86-64 processors with SSE4.2 the crc32 instruction is used
// instead, chosen once at run time. Both give the same values (checked in the tests).
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem {

// The CRC-32C of n bytes continued from `crc` (the CRC of the bytes before them; 0 to start):
// crc32c_extend(crc32c(a), b) == crc32c(a + b).
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
inline uint32_t crc32c(const void* data, size_t n) { return crc32c_extend(0, data, n); }

// The table-driven version, whatever the processor: the reference the fast path is tested with.
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);
// Whether crc32c_extend uses the SSE4.2 crc32 instruction on this machine.
bool crc32c_hardware_accelerated();

// TFRecord stores CRCs masked (a CRC of data that holds CRCs is weak otherwise):
// rotate right by 15 bits, then add a constant.
constexpr uint32_t kCrc32cMaskDelta = 0xa282ead8u;
inline uint32_t crc32c_mask(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + kCrc32cMaskDelta;
}
inline uint32_t crc32c_unmask(uint32_t masked) {
  const uint32_t rot = masked - kCrc32cMaskDelta;
  return (rot >> 17) | (rot << 15);
}

}  // namespace tandem
