#include "data_store_of.h"

#include <cstdio>
#include <nlohmann/json.hpp>

#include "dataset_store.h"
#include "tandem/dataset.h"

namespace tandem::cli {

std::string data_store_of(const std::string& data, const std::string& dir, const std::string& by) {
  if (is_dataset_store(data)) return data;
  const std::string store = dir + "/data.zarr";
  if (!is_dataset_store(store)) {
    std::fprintf(stderr, "preparing %s from %s\n", store.c_str(), data.c_str());
    const DataSplits splits = load_mnist_splits(data);
    write_dataset_store(splits, store, StoreWriteOptions{},
                        nlohmann::json{{"source", data}, {"by", by}});
  }
  return store;
}

}  // namespace tandem::cli
