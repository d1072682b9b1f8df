#include "dataset_store.h"
#include "split_labels.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <limits>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <set>
#include <type_traits>

#include "array_stats.h"
#include "file_io.h"
#include "tandem/error.h"
#include "thread_pool.h"
#include "zarr/zarr_metadata.h"

namespace tandem {
namespace fs = std::filesystem;

bool image_shape_describes(const nlohmann::json& shape, int64_t features) {
  if (!shape.is_array() || shape.empty() || features < 1) return false;
  int64_t product = 1;
  for (const auto& d : shape) {
    // Every partial product is at most the feature count, or the product overflows.
    if (!d.is_number_integer() || d.get<int64_t>() < 1 || product > features / d.get<int64_t>())
      return false;
    product *= d.get<int64_t>();
  }
  return product == features;
}

namespace {


std::string join(const std::string& dir, const std::string& name) {
  return (fs::path(dir) / name).string();
}

bool path_exists(const std::string& path) {
  std::error_code ec;
  return fs::symlink_status(path, ec).type() != fs::file_type::not_found && !ec;
}

// Renames `from` to `to`, refusing to replace anything at `to` (renameat2 RENAME_NOREPLACE where
// the filesystem supports it; a plain rename otherwise, which still refuses a non-empty directory).
void rename_no_replace(const std::string& from, const std::string& to) {
  int rc = ::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE);
  if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
    if (path_exists(to)) {
      errno = EEXIST;
    } else {
      rc = std::rename(from.c_str(), to.c_str());
    }
  }
  if (rc != 0) {
    const int err = errno;
    throw IoError("cannot rename " + from + " to " + to + ": " + std::strerror(err));
  }
}

// fsyncs a directory, making the renames inside it durable.
void sync_directory(const std::string& dir) {
  if (const int err = fsync_directory(dir)) {
    throw IoError("cannot fsync directory " + dir + ": " + std::strerror(err));
  }
}

// Chunk files are fsynced as they are written but not the directories that name them; this
// makes every directory of the store durable before the store is published by a rename.
void sync_tree(const std::string& root) {
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(root, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code dec;
    if (it->is_directory(dec)) sync_directory(it->path().string());
  }
  if (ec) throw IoError("cannot list " + root + ": " + ec.message());
  sync_directory(root);
}

std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

void remove_tree(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

nlohmann::json image_shape_for(const nlohmann::json& provenance, int64_t features) {
  if (provenance.contains("image_shape")) {
    const nlohmann::json& s = provenance["image_shape"];
    if (!image_shape_describes(s, features))
      throw InputError("provenance image_shape " + s.dump() + " does not describe " +
                       std::to_string(features) + " features; expected positive sides whose "
                       "product is the feature count");
    return s;
  }
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(double(features))));
  if (side * side == features) return {side, side};
  return {1, features};
}

// One split to write: `rows` output rows, row r taken from source row r % source.rows().
struct SplitPlan {
  const Dataset* source;
  std::string dir;  // "" (root), "validation", "test"
  int64_t rows;
  zarr::Array images;
  zarr::Array labels;
};

struct ChunkTask {
  size_t split;
  int64_t chunk;
};

// Fills one chunk of images and labels (chunk_rows rows, the tail past `rows` zeroed).
void fill_chunk(const SplitPlan& plan, int64_t chunk, int64_t chunk_rows, PixelType out_type,
                std::vector<uint8_t>& images, std::vector<uint8_t>& labels) {
  const Dataset& src = *plan.source;
  const int64_t features = src.features();
  const size_t out_pixel = out_type == PixelType::UInt8 ? 1 : 4;
  const int64_t begin = chunk * chunk_rows;
  const int64_t end = std::min(plan.rows, begin + chunk_rows);
  int64_t r = begin;
  while (r < end) {
    const int64_t src_row = r % src.rows();
    const int64_t n = std::min(end - r, src.rows() - src_row);  // contiguous in the source
    const int64_t local = r - begin;
    std::memcpy(labels.data() + local, src.label_data() + src_row, size_t(n));
    const size_t count = size_t(n * features);
    uint8_t* dst = images.data() + size_t(local * features) * out_pixel;
    if (src.pixel_type() == out_type) {
      std::memcpy(dst, src.pixel_data() + size_t(src_row * features) * out_pixel, count * out_pixel);
    } else {  // uint8 -> float32, scaled as TensorFlow's reader does
      const uint8_t* s = src.pixel_data() + size_t(src_row * features);
      float* d = reinterpret_cast<float*>(dst);
      for (size_t i = 0; i < count; ++i) d[i] = float(s[i]) * (1.0f / 255.0f);
    }
    r += n;
  }
  const int64_t filled = end - begin;
  if (filled < chunk_rows) {
    std::memset(labels.data() + filled, 0, size_t(chunk_rows - filled));
    std::memset(images.data() + size_t(filled * features) * out_pixel, 0,
                size_t((chunk_rows - filled) * features) * out_pixel);
  }
}

