// The CPU kernels against straightforward float64 loops, on random inputs at awkward sizes.
#include <cmath>

#include "cpu/adam_cpu.h"
#include "cpu/convert_cpu.h"
#include "cpu/dense_cpu.h"
#include "cpu/softmax_xent_cpu.h"
#include "test_support.h"

namespace tandem {
namespace {

using test::all_close;
using test::random_floats;

struct Shape {
  int64_t rows, in, out;
};
const Shape kShapes[] = {{1, 784, 100}, {7, 100, 10}, {33, 13, 1}, {129, 333, 17}};

// sgemm sums in float32 in its own order; against float64 sums of |terms| ~ in * 1 the error
// stays near in * 2^-24 * magnitude, so 1e-4 absolute plus 1e-4 relative is ample and still far
// below any indexing mistake (which shows as O(1) errors).
constexpr double kGemmAtol = 1e-4, kGemmRtol = 1e-4;

TEST(DenseCpu, ForwardMatchesFloat64Loops) {
  uint32_t seed = 11;
  for (const Shape s : kShapes)
    for (bool relu : {false, true}) {
      const auto x = random_floats(s.rows * s.in, seed++);
      const auto w = random_floats(s.in * s.out, seed++);
      const auto b = random_floats(s.out, seed++);
      std::vector<float> y(s.rows * s.out, NAN);  // poisoned: every element must be written
      kernels::dense_forward_cpu(x.data(), w.data(), b.data(), y.data(), s.rows, s.in, s.out, relu);
      std::vector<double> ref(y.size());
      for (int64_t r = 0; r < s.rows; ++r)
        for (int64_t j = 0; j < s.out; ++j) {
          double acc = b[j];
          for (int64_t k = 0; k < s.in; ++k) acc += double(x[r * s.in + k]) * w[k * s.out + j];
          ref[r * s.out + j] = relu ? std::max(acc, 0.0) : acc;
        }
      EXPECT_TRUE(all_close(y, ref, kGemmAtol, kGemmRtol))
          << "rows " << s.rows << " in " << s.in << " out " << s.out << " relu " << relu;
    }
}

TEST(DenseCpu, BackwardParamsAccumulateAndOverwrite) {
  uint32_t seed = 101;
  for (const Shape s : kShapes) {
    const auto x = random_floats(s.rows * s.in, seed++);
    const auto dy = random_floats(s.rows * s.out, seed++);
    const auto dw0 = random_floats(s.in * s.out, seed++);
    const auto db0 = random_floats(s.out, seed++);
    for (bool accumulate : {false, true}) {
      std::vector<float> dw = dw0, db = db0;
      kernels::dense_backward_params_cpu(x.data(), dy.data(), dw.data(), db.data(), s.rows, s.in,
                                         s.out, accumulate);
      std::vector<double> ref_w(dw.size()), ref_b(db.size());
      for (int64_t k = 0; k < s.in; ++k)
        for (int64_t j = 0; j < s.out; ++j) {
          double acc = accumulate ? dw0[k * s.out + j] : 0.0;
          for (int64_t r = 0; r < s.rows; ++r) acc += double(x[r * s.in + k]) * dy[r * s.out + j];
          ref_w[k * s.out + j] = acc;
        }
      for (int64_t j = 0; j < s.out; ++j) {
        double acc = accumulate ? db0[j] : 0.0;
        for (int64_t r = 0; r < s.rows; ++r) acc += dy[r * s.out + j];
        ref_b[j] = acc;
      }
      EXPECT_TRUE(all_close(dw, ref_w, kGemmAtol, kGemmRtol)) << "rows " << s.rows;
      EXPECT_TRUE(all_close(db, ref_b, kGemmAtol, kGemmRtol)) << "rows " << s.rows;
    }
  }
}

TEST(DenseCpu, BackwardInputThroughRelu) {
  uint32_t seed = 201;
  for (const Shape s : kShapes) {
    const auto dy = random_floats(s.rows * s.out, seed++);
    const auto w = random_floats(s.in * s.out, seed++);
    auto x = random_floats(s.rows * s.in, seed++);
    for (auto& v : x) v = std::max(v, 0.0f);  // a ReLU output: about half exact zeros
    std::vector<float> dx(s.rows * s.in, NAN);
    kernels::dense_backward_input_relu_cpu(dy.data(), w.data(), x.data(), dx.data(), s.rows, s.in,
                                           s.out);
    std::vector<double> ref(dx.size());
    for (int64_t r = 0; r < s.rows; ++r)
      for (int64_t k = 0; k < s.in; ++k) {
        double acc = 0.0;
        for (int64_t j = 0; j < s.out; ++j) acc += double(dy[r * s.out + j]) * w[k * s.out + j];
        ref[r * s.in + k] = x[r * s.in + k] > 0.0f ? acc : 0.0;
      }
    EXPECT_TRUE(all_close(dx, ref, kGemmAtol, kGemmRtol)) << "rows " << s.rows;
  }
}

// Float64 reference of the seed's loss: -log(clip(softmax(z)[label], 1e-10, 1)).
double reference_row_loss(const float* z, int64_t classes, int label, std::vector<double>* grad) {
  double zmax = z[0];
  for (int64_t j = 1; j < classes; ++j) zmax = std::max<double>(zmax, z[j]);
  double sum = 0.0;
  for (int64_t j = 0; j < classes; ++j) sum += std::exp(z[j] - zmax);
  const double p_label = std::exp(z[label] - zmax) / sum;
  const bool clipped = p_label < 1e-10;
  if (grad) {
    grad->assign(classes, 0.0);
    if (!clipped)
      for (int64_t j = 0; j < classes; ++j)
        (*grad)[j] = std::exp(z[j] - zmax) / sum - (j == label ? 1.0 : 0.0);
  }
  return -std::log(std::max(p_label, 1e-10));
}

TEST(SoftmaxXentCpu, LossGradientAndCountMatchFloat64) {
  uint32_t seed = 301;
  for (int64_t rows : {1, 7, 1001})
    for (int64_t classes : {2, 10, 37}) {
      const auto z = random_floats(rows * classes, seed++, -8.0f, 8.0f);
      std::vector<uint8_t> labels(rows);
      for (int64_t r = 0; r < rows; ++r) labels[r] = static_cast<uint8_t>((r * 7 + 3) % classes);
      std::vector<float> dz(z.size(), NAN);
      kernels::SoftmaxXentStats stats;
      kernels::softmax_xent_cpu(z.data(), labels.data(), dz.data(), rows, classes, stats);
      double loss = 0.0;
      int64_t correct = 0;
      std::vector<double> ref_dz;
      std::vector<double> row_grad;
      for (int64_t r = 0; r < rows; ++r) {
        loss += reference_row_loss(z.data() + r * classes, classes, labels[r], &row_grad);
        ref_dz.insert(ref_dz.end(), row_grad.begin(), row_grad.end());
        int64_t best = 0;
        for (int64_t j = 1; j < classes; ++j)
          if (z[r * classes + j] > z[r * classes + best]) best = j;
        correct += best == labels[r];
      }
      // float32 exp/log per row: relative 1e-5 of the sum; gradients are probabilities (|g| <= 1).
      EXPECT_NEAR(stats.loss_sum, loss, 1e-5 * std::fabs(loss) + 1e-5) << rows << "x" << classes;
      EXPECT_EQ(stats.correct, correct);
      EXPECT_TRUE(all_close(dz, ref_dz, 1e-6, 1e-5)) << rows << "x" << classes;
    }
}

TEST(SoftmaxXentCpu, ExtremeLogitsAreStableAndClipped) {
  // Row 0: the label's logit is 200 below the best: p = e^-200 underflows; the clip gives
  // -log(1e-10) and a zero gradient (clip_by_value passes no gradient where it bites).
  // Row 1: huge logits in float range would overflow a naive exp; stable form gives ~0 loss.
  // Row 2: the label just above the clip threshold (log p = -23) keeps its gradient.
  const int64_t classes = 3;
  std::vector<float> z = {200.0f, 0.0f, 0.0f, 1e30f, -1e30f, 0.0f, 23.0f, 0.0f, 0.0f};
  std::vector<uint8_t> labels = {1, 0, 1};
  std::vector<float> dz(z.size(), NAN);
  kernels::SoftmaxXentStats stats;
  kernels::softmax_xent_cpu(z.data(), labels.data(), dz.data(), 3, classes, stats);
  const double clip_loss = -std::log(1e-10);
  const double row2 = reference_row_loss(z.data() + 6, classes, 1, nullptr);
  EXPECT_NEAR(stats.loss_sum, clip_loss + 0.0 + row2, 1e-4);
  EXPECT_LT(row2, clip_loss);
  for (int j = 0; j < 3; ++j) EXPECT_EQ(dz[j], 0.0f) << "clipped row must have zero gradient";
  EXPECT_NEAR(dz[3], 0.0f, 1e-7);
  EXPECT_NEAR(dz[4], 0.0f, 1e-7);
  EXPECT_NEAR(dz[5], 0.0f, 1e-7);
  EXPECT_NEAR(dz[7], std::exp(-23.0) / (1 + 2 * std::exp(-23.0)) - 1.0, 1e-6);
  EXPECT_GT(dz[6], 0.99f);
  EXPECT_EQ(stats.correct, 1);  // row 1 (label 0 is the arg-max); rows 0 and 2 are wrong
}

TEST(SoftmaxXentCpu, ArgmaxTakesTheFirstMaximum) {
  std::vector<float> z = {1, 3, 3, 0, -1, -1, -2, -5};
  std::vector<uint8_t> out(2, 99);
  kernels::argmax_rows_cpu(z.data(), out.data(), 2, 4);
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 0);
}

TEST(ConvertCpu, GathersAndScalesRows) {
  const int64_t features = 13;
  std::vector<uint8_t> src(5 * features);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 5);
  const std::vector<int32_t> rows = {4, 0, 2};
  std::vector<float> dst(3 * features, NAN);
  kernels::gather_rows_u8_cpu(src.data(), features, rows.data(), 3, dst.data());
  for (int i = 0; i < 3; ++i)
    for (int64_t f = 0; f < features; ++f)
      ASSERT_EQ(dst[i * features + f], float(src[rows[i] * features + f]) * (1.0f / 255.0f));
  std::vector<float> srcf = random_floats(5 * features, 7);
  kernels::gather_rows_f32_cpu(srcf.data(), features, nullptr, 2, dst.data());
  for (int64_t i = 0; i < 2 * features; ++i) ASSERT_EQ(dst[i], srcf[i]);
  std::vector<uint8_t> labels = {9, 8, 7, 6, 5}, out(3);
  kernels::gather_labels_cpu(labels.data(), rows.data(), 3, out.data());
  EXPECT_EQ(out, (std::vector<uint8_t>{5, 9, 7}));
}

}  // namespace
}  // namespace tandem
