// Data sets as the engine sees them: rows of pixels with one class label each.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
#include "tandem/export.h"

namespace tandem {

// How pixels are stored. UInt8 pixels are scaled to [0,1] (x * (1/255), as TensorFlow's MNIST
// reader does) when a backend reads them, so data stays a quarter of the bytes until it is used.
enum class PixelType : uint8_t { UInt8, Float32 };

// A non-owning view of `rows` consecutive rows. Cheap to copy; the owner must outlive it.
struct TANDEM_API DatasetView {
  PixelType pixel_type = PixelType::UInt8;
  const void* pixels = nullptr;     // rows x features, row-major
  const uint8_t* labels = nullptr;  // rows class indices in [0, num_classes); null: unlabelled
  int64_t rows = 0;
  int64_t features = 0;
  int num_classes = 0;

  size_t pixel_bytes() const { return pixel_type == PixelType::UInt8 ? 1 : 4; }
  // Rows [begin, end) of this view; throws InputError when the range is outside it.
  DatasetView slice(int64_t begin, int64_t end) const;
};

// An owning data set: the bytes of its pixels and labels.
class TANDEM_API Dataset {
 public:
  Dataset() = default;
  Dataset(PixelType type, int64_t rows, int64_t features, int num_classes);

  DatasetView view() const;
  uint8_t* pixel_data() { return pixels_.data(); }
  uint8_t* label_data() { return labels_.data(); }
  const uint8_t* pixel_data() const { return pixels_.data(); }
  const uint8_t* label_data() const { return labels_.data(); }
  int64_t rows() const { return rows_; }
  int64_t features() const { return features_; }
  int num_classes() const { return num_classes_; }
  PixelType pixel_type() const { return type_; }

 private:
  PixelType type_ = PixelType::UInt8;
  int64_t rows_ = 0;
  int64_t features_ = 0;
  int num_classes_ = 0;
  std::vector<uint8_t> pixels_;
  std::vector<uint8_t> labels_;
};

// A source of training batches, epoch after epoch: the chunk manager streaming a persisted store
// implements it (open_store_stream in trainer.h), refusing a float32 pixel that is NaN or
// infinite as it reads (InputError naming the store and row). The trainer takes another
// implementation's batches as they come: such a stream checks its own pixels.
class TANDEM_API BatchStream {
 public:
  virtual ~BatchStream() = default;
  // Rows this stream yields in one epoch (all of its batches together).
  virtual int64_t rows_per_epoch() const = 0;
  virtual int64_t features() const = 0;
  virtual int num_classes() const = 0;
  // Starts epoch `epoch` (0-based): its order follows from the seed and the epoch number.
  virtual void start_epoch(int64_t epoch) = 0;
  // The epoch's next batch, valid until the next call to next() or start_epoch(); false once the
  // epoch is exhausted. Rethrows a reader's error (InputError naming the store and chunk).
  virtual bool next(DatasetView& batch) = 0;
};

// The three splits of an MNIST-format data set, split as TensorFlow's reader does: the last
// `validation_rows` training images are the validation split, the t10k files are the test split.
struct TANDEM_API DataSplits {
  Dataset train;
  Dataset validation;
  Dataset test;
  std::string source;  // the directory the files came from
};

// Where Debian's dataset-fashion-mnist package puts its IDX files.
TANDEM_API std::string default_data_dir();

// Reads train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte and
// t10k-labels-idx1-ubyte (each raw or with a .gz suffix) from `dir`. Throws InputError naming the
// file and the problem when a file is missing, malformed, or the counts disagree.
TANDEM_API DataSplits load_mnist_splits(const std::string& dir, int64_t validation_rows = 5000);

// Persisted dataset stores (Zarr groups written by `tandem prepare`, or by Dask): `images` and
// `labels` for training, and the same under `validation/` and `test/`.
struct TANDEM_API StreamOptions {
  int64_t batch_rows = 1000;
  bool shuffle = true;  // chunk order and rows within each chunk, per epoch, from the seed
  uint64_t seed = 1;
  int shard_index = 0;  // this worker takes batches b with b % shard_count == shard_index
  int shard_count = 1;
  int readers = 2;                           // reader/decompressor threads
  int assemblers = 2;                        // threads copying rows into batches
  size_t memory_budget = size_t{256} << 20;  // chunks in flight, bytes
  // The CUDA device the batches go to (their buffers are page-locked in its context, and it
  // becomes the current device of the thread that opens the stream); -1 when they go to the CPU
  // (plain memory: no CUDA context is created, the current device is left alone).
  int pin_for_device = 0;
};

// True when `path` is a Zarr group (a dataset store) rather than a directory of IDX files.
TANDEM_API bool is_dataset_store(const std::string& path);

// The validation and test splits of a store, read into memory (train is left empty: stream it).
TANDEM_API DataSplits load_store_eval_splits(const std::string& path);

// The training split of a store as a stream of batches through the chunk manager.
TANDEM_API std::unique_ptr<BatchStream> open_store_stream(const std::string& path,
                                                         const StreamOptions& options);

}  // namespace tandem
