// The public entry points to dataset stores: detection, evaluation splits, the training stream.
#include <filesystem>

#include "chunk_manager.h"
#include "dataset_store.h"
#include "idx_reader.h"

namespace tandem {

bool is_dataset_store(const std::string& path) {
  // Zarr metadata at the top (damaged, or an array's rather than a group's) makes it a store
  // too, one that DatasetStore::open then refuses saying what is wrong: taken for a directory of
  // IDX files, it was refused for having none. Unless it has IDX files: a stray .zattrs or
  // .zarray beside them does not make them a store (a group's metadata does: looks_like_store).
  if (DatasetStore::looks_like_store(path)) return true;
  return DatasetStore::has_zarr_metadata(path) && !holds_idx_images(path);
}

DataSplits read_eval_splits(const DatasetStore& store) {
  const std::string& path = store.path;
  DataSplits splits;  // (source: the caller's name for the store)
  if (store.validation.rows > 0)
    splits.validation = read_split(store.validation, store.num_classes, path + " (validation)");
  if (store.test.rows > 0) splits.test = read_split(store.test, store.num_classes, path + " (test)");
  return splits;
}

DataSplits load_store_eval_splits(const std::string& path) {
  DataSplits splits = read_eval_splits(DatasetStore::open(path));
  splits.source = path;  // as given (open drops a trailing slash)
  return splits;
}

std::unique_ptr<BatchStream> open_store_stream(const std::string& path, const StreamOptions& o) {
  const DatasetStore store = DatasetStore::open(path);
  ChunkManagerOptions options;
  options.batch_rows = o.batch_rows;
  options.shuffle = o.shuffle;
  options.seed = o.seed;
  options.shard_index = o.shard_index;
  options.shard_count = o.shard_count;
  options.readers = o.readers;
  options.assemblers = o.assemblers;
  options.memory_budget = o.memory_budget;
  options.pin_for_device = o.pin_for_device;
  return std::make_unique<ChunkManager>(store.train, store.num_classes, options);
}

}  // namespace tandem
