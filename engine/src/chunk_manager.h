// The chunk manager: streams a persisted split (a Zarr images array and its labels) as batches.
//
//   reader threads: read + decompress row bands (one chunk row of the images array) in the
//                   epoch's band order, into a bounded pool of band buffers
//   assemblers:     each takes the next unit (one batch, or several: below) together with a free
//                   slot of a ring of pinned host buffers, and copies the unit's rows into it from
//                   the bands (shared, read-only once read; a band returns to the pool when every
//                   unit using it is done), applying the within-band row shuffle (batches of any
//                   size, spanning bands)
//   consumer:       next() hands out the batches in order, each a view into its unit's slot; a
//                   slot returns to the ring once the consumer has moved past its last batch
//
// A unit is one batch, except for shuffled batches smaller than a quarter of a band: those would
// each gather their rows from all over a band, waiting on memory for every row. A unit of such
// batches (consecutive, about a band's rows, at most kMaxUnitBytes) is filled instead by walking
// the bands in storage order and scattering each row to its shuffled place, as large batches
// are; the slots are that much larger (bench/RESULTS.md, "Small shuffled batches filled a band
// at a time").
//
// Per-epoch shuffling (band order and rows within a band, from the seed and the epoch number),
// sharding of the batch sequence across workers (batch b goes to worker b % shard_count), a memory
// budget for band buffers, clean cancellation (the destructor, or start_epoch mid-epoch), and an
// error in any reader or the assembler rethrown by next() with the store and chunk in its text.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/pinned_memory.h"
#include "dataset_store.h"
#include "tandem/dataset.h"

namespace tandem {

// The most a memory budget may say, in MiB: a petabyte (more would overflow in bytes, and holds
// every band of any store anyway). train's and the cluster's --memory-budget take 1 to this.
constexpr int64_t kMaxMemoryBudgetMib = int64_t{1} << 30;

struct ChunkManagerOptions {
  int64_t batch_rows = 1000;
  bool shuffle = true;
  uint64_t seed = 1;
  int shard_index = 0;  // this worker's share of the batch sequence:
  int shard_count = 1;  // batches b with b % shard_count == shard_index
  int readers = 2;      // threads reading and decompressing bands
  int assemblers = 2;   // threads copying rows into ring slots (one unit each at a time)
  // Pinned buffers of one unit each (a batch, or up to kMaxUnitBytes of small shuffled batches:
  // the top of this file), outside memory_budget: triple buffering.
  int ring_slots = 3;
  // The CUDA device the batches go to: the ring is page-locked in its context. -1: a CPU
  // consumer, plain memory (page-locking would only create a CUDA context, on device 0).
  int pin_for_device = 0;
  size_t memory_budget = size_t{256} << 20;  // band buffers in flight, bytes (at least two bands)
};

class ChunkManager final : public BatchStream {
 public:
  ChunkManager(const DatasetStore::Split& split, int num_classes, const ChunkManagerOptions& options);
  ~ChunkManager() override;
  ChunkManager(const ChunkManager&) = delete;
  ChunkManager& operator=(const ChunkManager&) = delete;

  // This shard's rows in an epoch; after start_epoch with a list, the listed batches' rows.
  int64_t rows_per_epoch() const override { return rows_per_epoch_; }
  int64_t features() const override { return features_; }
  int num_classes() const override { return num_classes_; }
  void start_epoch(int64_t epoch) override;  // this shard's batches (see the options)
  // Epoch `epoch`'s batches listed (any order, duplicates ignored; they are streamed in
  // ascending order): a cluster worker's assignment. The epoch's row order is the same as above
  // for every worker with the same seed, so batch b means the same rows everywhere. Throws
  // InputError for a batch outside the epoch.
  void start_epoch(int64_t epoch, std::vector<int64_t> batches);
  int64_t batches_per_epoch() const;
  bool next(DatasetView& batch) override;
  // Stops the threads of the current epoch; next() then returns false.
  void cancel();

  int64_t bands() const { return static_cast<int64_t>(band_count_); }
  // Batches assembled and waiting for next(): the queue's depth (0 means the consumer waits).
  size_t ready_batches();
  bool page_locked() const;  // the ring is in cudaHostAlloc memory

