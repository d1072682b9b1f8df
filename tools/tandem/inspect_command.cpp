// tandem inspect: what the seed's notebook shows of its persisted array (a sample image, the mean
// and the variance image), as PNG files, and per-array statistics of a dataset store.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "file_io.h"
#include "json_text.h"
#include "number_checks.h"
#include "array_stats.h"
#include "data_store_of.h"
#include "dataset_store.h"
#include "png_writer.h"
#include "split_labels.h"
#include "store_commands.h"
#include "tandem/error.h"

namespace tandem::cli {

namespace {

struct InspectOptions {
  std::string store;
  std::string out = ".";
  std::string split = "train";
  int64_t sample = 1;
  int scale = 10;
  int threads = 0;
  bool json = false;
};

// The image shape recorded by prepare when it describes `features`; else the images array's own
// height and width when it is [rows, height, width] (Dask's, or a store without attributes);
// else a square; else a strip.
std::pair<int64_t, int64_t> image_shape(const DatasetStore& store, int64_t features) {
  const nlohmann::json& a = store.attributes;
  const std::vector<int64_t>& shape = store.train.images.meta().shape;
  if (a.is_object() && a.contains("image_shape") && a["image_shape"].is_array()) {
    const nlohmann::json& s = a["image_shape"];
    if (s.size() == 2 && image_shape_describes(s, features))
      return {s[0].get<int64_t>(), s[1].get<int64_t>()};
  }
  if (shape.size() == 3 && shape[1] * shape[2] == features) return {shape[1], shape[2]};
  const auto side = static_cast<int64_t>(std::llround(std::sqrt(double(features))));
  if (side * side == features) return {side, side};
  return {1, features};
}

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "x" : "") + std::to_string(v[i]);
  return s;
}

nlohmann::json array_json(const zarr::Array& a) {
  const zarr::ArrayMeta& m = a.meta();
  return {{"rows", m.shape.empty() ? 0 : m.shape[0]},
          {"shape", m.shape},
          {"dtype", zarr::dtype_name(m.dtype)},
          {"chunks", m.chunks},
          {"compressor", m.compressor.describe()}};
}

struct SplitReport {
  std::string name;  // "train", "validation", "test"
  std::string prefix;  // "", "validation/", "test/"
  const DatasetStore::Split* split;
  ColumnStats images;
  IntegerHistogram labels;  // empty when the split has no labels
};

// The labels' histogram: of the values of integer class indices (out-of-range ones shown as they
// are), or of the classes that float indices or one-hot rows stand for (each checked).
IntegerHistogram label_histogram(const DatasetStore& store, const DatasetStore::Split& split,
                                 int threads) {
  const zarr::ArrayMeta& meta = split.labels.meta();
  const bool floats = meta.dtype == zarr::DType::Float32 || meta.dtype == zarr::DType::Float64;
  if (one_hot_classes(meta) == 0 && !floats)
    return integer_histogram(split.labels, threads, split.every_chunk_written);
  IntegerHistogram h;
  for (const uint8_t c : read_class_labels(split.labels, store.num_classes, store.path,
                                           split.every_chunk_written)) {
    h.min = h.count == 0 ? c : std::min<int64_t>(h.min, c);
    h.max = h.count == 0 ? c : std::max<int64_t>(h.max, c);
    ++h.count;
    ++h.counts[c];
  }
  return h;
}

// Row `row`'s label: its value, or the class of its one-hot row (by the rule training reads).
double sample_label_of(const DatasetStore::Split& split, int64_t row) {
  const std::vector<double> values = read_matrix_row(split.labels, row, split.every_chunk_written);
  if (one_hot_classes(split.labels.meta()) == 0) return values[0];
  const char* why = nullptr;
  const int64_t c = one_hot_row_class(values.data(), int64_t(values.size()), &why);
  if (c < 0)
    throw InputError(split.labels.path() + ": one-hot label row " + std::to_string(row) +
                     " names no class (" + why + ")");
  return double(c);
}

