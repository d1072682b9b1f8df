// Batch prediction over a persisted store (the seed's `df.map_partitions(predict)`): every row
// chunk of one split's images goes through a saved model and its class ids and probabilities are
// written as Zarr arrays chunked like the input, `classes` uint8 [rows] and `probabilities`
// float32 [rows, classes], in a group at `out` in the input's Zarr format.
//
// Chunks are independent: a pool of threads takes whole chunks (read, predict, write), and several
// processes can each take a share of the chunks (`tandem predict --processes`). Each chunk file is
// written through a temporary file and a rename, so a chunk is done exactly when both its files
// exist at full size; a rerun with the same model and input skips those. The group's attributes
// record a fingerprint of both, and a rerun with a different one is refused unless asked to
// overwrite.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "pixels_finite.h"
#include "run_dir_lock.h"
#include "tandem/config.h"
#include "tandem/model.h"
#include "zarr/zarr_array.h"

namespace tandem {

class Backend;
struct DatasetView;

// The output group of a prediction, whatever its rows come from (a store's split for tandem
// predict, a dask array's blocks for tandem.dask.predict through the Python module).
struct PredictionsLayout {
  zarr::Format format = zarr::Format::V3;
  int64_t rows = 0;
  int64_t chunk_rows = 0;
  int64_t classes = 0;
  std::string fingerprint;  // of the model and the input: a rerun resumes only when it matches
  // A third array, `input_sha256` (uint8 [chunks, 32], one row per chunk), holds the SHA-256 the
  // writer gave each chunk's input rows, written before the chunk. tandem.dask.predict's input
  // is a dask array with no files to fingerprint: a rerun compares each done chunk's rows with
  // the digest recorded for them.
  bool input_digests = false;
  static constexpr size_t kDigestBytes = 32;
  int64_t chunks() const { return chunk_rows > 0 ? (rows + chunk_rows - 1) / chunk_rows : 0; }
  int64_t rows_in_chunk(int64_t chunk) const;  // chunk_rows, less at the edge
  std::string describe() const;  // "10000 rows in chunks of 3000, 10 classes"
};

// Creates the predictions group at `out` (`attributes` plus the marker, the fingerprint and the
// rows), or, when one is there, checks it was made for the same layout and fingerprint, and
// removes the temporary files an interrupted run left. Anything else at `out` is refused
// (InputError naming it); a predictions group with another layout or fingerprint too, naming
// `overwrite_hint` ("pass --overwrite to replace it"), unless `overwrite`, which replaces it.
// Returns the group's output id for this run's writers (PredictionsOutput's run_output_id): the
// group gets a new one whenever a run takes it over, resuming or replacing it, so the writers of
// earlier runs stop (predictions_writers_lock.h).
std::string prepare_predictions_output(const std::string& out, const PredictionsLayout& layout,
                                       const nlohmann::json& attributes, bool overwrite,
                                       const std::string& overwrite_hint);

// Whether `path` is a group tandem predict made (its marker attribute), this run's or another's.
bool is_predictions_group(const std::string& path);

// The lock tandem predict and tandem.dask.predict hold on their output (lock_prediction_output:
// OUT.lock beside it), released when destroyed. A run that ends with no predictions group at
// `out` (refused: something else is there) also removes the OUT.lock it made, so that nothing
// is left beside the user's path.
class PredictionOutputLock {
 public:
  PredictionOutputLock(const std::string& out, const std::string& option);
  ~PredictionOutputLock();
  PredictionOutputLock(const PredictionOutputLock&) = delete;
  PredictionOutputLock& operator=(const PredictionOutputLock&) = delete;

