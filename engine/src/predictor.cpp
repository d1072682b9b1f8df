#include "predictor.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <vector>

#include "array_stats.h"
#include "backend.h"
#include "crc32c.h"
#include "cuda/cuda_device.h"
#include "dataset_store.h"
#include "file_io.h"
#include "json_fields.h"
#include "predictions_writers_lock.h"
#include "split_labels.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "thread_pool.h"

namespace tandem {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kMarker = "tandem_predictions";

std::string join(const std::string& a, const std::string& b) { return a + "/" + b; }

const DatasetStore::Split& pick_split(const DatasetStore& store, const std::string& split) {
  const DatasetStore::Split& s = split == "train" ? store.train
                                 : split == "validation" ? store.validation
                                 : split == "test" ? store.test
                                 : throw InputError("split must be train, validation or test, "
                                                    "got '" + split + "'");
  if (s.rows == 0) throw InputError(store.path + ": no rows in the " + split + " split");
  return s;
}

// Everything both the preparing process and the predicting ones need to agree on.
struct Inputs {
  Checkpoint checkpoint;
  DatasetStore store;
  DatasetStore::Split split;  // a copy: Inputs is returned by value
  int64_t chunk_rows = 0;
  int64_t chunks = 0;
  int64_t classes = 0;
  std::string fingerprint;
  PredictionsLayout layout;
};

uint32_t file_crc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw InputError(path + ": cannot read it to fingerprint it");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return crc32c(bytes.data(), bytes.size());
}

// The identity of every file under `dir` (the images array: metadata and chunks): its name, size,
// modification time to the nanosecond and inode. A store rewritten since (tandem prepare
// --overwrite, dask's to_zarr, one chunk replaced) differs, though its metadata may be the same
// bytes: predictions of the old data are then not resumed onto as if they were of the new.
uint32_t files_crc(const std::string& dir) {
  std::vector<std::string> records;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    struct stat st {};
    if (::stat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    char text[96];
    std::snprintf(text, sizeof text, ":%lld:%lld.%09ld:%llu\n", static_cast<long long>(st.st_size),
                  static_cast<long long>(st.st_mtim.tv_sec), static_cast<long>(st.st_mtim.tv_nsec),
                  static_cast<unsigned long long>(st.st_ino));
    records.push_back(fs::relative(it->path(), dir).string() + text);
  }
  if (ec) throw InputError(dir + ": cannot list it to fingerprint it (" + ec.message() + ")");
  std::sort(records.begin(), records.end());
  uint32_t crc = 0;
  for (const std::string& r : records) crc = crc32c_extend(crc, r.data(), r.size());
  return crc;
}

std::string images_metadata_file(const zarr::Array& images) {
  return join(images.path(), images.meta().format == zarr::Format::V2 ? ".zarray" : "zarr.json");
}

Inputs open_inputs(const std::string& model_path, const std::string& store_path,
                   const std::string& split) {
  check_prediction_inputs(model_path, store_path);
  Inputs in;
  in.checkpoint = load_checkpoint(model_path);
  in.store = DatasetStore::open(store_path, DatasetStore::Labels::Optional);
  in.split = pick_split(in.store, split);
  const ModelConfig& config = in.checkpoint.model.config();
  if (config.inputs() != in.split.features)
    throw InputError("model " + model_path + " (" + config.describe() + ") takes " +
                     std::to_string(config.inputs()) + " features, but the " + split +
                     " split of " + store_path + " has " + std::to_string(in.split.features));
  if (in.split.has_labels && in.store.num_classes > config.classes())
    throw InputError("model " + model_path + " has " + std::to_string(config.classes()) +
                     " outputs, but " + store_path + " has " +
                     std::to_string(in.store.num_classes) + " classes");
  const zarr::ArrayMeta& im = in.split.images.meta();
  in.chunk_rows = im.chunks[0];
  in.chunks = (in.split.rows + in.chunk_rows - 1) / in.chunk_rows;
  in.classes = config.classes();
  // The model file's bytes and the input array's identity: its place, shape, chunking and dtype,
  // and its files as they are now (files_crc).
  char text[96];
  std::snprintf(text, sizeof text, "model-crc32c:%08x;input-crc32c:%08x;input-files:%08x",
                file_crc(model_path), file_crc(images_metadata_file(in.split.images)),
                files_crc(in.split.images.path()));
  // The place canonical (no "..", no symlinks): the same input named another way is the same.
  in.fingerprint = std::string(text) + ";input:" +
                   fs::weakly_canonical(fs::absolute(in.split.images.path())).string() +
                   ";rows:" + std::to_string(in.split.rows);
  in.layout.format = im.format;
  in.layout.rows = in.split.rows;
  in.layout.chunk_rows = in.chunk_rows;
  in.layout.classes = in.classes;
  in.layout.fingerprint = in.fingerprint;
  return in;
}