bool stop_requested(const StoreWriteOptions& o) {
  return o.stop != nullptr && o.stop->load(std::memory_order_relaxed);
}

// This machine's name as the temporary names carry it: a process id means something on its own
// machine only, and a store on a shared filesystem may be written from several.
std::string host_for_names() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  std::string host(name);
  for (char& c : host)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-') c = '_';
  return host;
}

// `out` + `kind` (".partial-", ".old-") + HOST-PID: this process's temporary name of that kind.
std::string temporary_path(const std::string& out, const char* kind) {
  return out + kind + host_for_names() + "-" + std::to_string(::getpid());
}

// Removes the directories named `out` + `kind` + HOST-PID (".partial-", ".old-") that earlier
// runs writing `out` on this machine left when they were killed: those whose process is gone. A
// directory of a live process (another prepare writing the same store right now) is left alone,
// and so is one of another machine. A name without this machine's HOST- is not one this code
// wrote: a user's backup may be named `out.old-20240101`, and no such PID runs.
void remove_stale(const std::string& out, const std::string& kind) {
  const fs::path target(out);
  const std::string prefix = target.filename().string() + kind;
  const std::string this_host = host_for_names();
  fs::path parent = target.parent_path();
  if (parent.empty()) parent = ".";
  std::error_code ec;
  for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) continue;
    const std::string rest = name.substr(prefix.size());
    const size_t dash = rest.rfind('-');
    if (dash == std::string::npos || rest.compare(0, dash, this_host) != 0) continue;
    const std::string digits = rest.substr(dash + 1);
    // A PID as this code writes it: no leading zero, at most 9 digits.
    if (digits.empty() || digits[0] == '0' ||
        digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9)
      continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    if (pid == ::getpid()) continue;  // ours is removed by the caller
    if (::kill(pid, 0) == 0 || errno == EPERM) continue;  // still running
    std::error_code sec;
    if (!it->is_directory(sec) || it->is_symlink(sec)) continue;
    // A temporary directory gets its group metadata last, just before its rename: one that has
    // it is a whole store (a run killed between the two, or a store someone named so), kept.
    if (kind == ".partial-" && zarr::Group::exists(it->path().string())) continue;
    remove_tree(it->path().string());
  }
}

// A name Zarr gives a chunk, or a directory of chunks: digits, with dots between them under the
// "." separator ("0.3"), one number a level under "/" ("0/3", v3's "c/0/3"; v3's "c.0.3" is
// taken at the array's top).
static bool is_chunk_key_part(const std::string& name) {
  return !name.empty() && name.find_first_not_of("0123456789.") == std::string::npos;
}

