#include "ps_placement.h"

#include <algorithm>
#include <numeric>

#include "tandem/error.h"

namespace tandem {

std::vector<int> place_tensors(const std::vector<int64_t>& sizes, int servers) {
  if (servers < 1) throw InputError("tensor placement: need at least one server");
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  std::vector<int64_t> load(size_t(servers), 0);
  std::vector<int> placement(sizes.size(), 0);
  for (size_t t : order) {
    const int s = int(std::min_element(load.begin(), load.end()) - load.begin());
    placement[t] = s;
    load[size_t(s)] += sizes[t];
  }
  return placement;
}

}  // namespace tandem
