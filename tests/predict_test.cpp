// tandem predict's engine side (predictor.h): the written classes equal single-threaded
// prediction bit for bit across chunk boundaries and an edge chunk, the probabilities agree with
// them, the thread count and process shares change nothing, and an interrupted run resumes
// without rewriting or corrupting chunks. The backend choice: auto is the CPU without a device
// and `cuda` is refused there; with a device, the GPU's output agrees with the CPU's. The output
// group alone (tandem.dask.predict's): chunks written from elsewhere, its layout checked on reruns.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda_device.h"
#include "dataset_store.h"
#include "predictions_writers_lock.h"
#include "predictor.h"
#include "tandem/error.h"
#include "tandem/model.h"
#include "tandem/trainer.h"
#include "test_support.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr int64_t kTestRows = 1037;  // 200-row chunks: five full ones and an edge of 37
constexpr int64_t kChunkRows = 200;

// The tests that compare with single-threaded CPU prediction bit for bit run on the CPU backend
// whatever devices are present (auto would take a GPU).
PredictOptions cpu_options() {
  PredictOptions o;
  o.backend = BackendKind::Cpu;
  return o;
}

// A checkpoint of `model` alone (SGD: no optimizer state to carry).
void save_model(const std::string& path, const Model& model) {
  Checkpoint ckpt;
  ckpt.model = model;
  ckpt.optimizer.kind = OptimizerKind::Sgd;
  save_checkpoint(path, ckpt);
}

struct Fixture {
  test::TempDir dir;
  DataSplits splits;
  std::string store;
  std::string model;
  Model net = Model::initialized(ModelConfig::parse("40-16-4"), 11);

  explicit Fixture(zarr::Format format = zarr::Format::V3) {
    splits.train = test::separable_dataset(400, 40, 4, 1);
    splits.validation = test::separable_dataset(100, 40, 4, 2);
    splits.test = test::random_dataset(PixelType::UInt8, kTestRows, 40, 4, 3);
    splits.source = "synthetic";
    StoreWriteOptions w;
    w.chunk_rows = kChunkRows;
    w.format = format;
    store = dir.file("small.zarr");
    write_dataset_store(splits, store, w, json{{"source", "predict_test"}});
    model = dir.file("model.safetensors");
    save_model(model, net);
  }
};

// Every chunk file of an output array, by key, as bytes.
std::map<std::string, std::string> chunk_files(const std::string& array) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::recursive_directory_iterator(array)) {
    const std::string name = e.path().filename().string();
    if (!e.is_regular_file() || name == "zarr.json" || name[0] == '.') continue;
    files[fs::relative(e.path(), array).string()] = test::read_bytes(e.path().string());
  }
  return files;
}

std::vector<uint8_t> read_classes(const std::string& out, int64_t rows) {
  const zarr::Array a = zarr::Array::open(out + "/classes");
  std::vector<uint8_t> all, chunk(a.meta().chunk_bytes());
  for (int64_t c = 0; c < a.meta().grid()[0]; ++c) {
    EXPECT_TRUE(a.read_chunk({c}, chunk.data())) << "chunk " << c << " missing";
    all.insert(all.end(), chunk.begin(), chunk.end());
  }
  all.resize(size_t(rows));
  return all;
}

std::vector<float> read_probabilities(const std::string& out, int64_t rows, int64_t classes) {
  const zarr::Array a = zarr::Array::open(out + "/probabilities");
  std::vector<float> all, chunk(a.meta().chunk_bytes() / sizeof(float));
  for (int64_t c = 0; c < a.meta().grid()[0]; ++c) {
    EXPECT_TRUE(a.read_chunk({c, 0}, reinterpret_cast<uint8_t*>(chunk.data())));
    all.insert(all.end(), chunk.begin(), chunk.end());
  }
  all.resize(size_t(rows * classes));
  return all;
}

TEST(Predictor, ClassesEqualSingleThreadedPredictionBitExactly) {
  Fixture f;
  PredictOptions o = cpu_options();
  o.threads = 3;
  const std::string out = f.dir.file("pred.zarr");
  const PredictSummary s = predict_store(f.model, f.store, out, o);
  EXPECT_EQ(s.rows, kTestRows);
  EXPECT_EQ(s.chunks, 6);
  EXPECT_EQ(s.chunks_written, 6);
  EXPECT_EQ(s.chunks_skipped, 0);

  const std::vector<uint8_t> want = predict(f.net, f.splits.test.view(), 1);
  const std::vector<uint8_t> got = read_classes(out, kTestRows);
  ASSERT_EQ(got, want);
  ASSERT_GT(std::count(want.begin(), want.end(), want[0]), 0);
  ASSERT_LT(std::count(want.begin(), want.end(), want[0]), kTestRows) << "a constant model";

  const std::vector<float> p = read_probabilities(out, kTestRows, 4);
  for (int64_t r = 0; r < kTestRows; ++r) {
    const float* row = p.data() + r * 4;
    double sum = 0.0;
    for (int k = 0; k < 4; ++k) sum += row[k];
    ASSERT_NEAR(sum, 1.0, 1e-6) << "row " << r;
    ASSERT_EQ(std::max_element(row, row + 4) - row, got[size_t(r)]) << "row " << r;
  }

  const EvalResult eval = evaluate_model(f.net, f.splits.test.view(), 1);
  ASSERT_TRUE(s.has_labels);
  EXPECT_EQ(s.correct, eval.correct);
  EXPECT_DOUBLE_EQ(s.accuracy, eval.accuracy);
}

