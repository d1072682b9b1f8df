// tandem prepare: writes a Zarr dataset store (images + labels per split) from MNIST-format IDX
// files, the training split repeated --copies times as the seed's Dask graph does.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <memory>

#include "json_text.h"
#include "number_checks.h"
#include "dataset_store.h"
#include "idx_reader.h"
#include "progress_line.h"
#include "stop_signals.h"
#include "store_commands.h"
#include "tandem/dataset.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace tandem::cli {

namespace {

constexpr int kClasses = 10;

struct PrepareOptions {
  std::string out;
  std::string data;
  std::string images, labels, test_images, test_labels;
  int copies = 1;
  int64_t chunk_rows = 10000;
  int64_t validation_rows = 5000;
  std::string dtype = "uint8";
  std::string compressor = "none";
  int format = 3;
  bool overwrite = false;
  bool json = false;
};

// An IDX image file as [count, features], with its image shape when it has one.
struct ImageFile {
  IdxArray a;
  int64_t count = 0;
  int64_t features = 0;
  nlohmann::json shape;
};

ImageFile read_image_file(const std::string& path) {
  ImageFile f;
  f.a = read_idx(path);
  if (f.a.type != IdxType::UInt8 || (f.a.dims.size() != 2 && f.a.dims.size() != 3))
    throw InputError(path + ": images are " + idx_type_name(f.a.type) + " with " +
                     std::to_string(f.a.dims.size()) + " dimensions, expected uint8 with 3 "
                     "dimensions (count, rows, cols) or 2 (count, features)");
  f.count = f.a.dims[0];
  f.features = f.a.dims[1] * (f.a.dims.size() == 3 ? f.a.dims[2] : 1);
  if (f.a.dims.size() == 3) f.shape = {f.a.dims[1], f.a.dims[2]};
  return f;
}

IdxArray read_label_file(const std::string& path, const ImageFile& images,
                         const std::string& images_path) {
  IdxArray a = read_idx_labels(path);
  check_label_count(images_path, images.count, path, a);
  check_label_classes(path, a, kClasses);
  return a;
}

Dataset rows_of(const ImageFile& images, const IdxArray& labels, int64_t begin, int64_t end) {
  Dataset d(PixelType::UInt8, end - begin, images.features, kClasses);
  std::copy(images.a.data.begin() + begin * images.features,
            images.a.data.begin() + end * images.features, d.pixel_data());
  std::copy(labels.data.begin() + begin, labels.data.begin() + end, d.label_data());
  return d;
}

// --images/--labels (and --test-images/--test-labels): the last validation_rows training images
// are the validation split, as TensorFlow's reader does.
DataSplits load_files(const PrepareOptions& o, nlohmann::json& provenance) {
  const ImageFile train = read_image_file(o.images);
  const IdxArray train_labels = read_label_file(o.labels, train, o.images);
  if (train.count == 0)
    throw InputError(o.images + " holds no images: nothing to train on");
  if (o.validation_rows < 0 || o.validation_rows >= train.count)
    throw InputError("--validation-rows is " + std::to_string(o.validation_rows) +
                     ", expected 0 <= rows < " + std::to_string(train.count) +
                     " (the images in " + o.images + ")");
  DataSplits s;
  s.source = o.images;
  s.train = rows_of(train, train_labels, 0, train.count - o.validation_rows);
  s.validation = rows_of(train, train_labels, train.count - o.validation_rows, train.count);
  provenance["source_files"] = {{"train_images", o.images}, {"train_labels", o.labels}};
  if (!train.shape.is_null()) provenance["image_shape"] = train.shape;
  if (!o.test_images.empty()) {
    const ImageFile test = read_image_file(o.test_images);
    const IdxArray test_labels = read_label_file(o.test_labels, test, o.test_images);
    if (test.features != train.features || (test.shape != train.shape))
      throw InputError(o.test_images + ": images have " + std::to_string(test.features) +
                       " features (shape " + test.shape.dump() + "), expected " +
                       std::to_string(train.features) + " (shape " + train.shape.dump() +
                       ") as in " + o.images);
    s.test = rows_of(test, test_labels, 0, test.count);
    provenance["source_files"]["test_images"] = o.test_images;
    provenance["source_files"]["test_labels"] = o.test_labels;
  } else {
    s.test = Dataset(PixelType::UInt8, 0, train.features, kClasses);
  }
  return s;
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char text[32];
  std::strftime(text, sizeof(text), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return text;
}

int64_t bytes_under(const std::string& dir) {
  int64_t total = 0;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code fec;
    if (it->is_regular_file(fec)) total += int64_t(it->file_size(fec));
  }
  return total;
}

void run_prepare(const PrepareOptions& o) {
  StoreWriteOptions w;
  w.format = o.format == 2 ? zarr::Format::V2 : zarr::Format::V3;
  w.pixel_type = o.dtype == "float32" ? PixelType::Float32 : PixelType::UInt8;
  w.chunk_rows = o.chunk_rows;
  w.compressor = zarr::Compressor::parse(o.compressor);
  if (w.format == zarr::Format::V3 && w.compressor.kind == zarr::Compressor::Kind::Zlib)
    throw InputError("--compressor " + o.compressor + ": zlib is a Zarr v2 compressor; with "
                     "--format 3 use gzip (the same deflate data in gzip's wrapper)");
  w.copies = o.copies;
  w.overwrite = o.overwrite;
  w.stop = &stop_on_signals();  // handled from here on: see the write below
  // Refuse an existing store before spending seconds on reading the source.
  std::error_code ec;
  if (!o.overwrite && std::filesystem::symlink_status(o.out, ec).type() !=
                          std::filesystem::file_type::not_found)
    throw InputError(o.out + " already exists; pass --overwrite to replace it");

  const auto t0 = std::chrono::steady_clock::now();
  nlohmann::json provenance{{"created_by", "tandem prepare"},
                            {"tandem_version", TANDEM_VERSION},
                            {"created_at", utc_now()},
                            {"validation_rows", o.validation_rows}};
  DataSplits splits;
  if (!o.images.empty()) {
    splits = load_files(o, provenance);
  } else {
    const std::string dir = o.data.empty() ? default_data_dir() : o.data;
    // The other commands' --data takes a store; prepare's reads IDX files: a store given here is
    // that mix-up, not a directory missing its IDX files.
    if (is_dataset_store(dir))
      throw InputError("--data " + dir + " is a dataset store already: prepare makes one from "
                       "IDX files (train, eval, launch and predict take the store as it is)");
    splits = load_mnist_splits(dir, o.validation_rows);
    provenance["source_dir"] = dir;
  }
  provenance["source"] = splits.source;
  provenance["source_rows"] = {{"train", splits.train.rows()},
                               {"validation", splits.validation.rows()},
                               {"test", splits.test.rows()}};
  const auto t1 = std::chrono::steady_clock::now();

  ProgressLine progress;
  const auto write_start = std::chrono::steady_clock::now();
  w.progress = [&](int64_t done, int64_t total) {
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - write_start).count();
    char line[200];
    std::snprintf(line, sizeof(line), "writing %s: %lld/%lld rows (%.0f%%), %.1f s",
                  o.out.c_str(), static_cast<long long>(done), static_cast<long long>(total),
                  total > 0 ? 100.0 * double(done) / double(total) : 100.0, s);
    progress.update(line, done == total);
  };
  // A stop signal ends the write between two chunks, with its temporary directory removed: an
  // interrupted prepare leaves neither a store nor litter (kill -9 leaves a directory that is no
  // store, removed by the next prepare of the same store).
  try {
    if (w.stop->load()) throw StoreWriteStopped("stopped while reading the source");
    write_dataset_store(splits, o.out, w, provenance);
  } catch (const StoreWriteStopped&) {
    progress.finish();
    throw Error(std::string("prepare stopped by ") + stop_signal_name() + "; nothing was written " +
                "to " + o.out + (w.overwrite ? " (the store there is unchanged)" : ""));
  }
  progress.finish();
  const auto t2 = std::chrono::steady_clock::now();
  const double load_s = std::chrono::duration<double>(t1 - t0).count();
  const double write_s = std::chrono::duration<double>(t2 - t1).count();

