// Statistics of Zarr arrays computed chunk by chunk, without holding the array in memory: per-
// column mean and variance of an image array (what the seed's Dask graph computes for its mean and
// variance images), overall minimum/maximum/mean, and a histogram of an integer (label) array.
// Also the chunk geometry that readers of [rows, features] arrays share.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "tandem/dataset.h"
#include "zarr/zarr_array.h"

namespace tandem {

// The pixels the engine reads from an images array: uint8 as stored, float32 as stored, and
// float64 (what Dask's `x / 255.` makes) narrowed to float32 as each chunk is read. InputError
// naming `what` for any other dtype.
PixelType image_pixel_type(const zarr::ArrayMeta& images, const std::string& what);
// A decoded chunk of `images` (chunk_elements() of its dtype at `chunk`) made the engine's
// pixels in place: float64 narrowed to float32 at the front of the buffer, others left as they
// are. Returns the size of an element after.
size_t pixels_in_place(const zarr::ArrayMeta& images, uint8_t* chunk);

// An array [rows, d1, d2, ...] seen as a matrix [rows, features], features = d1 * d2 * ...
// (1 for a 1-D array).
int64_t matrix_features(const zarr::ArrayMeta& meta);

// Threads for reading `jobs` chunks of `chunk_bytes` each with `buffers_per_thread` chunk
// buffers per thread: `threads` (0: every core), no more than there are jobs, and no more than
// kChunkReadBudget of buffers allows (one at least). A chunk may be up to 2 GB (zarr-python writes
// what it is told), and a large machine's cores times that would not fit in memory.
// InputError for threads < 0.
constexpr size_t kChunkReadBudget = size_t{1} << 30;
int chunk_read_threads(int threads, int64_t jobs, size_t chunk_bytes, int buffers_per_thread);

// Where the valid (non-padding) part of one chunk lies in that matrix. Each chunk row holds
// `chunk_row_elements` elements in the decompressed chunk; of those, `runs` are contiguous both in
// the chunk and in the matrix row.
struct ChunkLayout {
  struct Run {
    int64_t chunk_offset;  // element offset within a chunk row
    int64_t feature;       // first matrix column
    int64_t length;        // elements
  };
  int64_t row_begin = 0;  // first matrix row of the chunk
  int64_t rows = 0;       // valid rows (fewer than chunks[0] at the edge)
  int64_t chunk_row_elements = 1;
  std::vector<Run> runs;
  int64_t columns() const;  // sum of run lengths: valid columns of the chunk
};
ChunkLayout chunk_layout(const zarr::ArrayMeta& meta, const std::vector<int64_t>& chunk_index);
// Copies a chunk's valid part (`chunk`: its decompressed bytes, `layout` its place) into matrix
// rows of `features` elements of element_bytes each, its first row at `rows`.
void place_chunk_rows(const ChunkLayout& layout, const uint8_t* chunk, size_t element_bytes,
                      int64_t features, uint8_t* rows);
// Row band `band` (chunk row `band` of the grid) of an array [rows, ...] as a matrix [band rows,
// features] at `out`, which holds chunks[0] rows: every chunk of the band read, through
// `scratch` (resized to one chunk), and its valid part placed. InputError as read_chunk.
// With `as_pixels`, each chunk is made the engine's pixels first (pixels_in_place), so `out` holds
// elements of that size. Returns false when a chunk of the band is missing (read as its fill
// value).
bool read_row_band(const zarr::Array& array, int64_t band, int64_t features, uint8_t* out,
                   std::vector<uint8_t>& scratch, bool as_pixels = false);
// read_row_band of a store's images; with `every_chunk_written` (a store tandem prepare wrote,
// DatasetStore::Split::every_chunk_written) a missing chunk is an InputError, not fill values.
void read_images_band(const zarr::Array& images, int64_t band, int64_t features, uint8_t* out,
                      std::vector<uint8_t>& scratch, bool every_chunk_written);
// Chunk `linear` of the grid in C order, as a chunk index.
std::vector<int64_t> chunk_index_of(const std::vector<int64_t>& grid, int64_t linear);
int64_t chunk_count(const std::vector<int64_t>& grid);

struct ColumnStats {
  int64_t rows = 0;
  int64_t features = 0;
  std::vector<double> mean;      // per column
  std::vector<double> variance;  // per column, population variance (ddof=0, as NumPy's var)
  double min = 0.0;              // over all elements; NaN for an empty array
  double max = 0.0;
  double overall_mean = 0.0;  // mean of all elements
};

// Per-column mean and variance of a uint8 or float32 array [rows, ...] in float64 (a float64
// array as the engine reads it: narrowed to float32). Each chunk is
// reduced on its own (uint8: exact integer sums; float32: corrected two-pass) and the partial
// results are merged with Chan et al.'s pairwise formula in an order fixed by the array's shape,
// so the result does not depend on `threads` (0: every core this process may use). InputError
// for another dtype or a corrupt chunk (naming the store and key). `every_chunk_written` (a
// store tandem prepare wrote): a missing chunk is an InputError too, not its fill value.
ColumnStats column_stats(const zarr::Array& array, int threads = 0,
                         bool every_chunk_written = false);

struct IntegerHistogram {
  int64_t count = 0;
  int64_t min = 0;  // 0 when count == 0
  int64_t max = 0;
  std::map<int64_t, int64_t> counts;  // value -> occurrences
};

// Histogram of the values of an integer array (any shape); InputError for a float dtype, and
// for a missing chunk with `every_chunk_written`.
IntegerHistogram integer_histogram(const zarr::Array& array, int threads = 0,
                                   bool every_chunk_written = false);

// Row `row` of the array as a matrix, converted to double (InputError when out of range, and
// for a missing chunk with `every_chunk_written`).
std::vector<double> read_matrix_row(const zarr::Array& array, int64_t row,
                                    bool every_chunk_written = false);

}  // namespace tandem
