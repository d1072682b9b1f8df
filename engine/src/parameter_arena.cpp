#include "parameter_arena.h"

#include <algorithm>
#include <cstring>

#include "tandem/error.h"

namespace tandem {

void check_tensors_fit(const std::vector<NamedTensor>& tensors, const ParameterLayout& layout,
                       const char* what) {
  if (tensors.size() != layout.entries.size())
    throw InputError(std::string(what) + ": expected " + std::to_string(layout.entries.size()) +
                     " tensors, got " + std::to_string(tensors.size()));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const auto& entry = layout.entries[i];
    if (tensors[i].shape != entry.shape ||
        static_cast<int64_t>(tensors[i].values.size()) != entry.size)
      throw InputError(std::string(what) + ": tensor '" + tensors[i].name +
                       "' does not have the shape of '" + entry.name + "'");
  }
}

void copy_tensors_in(const std::vector<NamedTensor>& tensors, const ParameterLayout& layout,
                     float* arena, const char* what) {
  check_tensors_fit(tensors, layout, what);  // all of them before any is copied
  for (size_t i = 0; i < tensors.size(); ++i)
    std::copy(tensors[i].values.begin(), tensors[i].values.end(),
              arena + layout.entries[i].offset);
}

void copy_runs_in(const ParameterRuns& runs, const ParameterLayout& layout, float* arena,
                  const char* what) {
  const size_t n = runs.shapes == nullptr ? 0 : runs.shapes->size();
  if (n != layout.entries.size())
    throw InputError(std::string(what) + ": expected " + std::to_string(layout.entries.size()) +
                     " tensors, got " + std::to_string(n));
  for (size_t i = 0; i < n; ++i)
    if ((*runs.shapes)[i] != layout.entries[i].shape)
      throw InputError(std::string(what) + ": tensor " + std::to_string(i) +
                       " does not have the shape of '" + layout.entries[i].name + "'");
  for (const auto& run : runs.runs)
    if (run.tensor >= n || run.offset < 0 || run.count < 0 ||
        run.count > layout.entries[run.tensor].size - run.offset || run.bytes == nullptr)
      throw InputError(std::string(what) + ": a run of " + std::to_string(run.count) +
                       " values from element " + std::to_string(run.offset) + " of tensor " +
                       std::to_string(run.tensor) + " lies outside it");
  for (const auto& run : runs.runs)
    std::memcpy(arena + layout.entries[run.tensor].offset + run.offset, run.bytes,
                static_cast<size_t>(run.count) * sizeof(float));
}

void copy_tensors_out(const ParameterLayout& layout, const float* arena,
                      std::vector<NamedTensor>& out, const std::string& suffix) {
  // Called per step by cluster workers (gradients out): tensors already there keep their
  // storage, so a step copies 318 KB and allocates nothing.
  out.resize(layout.entries.size());
  for (size_t i = 0; i < layout.entries.size(); ++i) {
    const auto& entry = layout.entries[i];
    out[i].name = entry.name + suffix;
    out[i].shape = entry.shape;
    out[i].values.assign(arena + entry.offset, arena + entry.offset + entry.size);
  }
}

}  // namespace tandem