// Block by block (the Python package looks at Ctrl-C between two blocks): the same classes and
// probabilities as one call over every row, between_blocks called before each block but the
// first, and what it throws ends the prediction there.
TEST(Predictor, PredictionInBlocksStopsWhereItsCallbackThrows) {
  const Model model = Model::initialized(ModelConfig::parse("4-3-2"), 9);
  const Dataset data = test::separable_dataset(20000, 4, 2, 3);  // blocks of 8192: three
  const std::vector<uint8_t> whole = predict(model, data.view(), 2);
  std::vector<uint8_t> ids(whole.size(), 255);
  std::vector<float> probabilities(whole.size() * 2, -1.0f);
  int calls = 0;
  predict_in_blocks(model, data.view(), 2, ids.data(), probabilities.data(), [&] { ++calls; });
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(ids, whole);
  for (size_t r = 0; r < whole.size(); ++r)
    ASSERT_GE(probabilities[r * 2 + whole[r]], probabilities[r * 2 + 1 - whole[r]]) << r;
  std::fill(ids.begin(), ids.end(), 255);
  calls = 0;
  EXPECT_THROW(predict_in_blocks(model, data.view(), 2, ids.data(), nullptr,
                                 [&] {
                                   if (++calls == 2) throw Error("interrupted");
                                 }),
               Error);
  EXPECT_TRUE(std::equal(ids.begin(), ids.begin() + 2 * 8192, whole.begin()));
  EXPECT_TRUE(std::all_of(ids.begin() + 2 * 8192, ids.end(), [](uint8_t c) { return c == 255; }));
}

TEST(Predictor, ThreadCountAndProcessSharesChangeNoBit) {
  Fixture f;
  PredictOptions o = cpu_options();
  o.threads = 1;
  const std::string one = f.dir.file("one.zarr"), four = f.dir.file("four.zarr");
  predict_store(f.model, f.store, one, o);
  o.threads = 4;
  predict_store(f.model, f.store, four, o);
  EXPECT_EQ(chunk_files(one + "/classes"), chunk_files(four + "/classes"));
  EXPECT_EQ(chunk_files(one + "/probabilities"), chunk_files(four + "/probabilities"));
  // More threads than chunks: a worker per chunk, each predicting its chunk on several threads.
  const std::string eleven = f.dir.file("eleven.zarr");
  o.threads = 11;
  predict_store(f.model, f.store, eleven, o);
  EXPECT_EQ(chunk_files(one + "/classes"), chunk_files(eleven + "/classes"));
  EXPECT_EQ(chunk_files(one + "/probabilities"), chunk_files(eleven + "/probabilities"));

  // Three shares, as three processes would take them.
  const std::string shared = f.dir.file("shared.zarr");
  o.threads = 2;
  o.shares = 3;
  prepare_predictions(f.model, f.store, shared, o);
  int64_t written = 0;
  for (int i = 0; i < 3; ++i) {
    o.share = i;
    written += predict_chunks(f.model, f.store, shared, o).chunks_written;
  }
  EXPECT_EQ(written, 6);
  EXPECT_EQ(chunk_files(one + "/classes"), chunk_files(shared + "/classes"));
  EXPECT_EQ(chunk_files(one + "/probabilities"), chunk_files(shared + "/probabilities"));
  PredictSummary s;
  add_accuracy(f.store, shared, o, s);
  EXPECT_EQ(s.correct, evaluate_model(f.net, f.splits.test.view(), 1).correct);
}

TEST(Predictor, InterruptedRunResumesWithoutRewritingDoneChunks) {
  Fixture f(zarr::Format::V2);
  PredictOptions o = cpu_options();
  o.threads = 1;
  const std::string fresh = f.dir.file("fresh.zarr"), out = f.dir.file("resumed.zarr");
  predict_store(f.model, f.store, fresh, o);

  o.stop_after_chunks = 2;
  PredictSummary s = predict_store(f.model, f.store, out, o);
  EXPECT_EQ(s.chunks_written, 2);
  EXPECT_FALSE(s.has_labels) << "accuracy of an incomplete output";
  EXPECT_THROW(add_accuracy(f.store, out, o, s), InputError);
  // What a process killed mid-write leaves: a temporary file beside a chunk that is not there.
  const std::string stray = out + "/classes/3.tmp-12345-12345";
  test::write_bytes(stray, std::string("half a chunk"));
  std::map<std::string, fs::file_time_type> before;
  for (const auto& e : fs::recursive_directory_iterator(out))
    if (e.is_regular_file()) before[e.path().string()] = e.last_write_time();

  o.stop_after_chunks = -1;
  s = predict_store(f.model, f.store, out, o);
  EXPECT_EQ(s.chunks_skipped, 2);
  EXPECT_EQ(s.chunks_written, 4);
  EXPECT_EQ(s.rows_predicted, kTestRows - 2 * kChunkRows);
  EXPECT_FALSE(fs::exists(stray));
  ASSERT_GE(before.size(), 4u + 1u);  // two chunks of each array and the stray file at least
  for (const auto& [path, time] : before) {
    // (The group's own metadata gets a new output id on every run that takes the group over.)
    const std::string name = fs::path(path).filename().string();
    if (path == stray || (fs::path(path).parent_path() == fs::path(out) &&
                          (name == ".zattrs" || name == ".zgroup" || name == "zarr.json")))
      continue;
    ASSERT_TRUE(fs::exists(path)) << path;
    EXPECT_EQ(fs::last_write_time(path), time) << path << " was rewritten";
  }
  EXPECT_EQ(chunk_files(fresh + "/classes"), chunk_files(out + "/classes"));
  EXPECT_EQ(chunk_files(fresh + "/probabilities"), chunk_files(out + "/probabilities"));
  EXPECT_EQ(s.correct, evaluate_model(f.net, f.splits.test.view(), 1).correct);

  // A third run has nothing to do.
  s = predict_store(f.model, f.store, out, o);
  EXPECT_EQ(s.chunks_skipped, 6);
  EXPECT_EQ(s.chunks_written, 0);
}