// `out` is a dataset store that --overwrite may replace: a Zarr group, or arrays written without
// one (as Dask writes them), holding nothing a dataset store does not, in its validation and test
// splits neither. Its whole directory goes, so a group of someone's other arrays (predictions,
// results) or a file of theirs among the arrays or their chunks makes it no store to replace.
void check_store_replaceable(const std::string& out, const std::string& overwrite_option) {
  const std::string refusal = "; refusing to replace it even with " + overwrite_option +
                              " (remove it yourself if it should go)";
  const auto foreign = [&](const std::string& dir, const std::string& name) {
    return InputError(out + " holds " + join(dir, name).substr(out.size() + 1) +
                      ", which no dataset store has" + refusal);
  };
  // An array's directory: its metadata and chunk keys, nested as deep as its separator puts them.
  const std::function<void(const std::string&, bool)> check_array = [&](const std::string& dir,
                                                                        bool top) {
    static const std::set<std::string> metadata = {".zarray", ".zattrs", "zarr.json"};
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (top && metadata.count(name) != 0) continue;
      const bool v3_key = top && (name == "c" || (name.rfind("c.", 0) == 0 &&
                                                  is_chunk_key_part(name.substr(2))));
      if (!is_chunk_key_part(name) && !v3_key) throw foreign(dir, name);
      std::error_code ec;
      if (entry.is_directory(ec) && !entry.is_symlink(ec))
        check_array(entry.path().string(), false);
    }
  };
  if (!DatasetStore::looks_like_store(out))
    throw InputError(out + " exists and is not a dataset store (a Zarr group, or an images "
                     "array)" + refusal);
  static const std::set<std::string> split_entries = {"images", "labels", "zarr.json",
                                                      ".zgroup", ".zattrs", ".zmetadata"};
  const auto check = [&](const std::string& dir, bool root) {
    for (const auto& entry : fs::directory_iterator(dir)) {
      const std::string name = entry.path().filename().string();
      if (root && (name == "validation" || name == "test")) continue;
      if (split_entries.count(name) == 0) throw foreign(dir, name);
      std::error_code ec;
      if ((name == "images" || name == "labels") && entry.is_directory(ec) &&
          !entry.is_symlink(ec))
        check_array(entry.path().string(), true);
    }
  };
  check(out, true);
  for (const char* split : {"validation", "test"})
    if (fs::is_directory(join(out, split))) check(join(out, split), false);
}

void write_store_contents(const DataSplits& splits, const std::string& dir,
                          const StoreWriteOptions& o, const nlohmann::json& attributes) {
  const zarr::Format format = o.format;
  const int64_t features = splits.train.features();
  // The root group's metadata is written last (below): until then `dir` is no Zarr group, so a
  // run killed part way leaves nothing a reader takes for a store.
  std::error_code mkdir_error;
  fs::create_directories(dir, mkdir_error);
  if (mkdir_error) throw IoError("cannot create " + dir + ": " + mkdir_error.message());

  std::vector<SplitPlan> plans;
  plans.push_back({&splits.train, "", splits.train.rows() * o.copies, {}, {}});
  plans.push_back({&splits.validation, "validation", splits.validation.rows(), {}, {}});
  plans.push_back({&splits.test, "test", splits.test.rows(), {}, {}});
  for (SplitPlan& p : plans) {
    const std::string group = p.dir.empty() ? dir : join(dir, p.dir);
    if (!p.dir.empty()) zarr::Group::create(group, format);
    // Chunks no longer than the split: a 5000-row split is not padded to 10000 rows.
    const int64_t chunk_rows = std::max<int64_t>(1, std::min(o.chunk_rows, p.rows));
    zarr::ArrayMeta m;
    m.format = format;
    m.compressor = o.compressor;
    m.fill_value = 0.0;
    m.separator = format == zarr::Format::V2 ? '.' : '/';
    m.v3_default_key_encoding = true;
    m.dtype = o.pixel_type == PixelType::UInt8 ? zarr::DType::UInt8 : zarr::DType::Float32;
    m.shape = {p.rows, features};
    m.chunks = {chunk_rows, features};
    p.images = zarr::Array::create(join(group, "images"), m);
    m.dtype = zarr::DType::UInt8;
    m.shape = {p.rows};
    m.chunks = {chunk_rows};
    p.labels = zarr::Array::create(join(group, "labels"), m);
  }

  std::vector<ChunkTask> tasks;
  int64_t total_rows = 0;
  for (size_t s = 0; s < plans.size(); ++s) {
    const int64_t chunks = plans[s].images.meta().grid()[0];
    for (int64_t c = 0; c < chunks; ++c) tasks.push_back({s, c});
    total_rows += plans[s].rows;
  }
  const int threads = static_cast<int>(std::max<int64_t>(
      1, std::min<int64_t>(std::max(2, ThreadPool::available_cores()), int64_t(tasks.size()))));
  ThreadPool pool(threads);
  std::atomic<size_t> next{0};
  std::atomic<int64_t> rows_done{0};
  std::atomic<bool> failed{false};
  if (o.progress) o.progress(0, total_rows);
  pool.run([&](int member) {
    try {
      std::vector<uint8_t> images, labels;
      for (size_t t; !failed.load(std::memory_order_relaxed) && !stop_requested(o) &&
                     (t = next.fetch_add(1)) < tasks.size();) {
        const SplitPlan& p = plans[tasks[t].split];
        const zarr::ArrayMeta& im = p.images.meta();
        const int64_t chunk_rows = im.chunks[0];
        images.resize(im.chunk_bytes());
        labels.resize(p.labels.meta().chunk_bytes());
        fill_chunk(p, tasks[t].chunk, chunk_rows, o.pixel_type, images, labels);
        p.images.write_chunk({tasks[t].chunk, 0}, images.data());
        p.labels.write_chunk({tasks[t].chunk}, labels.data());
        const int64_t rows =
            std::min(chunk_rows, p.rows - tasks[t].chunk * chunk_rows);
        const int64_t done = rows_done.fetch_add(rows) + rows;
        // Only share 0 reports, so the callback never runs concurrently; the pool's threads
        // claim shares, so it may run on one of them rather than the caller's.
        if (member == 0 && o.progress) o.progress(done, total_rows);
      }
    } catch (...) {
      failed.store(true);
      throw;
    }
  });
  if (stop_requested(o)) throw StoreWriteStopped("stopped before the store was complete");
  zarr::Group::create(dir, format, attributes);
  if (o.progress) o.progress(total_rows, total_rows);
}