constexpr const char* kOverwriteHint = "pass --overwrite to replace it";

// A predictions group's arrays, by their names in it.
enum class Output { Classes, Probabilities, InputDigests };
const char* output_name(Output array) {
  switch (array) {
    case Output::Classes: return "classes";
    case Output::Probabilities: return "probabilities";
    case Output::InputDigests: return "input_sha256";
  }
  return "";
}

// The arrays a group of `layout` holds.
std::vector<Output> output_arrays(const PredictionsLayout& layout) {
  std::vector<Output> arrays{Output::Classes, Output::Probabilities};
  if (layout.input_digests) arrays.push_back(Output::InputDigests);
  return arrays;
}

zarr::ArrayMeta output_meta(const PredictionsLayout& layout, Output array) {
  zarr::ArrayMeta m;
  m.format = layout.format;
  m.separator = m.format == zarr::Format::V2 ? '.' : '/';
  m.dtype = array == Output::Probabilities ? zarr::DType::Float32 : zarr::DType::UInt8;
  switch (array) {
    case Output::Classes:
      m.shape = {layout.rows};
      m.chunks = {layout.chunk_rows};
      break;
    case Output::Probabilities:
      m.shape = {layout.rows, layout.classes};
      m.chunks = {layout.chunk_rows, layout.classes};
      break;
    case Output::InputDigests: {
      const auto digest = static_cast<int64_t>(PredictionsLayout::kDigestBytes);
      m.shape = {layout.chunks(), digest};
      m.chunks = {1, digest};
      break;
    }
  }
  return m;
}

bool same_layout(const zarr::ArrayMeta& found, const zarr::ArrayMeta& wanted) {
  return found.shape == wanted.shape && found.chunks == wanted.chunks &&
         found.dtype == wanted.dtype && found.stored_plain();
}

json output_attributes(const Inputs& in, const std::string& model_path,
                       const std::string& store_path, const std::string& split) {
  return {{"created_by", "tandem predict"},
          {"model", model_path},
          {"model_config", in.checkpoint.model.config().describe()},
          {"input_store", store_path},
          {"split", split},
          {"note", "classes: arg-max of the model's logits (first maximum), what tandem eval "
                   "counts; probabilities: their softmax. Chunked like the input's rows."}};
}

// Temporary chunk files (zarr_array.cpp's "KEY.tmp-PID-TID") that a killed run left behind.
void remove_stray_temporaries(const std::string& out) {
  std::vector<fs::path> stray;
  for (const Output array : {Output::Classes, Output::Probabilities, Output::InputDigests}) {
    const char* name = output_name(array);
    std::error_code ec;
    for (auto it = fs::recursive_directory_iterator(join(out, name), ec);
         !ec && it != fs::recursive_directory_iterator(); it.increment(ec))
      if (it->path().filename().string().find(".tmp-") != std::string::npos)
        stray.push_back(it->path());
  }
  for (const fs::path& p : stray) {
    // (On a read-only mount nothing is written by this run either: a stray file stays.)
    std::error_code ec;
    if (!fs::remove(p, ec) && ec && ec != std::errc::read_only_file_system &&
        ec != std::errc::permission_denied)
      throw fs::filesystem_error("cannot remove a temporary file", p, ec);
  }
}

// A predictions group's identity, made anew whenever the group is (re)created: a group removed
// and made again under the same name (an --overwrite) is told apart from the one a writer
// opened. (An inode number is not enough: the file system hands the freed one out again.)
std::string new_output_id() {
  std::random_device entropy;
  const auto now = std::chrono::system_clock::now().time_since_epoch().count();
  char text[48];
  std::snprintf(text, sizeof(text), "%08x%08x-%lld", entropy(), entropy(),
                static_cast<long long>(now));
  return text;
}

// The id in the group's attributes ("" for a group written before ids); none when no group is
// there any more.
std::optional<std::string> output_id_of(const std::string& out) {
  if (!zarr::Group::exists(out)) return std::nullopt;
  const json attributes = zarr::Group::open(out).second;
  return json_string_or(attributes, "output_id", "");  // "" for a group of another shape too
}

bool chunk_file_complete(const zarr::Array& array, const std::vector<int64_t>& index) {
  std::error_code ec;
  const auto size = fs::file_size(join(array.path(), array.chunk_key(index)), ec);
  return !ec && size == array.meta().chunk_bytes();
}

