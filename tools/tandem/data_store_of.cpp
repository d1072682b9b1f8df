#include "data_store_of.h"

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dataset_store.h"
#include "tandem/dataset.h"
#include "zarr/zarr_array.h"

namespace tandem::cli {

namespace {

// The IDX directory a store under a command's directory was prepared from, as recorded in its
// attributes ("" when it records none).
std::string recorded_source(const std::string& store) {
  const nlohmann::json attributes = zarr::Group::open(store).second;
  if (!attributes.is_object() || !attributes.contains("source") ||
      !attributes["source"].is_string())
    return "";
  return attributes["source"].get<std::string>();
}

}  // namespace

std::string data_store_of(const std::string& data, const std::string& dir, const std::string& by) {
  if (is_dataset_store(data)) return data;
  const std::string store = dir + "/data.zarr";
  // The store records where its files were, absolute, and one prepared from other files (the
  // same directory given another --data) is prepared again: reused, it would train on the old.
  std::error_code ec;
  std::filesystem::path where = std::filesystem::weakly_canonical(data, ec);
  if (ec) where = std::filesystem::absolute(data);
  const std::string source = where.string();
  std::string why;
  if (is_dataset_store(store)) {
    const std::string recorded = recorded_source(store);
    if (recorded == source) return store;
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
