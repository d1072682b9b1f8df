#include "chunk_manager.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include "batch_count.h"
#include "mapped_read_guard.h"
#include "array_stats.h"
#include "random.h"
#include "pixels_finite.h"
#include "split_labels.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Shuffle streams: band order and each band's rows draw from their own streams, so any epoch's
// order follows from (seed, epoch) alone.
constexpr uint64_t kBandOrderStream = 1ull << 40;
constexpr uint64_t kRowOrderStream = 1ull << 41;

// Copies rows into a ring slot with non-temporal stores where the bytes allow (16-byte aligned
// destination, whole 16-byte words): a slot larger than the cache is written once and read next
// by the consumer or the GPU's copy engine, so pulling its lines into the cache first (a read
// for every write) only halves the bandwidth. streaming_stores_done() orders them before the
// slot is handed out.
void copy_rows_streaming(uint8_t* dst, const uint8_t* src, size_t bytes) {
#if defined(__SSE2__)
  if (reinterpret_cast<uintptr_t>(dst) % 16 == 0 && bytes % 16 == 0) {
    for (size_t k = 0; k < bytes; k += 16)
      _mm_stream_si128(reinterpret_cast<__m128i*>(dst + k),
                       _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + k)));
    return;
  }
#endif
  std::memcpy(dst, src, bytes);
}

// The same copy with ordinary stores, for slots small enough to stay in the cache from one use to
// the next (kCachedSlotBytes): writing them there is cheaper than sending every byte out to
// memory, and a CPU consumer then reads its batch from the cache.
void copy_rows_cached(uint8_t* dst, const uint8_t* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
}

// A ring of such slots stays in the L2 or L3 cache between uses (measured on a Zen 4 host with
// 1 MiB of L2 per core and 32 MiB of L3: bench/RESULTS.md).
constexpr size_t kCachedSlotBytes = size_t{1} << 20;

void streaming_stores_done() {
#if defined(__SSE2__)
  _mm_sfence();
#endif
}

// Whether a chunk of `meta` holds whole matrix rows and nothing else (no chunking after the row
// dimension, no padding past the shape there): then a row band is exactly one chunk.
bool bands_are_chunks(const zarr::ArrayMeta& meta) {
  for (size_t d = 1; d < meta.shape.size(); ++d)
    if (meta.chunks[d] != meta.shape[d]) return false;
  return true;
}

}  // namespace

