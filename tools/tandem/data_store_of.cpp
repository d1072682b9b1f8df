#include "data_store_of.h"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "dataset_store.h"
#include "file_io.h"
#include "idx_reader.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "zarr/zarr_array.h"

namespace tandem::cli {

namespace {

// The IDX files' names, sizes and modification times: a store prepared from them is stale once
// they change (new files copied over the old ones, the same directory named again).
nlohmann::json idx_fingerprint(const std::string& dir) {
  nlohmann::json files = nlohmann::json::object();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    struct stat st {};
    if (name.find("-ubyte") == std::string::npos || ::stat(it->path().c_str(), &st) != 0 ||
        !S_ISREG(st.st_mode))
      continue;
    files[name] = {{"bytes", int64_t(st.st_size)},
                   {"mtime_ns", int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec}};
  }
  return files;
}

}  // namespace

void check_data_exists(const std::string& data) {
  std::error_code ec;
  if (!std::filesystem::exists(data, ec))  // (ec is set for other errors than not found)
    throw InputError("--data " + data + ": " + (ec ? ec.message() : "no such file or directory") +
                     " (expected a dataset store, or a directory of MNIST-format IDX files)");
}

void refuse_idx_files_for_a_store(const std::string& data, const std::string& option) {
  if (is_dataset_store(data) || !holds_idx_images(data)) return;
  const std::string given = option.empty() ? "" : option + " ";  // ("": a positional argument)
  throw InputError(given + data + " holds IDX files, not a dataset store: make one with `tandem "
                   "prepare --data " + data + " --out STORE` and give " + given + "STORE");
}

void refuse_store_as_output(const std::string& dir, const std::string& option) {
  std::error_code ec;
  if (std::filesystem::is_directory(dir, ec) && is_dataset_store(dir))
    throw InputError(option + " " + dir + " is a dataset store: this command's files (and its "
                     "lock) would be written among its arrays; give a directory of its own");
}

std::string data_store_of(const std::string& data, const std::string& dir, const std::string& by) {
  if (is_dataset_store(data)) return data;
  const std::string store = dir + "/data.zarr";
  // The store records where its files were and what they were (sizes and times), and one
  // prepared from other files, or from these before they changed, is not reused: it would train
  // on the old files.
  const std::string source = resolved_path(data);
  const nlohmann::json fingerprint = idx_fingerprint(data);
  std::string why;
  if (is_dataset_store(store)) {
    const nlohmann::json attributes = DatasetStore::open(store).attributes;
    const auto text = [&](const char* key) {
      return attributes.is_object() && attributes.contains(key) && attributes[key].is_string()
                 ? attributes[key].get<std::string>()
                 : std::string();
    };
    const std::string recorded = text("source");
    const bool same_source = !recorded.empty() && resolved_path(recorded) == source;
    // Replaced only when a command made it this way: one the user put there (tandem prepare,
    // with its own options) is theirs to keep.
    const bool ours = text("by") == "tandem launch" || text("by") == "tandem search";
    const bool same_files = attributes.is_object() && attributes.contains("source_files") &&
                            attributes["source_files"] == fingerprint;
    if (same_source && (!ours || same_files)) return store;
    if (!ours)
      throw InputError(store + " holds a store prepared from " +
                       (recorded.empty() ? "files it does not name" : recorded) + ", not from " +
                       data + ": give --data " + store + " to train on it, or remove it to "
                       "prepare it from " + data);
    const bool fingerprinted = attributes.is_object() && attributes.contains("source_files");
    why = !same_source ? " (it was prepared from " +
                             (recorded.empty() ? "files it does not name" : recorded) + ")"
          : fingerprinted ? " (its files have changed since it was prepared from them)"
                          : " (it does not record what its files were, only where)";
  }
  DataSplits splits;
  try {
    splits = load_mnist_splits(data);
  } catch (const InputError& e) {
    // The default split (5,000 rows) is all this command offers: a smaller set is prepared
    // with its own split first.
    const bool split = std::string(e.what()).find("to split off") != std::string::npos;
    throw InputError(std::string(e.what()) +
                     (split ? "; for a smaller training set, prepare a store with `tandem "
                              "prepare --data " + data + " --validation-rows N --out STORE` "
                              "and give --data STORE"
                            : ""));
  }
  std::fprintf(stderr, "preparing %s from %s%s\n", store.c_str(), data.c_str(), why.c_str());
  StoreWriteOptions options;
  options.overwrite = true;
  write_dataset_store(splits, store, options,
                      nlohmann::json{
                          {"source", source}, {"source_files", fingerprint}, {"by", by}});
  return store;
}

}  // namespace tandem::cli
