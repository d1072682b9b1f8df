// Which server holds which tensor, or which rows of it. Small tensors are placed whole; a large
// one is split into row ranges on several servers so that the servers' loads are even.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tandem/config.h"

namespace tandem {

// Greedy by size: tensors from largest to smallest (ties: earlier first), each onto the server
// with the fewest elements so far (ties: lowest index). Deterministic, so every client that
// sees the same tensors computes the same placement. Returns the server index of each tensor.
std::vector<int> place_tensors(const std::vector<int64_t>& sizes, int servers);

// Row splitting. A tensor's rows are its first dimension (a 1-D tensor's rows are its elements,
// a 0-D tensor is one row). A part is the row range [row_begin, row_end) of a row-major tensor,
// so its values are the contiguous slice [offset, offset + size) of the tensor's. A part that is
// the whole tensor keeps the tensor's name; a split part is named "NAME[BEGIN:END]" (rows,
// half-open, decimal), e.g. "hid_w[0:392]" and "hid_w[392:784]". Servers store, update,
// checkpoint and report parts as ordinary named tensors; only clients know they belong together.
struct TensorPart {
  size_t tensor = 0;           // the whole tensor's index in the model's order
  std::string name;            // the tensor's name, or NAME[BEGIN:END]
  std::vector<int64_t> shape;  // the tensor's shape with END - BEGIN rows
  int64_t row_begin = 0, row_end = 0;
  int64_t offset = 0;  // elements from the start of the tensor
  int64_t size = 0;    // elements
  int server = 0;
};

int64_t row_count(const std::vector<int64_t>& shape);  // shape[0]; 1 for a 0-D tensor
int64_t row_size(const std::vector<int64_t>& shape);   // elements per row
std::string part_name(const std::string& tensor, int64_t row_begin, int64_t row_end);
// Reads "NAME[BEGIN:END]" (non-empty NAME, 0 <= BEGIN < END); false for any other name.
bool parse_part_name(const std::string& part, std::string& tensor, int64_t& row_begin,
                     int64_t& row_end);

// Places the tensors (`shapes` in the model's order) on `servers`. With `split` and more than one
// server, a tensor of more than total / (2 * servers) elements (total: all tensors) with at least
// two rows is split into min(servers, rows) near-equal row ranges (the first rows % k one row
// longer). Split tensors, largest first, hand their parts, largest first, to the servers from
// least to most loaded (ties: lowest index), so one tensor's parts sit on different servers;
// then the other tensors are placed whole as place_tensors does, each onto the least-loaded
// server so far. Without `split`: whole tensors exactly as place_tensors. Deterministic: every
// client computes the same parts from the same names and shapes. Returns the parts in the
// model's order, a split tensor's by row. Throws InputError for no server, a negative
// dimension, or a tensor name that reads as a part name.
std::vector<TensorPart> place_parts(const std::vector<std::string>& names,
                                    const std::vector<std::vector<int64_t>>& shapes, int servers,
                                    bool split = true);

// The parts of `model`'s parameters (ParameterLayout's order) on `servers` servers, as a
// cluster's chief initialises them (split by rows, PsClient's default).
std::vector<TensorPart> place_model_parts(const ModelConfig& model, int servers);

}  // namespace tandem