// A run stopped between making the predictions group and its arrays left one or both missing.
// When the group is this input's (format and fingerprint), they cannot hold a chunk yet: made
// now, so the rerun resumes instead of refusing the output.
void create_missing_arrays(const std::string& out, const PredictionsLayout& layout) {
  const auto [format, attributes] = zarr::Group::open(out);
  if (format != layout.format || !attributes.is_object() ||
      json_string_or(attributes, "fingerprint", "") != layout.fingerprint)
    return;
  for (const Output array : output_arrays(layout)) {
    const std::string path = join(out, output_name(array));
    std::error_code ec;
    if (!fs::exists(join(path, ".zarray"), ec) && !fs::exists(join(path, "zarr.json"), ec))
      zarr::Array::create(path, output_meta(layout, array));
  }
}

// What a predictions group's arrays hold, as PredictionsLayout::describe() says it.
std::string found_layout(zarr::Format format, const zarr::ArrayMeta& classes,
                         const zarr::ArrayMeta& probabilities) {
  PredictionsLayout found;
  found.format = format;
  found.rows = classes.shape.empty() ? 0 : classes.shape[0];
  found.chunk_rows = classes.chunks.empty() ? 0 : classes.chunks[0];
  found.classes = probabilities.shape.size() == 2 ? probabilities.shape[1] : 0;
  return found.describe();
}

// Row chunk `chunk` of the split's images as a [chunk rows, features] matrix in `out` (every
// chunk along the other dimensions read and placed; rows past the array's end zero). A chunk
// missing from a store `tandem prepare` wrote is an InputError, as in training: its fill value
// would be predicted on as if it were images.
void read_row_chunk(const DatasetStore::Split& split, int64_t chunk, int64_t features,
                    std::vector<uint8_t>& out, std::vector<uint8_t>& buffer) {
  const zarr::Array& images = split.images;
  const zarr::ArrayMeta& meta = images.meta();
  const size_t pixel = image_pixel_type(meta, images.path()) == PixelType::UInt8 ? 1 : 4;
  out.assign(size_t(meta.chunks[0] * features) * pixel, 0);
  read_images_band(images, chunk, features, out.data(), buffer, split.every_chunk_written);
}

}  // namespace

bool is_predictions_group(const std::string& path) {
  if (!zarr::Group::exists(path)) return false;
  const json a = zarr::Group::open(path).second;
  return a.is_object() && a.contains(kMarker);
}

PredictionOutputLock::PredictionOutputLock(const std::string& out, const std::string& option)
    : out_(out), lock_(lock_prediction_output(out, option)) {}

PredictionOutputLock::~PredictionOutputLock() {
  if (!lock_->made_file()) return;
  try {
    if (is_predictions_group(out_)) return;
  } catch (...) {
    return;  // (unreadable: left as it is, lock file and all)
  }
  lock_->remove_file();
}

int64_t PredictionsLayout::rows_in_chunk(int64_t chunk) const {
  return std::min(chunk_rows, rows - chunk * chunk_rows);
}

std::string PredictionsLayout::describe() const {
  return std::to_string(rows) + " rows in chunks of " + std::to_string(chunk_rows) + ", " +
         std::to_string(classes) + " classes, Zarr v" + std::to_string(int(format));
}

// A symbolic link as the output is written where it points: removed or replaced, the link alone
// would go, a new directory taking its place and the output it led to left as it was. ("link/"
// names the target already, but remove_all() of it empties the target, then fails on the link.)
static std::string through_link(const std::string& out) {
  const std::string name = without_trailing_slashes(out);
  std::error_code ec;
  return fs::is_symlink(name, ec) ? resolved_path(name) : out;
}

// A group's output id changes whenever a run takes the group over, resuming or replacing it: the
// writers of earlier runs on it (a share cut off from its client, the tasks of an interrupted
// Dask run), which check the id before each chunk, stop at their next one ("taken over by
// another run"), and a run's writers open the group with their run's id (PredictionsOutput's
// run_output_id). A replaced group's id is retired first: writers opened on it later without
// a run's id refuse it too.
static constexpr const char* kRetiredPrefix = "retired-";

static void set_output_id(const std::string& out, const std::string& id) {
  auto [format, group_attributes] = zarr::Group::open(out);
  group_attributes["output_id"] = id;
  zarr::Group::create(out, format, group_attributes);
}

