// The CPU backend's own contracts: bit-identical results for the same thread count, agreement
// across thread counts and block sizes, uint8 data equal to its float form, shuffled row lists.
#include <cstring>

#include "cpu_backend.h"
#include "tandem/error.h"
#include "parameter_runs_check.h"
#include "test_support.h"

namespace tandem {
namespace {

ModelConfig small_model() { return ModelConfig::parse("64-20-10"); }

std::vector<float> train_steps(int threads, int64_t block, const Dataset& data, int steps) {
  CpuBackend backend(small_model(), OptimizerConfig{}, threads, block);
  backend.set_parameters(Model::initialized(small_model(), 3));
  for (int s = 0; s < steps; ++s) {
    const int64_t begin = (s * 50) % (data.rows() - 50);
    backend.compute_gradients(data.view().slice(begin, begin + 50), nullptr, 50);
    backend.apply_gradients();
  }
  Model out(small_model());
  backend.get_parameters(out);
  std::vector<float> flat;
  for (const auto& t : out.parameters()) flat.insert(flat.end(), t.values.begin(), t.values.end());
  return flat;
}

TEST(CpuBackend, SameThreadCountGivesIdenticalBits) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 400, 64, 10, 5);
  for (int threads : {1, 2, 3}) EXPECT_EQ(train_steps(threads, 16, data, 12), train_steps(threads, 16, data, 12));
}

TEST(CpuBackend, ThreadCountsAndBlockSizesAgree) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 400, 64, 10, 6);
  const auto one = train_steps(1, 128, data, 12);
  // Different partial sums only: float32 rounding, amplified a little by Adam over 12 steps.
  EXPECT_TRUE(test::all_close(train_steps(2, 7, data, 12), one, 1e-5, 1e-3));
  EXPECT_TRUE(test::all_close(train_steps(3, 1, data, 12), one, 1e-5, 1e-3));
}

TEST(CpuBackend, Uint8DataEqualsItsScaledFloatForm) {
  const Dataset bytes = test::random_dataset(PixelType::UInt8, 97, 64, 10, 8);
  Dataset floats(PixelType::Float32, 97, 64, 10);
  auto* px = reinterpret_cast<float*>(floats.pixel_data());
  for (int64_t i = 0; i < 97 * 64; ++i) px[i] = float(bytes.pixel_data()[i]) * (1.0f / 255.0f);
  std::copy(bytes.label_data(), bytes.label_data() + 97, floats.label_data());
  CpuBackend backend(small_model(), OptimizerConfig{}, 2);
  backend.set_parameters(Model::initialized(small_model(), 1));
  const BatchStats a = backend.evaluate(bytes.view());
  const BatchStats b = backend.evaluate(floats.view());
  EXPECT_EQ(a.loss_sum, b.loss_sum);
  EXPECT_EQ(a.correct, b.correct);
  EXPECT_EQ(a.samples, 97);
}

TEST(CpuBackend, RowListSelectsTheSameRowsAsACopy) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 50, 64, 10, 9);
  const std::vector<int32_t> rows = {49, 3, 3, 17, 0, 28, 41};
  Dataset picked(PixelType::UInt8, 7, 64, 10);
  for (size_t i = 0; i < rows.size(); ++i) {
    std::copy(data.pixel_data() + rows[i] * 64, data.pixel_data() + rows[i] * 64 + 64,
              picked.pixel_data() + i * 64);
    picked.label_data()[i] = data.label_data()[rows[i]];
  }
  CpuBackend a(small_model(), OptimizerConfig{}, 1), b(small_model(), OptimizerConfig{}, 1);
  const Model init = Model::initialized(small_model(), 4);
  a.set_parameters(init);
  b.set_parameters(init);
  const BatchStats sa = a.compute_gradients(data.view(), rows.data(), 7);
  const BatchStats sb = b.compute_gradients(picked.view(), nullptr, 7);
  EXPECT_EQ(sa.loss_sum, sb.loss_sum);
  std::vector<NamedTensor> ga, gb;
  a.get_gradients(ga);
  b.get_gradients(gb);
  ASSERT_EQ(ga.size(), 2 * (small_model().layers.size() - 1));  // a weight and a bias a layer
  ASSERT_EQ(gb.size(), ga.size());
  for (size_t t = 0; t < ga.size(); ++t) EXPECT_EQ(ga[t].values, gb[t].values) << ga[t].name;
}