// What a reader takes (open_split): row indices and a model's inputs are 32-bit.
constexpr int64_t kMaxSplitRows = std::numeric_limits<int32_t>::max();

void check_inputs(const DataSplits& splits, const std::string& out, const StoreWriteOptions& o) {
  if (out.empty()) throw InputError("dataset store path is empty");
  if (o.chunk_rows < 1)
    throw InputError("chunk rows is " + std::to_string(o.chunk_rows) + ", expected >= 1");
  if (o.copies < 1) throw InputError("copies is " + std::to_string(o.copies) + ", expected >= 1");
  // Refused before anything is written, not by every reader of a store written for hours.
  if (splits.train.rows() > kMaxSplitRows / o.copies)
    throw InputError("the training split would have " + std::to_string(splits.train.rows()) +
                     " rows x " + std::to_string(o.copies) + " copies; a split holds at most " +
                     std::to_string(kMaxSplitRows) + " rows (fewer copies)");
  if (splits.train.rows() < 1 || splits.train.features() < 1)
    throw InputError("the training split of " + splits.source + " has " +
                     std::to_string(splits.train.rows()) + " rows of " +
                     std::to_string(splits.train.features()) +
                     " features; expected at least one row and one feature");
  const int classes = splits.train.num_classes();
  if (classes < 1 || classes > 256)
    throw InputError("the data set has " + std::to_string(classes) +
                     " classes, expected 1 to 256 (labels are stored as bytes)");
  const std::pair<const char*, const Dataset*> named[] = {
      {"train", &splits.train}, {"validation", &splits.validation}, {"test", &splits.test}};
  for (const auto& [name, d] : named) {
    if (d->rows() == 0) continue;
    if (d->features() != splits.train.features())
      throw InputError(std::string("the ") + name + " split has " + std::to_string(d->features()) +
                       " features, expected " + std::to_string(splits.train.features()) +
                       " as the training split");
    if (d->pixel_type() == PixelType::Float32 && o.pixel_type == PixelType::UInt8)
      throw InputError(std::string("the ") + name +
                       " split has float32 pixels; they cannot be stored as uint8 without loss "
                       "(choose float32)");
    for (int64_t i = 0; i < d->rows(); ++i)
      if (d->label_data()[i] >= classes)
        throw InputError(std::string("the ") + name + " split's label at index " +
                         std::to_string(i) + " is " + std::to_string(d->label_data()[i]) +
                         ", expected a class below " + std::to_string(classes));
  }
}