// A run resuming the group it found: a new id, then the chunks other writers had in flight
// (past their check) waited for. Writers of earlier runs stop at their next chunk, and those
// opened later with their run's id refuse the group; one that a replacement left retired when
// it gave up is live again. Returns the new id. A group this run may not write (a read-only
// mount: a rerun that finds every chunk done and only reads the classes back) keeps its id:
// this run writes no chunk there either.
static std::string renew_output_id(const std::string& out) {
  const std::string id = new_output_id();
  try {
    set_output_id(out, id);
  } catch (const IoError&) {
    if (::access(out.c_str(), W_OK) == 0) throw;  // (a full disk, say: not read-only)
    return output_id_of(out).value_or("");
  }
  const PredictionsWritersLock settled(out, PredictionsWritersLock::Kind::Replacing);
  return id;
}

// With the writers' lock held: removes what is at `out`, for a new group. Looked at again now,
// since the lock may have been waited for, and a caller of prepare that holds no OUT.lock (a
// program of its own using the Python _Predictions) may have made a group there meanwhile: that
// one is removed only with `overwrite`.
static void clear_for_new_group(const std::string& out, bool overwrite) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  if (fs::is_directory(out, ec) && fs::is_empty(out, ec)) {
    fs::remove(out, ec);
    return;
  }
  if (!is_predictions_group(out))
    throw InputError(out + ": exists and holds something other than tandem predict's "
                     "output; refusing to write there");
  if (!overwrite)
    throw InputError(out + ": another run made a predictions group here meanwhile; run again "
                     "to go on with it");
  fs::remove_all(out);
}

std::string prepare_predictions_output(const std::string& out_given,
                                       const PredictionsLayout& layout, const json& attributes,
                                       bool overwrite, const std::string& overwrite_hint) {
  const std::string out = through_link(out_given);
  if (layout.rows < 1 || layout.chunk_rows < 1 || layout.classes < 1 || layout.classes > 256)
    throw InputError(out + ": cannot write predictions of " + layout.describe() +
                     " (rows and chunk rows must be >= 1, classes from 1 to 256)");
  if (!attributes.is_object())
    throw InputError(out + ": the predictions' attributes must be a JSON object, got " +
                     attributes.dump());
  std::error_code ec;
  const bool exists = fs::exists(out, ec);
  const bool empty_dir = exists && fs::is_directory(out, ec) && fs::is_empty(out, ec);
  if (exists && !empty_dir) {
    if (!is_predictions_group(out))
      throw InputError(out + ": exists and holds something other than tandem predict's "
                       "output; refusing to write there");
    create_missing_arrays(out, layout);
    // The same layout and fingerprint (whatever its id: one a replacement that gave up left
    // retired is resumed too): this run takes it over; otherwise it is replaced, or refused.
    bool matches = true;
    try {
      const PredictionsOutput existing(out, layout, overwrite_hint,
                                       output_id_of(out).value_or(""));
    } catch (const InputError&) {
      if (!overwrite) throw;
      matches = false;
    }
    if (matches) {
      const std::string id = renew_output_id(out);
      // (No writer has a chunk in flight now, where the writers' lock could be had.)
      remove_stray_temporaries(out);
      return id;
    }
  }
  // Replaced (or made) with no chunk of another run's share in flight (predictions_writers_lock.h).
  if (exists && !empty_dir) set_output_id(out, kRetiredPrefix + new_output_id());
  const PredictionsWritersLock replacing(out, PredictionsWritersLock::Kind::Replacing);
  clear_for_new_group(out, overwrite);
  json all = attributes;
  all[kMarker] = 1;
  all["rows"] = layout.rows;
  all["fingerprint"] = layout.fingerprint;
  const std::string id = new_output_id();
  all["output_id"] = id;
  zarr::Group::create(out, layout.format, all);
  for (const Output array : output_arrays(layout))
    zarr::Array::create(join(out, output_name(array)), output_meta(layout, array));
  return id;
}

void remove_predictions_output(const std::string& out_given) {
  const std::string out = through_link(out_given);
  std::error_code ec;
  if (!fs::exists(out, ec) || (fs::is_directory(out, ec) && fs::is_empty(out, ec))) return;
  if (!is_predictions_group(out))
    throw InputError(out + ": exists and holds something other than tandem predict's "
                     "output; refusing to remove it");
  set_output_id(out, kRetiredPrefix + new_output_id());
  const PredictionsWritersLock replacing(out, PredictionsWritersLock::Kind::Replacing);
  clear_for_new_group(out, true);
}