  const int64_t features = splits.train.features();
  const int64_t rows_train = splits.train.rows() * o.copies;
  const int64_t rows_total = rows_train + splits.validation.rows() + splits.test.rows();
  const int64_t pixel_bytes = w.pixel_type == PixelType::UInt8 ? 1 : 4;
  const int64_t data_bytes = rows_total * features * pixel_bytes + rows_total;
  const int64_t stored_bytes = bytes_under(o.out);
  // As written: a --chunk-rows above the training rows is cut to them (the option said more).
  const int64_t chunk_rows = DatasetStore::open(o.out).train.images.meta().chunks[0];
  const double mb_per_s = write_s > 0 ? double(data_bytes) / 1e6 / write_s : 0.0;
  if (o.json) {
    nlohmann::json j{{"store", o.out},
                     {"format", o.format},
                     {"dtype", o.dtype},
                     {"compressor", w.compressor.describe()},
                     {"chunk_rows", chunk_rows},
                     {"copies", o.copies},
                     {"features", features},
                     {"rows", {{"train", rows_train},
                               {"validation", splits.validation.rows()},
                               {"test", splits.test.rows()}}},
                     {"data_bytes", data_bytes},
                     {"stored_bytes", stored_bytes},
                     {"load_seconds", load_s},
                     {"seconds", write_s},
                     {"mb_per_s", mb_per_s}};
    std::printf("%s\n", json_text(j).c_str());
  } else {
    std::printf("wrote %s: zarr v%d, %s pixels, %lld features, chunks of %lld rows, compressor %s\n",
                o.out.c_str(), o.format, o.dtype.c_str(), static_cast<long long>(features),
                static_cast<long long>(chunk_rows), w.compressor.describe().c_str());
    std::printf("  train %lld rows (%d %s of %lld), validation %lld, test %lld\n",
                static_cast<long long>(rows_train), o.copies, o.copies == 1 ? "copy" : "copies",
                static_cast<long long>(splits.train.rows()),
                static_cast<long long>(splits.validation.rows()),
                static_cast<long long>(splits.test.rows()));
    std::printf("  %.1f MB of data, %.1f MB on disk (ratio %.2f), written in %.2f s (%.0f MB/s); "
                "source read in %.2f s\n",
                double(data_bytes) / 1e6, double(stored_bytes) / 1e6,
                stored_bytes > 0 ? double(data_bytes) / double(stored_bytes) : 0.0, write_s,
                mb_per_s, load_s);
  }
}

}  // namespace

