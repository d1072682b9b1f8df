// The check of Backend::set_parameters(const ParameterRuns&) that every backend passes (the CPU
// backend's test and the CUDA backend's): runs install like whole tensors, in any order, and a
// bad run (past a tensor's end, no such tensor, another shape, too few tensors) is refused and
// changes nothing.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "backend.h"
#include "tandem/error.h"
#include "tandem/model.h"

namespace tandem::test {

// `backend` is made for `config` (a model of two layers: four tensors).
inline void check_parameter_runs(Backend& backend, const ModelConfig& config) {
  const Model model = Model::initialized(config, 5);
  std::vector<std::vector<int64_t>> shapes;
  ParameterRuns runs;
  runs.shapes = &shapes;
  for (size_t t = 0; t < model.parameters().size(); ++t) {
    const auto& tensor = model.parameters()[t];
    shapes.push_back(tensor.shape);
    // Each tensor in two runs, the second first: order does not matter, only coverage.
    const int64_t n = int64_t(tensor.values.size()), half = n / 2;
    runs.runs.push_back({t, half, n - half, tensor.values.data() + half});
    runs.runs.push_back({t, 0, half, tensor.values.data()});
  }
  backend.set_parameters(runs);
  Model installed(config);
  backend.get_parameters(installed);
  for (size_t t = 0; t < model.parameters().size(); ++t)
    EXPECT_EQ(installed.parameters()[t].values, model.parameters()[t].values) << t;

  const Model other = Model::initialized(config, 6);
  backend.set_parameters(other);
  auto expect_refused = [&](ParameterRuns bad, const std::string& says) {
    try {
      backend.set_parameters(bad);
      ADD_FAILURE() << "expected InputError saying " << says;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
    Model after(config);
    backend.get_parameters(after);
    for (size_t t = 0; t < other.parameters().size(); ++t)
      EXPECT_EQ(after.parameters()[t].values, other.parameters()[t].values) << says;
  };
  ParameterRuns past_end = runs;
  past_end.runs.front().count += 1;  // tensor 0's second half, one float past its end
  expect_refused(past_end, "lies outside it");
  ParameterRuns no_tensor = runs;
  no_tensor.runs.back().tensor = shapes.size();
  expect_refused(no_tensor, "lies outside it");
  std::vector<std::vector<int64_t>> wrong = shapes;
  wrong[0][0] += 1;
  ParameterRuns wrong_shape = runs;
  wrong_shape.shapes = &wrong;
  expect_refused(wrong_shape, "does not have the shape of");
  expect_refused(ParameterRuns{}, "expected 4 tensors, got 0");
}

}  // namespace tandem::test
