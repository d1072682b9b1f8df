#include "data_store_of.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dataset_store.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "zarr/zarr_array.h"

namespace tandem::cli {

namespace {

// Where a path leads, absolute (a path that does not exist yet, made absolute).
std::string resolved(const std::string& path) {
  std::error_code ec;
  std::filesystem::path where = std::filesystem::weakly_canonical(path, ec);
  if (ec) where = std::filesystem::absolute(path);
  return where.string();
}

}  // namespace

std::string data_store_of(const std::string& data, const std::string& dir, const std::string& by) {
  if (is_dataset_store(data)) return data;
  const std::string store = dir + "/data.zarr";
  // The store records where its files were, and one prepared from other files (the same
  // directory given another --data) is not reused: it would train on the old files.
  const std::string source = resolved(data);
  std::string why;
  if (is_dataset_store(store)) {
    const nlohmann::json attributes = zarr::Group::open(store).second;
    const auto text = [&](const char* key) {
      return attributes.is_object() && attributes.contains(key) && attributes[key].is_string()
                 ? attributes[key].get<std::string>()
                 : std::string();
    };
    const std::string recorded = text("source");
    if (!recorded.empty() && resolved(recorded) == source) return store;
    // Replaced only when a command made it this way: one the user put there (tandem prepare,
    // with its own options) is theirs to keep.
    if (text("by") != "tandem launch" && text("by") != "tandem search")
      throw InputError(store + " holds a store prepared from " +
                       (recorded.empty() ? "files it does not name" : recorded) + ", not from " +
                       data + ": give --data " + store + " to train on it, or remove it to "
                       "prepare it from " + data);
    why = " (it was prepared from " + (recorded.empty() ? "files it does not name" : recorded) +
          ")";
  }
  std::fprintf(stderr, "preparing %s from %s%s\n", store.c_str(), data.c_str(), why.c_str());
  const DataSplits splits = load_mnist_splits(data);
  StoreWriteOptions options;
  options.overwrite = true;
  write_dataset_store(splits, store, options, nlohmann::json{{"source", source}, {"by", by}});
  return store;
}

}  // namespace tandem::cli