PredictionsOutput::PredictionsOutput(const std::string& out, const PredictionsLayout& layout,
                                     const std::string& overwrite_hint,
                                     const std::string& run_output_id)
    : path_(out), layout_(layout) {
  if (!zarr::Group::exists(out))
    throw InputError(out + ": no predictions group here (prepare_predictions makes it)");
  const auto [format, attributes] = zarr::Group::open(out);
  if (!attributes.is_object() || !attributes.contains(kMarker))
    throw InputError(out + ": a Zarr group not written by tandem predict");
  classes_ = zarr::Array::open(join(out, output_name(Output::Classes)));
  probabilities_ = zarr::Array::open(join(out, output_name(Output::Probabilities)));
  const JsonFields fields(attributes, out + "'s attributes");
  const std::string none;
  output_id_ = fields.text("output_id", &none);
  // A writer that comes late (a share or a Dask task of a run that another has since taken the
  // group over from) would pass the check of the id it read and write into the other run's
  // group: refused, by its run's id or, without one, when the group is being replaced.
  if (!run_output_id.empty() && output_id_ != run_output_id)
    throw Error(out + ": taken over by another run (resumed or replaced) since this one "
                "prepared it; nothing written");
  if (run_output_id.empty() && output_id_.rfind(kRetiredPrefix, 0) == 0)
    throw InputError(out + ": being replaced by another run (an overwrite), or left so by one "
                     "that gave up (a rerun resumes it); nothing written");
  const zarr::ArrayMeta &c = classes_.meta(), &p = probabilities_.meta();
  if (format != layout.format || !same_layout(c, output_meta(layout, Output::Classes)) ||
      !same_layout(p, output_meta(layout, Output::Probabilities)))
    throw InputError(out + ": holds predictions of " + found_layout(format, c, p) +
                     ", but this input needs " + layout.describe() + "; " + overwrite_hint);
  const std::string found = fields.text("fingerprint", &none);
  if (found != layout.fingerprint)
    throw InputError(out + ": written from another model or input (fingerprint " + found +
                     ", now " + layout.fingerprint + "); " + overwrite_hint);
  if (layout.input_digests) {
    const std::string path = join(out, output_name(Output::InputDigests));
    std::error_code ec;
    if (fs::exists(join(path, ".zarray"), ec) || fs::exists(join(path, "zarr.json"), ec))
      input_digests_ = zarr::Array::open(path);
    if (!input_digests_ ||
        !same_layout(input_digests_->meta(), output_meta(layout, Output::InputDigests)))
      throw InputError(out + ": holds no input digests of one row per chunk (" + path +
                       "), which this writer compares its input with; " + overwrite_hint);
  }
}

bool PredictionsOutput::chunk_done(int64_t chunk) const {
  return chunk_file_complete(classes_, {chunk}) &&
         chunk_file_complete(probabilities_, {chunk, 0}) &&
         (!input_digests_ || chunk_file_complete(*input_digests_, {chunk, 0}));
}

void PredictionsOutput::write_chunk(int64_t chunk, const uint8_t* ids, const float* probabilities,
                                    const uint8_t* input_digest) const {
  if (input_digests_ && input_digest == nullptr)
    throw Error(path_ + ": chunk " + std::to_string(chunk) + " written without its input's "
                "digest, which this group records");
  if (chunk < 0 || chunk >= layout_.chunks())
    throw InputError(path_ + ": no chunk " + std::to_string(chunk) + " in predictions of " +
                     layout_.describe());
  // The check and the writes under one lock: a run replacing the group waits for them, or comes
  // first and this check sees it.
  const PredictionsWritersLock writing(through_link(path_), PredictionsWritersLock::Kind::Writing);
  if (output_id_of(path_) != output_id_)
    throw Error(path_ + ": taken over by another run (resumed, or replaced with an overwrite) "
                "while this one was writing; chunk " + std::to_string(chunk) +
                " and later ones not written");
  // The classes last: a chunk counts as done once every file exists, and a rerun that finds the
  // classes finds the digest they were made from.
  if (input_digests_) input_digests_->write_chunk({chunk, 0}, input_digest);
  probabilities_.write_chunk({chunk, 0}, reinterpret_cast<const uint8_t*>(probabilities));
  classes_.write_chunk({chunk}, ids);
  // Two runs writing the same chunk from different rows at once (each file is replaced whole,
  // but not the three together) can leave one's digest beside the other's predictions. Then
  // whichever wrote a prediction file after the other's digest finds that digest here, and says
  // so: a mixed chunk never passes silently.
  if (input_digests_) {
    uint8_t found[PredictionsLayout::kDigestBytes];
    if (!input_digests_->read_chunk({chunk, 0}, found) ||
        std::memcmp(found, input_digest, sizeof found) != 0)
      throw Error(path_ + ": chunk " + std::to_string(chunk) + " was written meanwhile by another "
                  "run from other input rows; its files may now be mixed: run again with the "
                  "intended input and overwrite=True");
  }
}