 private:
  std::string out_;
  std::unique_ptr<RunDirLock> lock_;
};

// Removes the predictions group at `out`, if any; InputError naming `out` when something else is
// there (an empty directory counts as nothing).
void remove_predictions_output(const std::string& out);

// A prepared predictions group: `classes` uint8 [rows] and `probabilities` float32 [rows,
// classes], both chunked by rows (and `input_sha256` with input_digests). A chunk is done once
// its files exist at full size.
class PredictionsOutput {
 public:
  // InputError naming `out` when no predictions group is there, or one of another layout or
  // fingerprint (with `overwrite_hint`). With `run_output_id` (what prepare returned to this
  // writer's run), Error when the group's id is another: another run has taken it over since.
  // Without it, any id but a retired one (a group being replaced) is taken.
  PredictionsOutput(const std::string& out, const PredictionsLayout& layout,
                    const std::string& overwrite_hint, const std::string& run_output_id = "");
  const PredictionsLayout& layout() const { return layout_; }
  const std::string& path() const { return path_; }
  bool chunk_done(int64_t chunk) const;
  // ids[chunk_rows] and probabilities[chunk_rows * classes], zero beyond the chunk's rows: the
  // input's digest (kDigestBytes; required with input_digests, else ignored) first, then the
  // probabilities' file, then the classes', each through a temporary file and a rename.
  // Throws Error, writing nothing, once the group was replaced since this object opened it
  // (another run's --overwrite): its chunks would pass for the new output's.
  void write_chunk(int64_t chunk, const uint8_t* ids, const float* probabilities,
                   const uint8_t* input_digest = nullptr) const;
  // The digest recorded for chunk `chunk`'s input (kDigestBytes into `digest`); false when there
  // is none (not written, or the layout has no input_digests).
  bool read_input_digest(int64_t chunk, uint8_t* digest) const;
  // Reads chunk `chunk` of the classes into ids[chunk_rows]; false when it is missing.
  bool read_classes(int64_t chunk, uint8_t* ids) const;

