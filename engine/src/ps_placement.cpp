#include "ps_placement.h"

#include <algorithm>
#include <numeric>

#include "parameter_layout.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Indices of `sizes`, largest first (ties: earlier first).
std::vector<size_t> largest_first(const std::vector<int64_t>& sizes) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  return order;
}

// The greedy rule: the tensors `which`, largest first, each onto the least-loaded server (ties:
// lowest index), adding to `load`.
void place_greedily(const std::vector<int64_t>& sizes, const std::vector<size_t>& which,
                    std::vector<int64_t>& load, std::vector<int>& placement) {
  std::vector<int64_t> chosen;
  for (size_t t : which) chosen.push_back(sizes[t]);
  for (size_t k : largest_first(chosen)) {
    const int s = int(std::min_element(load.begin(), load.end()) - load.begin());
    placement[which[k]] = s;
    load[size_t(s)] += sizes[which[k]];
  }
}

bool parse_index(const std::string& text, int64_t& out) {
  if (text.empty() || text.size() > 18) return false;
  out = 0;
  for (char c : text) {
    if (c < '0' || c > '9') return false;
    out = out * 10 + (c - '0');
  }
  return true;
}

}  // namespace

std::vector<int> place_tensors(const std::vector<int64_t>& sizes, int servers) {
  if (servers < 1) throw InputError("tensor placement: need at least one server");
  std::vector<int64_t> load(size_t(servers), 0);
  std::vector<int> placement(sizes.size(), 0);
  std::vector<size_t> all(sizes.size());
  std::iota(all.begin(), all.end(), 0);
  place_greedily(sizes, all, load, placement);
  return placement;
}

int64_t row_count(const std::vector<int64_t>& shape) { return shape.empty() ? 1 : shape[0]; }

int64_t row_size(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (size_t d = 1; d < shape.size(); ++d) n *= shape[d];
  return n;
}

std::string part_name(const std::string& tensor, int64_t row_begin, int64_t row_end) {
  return tensor + "[" + std::to_string(row_begin) + ":" + std::to_string(row_end) + "]";
}

bool parse_part_name(const std::string& part, std::string& tensor, int64_t& row_begin,
                     int64_t& row_end) {
  if (part.size() < 6 || part.back() != ']') return false;
  const size_t open = part.rfind('[');
  if (open == std::string::npos || open == 0) return false;
  const size_t colon = part.find(':', open);
  if (colon == std::string::npos) return false;
  int64_t b = 0, e = 0;
  if (!parse_index(part.substr(open + 1, colon - open - 1), b) ||
      !parse_index(part.substr(colon + 1, part.size() - colon - 2), e) || b >= e)
    return false;
  tensor = part.substr(0, open);
  row_begin = b;
  row_end = e;
  return true;
}

std::vector<TensorPart> place_parts(const std::vector<std::string>& names,
                                    const std::vector<std::vector<int64_t>>& shapes, int servers,
                                    bool split) {
  if (servers < 1) throw InputError("tensor placement: need at least one server");
  if (names.size() != shapes.size())
    throw InputError("tensor placement: " + std::to_string(names.size()) + " names for " +
                     std::to_string(shapes.size()) + " shapes");
  std::vector<int64_t> sizes;
  int64_t total = 0;
  for (size_t t = 0; t < names.size(); ++t) {
    std::string base;
    int64_t b = 0, e = 0;
    if (parse_part_name(names[t], base, b, e))
      throw InputError("tensor placement: parameter name '" + names[t] +
                       "' reads as a part name (NAME[BEGIN:END]); rename it");
    int64_t n = 1;
    for (int64_t d : shapes[t]) {
      if (d < 0) throw InputError("tensor placement: tensor '" + names[t] + "' has a negative dimension");
      n *= d;
    }
    sizes.push_back(n);
    total += n;
  }
  // Which tensors split and into how many parts.
  std::vector<int64_t> pieces(names.size(), 1);
  std::vector<size_t> split_ones, whole_ones;
  for (size_t t = 0; t < names.size(); ++t) {
    const int64_t rows = row_count(shapes[t]);
    if (split && servers > 1 && rows >= 2 && sizes[t] * 2 * servers > total) {
      pieces[t] = std::min<int64_t>(servers, rows);
      split_ones.push_back(t);
    } else {
      whole_ones.push_back(t);
    }
  }
  std::vector<int64_t> load(size_t(servers), 0);
  std::vector<std::vector<TensorPart>> by_tensor(names.size());
  std::vector<int64_t> split_sizes;
  for (size_t t : split_ones) split_sizes.push_back(sizes[t]);
  for (size_t k : largest_first(split_sizes)) {
    const size_t t = split_ones[k];
    const int64_t rows = row_count(shapes[t]), per_row = row_size(shapes[t]);
    std::vector<TensorPart>& parts = by_tensor[t];
    int64_t begin = 0;
    for (int64_t p = 0; p < pieces[t]; ++p) {
      const int64_t n = rows / pieces[t] + (p < rows % pieces[t] ? 1 : 0);
      TensorPart part;
      part.tensor = t;
      part.name = part_name(names[t], begin, begin + n);
      part.shape = shapes[t];
      part.shape[0] = n;
      part.row_begin = begin;
      part.row_end = begin + n;
      part.offset = begin * per_row;
      part.size = n * per_row;
      parts.push_back(std::move(part));
      begin += n;
    }
    // Parts are already largest first (longer ones come first); servers least loaded first.
    std::vector<size_t> servers_by_load(static_cast<size_t>(servers));
    std::iota(servers_by_load.begin(), servers_by_load.end(), 0);
    std::stable_sort(servers_by_load.begin(), servers_by_load.end(),
                     [&](size_t a, size_t b) { return load[a] < load[b]; });
    for (size_t p = 0; p < parts.size(); ++p) {
      parts[p].server = int(servers_by_load[p]);
      load[servers_by_load[p]] += parts[p].size;
    }
  }
  std::vector<int> placement(names.size(), 0);
  place_greedily(sizes, whole_ones, load, placement);
  for (size_t t : whole_ones) {
    TensorPart part;
    part.tensor = t;
    part.name = names[t];
    part.shape = shapes[t];
    part.row_end = row_count(shapes[t]);
    part.size = sizes[t];
    part.server = placement[t];
    by_tensor[t].push_back(std::move(part));
  }
  std::vector<TensorPart> out;
  for (auto& parts : by_tensor)
    for (auto& p : parts) out.push_back(std::move(p));
  return out;
}

std::vector<TensorPart> place_model_parts(const ModelConfig& model, int servers) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const auto& e : ParameterLayout::for_model(model).entries) {
    names.push_back(e.name);
    shapes.push_back(e.shape);
  }
  return place_parts(names, shapes, servers);
}

}  // namespace tandem