bool PredictionsOutput::read_input_digest(int64_t chunk, uint8_t* digest) const {
  if (!input_digests_ || chunk < 0 || chunk >= layout_.chunks()) return false;
  return input_digests_->read_chunk({chunk, 0}, digest);
}

bool PredictionsOutput::read_classes(int64_t chunk, uint8_t* ids) const {
  return classes_.read_chunk({chunk}, ids);
}

void check_logits_finite(const float* logits, int64_t rows, int64_t classes, int64_t first_row,
                         const std::string& what) {
  for (int64_t i = 0; i < rows * classes; ++i)
    if (!std::isfinite(logits[i]))
      throw InputError(what + ": row " + std::to_string(first_row + i / classes) +
                       " gives logits that are not finite (pixels too large for the model, or its "
                       "parameters: a run that diverged?); it "
                       "has no predicted class");
}

void predict_logits_checked(Backend& backend, const DatasetView& view, int64_t classes,
                            uint8_t* ids, float* logits, int64_t first_row,
                            const std::string& what, std::mutex* turn) {
  check_pixels_finite(view, first_row, what);
  {
    std::unique_lock<std::mutex> lock;
    if (turn != nullptr) lock = std::unique_lock<std::mutex>(*turn);
    backend.predict_logits(view, ids, logits);
  }
  check_logits_finite(logits, view.rows, classes, first_row, what);
}

void predict_rows(Backend& backend, const DatasetView& view, int64_t classes, uint8_t* ids,
                  float* probabilities, float* logits, int64_t first_row) {
  predict_logits_checked(backend, view, classes, ids, logits, first_row, "images");
  for (int64_t r = 0; r < view.rows; ++r)
    softmax_row(logits + r * classes, classes, ids[size_t(r)], probabilities + r * classes);
}

void predict_in_blocks(const Model& model, const DatasetView& view, int threads, uint8_t* ids,
                       float* probabilities, const std::function<void()>& between_blocks,
                       int64_t first_row) {
  check_model_data(model.config(), view, false);
  auto backend = make_cpu_backend(model.config(), OptimizerConfig{}, threads);
  backend->set_parameters(model);
  // A row's logits do not depend on the others': block by block gives the same bits. Small
  // enough that Ctrl-C is heard within a fraction of a second, large enough for whole GEMMs.
  constexpr int64_t kBlockRows = 8192;
  const int64_t classes = model.config().classes();
  std::vector<float> logits(size_t(std::min(view.rows, kBlockRows) * classes));
  for (int64_t first = 0; first < view.rows; first += kBlockRows) {
    if (first > 0 && between_blocks) between_blocks();
    const DatasetView block = view.slice(first, std::min(view.rows, first + kBlockRows));
    if (probabilities != nullptr)
      predict_rows(*backend, block, classes, ids + first, probabilities + first * classes,
                   logits.data(), first_row + first);
    else
      predict_logits_checked(*backend, block, classes, ids + first, logits.data(),
                             first_row + first, "images");
  }
}

void softmax_row(const float* logits, int64_t classes, uint8_t argmax, float* probabilities) {
  const float top = logits[argmax];
  double sum = 0.0;
  for (int64_t k = 0; k < classes; ++k) {
    probabilities[k] = std::exp(logits[k] - top);  // <= 1, so no overflow whatever the logits
    sum += probabilities[k];
  }
  for (int64_t k = 0; k < classes; ++k)
    probabilities[k] = static_cast<float>(probabilities[k] / sum);
  // exp and the division can round a slightly smaller earlier logit up to the maximum's value;
  // the probabilities' first maximum must still be the predicted class.
  for (int64_t k = 0; k < argmax; ++k)
    if (probabilities[k] >= probabilities[argmax])
      probabilities[k] = std::nextafter(probabilities[argmax], 0.0f);
}

void check_prediction_inputs(const std::string& model_path, const std::string& store_path) {
  std::error_code ec;
  if (!fs::is_regular_file(model_path, ec))
    throw InputError(model_path + ": no model checkpoint here");
  DatasetStore::check_is_directory(store_path);
}

// InputError with make_backend's reason when options ask for CUDA and no device can be used:
// said before an output is made or a chunk read.
static void check_device_for(const PredictOptions& options, const ModelConfig& config) {
  if (options.backend == BackendKind::Cuda && kernels::cuda_device_count() == 0)
    make_backend(BackendKind::Cuda, config, OptimizerConfig{}, 1);
}

