// Fuzz target: a Zarr array's metadata document (.zarray for v2, zarr.json for v3; the input's
// first byte chooses, the rest is the text). Accepted metadata must describe an array whose
// sizes are in range, and the document Tandem writes for it must read back as the same array.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz_target.h"
#include "zarr/zarr_metadata.h"

namespace {

using namespace tandem::zarr;

ArrayMeta parse(bool v3, const std::string& text) {
  const nlohmann::json doc =
      detail::parse_metadata_text("fuzz", v3 ? "zarr.json" : ".zarray", text);
  return v3 ? detail::parse_v3_array("fuzz", doc) : detail::parse_v2_array("fuzz", doc);
}

bool same_fill(double a, double b) { return (std::isnan(a) && std::isnan(b)) || a == b; }

bool same_array(const ArrayMeta& a, const ArrayMeta& b) {
  return a.format == b.format && a.dtype == b.dtype && a.shape == b.shape && a.chunks == b.chunks &&
         a.compressor.describe() == b.compressor.describe() && same_fill(a.fill_value, b.fill_value) &&
         a.separator == b.separator && a.v3_default_key_encoding == b.v3_default_key_encoding &&
         a.inner_chunks == b.inner_chunks && a.shard_index_at_start == b.shard_index_at_start &&
         a.shard_index_crc32c == b.shard_index_crc32c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool v3 = (data[0] & 1) != 0;
  const std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  ArrayMeta meta;
  if (!tandem::fuzz::accepts([&] { meta = parse(v3, text); })) return 0;

  FUZZ_CHECK(meta.shape.size() == meta.chunks.size());
  FUZZ_CHECK(meta.chunk_bytes() <= detail::kMaxChunkBytes);
  FUZZ_CHECK(meta.grid().size() == meta.shape.size());
  const std::string written =
      (v3 ? detail::v3_array_json(meta) : detail::v2_array_json(meta)).dump();
  ArrayMeta again;
  FUZZ_CHECK(tandem::fuzz::accepts([&] { again = parse(v3, written); }));
  FUZZ_CHECK(same_array(meta, again));
  return 0;
}