 private:
  struct Band {  // one row band read from the store: band_rows_ x features, store dtype
    std::vector<uint8_t> buffer;  // read or decompressed here...
    MappedFile mapping;           // ...or an uncompressed chunk mapped from the page cache
    const uint8_t* pixels = nullptr;
    int64_t rows = 0;
    // Shuffled epochs: the band's rows in stream order (stream offset -> storage row), and its
    // inverse. Built by the reader that reads the band, so only bands this shard uses are
    // shuffled, on the reader threads, while earlier bands are being copied.
    std::vector<int32_t> order, inverse;
  };
  struct Slot {  // one unit's batches, one after the other
    kernels::PinnedAllocation pixels;
    std::vector<uint8_t> labels;
  };
  struct BatchPlan {  // rows [begin, end) of the epoch's row stream
    int64_t begin, end;
  };
  // Consecutive batches of a unit that are consecutive in the stream too, copied together: rows
  // [begin, end) of the stream into the unit's slot from row slot_row on.
  struct Run {
    int64_t begin, end;
    int64_t slot_row;
    size_t first_cursor;  // index into needed_positions_ of the first band it touches
  };

  void stop_threads();
  void reader_loop();
  void assembler_loop();
  // Waits until band `cursor` has been read and returns it (it stays in ready_bands_).
  const Band* acquire_band(size_t cursor);
  // One batch is done with band `cursor`; the last one returns its buffer to the pool.
  void release_band(size_t cursor);
  // `scratch`: the reader's own chunk buffer, for bands made of several chunks.
  void read_band(int64_t band, Band& out, std::vector<uint8_t>& scratch) const;
  // A chunk of the band is missing: InputError naming it when the split's store has every chunk
  // (DatasetStore::Split::every_chunk_written); otherwise its fill value stands.
  void missing_chunk(const std::vector<int64_t>& index) const;
  // A float32 band's NaN or infinite pixel (trained on, every parameter turns NaN within a step;
  // scored on, the loss is NaN): InputError naming the store and the row, from the reader
  // threads, off the training thread, for every consumer of the stream.
  void check_band_finite(int64_t band_index, const Band& band) const;
  void shuffle_band(int64_t band, Band& out) const;  // out.order and out.inverse, for epoch_

  // A band buffer's size: a whole band's pixels (not one chunk: a band may be many), or the
  // band's one chunk as stored where that is more (float64, narrowed in place).
  size_t band_buffer_bytes() const;
  void say_if_over_budget() const;
  void fail(std::exception_ptr error);
  void wake_all();  // every waiter: stopping, or an error

  DatasetStore::Split split_;
  ChunkManagerOptions options_;
  int num_classes_;
  PixelType pixel_type_;
  size_t pixel_bytes_;
  int64_t features_;
  int64_t band_rows_;
  size_t band_count_;
  int64_t rows_per_epoch_ = 0;
  int64_t unit_batches_ = 1;  // batches per unit (the top of this file)
  static constexpr size_t kMaxUnitBytes = size_t{16} << 20;
  std::vector<uint8_t> labels_;  // the whole split's labels, read once (they are small)

  // The current epoch's plan.
  std::vector<int64_t> band_order_;               // bands in stream order
  int64_t epoch_ = 0;                             // seeds each band's row order
  std::vector<int64_t> band_start_;               // per stream position: first row in the stream
  std::vector<BatchPlan> my_batches_;             // this shard's batches, in order
  std::vector<Run> runs_;                         // every unit's runs, unit by unit
  std::vector<size_t> unit_first_run_;            // per unit (and one past the last): into runs_
  std::vector<size_t> needed_positions_;          // stream positions whose rows this shard uses
  std::vector<int> band_uses_;                    // per needed position: runs touching it

  // Shared state, guarded by mutex_.
  std::mutex mutex_;
  // One condition per kind of waiter, so that a change wakes only the threads it concerns: on a
  // machine with fewer cores than threads every needless wake-up takes a core from the copies.
  std::condition_variable band_freed_;    // readers: a band buffer is free
  std::condition_variable assembler_go_;  // assemblers: a band is ready, or a slot is free
  std::condition_variable batch_filled_;  // the consumer: a slot is filled
  bool stopping_ = false;
  std::exception_ptr error_;
  size_t next_to_read_ = 0;             // index into needed_positions_
  size_t free_band_buffers_ = 0;
  std::map<size_t, Band> ready_bands_;  // by index into needed_positions_
  std::vector<Band> spare_bands_;
  size_t next_unit_ = 0;                // the next unit an assembler takes
  std::map<size_t, size_t> filled_slots_;  // unit index -> slot
  size_t next_batch_out_ = 0;           // the next batch next() hands out
  std::vector<size_t> free_slots_;
  long long held_slot_ = -1;            // the slot of the unit the consumer is in
  size_t held_unit_ = 0;

  std::vector<Slot> ring_;
  std::vector<std::thread> threads_;
};

}  // namespace tandem