void run_inspect(const InspectOptions& o) {
  const auto t0 = std::chrono::steady_clock::now();
  refuse_idx_files_for_a_store(o.store, "");
  // Images to classify may come without labels (DatasetStore::Labels): inspect shows them too.
  const DatasetStore store = DatasetStore::open(o.store, DatasetStore::Labels::Optional);
  const DatasetStore::Split& chosen = o.split == "train"        ? store.train
                                      : o.split == "validation" ? store.validation
                                                                : store.test;
  if (chosen.rows == 0)
    throw InputError(store.path + ": the " + o.split + " split is empty or missing");
  if (o.sample < 0 || o.sample >= chosen.rows)
    throw InputError("--sample is " + std::to_string(o.sample) + ", expected a row of the " +
                     o.split + " split in [0, " + std::to_string(chosen.rows) + ") of " +
                     store.path);
  const auto [height, width] = image_shape(store, chosen.features);

  std::vector<SplitReport> reports;
  reports.push_back({"train", "", &store.train, {}, {}});
  if (store.validation.rows > 0) reports.push_back({"validation", "validation/", &store.validation, {}, {}});
  if (store.test.rows > 0) reports.push_back({"test", "test/", &store.test, {}, {}});
  double chosen_seconds = 0.0;
  const SplitReport* chosen_report = nullptr;
  for (SplitReport& r : reports) {
    const auto s0 = std::chrono::steady_clock::now();
    r.images = column_stats(r.split->images, o.threads, r.split->every_chunk_written);
    if (r.name == o.split) {
      chosen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - s0).count();
      chosen_report = &r;
    }
    if (r.split->has_labels) r.labels = label_histogram(store, *r.split, o.threads);
    // Shown as they are, but said: the commands that use the labels refuse them.
    if (r.split->has_labels && r.labels.count > 0 &&
        (r.labels.min < 0 || r.labels.max >= store.num_classes))
      std::fprintf(stderr,
                   "tandem inspect: warning: the %s split's labels run from %lld to %lld, but the "
                   "store has %d classes (0 to %d): train, eval and predict refuse them\n",
                   r.name.c_str(), static_cast<long long>(r.labels.min),
                   static_cast<long long>(r.labels.max), store.num_classes,
                   store.num_classes - 1);
  }

  // The images: row `sample`, the mean and the variance, each scaled by its own range.
  create_output_directory(o.out, "--out");
  const std::vector<double> sample =
      read_matrix_row(chosen.images, o.sample, chosen.every_chunk_written);
  const nlohmann::json sample_label =
      chosen.has_labels ? nlohmann::json(sample_label_of(chosen, o.sample)) : nullptr;
  PngOptions png;
  png.scale = o.scale;
  const std::string sample_png = (std::filesystem::path(o.out) / "sample.png").string();
  const std::string mean_png = (std::filesystem::path(o.out) / "mean.png").string();
  const std::string variance_png = (std::filesystem::path(o.out) / "variance.png").string();
  write_gray_png(sample_png, sample.data(), height, width, png);
  write_gray_png(mean_png, chosen_report->images.mean.data(), height, width, png);
  write_gray_png(variance_png, chosen_report->images.variance.data(), height, width, png);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int64_t scanned_bytes = chosen.rows * chosen.features *
                                int64_t(zarr::dtype_size(chosen.images.meta().dtype));

  if (o.json) {
    nlohmann::json arrays = nlohmann::json::object();
    for (const SplitReport& r : reports) {
      nlohmann::json im = array_json(r.split->images);
      im["features"] = r.images.features;
      im["min"] = r.images.min;
      im["max"] = r.images.max;
      im["mean"] = r.images.overall_mean;
      arrays[r.prefix + "images"] = im;
      if (!r.split->has_labels) continue;
      nlohmann::json lb = array_json(r.split->labels);
      lb["min"] = r.labels.min;
      lb["max"] = r.labels.max;
      nlohmann::json hist = nlohmann::json::object();
      for (const auto& [value, count] : r.labels.counts) hist[std::to_string(value)] = count;
      lb["histogram"] = hist;
      arrays[r.prefix + "labels"] = lb;
    }
    nlohmann::json j{{"store", store.path},
                     {"num_classes", store.num_classes},
                     {"split", o.split},
                     {"image_shape", {height, width}},
                     {"sample", {{"row", o.sample}, {"label", sample_label}}},
                     {"files", {{"sample", sample_png}, {"mean", mean_png}, {"variance", variance_png}}},
                     {"arrays", arrays},
                     {"column_mean", chosen_report->images.mean},
                     {"column_variance", chosen_report->images.variance},
                     {"stats_seconds", chosen_seconds},
                     {"seconds", seconds}};
    std::printf("%s\n", json_text(j).c_str());
    return;
  }
  std::printf("store %s: %d classes, image shape %lldx%lld\n", store.path.c_str(),
              store.num_classes, static_cast<long long>(height), static_cast<long long>(width));
  for (const SplitReport& r : reports) {
    const zarr::ArrayMeta& im = r.split->images.meta();
    const zarr::ArrayMeta& lm = r.split->labels.meta();
    std::printf("  %-18s %9lld x %-5lld %-8s chunks %-10s %-14s min %g  max %g  mean %.6g\n",
                (r.prefix + "images").c_str(), static_cast<long long>(r.split->rows),
                static_cast<long long>(r.split->features), zarr::dtype_name(im.dtype),
                dims_text(im.chunks).c_str(), im.compressor.describe().c_str(), r.images.min,
                r.images.max, r.images.overall_mean);
    if (!r.split->has_labels) {
      std::printf("  %-18s none\n", (r.prefix + "labels").c_str());
      continue;
    }
    std::string hist;
    for (const auto& [value, count] : r.labels.counts)
      hist += " " + std::to_string(value) + ":" + std::to_string(count);
    std::printf("  %-18s %9lld         %-8s chunks %-10s %-14s min %lld  max %lld  counts%s\n",
                (r.prefix + "labels").c_str(), static_cast<long long>(r.split->rows),
                zarr::dtype_name(lm.dtype), dims_text(lm.chunks).c_str(),
                lm.compressor.describe().c_str(), static_cast<long long>(r.labels.min),
                static_cast<long long>(r.labels.max), hist.c_str());
  }
  char label_text[48] = "no label";
  if (!sample_label.is_null())
    std::snprintf(label_text, sizeof label_text, "label %g", sample_label.get<double>());
  std::printf("wrote %s (%s row %lld, %s), %s and %s, %lldx%lld pixels each\n",
              sample_png.c_str(), o.split.c_str(), static_cast<long long>(o.sample), label_text,
              mean_png.c_str(), variance_png.c_str(), static_cast<long long>(height * o.scale),
              static_cast<long long>(width * o.scale));
  std::printf("mean and variance of %lld x %lld %s images in %.2f s (%.0f MB/s); %.2f s in all\n",
              static_cast<long long>(chosen.rows), static_cast<long long>(chosen.features),
              o.split.c_str(), chosen_seconds,
              chosen_seconds > 0 ? double(scanned_bytes) / 1e6 / chosen_seconds : 0.0, seconds);
}

}  // namespace

void add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  CLI::App* cmd = app.add_subcommand(
      "inspect", "Write a sample, the mean and the variance image of a dataset store as PNG files, "
                 "and print its statistics");
  cmd->add_option("store", o->store, "Dataset store (written by tandem prepare, or by Dask/zarr)")
      ->required();
  cmd->add_option("--out", o->out, "Directory for sample.png, mean.png and variance.png")
      ->capture_default_str();
  cmd->add_option("--sample", o->sample, "Row of the split to show")->capture_default_str();
  cmd->add_option("--split", o->split, "train, validation or test")
      ->check(CLI::IsMember({"train", "validation", "test"}))->capture_default_str();
  cmd->add_option("--scale", o->scale, "Upscaling factor of the images (nearest neighbour)")
      ->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--threads", o->threads, "Threads (0: all cores)")
      ->check(non_negative_number())
      ->capture_default_str();
  cmd->add_flag("--json", o->json, "Print one line of JSON (with the per-column mean and variance)");
  cmd->callback([o] { run_inspect(*o); });
}

}  // namespace tandem::cli