TEST(Predictor, RefusesAnotherModelsOutputAndMismatchedInputs) {
  Fixture f;
  PredictOptions o = cpu_options();
  o.threads = 2;
  const std::string out = f.dir.file("pred.zarr");
  predict_store(f.model, f.store, out, o);

  const Model other = Model::initialized(ModelConfig::parse("40-16-4"), 12);
  const std::string other_path = f.dir.file("other.safetensors");
  save_model(other_path, other);
  EXPECT_THROW(predict_store(other_path, f.store, out, o), InputError);
  o.overwrite = true;
  const PredictSummary s = predict_store(other_path, f.store, out, o);
  EXPECT_EQ(s.chunks_written, 6);
  EXPECT_EQ(read_classes(out, kTestRows), predict(other, f.splits.test.view(), 1));

  const std::string wide_path = f.dir.file("wide.safetensors");
  save_model(wide_path, Model::initialized(ModelConfig::parse("41-8-4"), 1));
  EXPECT_THROW(predict_store(wide_path, f.store, f.dir.file("w.zarr"), o), InputError);
  EXPECT_THROW(predict_store(f.dir.file("missing.safetensors"), f.store, f.dir.file("m.zarr"), o),
               InputError);
  EXPECT_THROW(predict_store(f.model, f.dir.file("missing.zarr"), f.dir.file("m.zarr"), o),
               InputError);
  // Never overwrite something that is not a predictions group, even when asked to.
  EXPECT_THROW(predict_store(f.model, f.store, f.store, o), InputError);
  const std::string file = f.dir.file("a_file");
  test::write_bytes(file, std::string("keep me"));
  EXPECT_THROW(predict_store(f.model, f.store, file, o), InputError);
  EXPECT_EQ(test::read_bytes(file), "keep me");
}

// A store rewritten with other data but the same shape, chunking and dtype (its array metadata
// the same bytes) is another input: a rerun refuses the old predictions instead of resuming onto
// them, and with overwrite predicts the new rows.
TEST(Predictor, RefusesToResumeOntoAStoreRewrittenSince) {
  Fixture f;
  PredictOptions o = cpu_options();
  o.threads = 2;
  const std::string out = f.dir.file("pred.zarr");
  predict_store(f.model, f.store, out, o);
  EXPECT_EQ(predict_store(f.model, f.store, out, o).chunks_written, 0);  // unchanged: resumed

  DataSplits other = f.splits;
  other.test = test::random_dataset(PixelType::UInt8, kTestRows, 40, 4, 99);
  StoreWriteOptions w;
  w.chunk_rows = kChunkRows;
  w.overwrite = true;
  write_dataset_store(other, f.store, w, json{{"source", "predict_test"}});
  try {
    predict_store(f.model, f.store, out, o);
    ADD_FAILURE() << "resumed onto predictions of the old data";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("another model or input"), std::string::npos) << e.what();
  }
  o.overwrite = true;
  EXPECT_EQ(predict_store(f.model, f.store, out, o).chunks_written, 6);
  EXPECT_EQ(read_classes(out, kTestRows), predict(f.net, other.test.view(), 1));

  // One chunk file replaced in place (same name, same size) is a rewrite too.
  o.overwrite = false;
  const std::string chunk = f.store + "/test/images/c/1/0";
  ASSERT_TRUE(fs::is_regular_file(chunk));
  const std::string bytes = test::read_bytes(chunk);
  fs::remove(chunk);
  test::write_bytes(chunk, bytes);
  EXPECT_THROW(predict_store(f.model, f.store, out, o), InputError);
}

