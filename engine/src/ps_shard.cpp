#include "ps_shard.h"

#include <cstring>

#include "cpu/adam_cpu.h"

namespace tandem {

using transport::ByteSpan;
using transport::DType;
using transport::Message;

namespace {
constexpr int64_t kAlignFloats = 16;

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

int64_t element_count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}
}  // namespace

const PsShard::Entry* PsShard::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

std::string PsShard::check_initial(const Message& m, const std::vector<ByteSpan>& data) const {
  if (m.tensors.empty()) return "an Init must carry the initial parameters";
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& t = m.tensors[i];
    if (t.dtype != DType::Float32) return "initial tensor '" + t.name + "' is not float32";
    if (!transport::all_finite(data[i]))
      return "initial tensor '" + t.name + "' holds a non-finite value at element " +
             std::to_string(transport::first_non_finite(data[i]));
  }
  return "";
}

void PsShard::initialize(const Message& m, const std::vector<ByteSpan>& data) {
  entries_.clear();
  index_.clear();
  int64_t offset = 0;
  for (const auto& t : m.tensors) {
    const int64_t size = element_count(t.shape);
    index_[t.name] = entries_.size();
    entries_.push_back({t.name, t.shape, offset, size});
    offset += (size + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  total_ = offset;
  arena_ = AlignedBuffer<float>(size_t(3 * total_));  // zeroed: m = v = 0, padding = 0
  gradients_ = AlignedBuffer<float>(size_t(total_));
  sum_ = AlignedBuffer<float>(size_t(total_));
  pending_ = 0;
  for (size_t i = 0; i < entries_.size(); ++i)
    std::memcpy(arena_.data() + entries_[i].offset, data[i].data, data[i].size);
  step_ = 0;
  initialized_ = true;
  if (device_) device_->upload(arena_.data(), total_, step_);
}

void PsShard::restore(const std::vector<Restored>& tensors, int64_t step) {
  entries_.clear();
  index_.clear();
  int64_t offset = 0;
  for (const auto& t : tensors) {
    const int64_t size = element_count(t.shape);
    index_[t.name] = entries_.size();
    entries_.push_back({t.name, t.shape, offset, size});
    offset += (size + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  total_ = offset;
  arena_ = AlignedBuffer<float>(size_t(3 * total_));
  gradients_ = AlignedBuffer<float>(size_t(total_));
  sum_ = AlignedBuffer<float>(size_t(total_));
  pending_ = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const auto& t = tensors[i];
    std::memcpy(arena_.data() + e.offset, t.values.data(), size_t(e.size) * sizeof(float));
    if (!t.m.empty())
      std::memcpy(arena_.data() + total_ + e.offset, t.m.data(), size_t(e.size) * sizeof(float));
    if (!t.v.empty())
      std::memcpy(arena_.data() + 2 * total_ + e.offset, t.v.data(), size_t(e.size) * sizeof(float));
  }
  step_ = step;
  initialized_ = true;
  if (device_) device_->upload(arena_.data(), total_, step_);
}

void PsShard::use_device(std::unique_ptr<ShardDevice> device) {
  device_ = std::move(device);
  if (device_ && initialized_) device_->upload(arena_.data(), total_, step_);
}

void PsShard::fetch_moments() {
  if (device_ && initialized_) device_->download_moments(arena_.data() + total_, arena_.data() + 2 * total_);
}

std::string PsShard::check_gradients(const Message& m, const std::vector<ByteSpan>& data,
                                     std::string& kind) const {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& t = m.tensors[i];
    const Entry* e = find(t.name);
    if (e == nullptr) {
      kind = "unknown name";
      return "unknown parameter '" + t.name + "'";
    }
    if (t.dtype != DType::Float32) {
      kind = "wrong dtype";
      return "gradient '" + t.name + "' is not float32";
    }
    if (t.shape != e->shape) {
      kind = "wrong shape";
      return "gradient '" + t.name + "' has shape " + shape_text(t.shape) + ", expected " +
             shape_text(e->shape);
    }
    if (!transport::all_finite(data[i])) {
      kind = "non-finite";
      return "gradient '" + t.name + "' holds a non-finite value at element " +
             std::to_string(transport::first_non_finite(data[i]));
    }
  }
  // Names are unique (the decoder checks), all known: every parameter is there iff counts match.
  if (m.tensors.size() != entries_.size()) {
    kind = "missing gradient";
    for (const auto& e : entries_) {
      bool present = false;
      for (const auto& t : m.tensors) present |= t.name == e.name;
      if (!present) return "push lacks a gradient for '" + e.name + "' (a push carries all)";
    }
  }
  return "";
}

void PsShard::apply(const Message& m, const std::vector<ByteSpan>& data) {
  // Gather into an aligned buffer: received frames may sit at any byte offset.
  for (size_t i = 0; i < m.tensors.size(); ++i)
    std::memcpy(gradients_.data() + find(m.tensors[i].name)->offset, data[i].data, data[i].size);
  step_with_gradients();
}

void PsShard::accumulate(const Message& m, const std::vector<ByteSpan>& data) {
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const Entry* e = find(m.tensors[i].name);
    float* dst = sum_.data() + e->offset;
    // The frame may sit at any byte offset: read each float with memcpy.
    for (int64_t k = 0; k < e->size; ++k) {
      float g;
      std::memcpy(&g, data[i].data + k * sizeof(float), sizeof(float));
      dst[k] += g;
    }
  }
  ++pending_;
}

void PsShard::apply_accumulated() {
  const float n = float(pending_);
  for (int64_t k = 0; k < total_; ++k) {
    gradients_.data()[k] = sum_.data()[k] / n;
    sum_.data()[k] = 0.0f;
  }
  pending_ = 0;
  step_with_gradients();
}

void PsShard::step_with_gradients() {
  ++step_;
  if (device_) {  // the same update, by the CUDA twin of the kernel below
    device_->step(gradients_.data(), arena_.data());
    return;
  }
  float* w = arena_.data();
  const float* g = gradients_.data();
  if (optimizer_.kind == OptimizerKind::Adam) {
    const kernels::AdamHyper h{optimizer_.learning_rate, optimizer_.beta1, optimizer_.beta2,
                               optimizer_.epsilon};
    const float lr_t = kernels::adam_step_size(h, step_);
    kernels::adam_update_cpu(w, w + total_, w + 2 * total_, &g, 1, 0, total_, lr_t, h);
  } else {
    kernels::sgd_update_cpu(w, &g, 1, 0, total_, optimizer_.learning_rate);
  }
}

std::string PsShard::select(const std::vector<std::string>& names,
                            std::vector<const Entry*>& out) const {
  out.clear();
  if (names.empty()) {
    for (const auto& e : entries_) out.push_back(&e);
    return "";
  }
  for (const auto& n : names) {
    const Entry* e = find(n);
    if (e == nullptr) return "unknown parameter '" + n + "'";
    out.push_back(e);
  }
  return "";
}

}  // namespace tandem