TEST(CpuBackend, PredictAgreesWithEvaluateAccuracy) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 333, 64, 10, 10);
  CpuBackend backend(small_model(), OptimizerConfig{}, 2, 16);
  backend.set_parameters(Model::initialized(small_model(), 2));
  std::vector<uint8_t> predicted(333, 255);
  backend.predict(data.view(), predicted.data());
  int64_t correct = 0;
  for (int64_t r = 0; r < 333; ++r) {
    ASSERT_LT(predicted[r], 10) << "row " << r << " not written";
    correct += predicted[r] == data.label_data()[r];
  }
  EXPECT_EQ(correct, backend.evaluate(data.view()).correct);
  DatasetView unlabelled = data.view();
  unlabelled.labels = nullptr;
  std::vector<uint8_t> again(333, 255);
  backend.predict(unlabelled, again.data());
  EXPECT_EQ(again, predicted);
  EXPECT_THROW(backend.evaluate(unlabelled), InputError);
  // Prediction reads no labels: labels that name no class of the model (200, in a view built by
  // hand) predict as none do. The loss indexed the logits by them, past the block's buffer
  // (AddressSanitizer: a heap-buffer-overflow in softmax_xent_cpu).
  std::vector<uint8_t> wild(333, 200);
  DatasetView wild_labels = data.view();
  wild_labels.labels = wild.data();
  wild_labels.num_classes = 0;
  std::vector<uint8_t> third(333, 255);
  backend.predict(wild_labels, third.data());
  EXPECT_EQ(third, predicted);
}

// A row's logits must not depend on how many threads share the rows: tandem predict splits a
// chunk across its threads only when it has fewer chunks than threads (a rerun of one lost
// chunk), and its output must be the same bits as the first run's. With OpenBLAS's AVX2 kernels
// a row's sgemm result depends on its place in the block (the block's row count and the row's
// offset in it), so the threads' shares start on whole blocks: every row is computed in the same
// block at the same offset whatever the thread count. The default model's shapes, 1,000 rows (the
// last block short).
TEST(CpuBackend, LogitsOfARowDoNotDependOnTheThreadCount) {
  const ModelConfig model = ModelConfig::parse("784-100-10");
  const int64_t rows = 1000;
  const Dataset data = test::random_dataset(PixelType::UInt8, rows, 784, 10, 12);
  auto logits_with = [&](int threads) {
    CpuBackend backend(model, OptimizerConfig{}, threads);
    backend.set_parameters(Model::initialized(model, 5));
    std::vector<uint8_t> classes(rows);
    std::vector<float> logits(rows * 10);
    backend.predict_logits(data.view(), classes.data(), logits.data());
    return logits;
  };
  const std::vector<float> one = logits_with(1);
  for (int threads : {2, 3, 4}) {
    const std::vector<float> many = logits_with(threads);
    int64_t first_different = -1;
    for (int64_t i = 0; i < rows * 10 && first_different < 0; ++i)
      if (std::memcmp(&one[i], &many[i], sizeof(float)) != 0) first_different = i / 10;
    EXPECT_EQ(first_different, -1) << threads << " threads: row " << first_different
                                   << " differs from one thread's";
  }
}

TEST(CpuBackend, RefusesDataOfTheWrongWidth) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 10, 63, 10, 11);
  CpuBackend backend(small_model(), OptimizerConfig{}, 1);
  try {
    backend.evaluate(data.view());
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("63 features"), std::string::npos) << e.what();
  }
}