TEST(Predictor, ARowWithoutFinitePixelsOrLogitsIsRefusedNamingIt) {
  Fixture f;
  // A float32 store (a Dask-written one may hold anything) with a NaN pixel in row 437 (chunk 2)
  // and an infinite one in row 1000 (the edge chunk): such a row has no arg-max, and was written
  // as class 0 with NaN probabilities.
  DataSplits splits = f.splits;
  splits.test = test::random_dataset(PixelType::Float32, kTestRows, 40, 4, 3);
  float* px = reinterpret_cast<float*>(splits.test.pixel_data());
  px[437 * 40 + 7] = std::nanf("");
  px[1000 * 40] = -std::numeric_limits<float>::infinity();
  StoreWriteOptions w;
  w.chunk_rows = kChunkRows;
  w.pixel_type = PixelType::Float32;
  const std::string store = f.dir.file("float.zarr");
  write_dataset_store(splits, store, w, json{{"source", "predict_test"}});
  PredictOptions o = cpu_options();
  o.threads = 1;  // chunks in order: the first bad row met is 437
  const std::string out = f.dir.file("pred.zarr");
  const std::string why =
      test::error_of<InputError>([&] { predict_store(f.model, store, out, o); });
  EXPECT_TRUE(test::contains(why, store + " (test): row 437 holds a pixel that is not finite"))
      << why;
  // Nothing is written for the chunk that holds it; the chunks before it are.
  const std::map<std::string, std::string> written = chunk_files(out + "/classes");
  EXPECT_EQ(written.size(), 2u);
  EXPECT_EQ(written.count("c/2"), 0u);

  // The same rule for predict() on rows in memory (Model.predict in Python).
  DatasetView view = splits.test.view();
  view.rows = 437;
  EXPECT_EQ(predict(f.net, view, 1).size(), 437u);
  view.rows = 438;
  const std::string in_memory = test::error_of<InputError>([&] { predict(f.net, view, 1); });
  EXPECT_TRUE(test::contains(in_memory, "images: row 437 holds a pixel that is not finite"))
      << in_memory;
  view.pixels = reinterpret_cast<const uint8_t*>(px + 1000 * 40);
  view.rows = 1;
  EXPECT_THROW(predict(f.net, view, 1), InputError);
  // Finite pixels so large that the logits overflow: the logits are checked too.
  std::vector<float> huge(40 * 3, 1.0f);
  std::fill(huge.begin() + 80, huge.end(), 3e38f);
  view.pixels = huge.data();
  view.rows = 3;
  const std::string overflow = test::error_of<InputError>([&] { predict(f.net, view, 1); });
  EXPECT_TRUE(test::contains(overflow, "images: row 2 gives logits that are not finite"))
      << overflow;
}