ChunkManager::ChunkManager(const DatasetStore::Split& split, int num_classes,
                           const ChunkManagerOptions& options)
    : split_(split), options_(options), num_classes_(num_classes) {
  const zarr::ArrayMeta& meta = split_.images.meta();
  const std::string what = "zarr store '" + split_.images.path() + "'";
  pixel_type_ = image_pixel_type(meta, what);
  pixel_bytes_ = pixel_type_ == PixelType::UInt8 ? 1 : 4;
  if (meta.shape.size() < 2) throw InputError(what + ": images must have at least 2 dimensions");
  features_ = split_.features;
  band_rows_ = meta.chunks[0];
  band_count_ = static_cast<size_t>((split_.rows + band_rows_ - 1) / band_rows_);
  if (options_.batch_rows < 1) throw InputError("batch rows must be >= 1");
  if (options_.shard_count < 1 || options_.shard_index < 0 || options_.shard_index >= options_.shard_count)
    throw InputError("shard " + std::to_string(options_.shard_index) + " of " +
                     std::to_string(options_.shard_count) + " does not exist");
  if (options_.readers < 1 || options_.assemblers < 1 || options_.ring_slots < 2)
    throw InputError("the chunk manager needs at least 1 reader, 1 assembler and 2 ring slots");
  labels_ = read_class_labels(split_.labels, num_classes_, "streaming a split",
                              split_.every_chunk_written);
  if (static_cast<int64_t>(labels_.size()) != split_.rows)
    throw InputError(what + ": " + std::to_string(split_.rows) + " images but " +
                     std::to_string(labels_.size()) + " labels");
  const int64_t batches = batch_count(split_.rows, options_.batch_rows);
  for (int64_t b = options_.shard_index; b < batches; b += options_.shard_count)
    rows_per_epoch_ += std::min(options_.batch_rows, split_.rows - b * options_.batch_rows);
  // Units of several batches where batches are small and shuffled (chunk_manager.h). Not for a
  // shard of every n-th batch: its batches are never consecutive in the stream.
  const size_t row_bytes = static_cast<size_t>(features_) * pixel_bytes_;
  const size_t batch_bytes = static_cast<size_t>(options_.batch_rows) * row_bytes;
  if (options_.shuffle && options_.shard_count == 1 && options_.batch_rows < (band_rows_ + 3) / 4) {
    const auto fit = static_cast<int64_t>(kMaxUnitBytes / std::max<size_t>(1, batch_bytes));
    unit_batches_ = std::max<int64_t>(1, std::min(band_rows_ / options_.batch_rows, fit));
  }
  // No unit holds more rows than the split: a batch size past it page-locks no more than that.
  const int64_t slot_rows =
      std::max<int64_t>(1, std::min(unit_batches_ * options_.batch_rows, split_.rows));
  ring_.resize(static_cast<size_t>(options_.ring_slots));
  try {
    for (auto& slot : ring_) {
      slot.pixels = kernels::pinned_alloc(static_cast<size_t>(slot_rows * features_) * pixel_bytes_,
                                          options_.pin_for_device);
      slot.labels.resize(static_cast<size_t>(slot_rows));
    }
  } catch (...) {
    // The destructor does not run for a constructor that throws: free the slots made so far.
    for (auto& slot : ring_) kernels::pinned_free(slot.pixels);
    throw;
  }
  say_if_over_budget();
}

ChunkManager::~ChunkManager() {
  stop_threads();
  for (auto& slot : ring_) kernels::pinned_free(slot.pixels);
}

bool ChunkManager::page_locked() const { return !ring_.empty() && ring_[0].pixels.page_locked; }

void ChunkManager::cancel() { stop_threads(); }

void ChunkManager::stop_threads() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_all();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

void ChunkManager::fail(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!error_) error_ = error;
    stopping_ = true;
  }
  wake_all();
}

void ChunkManager::wake_all() {
  band_freed_.notify_all();
  assembler_go_.notify_all();
  batch_filled_.notify_all();
}

size_t ChunkManager::ready_batches() {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t units = static_cast<size_t>(unit_batches_), batches = my_batches_.size();
  size_t ready = 0;
  for (const auto& filled : filled_slots_)
    ready += std::min(units, batches - filled.first * units);
  if (held_slot_ >= 0) ready += std::min((held_unit_ + 1) * units, batches) - next_batch_out_;
  return ready;
}

int64_t ChunkManager::batches_per_epoch() const {
  return batch_count(split_.rows, options_.batch_rows);
}

void ChunkManager::start_epoch(int64_t epoch) {
  std::vector<int64_t> mine;
  for (int64_t b = options_.shard_index; b < batches_per_epoch(); b += options_.shard_count)
    mine.push_back(b);
  start_epoch(epoch, mine);
}