template <typename T>
void convert_labels(const T* src, int64_t n, uint8_t* dst, int64_t first_index, int num_classes,
                    const std::string& what, const std::string& array_path) {
  for (int64_t i = 0; i < n; ++i) {
    const T v = src[i];
    bool bad;
    if constexpr (std::is_signed_v<T>) bad = v < 0 || int64_t(v) >= num_classes;
    else bad = uint64_t(v) >= uint64_t(num_classes);
    if (bad) {
      throw InputError(what + ": label at index " + std::to_string(first_index + i) + " is " +
                       std::to_string(v) + ", expected a class in [0, " +
                       std::to_string(num_classes) + ") (" + array_path + ")" +
                       kMoreClassesHint);
    }
    dst[i] = static_cast<uint8_t>(v);
  }
}

DatasetStore::Split open_split(const std::string& store, const std::string& dir,
                               const std::string& name, DatasetStore::Labels labels) {
  DatasetStore::Split s;
  s.images = zarr::Array::open(join(dir, "images"));
  const zarr::ArrayMeta& im = s.images.meta();
  if (im.shape.size() != 2 && im.shape.size() != 3)
    throw InputError(store + ": " + name + " images have shape " +
                     zarr::detail::dims_text(im.shape) +
                     ", expected [rows, features] or [rows, height, width]");
  image_pixel_type(im, store + ": " + name);
  s.rows = im.shape[0];
  s.features = matrix_features(im);
  // Row orders are int32 (the chunk manager's permutations, the trainer's batches), and a
  // declared shape of 2^50 rows, valid Zarr with every chunk missing, would have readers walk
  // trillions of fill-value chunks: refused here, before anything reads it.
  if (s.rows > kMaxSplitRows)
    throw InputError(store + ": " + name + " has " + std::to_string(s.rows) +
                     " rows; at most " + std::to_string(kMaxSplitRows) + " rows per split");
  if (s.features < 1)  // (a model of no inputs, an image of no pixels: refused far from here)
    throw InputError(store + ": " + name + " images have shape " +
                     zarr::detail::dims_text(im.shape) + ": no features (pixels) in a row");
  if (s.features > kMaxSplitRows)  // a model's inputs, and every per-feature statistic
    throw InputError(store + ": " + name + " has " + std::to_string(s.features) +
                     " features per row; at most " + std::to_string(kMaxSplitRows));
  // Only a labels array that is absent is let go: anything there must read as labels that fit.
  s.has_labels = labels == DatasetStore::Labels::Required || path_exists(join(dir, "labels"));
  if (!s.has_labels) return s;
  s.labels = zarr::Array::open(join(dir, "labels"));
  const std::string problem = labels_layout_problem(s.labels.meta(), im.shape[0]);
  if (!problem.empty()) throw InputError(store + ": " + name + " labels: " + problem);
  return s;
}

// A store being written by this process, claimed for the write's length: its temporary
// directories are named by host and process (temporary_path), so two threads writing the same
// store would write into, and remove, one directory. The second is refused instead.
class WriteClaim {
 public:
  // One key for every spelling of the path.
  explicit WriteClaim(const std::string& out) : key_(resolved_path(out)) {
    std::lock_guard<std::mutex> lock(mutex());
    if (!claimed().insert(key_).second)
      throw InputError(out + " is being written already, by another write of this process");
  }
  ~WriteClaim() {
    std::lock_guard<std::mutex> lock(mutex());
    claimed().erase(key_);
  }
  WriteClaim(const WriteClaim&) = delete;
  WriteClaim& operator=(const WriteClaim&) = delete;

 private:
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::set<std::string>& claimed() {
    static std::set<std::string> s;
    return s;
  }
  const std::string key_;
};

}  // namespace

std::string partial_store_path(const std::string& out) {
  return temporary_path(out, ".partial-");
}