TEST(Predictor, AutoIsTheCpuWithoutADeviceAndCudaIsRefusedThere) {
  if (kernels::cuda_device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present (auto takes it; OnTheGpuAgreesWithTheCpu covers it)";
  Fixture f;
  PredictOptions o;  // auto
  o.threads = 2;
  const std::string automatic = f.dir.file("auto.zarr"), cpu = f.dir.file("cpu.zarr");
  const PredictSummary s = predict_store(f.model, f.store, automatic, o);
  EXPECT_EQ(s.backend, "cpu");
  EXPECT_EQ(s.chunks_written, 6);
  o.backend = BackendKind::Cpu;
  EXPECT_EQ(predict_store(f.model, f.store, cpu, o).backend, "cpu");
  EXPECT_EQ(chunk_files(automatic + "/classes"), chunk_files(cpu + "/classes"));
  EXPECT_EQ(chunk_files(automatic + "/probabilities"), chunk_files(cpu + "/probabilities"));

  // Asked for by name, CUDA fails before any chunk is written, saying why.
  o.backend = BackendKind::Cuda;
  const std::string on_gpu = f.dir.file("cuda.zarr");
  try {
    predict_store(f.model, f.store, on_gpu, o);
    ADD_FAILURE() << "--backend cuda ran without a CUDA device";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA"), std::string::npos) << e.what();
  }
  if (fs::exists(on_gpu + "/classes")) {
    EXPECT_TRUE(chunk_files(on_gpu + "/classes").empty());
  }
  // Even with nothing left to predict (a finished output), `cuda` is refused.
  EXPECT_THROW(predict_chunks(f.model, f.store, cpu, o), InputError);
}

// The GPU check sets TANDEM_REQUIRE_CUDA=1: on a machine whose GPU the process cannot use, the
// device count throws, saying why, instead of counting none (the GPU tests then skipped, exit
// status 0, and the lent machine's time went on CPU figures).
TEST(CudaDevices, RequiredButNoneUsableIsAnErrorSayingWhy) {
  if (kernels::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is usable here";
  ASSERT_EQ(setenv("TANDEM_REQUIRE_CUDA", "1", 1), 0);
  const std::string why = test::error_of<Error>([] { kernels::cuda_device_count(); });
  ASSERT_EQ(setenv("TANDEM_REQUIRE_CUDA", "0", 1), 0);  // "0": not required
  EXPECT_EQ(kernels::cuda_device_count(), 0);
  ASSERT_EQ(unsetenv("TANDEM_REQUIRE_CUDA"), 0);
  EXPECT_TRUE(test::contains(why, "TANDEM_REQUIRE_CUDA is set, and no CUDA device is usable: "))
      << why;
  // ... and the reason itself: the runtime's error, or a build without CUDA.
  EXPECT_TRUE(test::contains(why, "cudaGetDeviceCount failed with CUDA error") ||
              test::contains(why, "the CUDA runtime sees none") ||
              test::contains(why, "has no CUDA"))
      << why;
}

TEST(Predictor, OnTheGpuAgreesWithTheCpu) {
  if (kernels::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Fixture f;
  PredictOptions o = cpu_options();
  o.threads = 3;
  const std::string cpu = f.dir.file("cpu.zarr"), gpu = f.dir.file("gpu.zarr");
  predict_store(f.model, f.store, cpu, o);
  // Three workers sharing the one CUDA backend; auto picks it too.
  for (BackendKind kind : {BackendKind::Cuda, BackendKind::Auto}) {
    SCOPED_TRACE(kind == BackendKind::Cuda ? "cuda" : "auto");
    o.backend = kind;
    o.overwrite = true;
    fs::remove_all(gpu);
    const PredictSummary s = predict_store(f.model, f.store, gpu, o);
    EXPECT_EQ(s.backend, "cuda");
    EXPECT_EQ(s.chunks_written, 6);
    const std::vector<uint8_t> want = read_classes(cpu, kTestRows);
    const std::vector<uint8_t> got = read_classes(gpu, kTestRows);
    // The logits differ by float32 summation order (~1e-6 here, see cuda_backend_test.cpp's
    // kLogitTol); a near-tie may flip on one row. Softmax moves by at most twice the largest
    // logit change, so the probabilities agree within 1e-5.
    int64_t mismatches = 0;
    for (size_t r = 0; r < got.size(); ++r) mismatches += got[r] != want[r];
    EXPECT_LE(mismatches, 1);
    const std::vector<float> p = read_probabilities(gpu, kTestRows, 4);
    EXPECT_TRUE(test::all_close(p, read_probabilities(cpu, kTestRows, 4), 1e-5, 0.0));
    for (int64_t r = 0; r < kTestRows; ++r) {
      const float* row = p.data() + r * 4;
      ASSERT_EQ(std::max_element(row, row + 4) - row, got[size_t(r)]) << "row " << r;
    }
  }
}

TEST(Predictor, SoftmaxKeepsThePredictedClassTheFirstMaximum) {
  // exp(-1e-10f) rounds to 1: without the fix class 0 would tie with the predicted class 1.
  const float logits[3] = {0.0f, 1e-10f, -3.0f};
  float p[3];
  softmax_row(logits, 3, 1, p);
  EXPECT_LT(p[0], p[1]);
  EXPECT_NEAR(double(p[0]) + p[1] + p[2], 1.0, 1e-6);
  const float big[2] = {1e30f, -1e30f};  // no overflow
  softmax_row(big, 2, 0, p);
  EXPECT_EQ(p[0], 1.0f);
  EXPECT_EQ(p[1], 0.0f);
}

// The predictions layout of the tests of a group alone: 5 rows in chunks of 2 (the last an
// edge), 3 classes.
PredictionsLayout five_rows_in_chunks_of_two() {
  PredictionsLayout layout;
  layout.rows = 5;
  layout.chunk_rows = 2;
  layout.classes = 3;
  layout.fingerprint = "model:a;input:b";
  return layout;
}
constexpr const char* kOverwriteHint = "pass overwrite=True to replace it";

// The group alone, for rows that come from elsewhere (tandem.dask.predict's dask blocks): written
// chunk by chunk, read back with an edge chunk, its layout checked on a rerun, replaced only when
// asked, and only when it is a predictions group.
TEST(Predictor, PredictionsOutputHoldsRowsFromElsewhere) {
  test::TempDir dir;
  const std::string out = dir.file("pred.zarr");
  const PredictionsLayout layout = five_rows_in_chunks_of_two();
  const std::string hint = kOverwriteHint;
  prepare_predictions_output(out, layout, json{{"created_by", "test"}}, false, hint);
  PredictionsOutput output(out, layout, hint);
  ASSERT_EQ(layout.chunks(), 3);
  EXPECT_EQ(layout.rows_in_chunk(2), 1);
  for (int64_t c = 0; c < 3; ++c) {
    EXPECT_FALSE(output.chunk_done(c));
    const uint8_t ids[2] = {uint8_t(c), uint8_t(c + 1)};
    std::vector<float> p(6);
    for (size_t i = 0; i < p.size(); ++i) p[i] = float(c * 10 + int64_t(i));
    output.write_chunk(c, ids, p.data());
    EXPECT_TRUE(output.chunk_done(c));
  }
  EXPECT_THROW(output.write_chunk(3, nullptr, nullptr), InputError);
  uint8_t ids[2];
  ASSERT_TRUE(output.read_classes(2, ids));
  EXPECT_EQ(ids[0], 2);
  const zarr::Array probabilities = zarr::Array::open(out + "/probabilities");
  EXPECT_EQ(probabilities.meta().shape, (std::vector<int64_t>{5, 3}));
  std::vector<float> p(6);
  ASSERT_TRUE(probabilities.read_chunk({1, 0}, reinterpret_cast<uint8_t*>(p.data())));
  EXPECT_EQ(p[5], 15.0f);
  EXPECT_EQ(zarr::Group::open(out).second.value("created_by", ""), "test");

  // A rerun with the same layout keeps the chunks and removes a killed write's temporary file.
  const std::string stray = out + "/classes/c/1.tmp-99-99";
  test::write_bytes(stray, std::string("xx"));
  prepare_predictions_output(out, layout, json::object(), false, hint);
  EXPECT_FALSE(fs::exists(stray));
  EXPECT_TRUE(PredictionsOutput(out, layout, hint).chunk_done(1));

  // Another chunking: refused naming the store, both layouts and the hint; then replaced. The
  // refused run leaves the group as it was: its id too, so its writers go on.
  PredictionsLayout other = layout;
  other.chunk_rows = 3;
  PredictionsOutput still_writing(out, layout, hint);
  const std::string id_before = zarr::Group::open(out).second.value("output_id", "");
  try {
    prepare_predictions_output(out, other, json::object(), false, hint);
    ADD_FAILURE() << "another chunking was accepted";
  } catch (const InputError& e) {
    const std::string m = e.what();
    for (const char* text : {"5 rows in chunks of 2", "5 rows in chunks of 3", "overwrite=True"})
      EXPECT_NE(m.find(text), std::string::npos) << m;
    EXPECT_EQ(m.rfind(out, 0), 0u) << m;
  }
  EXPECT_EQ(zarr::Group::open(out).second.value("output_id", ""), id_before);
  {
    const uint8_t two[2] = {0, 1};
    const std::vector<float> probabilities(6, 0.5f);
    EXPECT_NO_THROW(still_writing.write_chunk(0, two, probabilities.data()));
  }
  EXPECT_THROW(PredictionsOutput(out, other, hint), InputError);
  PredictionsLayout renamed = layout;
  renamed.fingerprint = "model:c;input:b";
  EXPECT_THROW(PredictionsOutput(out, renamed, hint), InputError);
  // Replaced by another run's overwrite while `output` (opened on the old group) still writes:
  // its chunk would pass for the new output's, so it is refused and nothing is written.
  prepare_predictions_output(out, other, json::object(), true, hint);
  EXPECT_FALSE(PredictionsOutput(out, other, hint).chunk_done(0));
  {
    const uint8_t ids[2] = {1, 1};
    const std::vector<float> p(6, 0.5f);
    try {
      output.write_chunk(0, ids, p.data());
      ADD_FAILURE() << "a chunk was written into the replacing output";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("taken over by another run"), std::string::npos)
          << e.what();
    }
    EXPECT_FALSE(PredictionsOutput(out, other, hint).chunk_done(0));
  }
  // A run stopped between making the group and its arrays: the rerun makes the missing array
  // and resumes (the group is this input's), keeping the other's chunks.
  {
    PredictionsOutput fresh(out, other, hint);
    const uint8_t ids[3] = {2, 2, 2};
    const std::vector<float> p(9, 0.25f);
    fresh.write_chunk(1, ids, p.data());
  }
  fs::remove_all(out + "/probabilities");
  prepare_predictions_output(out, other, json::object(), false, hint);
  EXPECT_FALSE(PredictionsOutput(out, other, hint).chunk_done(1));  // its probabilities are gone
  uint8_t kept[3];
  EXPECT_TRUE(PredictionsOutput(out, other, hint).read_classes(1, kept));
  fs::remove_all(out + "/classes");
  EXPECT_THROW(prepare_predictions_output(out, renamed, json::object(), false, hint), InputError);
  EXPECT_FALSE(fs::exists(out + "/classes"));  // not made for another input's group
  remove_predictions_output(out);
  EXPECT_FALSE(fs::exists(out));

  // Something else is never written to nor removed.
  const std::string data = dir.file("data");
  fs::create_directories(data);
  test::write_bytes(data + "/keep", std::string("keep me"));
  EXPECT_THROW(prepare_predictions_output(data, layout, json::object(), true, hint), InputError);
  EXPECT_THROW(remove_predictions_output(data), InputError);
  EXPECT_EQ(test::read_bytes(data + "/keep"), "keep me");
}

// A share of an earlier run, cut off from its client but still writing, and a run replacing the
// group (--overwrite) exclude each other. A chunk's check of the group and its writes hold the
// shared lock, so the replacement waits for the chunk in flight; a share stuck mid-chunk makes
// the replacement give up, saying so, with the old group untouched; a chunk begun during a
// replacement waits for it. Before the lock is waited for, the old group's output id is changed:
// its writers are turned away at their next chunk, and cannot keep the replacement out by taking
// turns with the shared lock.
TEST(Predictor, ReplacingAGroupWaitsForTheChunkAShareIsWriting) {
  test::TempDir dir;
  const std::string out = dir.file("pred.zarr");
  const PredictionsLayout layout = five_rows_in_chunks_of_two();
  prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
  PredictionsLayout other = layout;
  other.fingerprint = "model:c;input:b";
  using Kind = PredictionsWritersLock::Kind;
  {
    const PredictionsWritersLock share(out, Kind::Writing);  // a chunk in flight
    const std::string why = test::error_of<InputError>(
        [&] { PredictionsWritersLock replacing(out, Kind::Replacing, 200); });
    EXPECT_TRUE(test::contains(why, out + ": another run's share is still writing a chunk of it "
                                          "(200 ms waited"))
        << why;
    EXPECT_NO_THROW(PredictionsOutput(out, layout, kOverwriteHint)) << "the old group was touched";
  }

  const uint8_t ids[2] = {1, 2};
  const std::vector<float> p(6, 0.5f);
  PredictionsOutput old_writer(out, layout, kOverwriteHint);
  std::optional<PredictionsWritersLock> in_flight(std::in_place, out, Kind::Writing);
  std::atomic<bool> replaced{false};
  std::string replace_error;
  std::thread replacing([&] {
    try {
      prepare_predictions_output(out, other, json::object(), true, kOverwriteHint);
      replaced = true;
    } catch (const std::exception& e) {
      replace_error = e.what();
    }
  });
  // The old group's next chunk is turned away while the replacement still waits.
  EXPECT_TRUE(test::eventually(
      [&] {
        try {
          old_writer.write_chunk(1, ids, p.data());
          return false;
        } catch (const Error& e) {
          return test::contains(e.what(), "taken over by another run");
        }
      },
      10000, 1));
  EXPECT_FALSE(replaced.load()) << "replaced while a chunk was in flight";
  in_flight.reset();
  replacing.join();
  EXPECT_TRUE(replaced.load()) << replace_error;
  EXPECT_NO_THROW(PredictionsOutput(out, other, kOverwriteHint));

  // write_chunk takes the lock: while a replacement holds it, a chunk waits.
  PredictionsOutput output(out, other, kOverwriteHint);
  std::atomic<bool> written{false};
  std::thread writer;
  {
    const PredictionsWritersLock replacement(out, Kind::Replacing);
    writer = std::thread([&] {
      output.write_chunk(0, ids, p.data());
      written = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_FALSE(written.load()) << "a chunk was written during a replacement";
  }
  writer.join();
  EXPECT_TRUE(written.load());
  EXPECT_TRUE(output.chunk_done(0));
}

// A group whose output id was retired (by a replacement that then gave up: a chunk in flight for
// longer than it waited) takes no new writer, so shares and Dask tasks starting late cannot hold
// a replacement up; the next run that resumes it gives it a new live id (not the old one, which
// earlier writers still hold), keeping its chunks, with or without an overwrite.
TEST(Predictor, ARetiredGroupTakesNoNewWriterUntilARunResumesIt) {
  test::TempDir dir;
  const std::string out = dir.file("pred.zarr");
  const PredictionsLayout layout = five_rows_in_chunks_of_two();
  prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
  const uint8_t ids[2] = {1, 2};
  const std::vector<float> p(6, 0.5f);
  {
    // Any run taking the group over (here resuming it) turns the writers of earlier runs away
    // at their next chunk: the tasks of an interrupted Dask run, a share cut off from its client.
    PredictionsOutput earlier(out, layout, kOverwriteHint);
    prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
    const std::string why = test::error_of<Error>([&] { earlier.write_chunk(0, ids, p.data()); });
    EXPECT_TRUE(test::contains(why, "taken over by another run")) << why;
  }
  PredictionsOutput early(out, layout, kOverwriteHint);
  early.write_chunk(0, ids, p.data());
  auto [format, attributes] = zarr::Group::open(out);
  attributes["output_id"] = "retired-by-a-replacement-that-gave-up";
  zarr::Group::create(out, format, attributes);

  std::string why =
      test::error_of<InputError>([&] { PredictionsOutput(out, layout, kOverwriteHint); });
  EXPECT_TRUE(test::contains(why, out + ": being replaced by another run")) << why;
  why = test::error_of<Error>([&] { early.write_chunk(1, ids, p.data()); });
  EXPECT_TRUE(test::contains(why, "taken over by another run")) << why;

  prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
  why = test::error_of<Error>([&] { early.write_chunk(1, ids, p.data()); });
  EXPECT_TRUE(test::contains(why, "taken over by another run")) << why << " (a revived old id?)";
  PredictionsOutput resumed(out, layout, kOverwriteHint);
  EXPECT_TRUE(resumed.chunk_done(0));
  resumed.write_chunk(1, ids, p.data());
  EXPECT_TRUE(resumed.chunk_done(1));

  // A writer opened with its run's id (tandem predict's shares, tandem.dask.predict's tasks)
  // refuses the group once another run has taken it over, though the group's new id is live:
  // a late-starting writer of the earlier run writes nothing into the later run's group.
  const std::string first_run =
      prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
  EXPECT_NO_THROW(PredictionsOutput(out, layout, kOverwriteHint, first_run));
  const std::string second_run =
      prepare_predictions_output(out, layout, json::object(), false, kOverwriteHint);
  EXPECT_NE(first_run, second_run);
  EXPECT_EQ(zarr::Group::open(out).second.value("output_id", ""), second_run);
  why = test::error_of<Error>(
      [&] { PredictionsOutput(out, layout, kOverwriteHint, first_run); });
  EXPECT_TRUE(test::contains(why, out + ": taken over by another run")) << why;
  EXPECT_NO_THROW(PredictionsOutput(out, layout, kOverwriteHint, second_run));
  // The same with --overwrite (a script that always passes it): the group still matches, so
  // it is resumed, not replaced.
  attributes["output_id"] = "retired-again";
  zarr::Group::create(out, format, attributes);
  prepare_predictions_output(out, layout, json::object(), true, kOverwriteHint);
  EXPECT_TRUE(PredictionsOutput(out, layout, kOverwriteHint).chunk_done(1));
}

// With input_digests (tandem.dask.predict's groups), each chunk's input digest is written
// before its other files and read back; a chunk without its digest is not done, and one cannot
// be written without it. A group made without the digests' array is refused for such a layout.
TEST(Predictor, PredictionsOutputRecordsEachChunksInputDigest) {
  test::TempDir dir;
  const std::string out = dir.file("pred.zarr");
  PredictionsLayout layout = five_rows_in_chunks_of_two();
  layout.input_digests = true;
  const std::string hint = kOverwriteHint;
  prepare_predictions_output(out, layout, json::object(), false, hint);
  const PredictionsOutput output(out, layout, hint);
  uint8_t digest[PredictionsLayout::kDigestBytes];
  EXPECT_FALSE(output.read_input_digest(1, digest));
  const uint8_t ids[2] = {1, 2};
  const std::vector<float> p(6, 0.5f);
  EXPECT_THROW(output.write_chunk(1, ids, p.data()), Error);
  EXPECT_FALSE(output.chunk_done(1));
  uint8_t written[PredictionsLayout::kDigestBytes];
  for (size_t i = 0; i < sizeof written; ++i) written[i] = uint8_t(7 * i + 1);
  output.write_chunk(1, ids, p.data(), written);
  EXPECT_TRUE(output.chunk_done(1));
  ASSERT_TRUE(output.read_input_digest(1, digest));
  EXPECT_TRUE(std::equal(digest, digest + sizeof digest, written));
  EXPECT_FALSE(output.read_input_digest(0, digest));
  EXPECT_FALSE(output.read_input_digest(3, digest));  // past the last chunk
  const zarr::Array digests = zarr::Array::open(out + "/input_sha256");
  EXPECT_EQ(digests.meta().shape, (std::vector<int64_t>{3, 32}));
  fs::remove(out + "/input_sha256/c/1/0");
  EXPECT_FALSE(output.chunk_done(1));

  // Two runs writing chunk 2 at once from different rows: whenever the three files end up
  // mixed (one run's digest, the other's predictions), at least one of the runs said so.
  int mixed_rounds_said = 0;
  for (int round = 0; round < 200; ++round) {
    std::atomic<int> said{0};
    auto run = [&](uint8_t mark) {
      const PredictionsOutput writer(out, layout, hint);
      const uint8_t run_ids[2] = {mark, mark};
      const std::vector<float> run_p(6, float(mark));
      uint8_t run_digest[PredictionsLayout::kDigestBytes];
      std::fill(std::begin(run_digest), std::end(run_digest), mark);
      try {
        writer.write_chunk(2, run_ids, run_p.data(), run_digest);
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("written meanwhile by another run"),
                  std::string::npos) << e.what();
        ++said;
      }
    };
    std::thread a(run, uint8_t(1)), b(run, uint8_t(2));
    a.join();
    b.join();
    uint8_t ids_now[2];
    std::vector<float> p_now(6);
    ASSERT_TRUE(output.read_classes(2, ids_now));
    ASSERT_TRUE(output.read_input_digest(2, digest));
    ASSERT_TRUE(zarr::Array::open(out + "/probabilities")
                    .read_chunk({2, 0}, reinterpret_cast<uint8_t*>(p_now.data())));
    const bool consistent = ids_now[0] == digest[0] && p_now[0] == float(digest[0]);
    EXPECT_TRUE(consistent || said > 0) << "round " << round << ": a mixed chunk went unsaid";
    if (!consistent) ++mixed_rounds_said;
  }
  std::printf("mixed chunks (each said by a run): %d of 200 rounds\n", mixed_rounds_said);

  const std::string plain = dir.file("plain.zarr");
  PredictionsLayout without = layout;
  without.input_digests = false;
  prepare_predictions_output(plain, without, json::object(), false, hint);
  EXPECT_FALSE(fs::exists(plain + "/input_sha256"));
  EXPECT_THROW(PredictionsOutput(plain, layout, hint), InputError);
}

// A predictions group whose attributes hold another type where text belongs (edited by hand, or
// written by another tool): refused naming the store and the attribute, where nlohmann's own
// conversion threw an exception naming neither. A rerun's prepare reads them tolerantly.
TEST(Predictor, AttributesOfAnotherTypeAreRefusedNamingTheStoreAndTheAttribute) {
  test::TempDir dir;
  const std::string out = dir.file("pred.zarr");
  const PredictionsLayout layout = five_rows_in_chunks_of_two();
  const std::string hint = kOverwriteHint;
  prepare_predictions_output(out, layout, json::object(), false, hint);
  for (const char* key : {"fingerprint", "output_id"}) {
    SCOPED_TRACE(key);
    auto [format, attributes] = zarr::Group::open(out);
    const json kept = attributes[key];
    attributes[key] = 7;
    zarr::Group::create(out, format, attributes);
    std::string why =
        test::error_of<InputError>([&] { PredictionsOutput(out, layout, hint); });
    EXPECT_TRUE(test::contains(why, out + "'s attributes: '" + key + "' is 7, expected text"))
        << why;
    // A rerun's prepare reads them tolerantly, then refuses the group as its open does.
    why = test::error_of<InputError>(
        [&] { prepare_predictions_output(out, layout, json::object(), false, hint); });
    EXPECT_TRUE(test::contains(why, "'" + std::string(key) + "' is 7")) << why;
    attributes[key] = kept;
    zarr::Group::create(out, format, attributes);
    EXPECT_NO_THROW(PredictionsOutput(out, layout, hint));
  }
}

}  // namespace
}  // namespace tandem
