// Helper for the Zarr interoperability test (tests/python/zarr_interop_test.sh):
//   zarr_tool write DIR FORMAT COMPRESSOR [sharded]
//                                           a group at DIR with the known arrays below, FORMAT 2
//                                           or 3, COMPRESSOR as Compressor::parse takes it; with
//                                           sharded (v3), each array but the 0-d one in shards of
//                                           2 x its chunks per dimension, the chunks inner chunks
//   zarr_tool dump DIR                      one JSON line per array under DIR: its name, format,
//                                           dtype, shape, chunks (and inner_chunks when sharded),
//                                           FNV-1a 64 hash of the logical
//                                           C-order little-endian bytes, sum (NaN skipped), and
//                                           how many chunks were missing (read as fill_value)
// tests/python/zarr_interop.py writes the same arrays with dask and checks both directions.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zarr/zarr_array.h"
#include "zarr_test_arrays.h"

namespace {

using tandem::zarr::Array;
using tandem::zarr::ArrayMeta;
using tandem::zarr::DType;
using tandem::zarr::test_arrays::element_count;
using tandem::zarr::test_arrays::for_each_chunk;
using tandem::zarr::test_arrays::for_each_run;
using tandem::zarr::test_arrays::get_element;
using tandem::zarr::test_arrays::put_element;
using tandem::zarr::test_arrays::read_logical;
namespace fs = std::filesystem;

// The known arrays; their values are functions of the flat C-order index i, mirrored by
// zarr_interop.py (expected_arrays). f32_sparse leaves out every chunk whose index sum is odd, so
// those regions read as its NaN fill value.
struct Known {
  const char* name;
  DType dtype;
  std::vector<int64_t> shape, chunks;
  double fill_value;
};

const std::vector<Known>& known_arrays() {
  static const std::vector<Known> arrays = {
      {"u8", DType::UInt8, {137, 129}, {40, 32}, 0.0},
      {"i64", DType::Int64, {1001}, {250}, 0.0},
      {"f32", DType::Float32, {5, 7, 9}, {2, 3, 4}, 0.0},
      {"f32_sparse", DType::Float32, {10, 6}, {4, 3}, std::nan("")},
      {"scalar", DType::Int64, {}, {}, 0.0},
  };
  return arrays;
}

double known_value(const std::string& name, int64_t i) {
  if (name == "u8") return double((i * 7 + 3) % 256);
  if (name == "i64") return double((i * 2654435761LL) % 1000003 - 500000);
  if (name == "f32") return double(i) * 0.25 - 100.0;
  if (name == "f32_sparse") return double(i) * 0.5;
  return 42.0;  // scalar
}

bool chunk_is_skipped(const Known& k, const std::vector<int64_t>& index) {
  if (std::string(k.name) != "f32_sparse") return false;
  int64_t sum = 0;
  for (const int64_t i : index) sum += i;
  return sum % 2 == 1;
}

// Element i of f32_sparse lies in a chunk chunk_is_skipped leaves out: in a shard, which holds
// several such chunks, it is written as the fill value instead.
bool in_skipped_chunk(const Known& k, int64_t i) {
  if (std::string(k.name) != "f32_sparse") return false;
  return chunk_is_skipped(k, {i / k.shape[1] / k.chunks[0], i % k.shape[1] / k.chunks[1]});
}

void write_known(const std::string& dir, tandem::zarr::Format format,
                 const tandem::zarr::Compressor& compressor, bool sharded) {
  // A non-ASCII attribute (UTF-8 here): zarr 2.13 decodes .zattrs as ASCII, and must read it.
  tandem::zarr::Group::create(dir, format, {{"writer", "tandem zarr_tool"},
                                            {"note", "Donn\u00e9es \u2713"}});
  for (const Known& k : known_arrays()) {
    ArrayMeta meta;
    meta.format = format;
    meta.dtype = k.dtype;
    meta.shape = k.shape;
    meta.chunks = k.chunks;
    meta.compressor = compressor;
    meta.fill_value = k.fill_value;
    // zarr-python's defaults: "." for v2 keys, "c/i/j" for v3.
    meta.separator = format == tandem::zarr::Format::V2 ? '.' : '/';
    meta.v3_default_key_encoding = true;
    if (sharded && !k.shape.empty()) {
      meta.inner_chunks = k.chunks;
      for (int64_t& c : meta.chunks) c *= 2;
    }
    const Array a = Array::create(dir + "/" + k.name, meta);
    const size_t es = tandem::zarr::dtype_size(k.dtype);
    std::vector<uint8_t> chunk(meta.chunk_bytes());
    for_each_chunk(meta, [&](const std::vector<int64_t>& index) {
      if (!meta.sharded() && chunk_is_skipped(k, index)) return;
      // Edge chunks are padded with the fill value, as zarr-python pads them.
      for (size_t e = 0; e < meta.chunk_elements(); ++e) {
        put_element(k.dtype, chunk.data() + e * es, k.fill_value);
      }
      for_each_run(meta, index, [&](size_t ao, size_t co, size_t n) {
        for (size_t j = 0; j < n; ++j) {
          const int64_t i = int64_t(ao + j);
          put_element(k.dtype, chunk.data() + (co + j) * es,
                      in_skipped_chunk(k, i) ? k.fill_value : known_value(k.name, i));
        }
      });
      a.write_chunk(index, chunk.data());
    });
  }
}

uint64_t fnv1a64(const std::vector<uint8_t>& bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const uint8_t b : bytes) h = (h ^ b) * 0x100000001b3ull;
  return h;
}