std::string missing_chunk_message(const zarr::Array& array, const std::string& which) {
  return "zarr store '" + array.path() + "': " + which + " is missing, and a store `tandem " +
         "prepare` wrote has every chunk: it was removed, by damage or by a Zarr library that " +
         "drops a chunk holding only the fill value when it rewrites one (zarr-python 3 does " +
         "unless the array is opened with write_empty_chunks=True); write the chunk again, or " +
         "prepare the store again";
}

void write_dataset_store(const DataSplits& splits, const std::string& out_path,
                         const StoreWriteOptions& options, const nlohmann::json& provenance) {
  std::string out = without_trailing_slashes(out_path);
  // A store reached through a symbolic link (data.zarr -> /scratch/data.zarr) is written where
  // the link points: replaced there, its temporary directory beside it on its filesystem, the
  // link left as it is (renamed aside, the link alone would be replaced, the old store kept).
  std::error_code link_ec;
  if (fs::is_symlink(out, link_ec)) out = resolved_path(out);
  check_inputs(splits, out, options);
  if (!provenance.is_null() && !provenance.is_object())
    throw InputError("dataset store provenance must be a JSON object, got " + provenance.dump());
  const WriteClaim claim(out);
  const bool replace = path_exists(out);
  if (replace) {
    if (!options.overwrite)
      throw InputError(out + " already exists; pass " + options.overwrite_option +
                       " to replace it");
    std::error_code ec;
    const bool empty_dir = fs::is_directory(out, ec) && fs::is_empty(out, ec);
    if (!empty_dir) check_store_replaceable(out, options.overwrite_option);
  }

  nlohmann::json attributes = provenance.is_object() ? provenance : nlohmann::json::object();
  attributes["tandem_dataset"] = 1;
  attributes["image_shape"] = image_shape_for(attributes, splits.train.features());
  attributes["num_classes"] = splits.train.num_classes();
  attributes["copies"] = options.copies;
  attributes["pixel_dtype"] = options.pixel_type == PixelType::UInt8 ? "uint8" : "float32";
  attributes["split"] = "TensorFlow MNIST reader: last " +
                        std::to_string(splits.validation.rows()) +
                        " training images are validation, t10k is test";
  attributes["rows"] = {{"train", splits.train.rows() * options.copies},
                        {"validation", splits.validation.rows()},
                        {"test", splits.test.rows()}};

  const std::string partial = partial_store_path(out);
  remove_tree(partial);  // left by an earlier process with our pid
  remove_stale(out, ".partial-");
  // A replaced store renamed aside (`out.old-HOST-PID`) by a run killed before it removed it. Only
  // with a store in place: a run killed between its two renames leaves the old store as the one
  // whole copy, for the user to rename back.
  if (replace) remove_stale(out, ".old-");
  try {
    write_store_contents(splits, partial, options, attributes);
    sync_tree(partial);
    if (replace) {
      // The old store is renamed aside, the new one into place, and only then the old removed.
      const std::string old = temporary_path(out, ".old-");
      remove_tree(old);
      rename_no_replace(out, old);
      try {
        rename_no_replace(partial, out);
      } catch (...) {
        std::rename(old.c_str(), out.c_str());
        throw;
      }
      // The renames made durable before the old files go: a crash in between must not bring
      // back the old names over files already unlinked.
      sync_directory(parent_of(out));
      remove_tree(old);
    } else {
      rename_no_replace(partial, out);
    }
    sync_directory(parent_of(out));
  } catch (...) {
    remove_tree(partial);
    throw;
  }
}

