// Adam in TensorFlow's form against values computed by hand (float64, three steps), and SGD.
#include "cpu/adam_cpu.h"
#include "test_support.h"

namespace tandem {
namespace {

TEST(AdamCpu, StepSizeHasTensorFlowBiasCorrection) {
  // lr 0.01, beta1 0.9, beta2 0.999 as float32 constants, as TensorFlow holds them: 1 - 0.999f
  // is 1.0000467e-3, so values differ from exact-decimal arithmetic at 5e-5 relative. The
  // expected values below are computed in float64 from the float32 constants.
  const kernels::AdamHyper h;
  EXPECT_NEAR(kernels::adam_step_size(h, 1), 0.0031622564789450486, 1e-10);
  EXPECT_NEAR(kernels::adam_step_size(h, 2), 0.0023531515286522166, 1e-10);
  EXPECT_NEAR(kernels::adam_step_size(h, 3), 0.0020200925063066882, 1e-10);
}

TEST(AdamCpu, ThreeStepsMatchHandComputedValues) {
  // w, m, v after each step for w0 = (0.5, -1.25) and gradients (0.1, -2), (-0.3, 0.5), (0.2, 0),
  // computed by hand in float64 (from the float32 constants, see above) as
  // lr_t = lr sqrt(1-b2^t)/(1-b1^t), m = b1 m + (1-b1) g, v = b2 v + (1-b2) g^2,
  // w -= lr_t m / (sqrt(v) + eps).
  const double expected_w[3][2] = {{0.49000003184639623, -1.2400000018046662},
                                   {0.4949419253224492, -1.2353053210446379},
                                   {0.4947540486051624, -1.2316763192747462}};
  const double expected_m[3][2] = {{0.010000002533197438, -0.20000004768371582},
                                   {-0.021000006303191498, -0.13000002622604256},
                                   {0.0010999998942016961, -0.11700002050399616}};
  const double expected_v[3][2] = {{9.999871551986674e-06, 0.003999948501586914},
                                   {9.998872024735006e-05, 0.004245945385932259},
                                   {0.00013988821902236452, 0.00424169949521119}};
  const float grads[3][2] = {{0.1f, -2.0f}, {-0.3f, 0.5f}, {0.2f, 0.0f}};
  std::vector<float> w = {0.5f, -1.25f}, m(2, 0.0f), v(2, 0.0f);
  const kernels::AdamHyper h;
  for (int t = 0; t < 3; ++t) {
    const float* g = grads[t];
    kernels::adam_update_cpu(w.data(), m.data(), v.data(), &g, 1, 0, 2,
                             kernels::adam_step_size(h, t + 1), h);
    // float32 arithmetic: relative 1e-6 of each value.
    EXPECT_TRUE(test::all_close(w.data(), expected_w[t], 2, 1e-7, 1e-6)) << "step " << t + 1;
    EXPECT_TRUE(test::all_close(m.data(), expected_m[t], 2, 1e-8, 1e-6)) << "step " << t + 1;
    EXPECT_TRUE(test::all_close(v.data(), expected_v[t], 2, 1e-10, 1e-5)) << "step " << t + 1;
  }
}

TEST(AdamCpu, SumsPartialGradients) {
  // Two partial buffers (two threads' shares of a batch) must act as their sum, over a range.
  const size_t n = 37;
  const auto g0 = test::random_floats(n, 1), g1 = test::random_floats(n, 2);
  std::vector<float> sum(n);
  for (size_t i = 0; i < n; ++i) sum[i] = g0[i] + g1[i];
  auto w_a = test::random_floats(n, 3), w_b = w_a;
  std::vector<float> m_a(n, 0.1f), v_a(n, 0.2f), m_b = m_a, v_b = v_a;
  const kernels::AdamHyper h;
  const float* parts[] = {g0.data(), g1.data()};
  const float* whole[] = {sum.data()};
  kernels::adam_update_cpu(w_a.data(), m_a.data(), v_a.data(), parts, 2, 3, 30, 0.01f, h);
  kernels::adam_update_cpu(w_b.data(), m_b.data(), v_b.data(), whole, 1, 3, 30, 0.01f, h);
  EXPECT_EQ(w_a, w_b);
  EXPECT_EQ(m_a, m_b);
  EXPECT_EQ(v_a, v_b);
  const auto w0 = test::random_floats(n, 3);
  EXPECT_EQ(w_a[0], w0[0]) << "outside [begin, end) nothing changes";
  EXPECT_EQ(w_a[36], w0[36]);
}

TEST(SgdCpu, StepsAgainstTheGradient) {
  std::vector<float> w = {1.0f, -2.0f, 3.0f};
  const std::vector<float> g0 = {0.5f, 0.25f, -1.0f}, g1 = {0.5f, 0.25f, 0.0f};
  const float* parts[] = {g0.data(), g1.data()};
  kernels::sgd_update_cpu(w.data(), parts, 2, 0, 3, 0.1f);
  EXPECT_FLOAT_EQ(w[0], 0.9f);
  EXPECT_FLOAT_EQ(w[1], -2.05f);
  EXPECT_FLOAT_EQ(w[2], 3.1f);
}

// The one-buffer path (vectorised) against the general one (the same gradient plus a zero
// buffer, summed element by element): the same update, on a range with ragged ends.
TEST(SgdCpu, OneBufferPathStepsAsTheGeneralSum) {
  const size_t n = 1037;
  const auto w0 = test::random_floats(n, 11);
  const auto g = test::random_floats(n, 12);
  const std::vector<float> zeros(n, 0.0f);
  std::vector<float> one = w0, general = w0;
  const float* single[] = {g.data()};
  const float* pair[] = {g.data(), zeros.data()};
  kernels::sgd_update_cpu(one.data(), single, 1, 3, 1030, 0.03f);
  kernels::sgd_update_cpu(general.data(), pair, 2, 3, 1030, 0.03f);
  EXPECT_TRUE(test::all_close(one, general, 1e-7, 1e-6));
  EXPECT_EQ(one[2], w0[2]) << "outside [begin, end) nothing changes";
  EXPECT_EQ(one[1030], w0[1030]);
  EXPECT_NE(one[500], w0[500]);
}

}  // namespace
}  // namespace tandem