int64_t prepare_predictions(const std::string& model_path, const std::string& store_path,
                            const std::string& out_path, const PredictOptions& options,
                            std::string* output_id) {
  const Inputs in = open_inputs(model_path, store_path, options.split);
  // What would fail the prediction for want of threads or of a device fails before the output is
  // made: an empty group tied to this model would refuse the next run's other model.
  if (options.threads > 0) ThreadPool::check_thread_count(options.threads);
  check_device_for(options, in.checkpoint.model.config());
  const std::string id =
      prepare_predictions_output(out_path, in.layout,
                                 output_attributes(in, model_path, store_path, options.split),
                                 options.overwrite, kOverwriteHint);
  if (output_id != nullptr) *output_id = id;
  return in.chunks;
}

PredictSummary predict_chunks(const std::string& model_path, const std::string& store_path,
                              const std::string& out_path, const PredictOptions& options) {
  if (options.shares < 1 || options.share < 0 || options.share >= options.shares)
    throw InputError("chunk share " + std::to_string(options.share) + "/" +
                     std::to_string(options.shares) + " is not one of 0/N ... N-1/N");
  const auto start = std::chrono::steady_clock::now();
  const Inputs in = open_inputs(model_path, store_path, options.split);
  const PredictionsOutput out(out_path, in.layout, kOverwriteHint, options.output_id);
  PredictSummary s;
  s.rows = in.split.rows;
  s.chunks = in.chunks;
  const int64_t begin = in.chunks * options.share / options.shares;
  const int64_t end = in.chunks * (options.share + 1) / options.shares;
  std::vector<int64_t> chunks_to_write;
  for (int64_t c = begin; c < end; ++c) {
    if (out.chunk_done(c)) {
      ++s.chunks_skipped;
      s.rows_skipped += std::min(in.chunk_rows, in.split.rows - c * in.chunk_rows);
    } else {
      chunks_to_write.push_back(c);
    }
  }
  const int total_threads = options.threads > 0 ? options.threads : ThreadPool::available_cores();
  const zarr::ArrayMeta& im = in.split.images.meta();
  // A worker per chunk at most, and no more than kChunkReadBudget of buffers allows: each holds
  // a chunk as read, the row band's pixels (every chunk across the features, uint16 widened to
  // 4 bytes: read_row_chunk) and the band's logits, probabilities and classes; a chunk may be
  // 2 GB. (On the CPU the threads are shared out among the workers all the same.)
  const PixelType pixel_type = image_pixel_type(im, in.split.images.path());
  const size_t pixel_bytes = pixel_type == PixelType::UInt8 ? 1 : 4;
  const size_t worker_bytes = im.chunk_bytes() +
                              size_t(im.chunks[0] * in.split.features) * pixel_bytes +
                              size_t(im.chunks[0] * in.classes) * 9;
  const int workers = chunk_read_threads(total_threads, int64_t(chunks_to_write.size()),
                                         worker_bytes, 1);
  const int64_t features = in.split.features, classes = in.classes, chunk_rows = in.chunk_rows;
  // On a GPU, one backend for all the workers (one device context and one copy of the
  // parameters; the device takes the chunks one at a time, under `device_mutex`) while the
  // workers read and write chunks around it. Made before any chunk is read; `cuda` without a
  // usable device fails at once, even with nothing to do.
  check_device_for(options, in.checkpoint.model.config());
  const bool any_work = !chunks_to_write.empty() && options.stop_after_chunks != 0;
  std::unique_ptr<Backend> device_backend;
  std::mutex device_mutex;
  bool on_device = options.backend == BackendKind::Cuda ||
                   (options.backend == BackendKind::Auto && kernels::cuda_device_count() > 0);
  if (on_device && any_work) {
    // auto: the device when this build's kernels run on it; else make_backend says why not
    // (once) and the CPU predicts, as `tandem train --backend auto` trains there. (Only with
    // work to do: a call that only counts the chunks done starts no CUDA context.)
    device_backend = make_backend(options.backend, in.checkpoint.model.config(),
                                  OptimizerConfig{}, 1);
    on_device = device_backend->name() == "cuda";
    if (!on_device) device_backend.reset();
  }
  s.backend = on_device ? "cuda" : "cpu";
  if (device_backend) device_backend->set_parameters(in.checkpoint.model);
  // Only counting the chunks done (the parent of --processes asks that): no backend per worker.
  if (!any_work) return s;
  std::atomic<int64_t> next{0}, written{0}, predicted{0};
  std::atomic<bool> failed{false}, stopped{false};
  ThreadPool pool(workers);
  pool.run([&](int w) {
    try {
      std::unique_ptr<Backend> own_backend;
      Backend* backend = device_backend.get();
      if (!on_device) {
        // The threads are shared out among the workers; with fewer chunks than threads each
        // chunk is itself split across its worker's backend threads.
        const int threads = total_threads / workers + (w < total_threads % workers ? 1 : 0);
        own_backend = make_cpu_backend(in.checkpoint.model.config(), OptimizerConfig{}, threads);
        own_backend->set_parameters(in.checkpoint.model);
        backend = own_backend.get();
      }
      std::vector<uint8_t> pixels, buffer, ids(static_cast<size_t>(chunk_rows));
      std::vector<float> logits(size_t(chunk_rows * classes)), probs(logits.size());
      for (;;) {
        const int64_t j = next.fetch_add(1);
        if (failed.load() || j >= int64_t(chunks_to_write.size()) ||
            (options.stop_after_chunks >= 0 && j >= options.stop_after_chunks))
          break;
        if (options.stop != nullptr && options.stop->load()) {
          stopped.store(true);
          break;
        }
        const int64_t chunk = chunks_to_write[size_t(j)];
        const int64_t n = std::min(chunk_rows, in.split.rows - chunk * chunk_rows);
        read_row_chunk(in.split, chunk, features, pixels, buffer);
        DatasetView view;
        view.pixel_type = pixel_type;
        view.pixels = pixels.data();
        view.rows = n;
        view.features = features;
        view.num_classes = static_cast<int>(classes);
        std::fill(ids.begin(), ids.end(), uint8_t{0});
        std::fill(probs.begin(), probs.end(), 0.0f);  // the edge chunk's padding
        predict_logits_checked(*backend, view, classes, ids.data(), logits.data(),
                               chunk * chunk_rows, store_path + " (" + options.split + ")",
                               on_device ? &device_mutex : nullptr);
        for (int64_t r = 0; r < n; ++r)  // predict_rows' softmax, outside the device's turn
          softmax_row(logits.data() + r * classes, classes, ids[size_t(r)],
                      probs.data() + r * classes);
        out.write_chunk(chunk, ids.data(), probs.data());
        written.fetch_add(1);
        predicted.fetch_add(n);
      }
    } catch (...) {
      failed.store(true);
      throw;
    }
  });
  s.chunks_written = written.load();
  s.rows_predicted = predicted.load();
  s.stopped = stopped.load();
  s.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  s.samples_per_s = s.seconds > 0.0 ? double(s.rows_predicted) / s.seconds : 0.0;
  return s;
}