namespace {

// Node metadata is at `dir`: an array's (v2 .zarray), or v3's zarr.json of any node. Opening it
// says what is wrong with it.
bool array_exists(const std::string& dir) {
  return path_exists(join(dir, ".zarray")) || path_exists(join(dir, "zarr.json"));
}

// Group metadata is at `dir`, or v3 node metadata that must read as a group's (damaged, it is an
// error, not no group); v2 attributes are a group's too (their .zgroup lost is damage).
bool has_group_metadata(const std::string& dir) {
  return path_exists(join(dir, "zarr.json")) || path_exists(join(dir, ".zgroup")) ||
         path_exists(join(dir, ".zattrs"));
}

// A split (or a whole store) at `dir`: a Zarr group, or a directory holding an `images` array and
// no group metadata, which is what dask.array.to_zarr leaves when each array is written to its
// own path (zarr-python writes no metadata for the directories above an array).
bool split_exists(const std::string& dir) {
  return zarr::Group::exists(dir) ||
         (!has_group_metadata(dir) && array_exists(join(dir, "images")));
}

// A killed `tandem prepare`'s temporary directory (partial_store_path) holds arrays, and its
// group metadata only once complete: without it, it is no store.
bool killed_prepare_output(const std::string& path) {
  return fs::path(path).filename().string().find(".partial-") != std::string::npos &&
         !zarr::Group::exists(path);
}

}  // namespace

bool DatasetStore::looks_like_store(const std::string& path) {
  return !killed_prepare_output(path) && split_exists(path);
}

bool DatasetStore::has_zarr_metadata(const std::string& path) {
  // (.zattrs too: a v2 group that lost its .zgroup is a damaged store, not IDX files)
  return has_group_metadata(path) || array_exists(path);
}

void DatasetStore::check_is_directory(const std::string& path_in) {
  const std::string path = without_trailing_slashes(path_in);
  std::error_code ec;
  if (!fs::is_directory(path, ec))
    throw InputError(path + ": no dataset store here (" +
                     (path_exists(path) ? "not a directory" : "no such directory") + ")");
}

DatasetStore DatasetStore::open(const std::string& path_in, Labels labels) {
  const std::string path = without_trailing_slashes(path_in);
  check_is_directory(path);
  if (killed_prepare_output(path))
    throw InputError(path + ": the temporary directory of a `tandem prepare` that was killed, not "
                     "a dataset store (the next prepare of that store removes it)");
  DatasetStore store;
  store.path = path;
  // Without group metadata (arrays written one by one, as Dask does) there are no attributes.
  const nlohmann::json attributes =
      has_group_metadata(path) || !split_exists(path) ? zarr::Group::open(path).second
                                                      : nlohmann::json::object();
  store.attributes = attributes;
  // Every store has its training split at its root; a group holding only a test split (images
  // to classify, say) was refused naming an array path the user had not asked for.
  // (An `images` directory without its metadata is damage, said as such by the array's open.)
  if (!path_exists(join(path, "images"))) {
    std::string others;
    for (const char* name : {"validation", "test"})
      if (array_exists(join(join(path, name), "images")))
        others += std::string(others.empty() ? "" : " and ") + name;
    throw InputError(path + ": no training split (an `images` array at the store's root)" +
                     (others.empty()
                          ? std::string(": not a dataset store")
                          : "; it holds a " + others + " split, but a dataset store has its "
                            "training split at its root, the others beside it: write the images "
                            "(and labels) there to use them alone"));
  }
  store.train = open_split(path, path, "the training split", labels);
  const std::pair<const char*, Split*> optional_splits[] = {{"validation", &store.validation},
                                                            {"test", &store.test}};
  for (const auto& [name, split] : optional_splits) {
    const std::string dir = join(path, name);
    // No such split: no directory, or one with neither group metadata nor images (a stray empty
    // directory).
    const bool group = has_group_metadata(dir);
    if (!group && !array_exists(join(dir, "images"))) continue;
    // One that is there must open: damaged metadata is an error, not a split taken as absent
    // (training went on without validation, keeping "the best" of zero samples).
    if (group) zarr::Group::open(dir);
    *split = open_split(path, dir, std::string("the ") + name + " split", labels);
    if (split->rows > 0 && split->features != store.train.features)
      throw InputError(path + ": the " + name + " split has " + std::to_string(split->features) +
                       " features, expected " + std::to_string(store.train.features) +
                       " as the training split");
  }
  if (attributes.is_object() && attributes.contains("tandem_dataset"))
    for (Split* split : {&store.train, &store.validation, &store.test})
      split->every_chunk_written = true;
  if (attributes.is_object() && attributes.contains("num_classes")) {
    const nlohmann::json& n = attributes["num_classes"];
    if (!n.is_number_integer() || n.get<int64_t>() < 1 || n.get<int64_t>() > 256)
      throw InputError(path + ": attribute num_classes is " + n.dump() +
                       ", expected an integer from 1 to 256");
    store.num_classes = n.get<int>();
  } else if (store.train.has_labels && one_hot_classes(store.train.labels.meta()) > 0) {
    // One-hot labels say how many classes there are.
    store.num_classes = int(one_hot_classes(store.train.labels.meta()));
  }
  // One-hot rows of every split must be as wide as the classes.
  for (const Split* split : {&store.train, &store.validation, &store.test}) {
    if (!split->has_labels || split->rows == 0) continue;
    const int64_t width = one_hot_classes(split->labels.meta());
    if (width > 0 && width != store.num_classes)
      throw InputError(path + ": one-hot labels of " + std::to_string(width) + " classes in " +
                       split->labels.path() + ", but the store has " +
                       std::to_string(store.num_classes) + " classes");
  }
  return store;
}