void ChunkManager::start_epoch(int64_t epoch, std::vector<int64_t> batches) {
  std::sort(batches.begin(), batches.end());
  batches.erase(std::unique(batches.begin(), batches.end()), batches.end());
  if (!batches.empty() && (batches.front() < 0 || batches.back() >= batches_per_epoch()))
    throw InputError("chunk manager: batch " +
                     std::to_string(batches.front() < 0 ? batches.front() : batches.back()) +
                     " is outside the epoch's " + std::to_string(batches_per_epoch()) + " batches");
  stop_threads();
  const int64_t rows = split_.rows;
  // The epoch's row stream: bands in (shuffled) order, each band's rows (shuffled).
  band_order_.resize(band_count_);
  if (options_.shuffle) {
    const auto order = seeded_permutation(static_cast<int64_t>(band_count_), options_.seed,
                                          kBandOrderStream + static_cast<uint64_t>(epoch));
    for (size_t p = 0; p < band_count_; ++p) band_order_[p] = order[p];
  } else {
    for (size_t p = 0; p < band_count_; ++p) band_order_[p] = static_cast<int64_t>(p);
  }
  // Each band's row order is drawn by the reader that reads it (shuffle_band).
  epoch_ = epoch;
  band_start_.assign(band_count_ + 1, 0);
  for (size_t p = 0; p < band_count_; ++p) {
    const int64_t band = band_order_[p];
    band_start_[p + 1] = band_start_[p] + std::min(band_rows_, rows - band * band_rows_);
  }
  // This shard's batches, their units and runs, and the stream positions (bands) they touch.
  my_batches_.clear();
  runs_.clear();
  unit_first_run_.clear();
  needed_positions_.clear();
  band_uses_.clear();
  rows_per_epoch_ = 0;  // this epoch's: the listed batches' rows
  for (size_t i = 0; i < batches.size(); ++i) {
    const int64_t b = batches[i];
    const BatchPlan plan{b * options_.batch_rows, std::min(rows, (b + 1) * options_.batch_rows)};
    my_batches_.push_back(plan);
    rows_per_epoch_ += plan.end - plan.begin;
    // Every batch of a unit but the epoch's last is whole, so batch k of a unit starts at row
    // k x batch_rows of its slot.
    const int64_t in_unit = static_cast<int64_t>(i) % unit_batches_;
    if (in_unit == 0) unit_first_run_.push_back(runs_.size());
    if (in_unit > 0 && runs_.back().end == plan.begin) {
      runs_.back().end = plan.end;  // the same run goes on
    } else {
      runs_.push_back(Run{plan.begin, plan.end, in_unit * options_.batch_rows, 0});
    }
  }
  unit_first_run_.push_back(runs_.size());
  for (Run& run : runs_) {
    size_t p = static_cast<size_t>(std::upper_bound(band_start_.begin(), band_start_.end(),
                                                    run.begin) -
                                   band_start_.begin()) - 1;
    bool first = true;
    for (; p < band_count_ && band_start_[p] < run.end; ++p) {
      if (needed_positions_.empty() || needed_positions_.back() < p) {
        needed_positions_.push_back(p);
        band_uses_.push_back(0);
      }
      // Positions only grow from run to run, so p is the last needed position.
      if (first) run.first_cursor = needed_positions_.size() - 1;
      first = false;
      ++band_uses_.back();
    }
  }

  // Not counted: each reader's scratch chunk, for bands made of several chunks (a chunk is at
  // most a band).
  const size_t band_bytes = std::max<size_t>(1, band_buffer_bytes());
  std::lock_guard<std::mutex> lock(mutex_);
  stopping_ = false;
  error_ = nullptr;
  next_to_read_ = 0;
  // Enough bands to keep every reader busy while the assembler holds one and one waits ready;
  // more would only cost fresh pages (a page fault per 4 KiB) without adding speed. The memory
  // budget caps it (two bands at least, or nothing could flow).
  free_band_buffers_ = std::max<size_t>(
      2, std::min(options_.memory_budget / band_bytes, static_cast<size_t>(options_.readers) + 2));
  ready_bands_.clear();
  next_unit_ = 0;
  filled_slots_.clear();
  next_batch_out_ = 0;
  free_slots_.clear();
  for (size_t s = 0; s < ring_.size(); ++s) free_slots_.push_back(s);
  held_slot_ = -1;
  for (int r = 0; r < options_.readers; ++r) threads_.emplace_back([this] { reader_loop(); });
  for (int a = 0; a < options_.assemblers; ++a) threads_.emplace_back([this] { assembler_loop(); });
}

