// Whole-model gradient checks. A float64 reference of the model (plain loops) is checked against
// central finite differences of its own loss, then the float32 CPU backend's gradients are checked
// against the reference: the math is right, and the fast path computes that math.
#include <cmath>

#include "cpu_backend.h"
#include "tandem/model.h"
#include "test_support.h"

namespace tandem {
namespace {

// Float64 MLP: ReLU hidden layers, softmax output, summed clipped cross-entropy.
struct ReferenceModel {
  std::vector<int64_t> layers;
  std::vector<std::vector<double>> params;  // w0, b0, w1, b1, ...

  double loss(const std::vector<double>& x, const std::vector<uint8_t>& labels, int64_t rows,
              std::vector<std::vector<double>>* grads) const {
    const size_t L = layers.size() - 1;
    std::vector<std::vector<double>> acts(L + 1);
    acts[0] = x;
    for (size_t l = 0; l < L; ++l) {
      const int64_t in = layers[l], out = layers[l + 1];
      acts[l + 1].assign(rows * out, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < out; ++j) {
          double a = params[2 * l + 1][j];
          for (int64_t k = 0; k < in; ++k) a += acts[l][r * in + k] * params[2 * l][k * out + j];
          acts[l + 1][r * out + j] = (l + 1 < L) ? std::max(a, 0.0) : a;
        }
    }
    const int64_t C = layers.back();
    double total = 0.0;
    std::vector<double> delta(rows * C, 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const double* z = &acts[L][r * C];
      double zmax = z[0], sum = 0.0;
      for (int64_t j = 1; j < C; ++j) zmax = std::max(zmax, z[j]);
      for (int64_t j = 0; j < C; ++j) sum += std::exp(z[j] - zmax);
      const double p = std::exp(z[labels[r]] - zmax) / sum;
      total -= std::log(std::max(p, 1e-10));
      if (p >= 1e-10)
        for (int64_t j = 0; j < C; ++j)
          delta[r * C + j] = std::exp(z[j] - zmax) / sum - (j == labels[r] ? 1.0 : 0.0);
    }
    if (!grads) return total;
    grads->assign(params.size(), {});
    for (size_t l = L; l-- > 0;) {
      const int64_t in = layers[l], out = layers[l + 1];
      auto& gw = (*grads)[2 * l];
      auto& gb = (*grads)[2 * l + 1];
      gw.assign(in * out, 0.0);
      gb.assign(out, 0.0);
      std::vector<double> prev(rows * in, 0.0);
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < out; ++j) {
          const double d = delta[r * out + j];
          gb[j] += d;
          for (int64_t k = 0; k < in; ++k) {
            gw[k * out + j] += acts[l][r * in + k] * d;
            prev[r * in + k] += d * params[2 * l][k * out + j];
          }
        }
      for (int64_t i = 0; i < rows * in; ++i)
        if (acts[l][i] <= 0.0) prev[i] = 0.0;
      delta.swap(prev);
    }
    return total;
  }
};

struct Problem {
  ModelConfig config;
  Model model{ModelConfig{}};
  Dataset data;
  ReferenceModel reference;
  std::vector<double> x;
  std::vector<uint8_t> labels;
};

Problem make_problem(std::vector<int64_t> layers, int64_t rows, uint64_t seed) {
  Problem p;
  p.config.layers = std::move(layers);
  p.model = Model::initialized(p.config, seed);
  // Non-zero biases so the bias gradients and ReLU boundaries are exercised.
  uint32_t s = static_cast<uint32_t>(seed) * 7 + 1;
  for (auto& t : p.model.parameters())
    if (t.shape.size() == 1) t.values = test::random_floats(t.values.size(), s++, -0.3f, 0.3f);
  p.data = test::random_dataset(PixelType::Float32, rows, p.config.inputs(),
                                static_cast<int>(p.config.classes()), static_cast<uint32_t>(seed));
  p.reference.layers = p.config.layers;
  for (const auto& t : p.model.parameters()) p.reference.params.emplace_back(t.values.begin(), t.values.end());
  const auto* px = reinterpret_cast<const float*>(p.data.pixel_data());
  p.x.assign(px, px + rows * p.config.inputs());
  p.labels.assign(p.data.label_data(), p.data.label_data() + rows);
  return p;
}

TEST(GradientCheck, ReferenceMatchesFiniteDifferencesInFloat64) {
  for (auto layers : {std::vector<int64_t>{12, 7, 4}, std::vector<int64_t>{9, 6, 5, 3}}) {
    Problem p = make_problem(layers, 5, 42);
    std::vector<std::vector<double>> grads;
    p.reference.loss(p.x, p.labels, 5, &grads);
    const double h = 1e-6;
    for (size_t t = 0; t < p.reference.params.size(); ++t) {
      std::vector<double> numeric(p.reference.params[t].size());
      for (size_t i = 0; i < numeric.size(); ++i) {
        const double saved = p.reference.params[t][i];
        p.reference.params[t][i] = saved + h;
        const double up = p.reference.loss(p.x, p.labels, 5, nullptr);
        p.reference.params[t][i] = saved - h;
        const double down = p.reference.loss(p.x, p.labels, 5, nullptr);
        p.reference.params[t][i] = saved;
        numeric[i] = (up - down) / (2 * h);
      }
      // Central differences in float64 are good to ~1e-8 here; a ReLU kink within h of an
      // activation would break that, and random inputs make one vanishingly unlikely.
      EXPECT_TRUE(test::all_close(grads[t], numeric, 1e-6, 1e-5)) << "tensor " << t;
    }
  }
}

TEST(GradientCheck, CpuBackendMatchesFloat64Reference) {
  for (auto layers : {std::vector<int64_t>{784, 100, 10}, std::vector<int64_t>{50, 33, 17, 10}})
    for (int threads : {1, 2})
      for (int64_t block : {int64_t{1}, int64_t{4}, CpuBackend::kDefaultBlockRows}) {
        const int64_t rows = 23;
        Problem p = make_problem(layers, rows, 7);
        CpuBackend backend(p.config, OptimizerConfig{}, threads, block);
        backend.set_parameters(p.model);
        const BatchStats stats = backend.compute_gradients(p.data.view(), nullptr, rows);
        std::vector<NamedTensor> grads;
        backend.get_gradients(grads);
        std::vector<std::vector<double>> ref;
        const double loss = p.reference.loss(p.x, p.labels, rows, &ref);
        EXPECT_NEAR(stats.loss_sum, loss, 1e-5 * std::fabs(loss));
        EXPECT_EQ(stats.samples, rows);
        // A weight and a bias per layer: an empty list would compare nothing.
        ASSERT_EQ(grads.size(), 2 * (layers.size() - 1));
        ASSERT_EQ(ref.size(), grads.size());
        for (size_t t = 0; t < grads.size(); ++t)
          // float32 sums of up to 784 products: 1e-4 relative plus 1e-5 absolute.
          EXPECT_TRUE(test::all_close(grads[t].values, ref[t], 1e-5, 1e-4))
              << grads[t].name << " threads " << threads << " block " << block;
      }
}

}  // namespace
}  // namespace tandem