void labels_to_classes(zarr::DType dtype, const void* src, int64_t n, uint8_t* dst,
                       int64_t first_index, int num_classes, const std::string& what,
                       const std::string& array_path) {
  auto as = [&](auto* typed) {
    convert_labels(typed, n, dst, first_index, num_classes, what, array_path);
  };
  switch (dtype) {
    case zarr::DType::UInt8: return as(static_cast<const uint8_t*>(src));
    case zarr::DType::Int8: return as(static_cast<const int8_t*>(src));
    case zarr::DType::UInt16: return as(static_cast<const uint16_t*>(src));
    case zarr::DType::Int16: return as(static_cast<const int16_t*>(src));
    case zarr::DType::UInt32: return as(static_cast<const uint32_t*>(src));
    case zarr::DType::Int32: return as(static_cast<const int32_t*>(src));
    case zarr::DType::UInt64: return as(static_cast<const uint64_t*>(src));
    case zarr::DType::Int64: return as(static_cast<const int64_t*>(src));
    default:
      throw InputError(what + ": labels are " + zarr::dtype_name(dtype) +
                       ", expected integers (" + array_path + ")");
  }
}

Dataset read_split(const DatasetStore::Split& split, int num_classes, const std::string& what) {
  if (split.rows == 0) return Dataset(PixelType::UInt8, 0, split.features, num_classes);
  const zarr::ArrayMeta& im = split.images.meta();
  const PixelType type = image_pixel_type(im, what + " (" + split.images.path() + ")");
  Dataset d(type, split.rows, split.features, num_classes);
  const size_t esize = type == PixelType::UInt8 ? 1 : 4;
  const std::vector<uint8_t> labels =
      read_class_labels(split.labels, num_classes, what, split.every_chunk_written);
  std::memcpy(d.label_data(), labels.data(), labels.size());
  const std::vector<int64_t> igrid = im.grid();
  const int64_t jobs = chunk_count(igrid);
  const int threads = chunk_read_threads(0, jobs, im.chunk_bytes(), 1);
  ThreadPool pool(threads);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  pool.run([&](int) {
    try {
      std::vector<uint8_t> buffer;
      for (int64_t j; !failed.load(std::memory_order_relaxed) && (j = next.fetch_add(1)) < jobs;) {
        buffer.resize(im.chunk_bytes());
        const std::vector<int64_t> index = chunk_index_of(igrid, j);
        if (!split.images.read_chunk(index, buffer.data()) && split.every_chunk_written)
          throw InputError(
              missing_chunk_message(split.images, "chunk " + split.images.chunk_key(index)));
        pixels_in_place(im, buffer.data());
        const ChunkLayout layout = chunk_layout(im, index);
        place_chunk_rows(layout, buffer.data(), esize, split.features,
                         d.pixel_data() + size_t(layout.row_begin * split.features) * esize);
      }
    } catch (...) {
      failed.store(true);
      throw;
    }
  });
  return d;
}

}  // namespace tandem