// Two bands flow whatever the budget (one read while the assembler holds the other), so a
// budget below that is not kept: said once, with what is held instead.
void ChunkManager::say_if_over_budget() const {
  const size_t band_bytes = std::max<size_t>(1, band_buffer_bytes());
  if (options_.memory_budget >= 2 * band_bytes) return;
  const auto mib = [](size_t bytes) { return double(bytes) / double(size_t{1} << 20); };
  std::fprintf(stderr,
               "tandem: the memory budget (%.1f MiB) holds fewer than two of the %lld-row bands "
               "of %s (%.1f MiB each, one chunk row): two are held, %.1f MiB\n",
               mib(options_.memory_budget), static_cast<long long>(band_rows_),
               split_.images.path().c_str(), mib(band_bytes), mib(2 * band_bytes));
}

size_t ChunkManager::band_buffer_bytes() const {
  const zarr::ArrayMeta& meta = split_.images.meta();
  const size_t pixels = static_cast<size_t>(band_rows_ * features_) * pixel_bytes_;
  return bands_are_chunks(meta) ? std::max(pixels, meta.chunk_bytes()) : pixels;
}

void ChunkManager::read_band(int64_t band, Band& out, std::vector<uint8_t>& scratch) const {
  const zarr::ArrayMeta& meta = split_.images.meta();
  out.rows = std::min(band_rows_, split_.rows - band * band_rows_);
  std::vector<int64_t> index(meta.shape.size(), 0);
  index[0] = band;
  const bool one_chunk = bands_are_chunks(meta);
  out.mapping = MappedFile();
  if (one_chunk && meta.stored_plain() && meta.dtype != zarr::DType::Float64) {
    // Uncompressed: the assembler copies rows straight out of the page cache (one copy, not two).
    out.mapping = split_.images.map_chunk(index);
    if (out.mapping.data() != nullptr) {
      out.pixels = out.mapping.data();
      return;
    }
    missing_chunk(index);
  }
  out.buffer.resize(band_buffer_bytes());
  out.pixels = out.buffer.data();
  if (one_chunk) {
    // (the chunk is the whole band)
    if (!split_.images.read_chunk(index, out.buffer.data())) missing_chunk(index);
    pixels_in_place(meta, out.buffer.data());
    return;
  }
  // Chunked after the row dimension too (or chunks padded past the shape there): the band is
  // put together from every chunk of its chunk row, each chunk's valid part where it belongs.
  read_images_band(split_.images, band, features_, out.buffer.data(), scratch,
                   split_.every_chunk_written);
}

void ChunkManager::check_band_finite(int64_t band_index, const Band& band) const {
  if (pixel_type_ != PixelType::Float32) return;
  DatasetView view;
  view.pixel_type = pixel_type_;
  view.pixels = band.pixels;
  view.rows = band.rows;
  view.features = features_;
  check_pixels_finite(view, band_index * band_rows_, "zarr store '" + split_.images.path() + "'",
                      kNaNOutputs);
}

void ChunkManager::missing_chunk(const std::vector<int64_t>& index) const {
  if (!split_.every_chunk_written) return;  // a fill value, as Zarr means it
  throw InputError(missing_chunk_message(split_.images, "chunk " + split_.images.chunk_key(index)));
}

void ChunkManager::shuffle_band(int64_t band, Band& out) const {
  fill_seeded_permutation(out.order, out.rows, options_.seed,
                          kRowOrderStream + static_cast<uint64_t>(epoch_) * 1000003u +
                              static_cast<uint64_t>(band));
  out.inverse.resize(out.order.size());
  for (size_t k = 0; k < out.order.size(); ++k)
    out.inverse[static_cast<size_t>(out.order[k])] = static_cast<int32_t>(k);
}

