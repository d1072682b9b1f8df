// Moving named tensors in and out of a backend's flat parameter arena (see parameter_layout.h).
#pragma once

#include <string>
#include <vector>

#include "parameter_layout.h"
#include "tandem/model.h"

namespace tandem {

// Copies `tensors` (one per layout entry, in order, with matching shapes) into `arena`; throws
// InputError naming `what` and the tensor otherwise. Padding between tensors is left as it is.
void copy_tensors_in(const std::vector<NamedTensor>& tensors, const ParameterLayout& layout,
                     float* arena, const char* what);
// The arena's tensors, named by the layout with `suffix` appended.
void copy_tensors_out(const ParameterLayout& layout, const float* arena,
                      std::vector<NamedTensor>& out, const std::string& suffix);

}  // namespace tandem