// A listed row outside the data was read past its end (undefined here; on a GPU an illegal
// address that ends the context): refused, naming it.
TEST(CpuBackend, RefusesRowsOutsideTheData) {
  const Dataset data = test::random_dataset(PixelType::UInt8, 10, 64, 10, 12);
  CpuBackend backend(small_model(), OptimizerConfig{}, 1);
  for (const int32_t bad : {-1, 10}) {
    const std::vector<int32_t> rows{0, 3, bad, 9};
    try {
      backend.compute_gradients(data.view(), rows.data(), 4);
      ADD_FAILURE() << "row " << bad << " was taken";
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find("row " + std::to_string(bad) + " (entry 2"),
                std::string::npos)
          << e.what();
    }
  }
}

// A label past the model's outputs was used as an index: the loss kernel read and wrote past the
// row's logits and gradient (valgrind: invalid reads and writes), and training went on.
TEST(CpuBackend, RefusesALabelPastTheModelsOutputs) {
  Dataset data = test::random_dataset(PixelType::UInt8, 10, 64, 10, 13);
  data.label_data()[6] = 250;
  CpuBackend backend(small_model(), OptimizerConfig{}, 1);
  const std::string expected = "row 6 has label 250; expected a class in [0, 10)";
  const std::vector<int32_t> with_row_6{0, 6}, without{0, 5};
  EXPECT_TRUE(test::contains(test::error_of<InputError>([&] { backend.evaluate(data.view()); }),
                             expected));
  EXPECT_TRUE(test::contains(
      test::error_of<InputError>([&] { backend.compute_gradients(data.view(), nullptr, 10); }),
      expected));
  EXPECT_TRUE(test::contains(test::error_of<InputError>([&] {
                               backend.compute_gradients(data.view(), with_row_6.data(), 2);
                             }),
                             expected));
  // Only the batch's rows are looked at: batches without row 6 are taken.
  EXPECT_NO_THROW(backend.compute_gradients(data.view(), without.data(), 2));
  EXPECT_NO_THROW(backend.compute_gradients(data.view(), nullptr, 6));
}

// A refused optimizer state changes nothing: the first moments were copied in before the second
// moments' shapes were looked at (the CUDA twin stages both first).
TEST(CpuBackend, ARefusedOptimizerStateLeavesTheMomentsAsTheyWere) {
  CpuBackend backend(small_model(), OptimizerConfig{}, 1);
  OptimizerState before;
  const Model model = Model::initialized(small_model(), 7);
  for (const auto& p : model.parameters()) {
    before.m.push_back({p.name, p.shape, test::random_floats(p.values.size(), 1)});
    before.v.push_back({p.name, p.shape, test::random_floats(p.values.size(), 2, 0.0f, 1.0f)});
  }
  backend.set_optimizer_state(before, 3);
  OptimizerState bad = before;
  for (auto& m : bad.m) std::fill(m.values.begin(), m.values.end(), 9.0f);
  bad.v.back().shape.push_back(1);  // a second moment of another shape
  EXPECT_THROW(backend.set_optimizer_state(bad, 4), InputError);
  OptimizerState after;
  backend.get_optimizer_state(after);
  for (size_t t = 0; t < before.m.size(); ++t) {
    EXPECT_EQ(after.m[t].values, before.m[t].values) << t;
    EXPECT_EQ(after.v[t].values, before.v[t].values) << t;
  }
  EXPECT_EQ(backend.step(), 3);
}

// Parameters in runs (a reply read in place) install like whole tensors, and a run that does not
// fit the backend's layout is refused before anything is copied.
TEST(CpuBackend, ParameterRunsInstallLikeTensorsAndBadRunsChangeNothing) {
  CpuBackend backend(small_model(), OptimizerConfig{}, 1);
  test::check_parameter_runs(backend, small_model());
}

}  // namespace
}  // namespace tandem