void add_accuracy(const std::string& store_path, const std::string& out_path,
                  const PredictOptions& options, PredictSummary& summary) {
  const DatasetStore store = DatasetStore::open(store_path, DatasetStore::Labels::Optional);
  const DatasetStore::Split& split = pick_split(store, options.split);
  if (!split.has_labels) return;  // new images to classify: the predictions are all there is
  const zarr::Array classes = zarr::Array::open(join(out_path, "classes"));
  // A label that names no class would count as a wrong prediction without a word: refused as
  // tandem eval and training refuse it.
  std::vector<uint8_t> labels;
  try {
    labels = read_class_labels(split.labels, store.num_classes,
                               store_path + " (" + options.split + ")");
  } catch (const InputError& e) {
    throw InputError(std::string(e.what()) + "; the predictions are written, the accuracy is not "
                     "counted");
  }
  const int64_t chunk_rows = classes.meta().chunks[0];
  std::vector<uint8_t> ids(classes.meta().chunk_bytes());
  int64_t correct = 0;
  for (int64_t c = 0, n = classes.meta().grid()[0]; c < n; ++c) {
    if (!classes.read_chunk({c}, ids.data()))
      throw InputError(out_path + ": chunk " + std::to_string(c) + " of classes is missing; "
                       "run tandem predict again to finish it");
    const int64_t first = c * chunk_rows, count = std::min(chunk_rows, split.rows - first);
    for (int64_t r = 0; r < count; ++r) correct += labels[size_t(first + r)] == ids[size_t(r)];
  }
  summary.has_labels = true;
  summary.correct = correct;
  summary.accuracy = split.rows > 0 ? double(correct) / double(split.rows) : 0.0;
}

PredictSummary predict_store(const std::string& model_path, const std::string& store_path,
                             const std::string& out_path, const PredictOptions& options) {
  PredictOptions run = options;
  prepare_predictions(model_path, store_path, out_path, options, &run.output_id);
  PredictSummary s = predict_chunks(model_path, store_path, out_path, run);
  const bool whole = options.shares == 1 && s.chunks_written + s.chunks_skipped == s.chunks;
  if (whole) add_accuracy(store_path, out_path, options, s);
  return s;
}

}  // namespace tandem