 private:
  std::string path_;
  PredictionsLayout layout_;
  zarr::Array classes_;
  zarr::Array probabilities_;
  std::optional<zarr::Array> input_digests_;  // with layout_.input_digests
  std::string output_id_;  // the group's, made anew each time the group is (re)created
};

// The same for logits: InputError naming the first row whose logits are not all finite (pixels
// so large that the logits overflow).
void check_logits_finite(const float* logits, int64_t rows, int64_t classes, int64_t first_row,
                         const std::string& what);

// backend.predict_logits between check_pixels_finite and check_logits_finite: the classes and
// logits of `view`'s rows, refused (InputError naming the row, from first_row, in `what`) for a
// row that has no class. `turn`, when given, is held around the backend alone (a device shared
// by threads).
void predict_logits_checked(Backend& backend, const DatasetView& view, int64_t classes,
                            uint8_t* ids, float* logits, int64_t first_row,
                            const std::string& what, std::mutex* turn = nullptr);

// Class ids (the arg-max of the logits, first maximum: what tandem eval counts) and softmax
// probabilities of every row of `view`; `logits` is scratch of view.rows * classes floats.
// InputError for a row whose pixels or logits are not finite (check_pixels_finite,
// check_logits_finite; the view's rows are counted from first_row, "images: row N").
void predict_rows(Backend& backend, const DatasetView& view, int64_t classes, uint8_t* ids,
                  float* probabilities, float* logits, int64_t first_row = 0);

// Class ids of every row of `view` (and, when `probabilities` is given, each row's softmax into
// it, rows x classes), a block of 8,192 rows at a time on one CPU backend: the logits' buffer stays
// the size of a block however many rows there are, and `between_blocks`, when given, is called
// before each block but the first (the Python package looks at Ctrl-C there; what it throws
// ends the prediction). Rows are named in errors from `first_row` ("images: row N").
// tandem::predict, Model.predict and tandem.dask.predict's chunks go through it.
void predict_in_blocks(const Model& model, const DatasetView& view, int threads, uint8_t* ids,
                       float* probabilities, const std::function<void()>& between_blocks = {},
                       int64_t first_row = 0);

struct PredictOptions {
  std::string split = "test";  // train, validation or test
  int threads = 0;             // CPU threads in all (0: all cores)
  // Cpu: each worker thread has its own CPU backend with its share of the threads. Cuda: one
  // backend on device 0 predicts every chunk in turn while the `threads` workers read and write
  // chunks around it. Auto: Cuda when a device is present, Cpu otherwise.
  BackendKind backend = BackendKind::Auto;
  int share = 0;               // this process takes share `share` of `shares` (contiguous chunks)
  int shares = 1;
  bool overwrite = false;      // replace an output made from another model or input
  int64_t stop_after_chunks = -1;  // tests: stop taking chunks once this many were written
  // When it turns true (a signal handler: tandem predict on SIGTERM), no chunk is started any
  // more; the chunks being predicted are finished and renamed into place, so the run leaves no
  // temporary file and a rerun finishes the rest.
  const std::atomic<bool>* stop = nullptr;
  // The output id this run's writers write under (prepare_predictions sets it; tandem predict
  // gives it to its shares): a share of an earlier run, started late, finds the group taken over
  // and writes nothing. Empty: the id the group has when predict_chunks opens it.
  std::string output_id;
};

struct PredictSummary {
  int64_t rows = 0;            // rows of the split
  int64_t chunks = 0;          // row chunks of the split
  int64_t chunks_written = 0;  // by this call
  int64_t chunks_skipped = 0;  // already complete (of this call's share)
  int64_t rows_skipped = 0;    // in the skipped chunks
  int64_t rows_predicted = 0;  // by this call
  bool stopped = false;        // options.stop ended the call with chunks of its share left
  double seconds = 0.0;
  double samples_per_s = 0.0;  // rows_predicted / seconds
  std::string backend;         // "cpu" or "cuda": what options.backend chose here
  bool has_labels = false;     // accuracy and correct are set (after add_accuracy)
  double accuracy = 0.0;
  int64_t correct = 0;
};

// InputError unless the model is a file and the store a directory: the first checks of
// prepare_predictions and predict_chunks, for a caller that makes a directory or lock first.
void check_prediction_inputs(const std::string& model_path, const std::string& store_path);

// Checks the model against the split and creates the output group (or, on a rerun, checks that it
// was made from the same model and input: InputError otherwise, unless options.overwrite, which
// replaces a predictions group but nothing else). Removes temporary files an interrupted run left.
// Call once, before any process predicts. Returns the number of row chunks.
// `output_id`, when given, is set to the group's output id for this run's writers.
int64_t prepare_predictions(const std::string& model_path, const std::string& store_path,
                            const std::string& out_path, const PredictOptions& options,
                            std::string* output_id = nullptr);

// Predicts the chunks of options' share that are not complete yet, with options.threads threads,
// on options.backend. The output must have been prepared (InputError otherwise, or when its
// fingerprint differs); InputError too when CUDA is asked for and no device can be used.
PredictSummary predict_chunks(const std::string& model_path, const std::string& store_path,
                              const std::string& out_path, const PredictOptions& options);

// Counts correct predictions over every row (classes read back from the output, so chunks skipped
// on a rerun count too) when the split has labels. InputError if a chunk is still missing.
void add_accuracy(const std::string& store_path, const std::string& out_path,
                  const PredictOptions& options, PredictSummary& summary);

// prepare_predictions, predict_chunks and (for a whole run) add_accuracy, in one process.
PredictSummary predict_store(const std::string& model_path, const std::string& store_path,
                             const std::string& out_path, const PredictOptions& options);

// Stable softmax of `classes` logits into `probabilities`, whose first maximum is at `argmax`
// (the class predicted from the logits): an earlier class whose probability rounds up to the
// maximum's is set one float below it.
void softmax_row(const float* logits, int64_t classes, uint8_t argmax, float* probabilities);

}  // namespace tandem
