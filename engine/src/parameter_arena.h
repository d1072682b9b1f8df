// Moving named tensors in and out of a backend's flat parameter arena (see parameter_layout.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "parameter_layout.h"
#include "tandem/model.h"

namespace tandem {

// Parameters read where they already are, in pieces: a parameter server's reply as ZeroMQ
// received it (PsClient's ReceivedParameters), so a worker copies them once, into its backend.
// `shapes` gives every tensor's shape in the layout's order; each run holds `count` floats of
// tensor `tensor` from its element `offset`, at `bytes` (any alignment: frames sit at any byte
// offset). Together the runs cover every element of every tensor (PsClient checks that).
struct ParameterRuns {
  struct Run {
    size_t tensor = 0;
    int64_t offset = 0;
    int64_t count = 0;
    const void* bytes = nullptr;
  };
  const std::vector<std::vector<int64_t>>* shapes = nullptr;
  std::vector<Run> runs;
};

// InputError naming `what` and the tensor unless `tensors` are one per layout entry, in order,
// with matching shapes.
void check_tensors_fit(const std::vector<NamedTensor>& tensors, const ParameterLayout& layout,
                       const char* what);
// Copies `tensors` into `arena` once check_tensors_fit passed (nothing is copied otherwise).
// Padding between tensors is left as it is.
void copy_tensors_in(const std::vector<NamedTensor>& tensors, const ParameterLayout& layout,
                     float* arena, const char* what);
// Copies every run into its place in `arena`; throws InputError naming `what` when the shapes
// are not the layout's or a run lies outside its tensor (nothing is copied then).
void copy_runs_in(const ParameterRuns& runs, const ParameterLayout& layout, float* arena,
                  const char* what);
// The arena's tensors, named by the layout with `suffix` appended.
void copy_tensors_out(const ParameterLayout& layout, const float* arena,
                      std::vector<NamedTensor>& out, const std::string& suffix);

}  // namespace tandem