void ChunkManager::reader_loop() {
  try {
    std::vector<uint8_t> scratch;  // one chunk, for bands of several chunks
    for (;;) {
      size_t index;
      Band band;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        band_freed_.wait(lock, [&] {
          return stopping_ || next_to_read_ >= needed_positions_.size() || free_band_buffers_ > 0;
        });
        if (stopping_ || next_to_read_ >= needed_positions_.size()) return;
        index = next_to_read_++;
        --free_band_buffers_;
        if (!spare_bands_.empty()) {
          band = std::move(spare_bands_.back());
          spare_bands_.pop_back();
        }
      }
      const int64_t band_index = band_order_[needed_positions_[index]];
      read_band(band_index, band, scratch);
      check_band_finite(band_index, band);
      if (options_.shuffle) shuffle_band(band_index, band);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ready_bands_.emplace(index, std::move(band));
      }
      assembler_go_.notify_all();  // each assembler waits for a band of its own
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

const ChunkManager::Band* ChunkManager::acquire_band(size_t cursor) {
  std::unique_lock<std::mutex> lock(mutex_);
  assembler_go_.wait(lock, [&] { return stopping_ || ready_bands_.count(cursor) > 0; });
  if (stopping_) return nullptr;
  // std::map never moves an element, and a ready band is not written again until released.
  return &ready_bands_.at(cursor);
}

void ChunkManager::release_band(size_t cursor) {
  Band band;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--band_uses_[cursor] > 0) return;
    auto it = ready_bands_.find(cursor);
    band = std::move(it->second);
    ready_bands_.erase(it);
  }
  band.mapping = MappedFile();  // unmap outside the lock
  {
    std::lock_guard<std::mutex> lock(mutex_);
    spare_bands_.push_back(std::move(band));
    ++free_band_buffers_;
  }
  // One buffer: one reader can take it. A reader that wakes to find nothing left to read returns;
  // others still waiting stay asleep until a later release or stop_threads() wakes them, and
  // nothing waits for them before stop_threads().
  band_freed_.notify_one();
}

void ChunkManager::assembler_loop() {
  try {
    const size_t row_bytes = static_cast<size_t>(features_) * pixel_bytes_;
    const size_t slot_bytes =
        static_cast<size_t>(unit_batches_ * options_.batch_rows) * row_bytes;
    const auto copy_rows = slot_bytes <= kCachedSlotBytes ? copy_rows_cached : copy_rows_streaming;
    const size_t units = unit_first_run_.size() - 1;
    for (;;) {
      // The unit and its slot are taken together, so the slots always hold the oldest units
      // not yet handed out (the consumer can never wait on a unit that has no slot).
      size_t unit, slot_index;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        assembler_go_.wait(lock, [&] {
          return stopping_ || next_unit_ >= units || !free_slots_.empty();
        });
        if (stopping_ || next_unit_ >= units) return;
        unit = next_unit_++;
        slot_index = free_slots_.back();
        free_slots_.pop_back();
      }
      Slot& slot = ring_[slot_index];
      for (size_t r = unit_first_run_[unit]; r < unit_first_run_[unit + 1]; ++r) {
        const Run run = runs_[r];
        uint8_t* const pixels = static_cast<uint8_t*>(slot.pixels.data) + run.slot_row * row_bytes;
        uint8_t* const labels = slot.labels.data() + run.slot_row;
        // Band by band: the part of the run that lies in each band of the stream.
        for (size_t cursor = run.first_cursor;; ++cursor) {
          const size_t position = needed_positions_[cursor];
          const int64_t lo = std::max(run.begin, band_start_[position]);
          const int64_t hi = std::min(run.end, band_start_[position + 1]);
          if (lo >= hi) break;
          const Band* band = acquire_band(cursor);
          if (band == nullptr) return;  // stopping
          // A chunk file cut short faults: a clear error.
          const MappedReadGuard guard(band->mapping);
          const uint8_t* band_labels = labels_.data() + band_order_[position] * band_rows_;
          uint8_t* out = pixels + (lo - run.begin) * row_bytes;
          uint8_t* out_labels = labels + (lo - run.begin);
          const int64_t first = lo - band_start_[position], last = hi - band_start_[position];
          if (!options_.shuffle) {
            // Unshuffled: one contiguous run.
            copy_rows(out, band->pixels + first * row_bytes,
                      static_cast<size_t>(last - first) * row_bytes);
            std::memcpy(out_labels, band_labels + first, static_cast<size_t>(last - first));
          } else if ((last - first) * 4 >= band->rows) {
            // Shuffled, a large part of the band: walk the band's rows in storage order and
            // scatter those that belong here to their shuffled places. Reading in order (rather
            // than gathering rows in shuffled order) lets the prefetcher stream the band from
            // memory.
            const int32_t* where = band->inverse.data();
            for (int64_t j = 0; j < band->rows; ++j) {
              const int64_t k = where[j];
              if (k < first || k >= last) continue;
              copy_rows(out + (k - first) * row_bytes, band->pixels + j * row_bytes, row_bytes);
              out_labels[k - first] = band_labels[j];
            }
          } else {
            // Shuffled, a small part of the band: gather its rows, prefetching a few rows ahead
            // (they are scattered over the band, so the hardware cannot guess them).
            const int32_t* order = band->order.data();
            constexpr int64_t kAhead = 4;
            for (int64_t k = first; k < last; ++k) {
              if (k + kAhead < last) {
                const uint8_t* ahead = band->pixels + order[k + kAhead] * row_bytes;
                for (size_t b = 0; b < row_bytes; b += 64) __builtin_prefetch(ahead + b);
              }
              copy_rows(out + (k - first) * row_bytes, band->pixels + order[k] * row_bytes,
                        row_bytes);
              out_labels[k - first] = band_labels[order[k]];
            }
          }
          guard.check("zarr store '" + split_.images.path() + "'");
          release_band(cursor);
          if (hi == run.end) break;
        }
      }
      streaming_stores_done();
      {
        std::lock_guard<std::mutex> lock(mutex_);
        filled_slots_.emplace(unit, slot_index);
      }
      batch_filled_.notify_one();  // there is one consumer
    }
  } catch (...) {
    fail(std::current_exception());
  }
}

