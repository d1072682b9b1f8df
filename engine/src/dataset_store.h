// Data sets persisted as Zarr groups: `images` [rows, features] and `labels` [rows] for the
// training split, and the same pair under `validation/` and `test/`; provenance in the root
// group's attributes. `tandem prepare` writes them, `tandem inspect` and training read them.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "tandem/dataset.h"
#include "tandem/error.h"
#include "zarr/zarr_array.h"

namespace tandem {

struct StoreWriteOptions {
  zarr::Format format = zarr::Format::V3;
  PixelType pixel_type = PixelType::UInt8;  // float32 mirrors the seed (pixels scaled to [0,1])
  int64_t chunk_rows = 10000;
  zarr::Compressor compressor;  // default: none
  int copies = 1;               // the training split is repeated this many times, as the seed does
  bool overwrite = false;
  std::string overwrite_option = "--overwrite";  // how the caller asks for it, for the messages
  // Called now and then with (rows written, rows in total) over all splits; never concurrently,
  // but not always on the caller's thread (on one of the writer threads).
  std::function<void(int64_t, int64_t)> progress;
  // Polled between chunks when set: once true, the write stops, its temporary directory is
  // removed and write_dataset_store throws StoreWriteStopped (a stop signal, stop_signals.h).
  const std::atomic<bool>* stop = nullptr;
};

// What write_dataset_store throws when StoreWriteOptions::stop ended it: nothing was written.
class StoreWriteStopped : public Error {
 public:
  using Error::Error;
};

// Writes `splits` as a dataset store at `out`. It is written under a temporary name beside `out`
// (partial_store_path) and renamed into place when complete, so an interrupted run leaves no
// store that looks complete: the root group's metadata is written last, so even the temporary
// directory of a killed run is not a store. Temporary directories that earlier runs on this
// machine left are removed first when their process is gone; those of other machines (a store
// on a shared filesystem) are left alone, since their process cannot be checked from here.
// Memory stays bounded by a few chunks however many copies are asked for. Refuses an existing
// `out` unless options.overwrite. `provenance` goes into the root attributes.
void write_dataset_store(const DataSplits& splits, const std::string& out,
                         const StoreWriteOptions& options, const nlohmann::json& provenance);

// Where this process writes `out` (as write_dataset_store resolves it: no trailing slash, a
// symbolic link followed) until it is complete: `out.partial-HOST-PID`, HOST this machine's name
// (letters, digits, '.' and '-'; anything else as '_'). Machines that share a name but not
// their process ids (containers with the host's network) are taken for one.
std::string partial_store_path(const std::string& out);

// What a chunk missing from `array` means in a split whose every chunk was written (a store
// `tandem prepare` wrote): damage, not fill values to train on. `which` names it ("chunk 0.0",
// "a chunk of row band 3").
std::string missing_chunk_message(const zarr::Array& array, const std::string& which);

// An opened dataset store: the arrays of each split.
struct DatasetStore {
  struct Split {
    zarr::Array images;  // [rows, features] (or [rows, h, w], flattened by readers)
    zarr::Array labels;  // [rows], any integer dtype with values < num_classes
    int64_t rows = 0;
    int64_t features = 0;
    bool has_labels = true;  // false only when opened with Labels::Optional and it has none
    // A store `tandem prepare` wrote (group attribute tandem_dataset) has every chunk: one
    // missing is damage (the store removed under a reader: `rm -rf` deletes the chunk files
    // before their directory), not fill values to train on.
    bool every_chunk_written = false;
  };
  std::string path;
  nlohmann::json attributes;
  Split train;
  Split validation;  // rows == 0 when the store has none
  Split test;        // rows == 0 when the store has none
  int num_classes = 10;

  // Whether a split may come without its `labels` array: only prediction does without them
  // (new images to classify); training and evaluation need them.
  enum class Labels { Required, Optional };

  // Opens and checks a store (InputError naming the path and the problem).
  static DatasetStore open(const std::string& path, Labels labels = Labels::Required);
  // A Zarr group is at path, or a directory holding an `images` array and no group metadata.
  static bool looks_like_store(const std::string& path);
  // Zarr metadata (zarr.json, .zgroup, .zattrs or .zarray) is at path, readable or not.
  static bool has_zarr_metadata(const std::string& path);
  // InputError "PATH: no dataset store here (no such directory | not a directory)" unless path
  // is a directory: open()'s first check, for a caller that must refuse before it makes anything.
  static void check_is_directory(const std::string& path);
};

// Whether `shape` (an image_shape attribute: anyone's JSON) is a non-empty array of positive
// integers whose product is `features`; the product is checked as it grows, never overflowing.
bool image_shape_describes(const nlohmann::json& shape, int64_t features);

// Reads a whole split into memory (for validation/test evaluation and small stores).
Dataset read_split(const DatasetStore::Split& split, int num_classes, const std::string& what);

// The validation and test splits of an opened store, read into memory (load_store_eval_splits).
DataSplits read_eval_splits(const DatasetStore& store);

// Ends the error for a label past the classes: how a store says it has more than the default 10
// (Dask writes no attributes).
inline constexpr const char* kMoreClassesHint =
    "; a store of more classes gives their number in its group attribute num_classes";

// Converts `n` labels of a labels array's dtype (any integer type; `src` points at them) to class
// bytes, each checked to lie in [0, num_classes): InputError naming `what`, the label's index
// (first_index + i) and `array_path` for one that does not, or for a dtype that is no integer.
void labels_to_classes(zarr::DType dtype, const void* src, int64_t n, uint8_t* dst,
                       int64_t first_index, int num_classes, const std::string& what,
                       const std::string& array_path);

}  // namespace tandem