void add_prepare_command(CLI::App& app) {
  auto o = std::make_shared<PrepareOptions>();
  CLI::App* cmd = app.add_subcommand(
      "prepare", "Write a Zarr dataset store from MNIST-format IDX files");
  cmd->add_option("--out", o->out, "Dataset store to write (a directory)")->required();
  CLI::Option* data = cmd->add_option(
      "--data", o->data, "Directory of MNIST-format IDX files (default " + default_data_dir() + ")");
  CLI::Option* images = cmd->add_option("--images", o->images, "Training images (IDX file)")
                            ->check(CLI::ExistingFile);
  CLI::Option* labels = cmd->add_option("--labels", o->labels, "Training labels (IDX file)")
                            ->check(CLI::ExistingFile);
  CLI::Option* test_images =
      cmd->add_option("--test-images", o->test_images, "Test images (IDX file)")
          ->check(CLI::ExistingFile);
  CLI::Option* test_labels =
      cmd->add_option("--test-labels", o->test_labels, "Test labels (IDX file)")
          ->check(CLI::ExistingFile);
  data->excludes(images)->excludes(labels)->excludes(test_images)->excludes(test_labels);
  images->needs(labels);
  labels->needs(images);
  test_images->needs(test_labels)->needs(images);
  test_labels->needs(test_images);
  cmd->add_option("--copies", o->copies, "Copies of the training split (the seed uses 20)")
      ->check(positive_number())->capture_default_str();
  cmd->add_option("--chunk-rows", o->chunk_rows, "Rows per chunk")->check(positive_number())
      ->capture_default_str();
  cmd->add_option("--validation-rows", o->validation_rows,
                  "Last training rows held out for validation")->capture_default_str();
  cmd->add_option("--dtype", o->dtype, "Pixel type: uint8, or float32 scaled to [0,1]")
      ->check(CLI::IsMember({"uint8", "float32"}))->capture_default_str();
  cmd->add_option("--compressor", o->compressor,
                  "none, zstd[:LEVEL], blosc-CNAME[-SHUFFLE][:LEVEL] (CNAME lz4, lz4hc, blosclz, "
                  "zstd or zlib; SHUFFLE shuffle, the default, noshuffle or bitshuffle), "
                  "gzip[:LEVEL] or zlib[:LEVEL] (Zarr v2 only)")
      ->capture_default_str();
  cmd->add_option("--format", o->format, "Zarr format: 2 or 3")
      ->check(CLI::IsMember({2, 3}))->capture_default_str();
  cmd->add_flag("--overwrite", o->overwrite, "Replace an existing store (once the new one is complete)");
  cmd->add_flag("--json", o->json, "Print one line of JSON");
  cmd->callback([o] { run_prepare(*o); });
}

}  // namespace tandem::cli