bool ChunkManager::next(DatasetView& batch) {
  std::unique_lock<std::mutex> lock(mutex_);
  const size_t unit = next_batch_out_ / static_cast<size_t>(unit_batches_);
  const bool over = next_batch_out_ >= my_batches_.size();
  if (held_slot_ >= 0 && (over || held_unit_ != unit || stopping_)) {
    // The consumer has moved past the unit's last batch: its slot goes back to the ring.
    free_slots_.push_back(static_cast<size_t>(held_slot_));
    held_slot_ = -1;
    assembler_go_.notify_all();  // an assembler may be waiting for a band, another for a slot
  }
  if (held_slot_ < 0) {
    batch_filled_.wait(lock, [&] {
      return error_ || stopping_ || over || filled_slots_.count(unit) > 0;
    });
    if (error_) std::rethrow_exception(error_);
    if (stopping_ || over) return false;  // cancelled, or the epoch is over
    auto filled = filled_slots_.find(unit);
    held_slot_ = static_cast<long long>(filled->second);
    held_unit_ = unit;
    filled_slots_.erase(filled);
  }
  const BatchPlan plan = my_batches_[next_batch_out_];
  const int64_t slot_row =
      static_cast<int64_t>(next_batch_out_ % static_cast<size_t>(unit_batches_)) *
      options_.batch_rows;
  ++next_batch_out_;
  const Slot& slot = ring_[static_cast<size_t>(held_slot_)];
  batch.pixel_type = pixel_type_;
  batch.pixels = static_cast<const uint8_t*>(slot.pixels.data) +
                 static_cast<size_t>(slot_row * features_) * pixel_bytes_;
  batch.labels = slot.labels.data() + slot_row;
  batch.rows = plan.end - plan.begin;
  batch.features = features_;
  batch.num_classes = num_classes_;
  return true;
}

}  // namespace tandem