nlohmann::ordered_json dump_array(const std::string& dir, const std::string& name) {
  const Array a = Array::open(dir + "/" + name);
  const ArrayMeta& m = a.meta();
  const size_t es = tandem::zarr::dtype_size(m.dtype);
  int missing = 0;
  const std::vector<uint8_t> data = read_logical(a, &missing);
  double sum = 0.0;
  for (size_t e = 0; e < element_count(m); ++e) {
    const double v = get_element(m.dtype, data.data() + e * es);
    if (!std::isnan(v)) sum += v;
  }
  char hash[17];
  std::snprintf(hash, sizeof hash, "%016llx", static_cast<unsigned long long>(fnv1a64(data)));
  nlohmann::ordered_json line;
  line["name"] = name;
  line["format"] = int(m.format);
  line["dtype"] = tandem::zarr::dtype_name(m.dtype);
  line["shape"] = m.shape;
  line["chunks"] = m.chunks;
  if (m.sharded()) line["inner_chunks"] = m.inner_chunks;
  line["compressor"] = m.compressor.describe();
  line["fnv1a64"] = hash;
  line["sum"] = sum;
  line["missing_chunks"] = missing;
  return line;
}

// Arrays anywhere under dir (v2 .zarray or v3 zarr.json with node_type "array"), sorted by name.
std::vector<std::string> find_arrays(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    const fs::path p = entry.path();
    const bool is_array = fs::exists(p / ".zarray") ||
                          (fs::exists(p / "zarr.json") && !tandem::zarr::Group::exists(p.string()));
    if (is_array) names.push_back(fs::relative(p, dir).string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

int usage() {
  std::fprintf(stderr,
               "usage: zarr_tool write DIR FORMAT(2|3) COMPRESSOR [sharded]\n"
               "       zarr_tool dump DIR\n"
               "       zarr_tool group-attributes DIR\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::vector<std::string> args(argv + 1, argv + argc);
    if ((args.size() == 4 || args.size() == 5) && args[0] == "write") {
      if (args[2] != "2" && args[2] != "3") return usage();
      if (args.size() == 5 && args[4] != "sharded") return usage();
      write_known(args[1], args[2] == "2" ? tandem::zarr::Format::V2 : tandem::zarr::Format::V3,
                  tandem::zarr::Compressor::parse(args[3]), args.size() == 5);
      return 0;
    }
    if (args.size() == 2 && args[0] == "group-attributes") {  // the group at DIR, as JSON
      std::printf("%s\n", tandem::zarr::Group::open(args[1]).second.dump().c_str());
      return 0;
    }
    if (args.size() == 2 && args[0] == "dump") {
      for (const std::string& name : find_arrays(args[1])) {
        std::printf("%s\n", dump_array(args[1], name).dump().c_str());
      }
      return 0;
    }
    return usage();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "zarr_tool: %s\n", e.what());
    return 1;
  }
}
