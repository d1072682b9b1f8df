#include "ps_shard.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>

#include "cpu/adam_cpu.h"
#include "ps_checkpoint_file.h"

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
    const std::string reserved = reserved_parameter_name_problem(t.name);
    if (!reserved.empty()) return reserved;
    if (!transport::all_finite(data[i]))
      return "initial tensor '" + t.name + "' holds a non-finite value at element " +
             std::to_string(transport::first_non_finite(data[i]));
  }
  return "";
}

void PsShard::lay_out(const std::vector<std::pair<std::string, std::vector<int64_t>>>& tensors) {
  entries_.clear();
  index_.clear();
  int64_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    const int64_t size = element_count(shape);
    index_[name] = entries_.size();
    entries_.push_back({name, shape, offset, size});
    offset += (size + kAlignFloats - 1) / kAlignFloats * kAlignFloats;
  }
  total_ = offset;
  // Blocks of the old layout may still be on the wire: they keep themselves alive until sent.
  param_blocks_.clear();
  params_ = param_blocks_.take();
  params_->value = AlignedBuffer<float>(size_t(total_));  // zeroed: padding = 0
  moments_ = AlignedBuffer<float>(size_t(2 * total_));    // m = v = 0
  gradients_ = AlignedBuffer<float>(size_t(total_));
  sum_ = AlignedBuffer<float>(size_t(total_));
  pending_ = 0;
  step_ = 0;
}

void PsShard::initialize(const Message& m, const std::vector<ByteSpan>& data) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& t : m.tensors) shapes.push_back({t.name, t.shape});
  lay_out(shapes);
  for (size_t i = 0; i < entries_.size(); ++i)
    std::memcpy(params_->value.data() + entries_[i].offset, data[i].data, data[i].size);
  upload_to_device();
  initialized_ = true;
}

void PsShard::restore(const std::vector<Restored>& tensors, int64_t step) {
  std::vector<std::pair<std::string, std::vector<int64_t>>> shapes;
  for (const auto& t : tensors) shapes.push_back({t.name, t.shape});
  lay_out(shapes);
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const auto& t = tensors[i];
    const size_t bytes = size_t(e.size) * sizeof(float);
    std::memcpy(params_->value.data() + e.offset, t.values.data(), bytes);
    if (!t.m.empty()) std::memcpy(moments_.data() + e.offset, t.m.data(), bytes);
    if (!t.v.empty()) std::memcpy(moments_.data() + total_ + e.offset, t.v.data(), bytes);
  }
  step_ = step;
  upload_to_device();
  initialized_ = true;
}

void PsShard::use_device(std::unique_ptr<ShardDevice> device) {
  device_ = std::move(device);
  if (initialized_) upload_to_device();
}

void PsShard::upload_to_device() {
  if (!device_) return;
  on_device("upload",
            [&] { device_->upload(params_->value.data(), moments_.data(), total_, step_); });
}

void PsShard::on_device(const char* what, const std::function<void()>& call) {
  if (!device_failure_.empty()) throw ShardDeviceFailed(device_failure_);
  try {
    call();
  } catch (const std::exception& e) {
    device_failure_ = std::string("the shard's GPU (device ") + std::to_string(device_->device()) +
                      ") failed in its " + what + ": " + e.what();
    throw ShardDeviceFailed(device_failure_);
  }
}

void PsShard::fetch_moments() {
  if (device_ && initialized_)
    on_device("download of Adam's moments",
              [&] { device_->download_moments(moments_.data(), moments_.data() + total_); });
}

float* PsShard::writable_params(bool keep_values) {
  if (params_->in_use()) {
    std::shared_ptr<ParamBlock> next = param_blocks_.take();  // not params_: that one is held
    if (next->value.size() != size_t(total_)) next->value = AlignedBuffer<float>(size_t(total_));
    // ZeroMQ may let params_ go between in_use() and take(), which then hands back params_
    // itself: its values are already there (and memcpy onto itself is undefined).
    if (keep_values && next != params_)
      std::memcpy(next->value.data(), params_->value.data(), size_t(total_) * sizeof(float));
    params_ = std::move(next);
  }
  return params_->value.data();
}

std::string PsShard::stage_gradients(const Message& m, const std::vector<ByteSpan>& data,
                                     std::string& kind) {
  staged_.clear();
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const auto& t = m.tensors[i];
    const Entry* e = find(t.name);
    if (e == nullptr) {
      kind = transport::kUnknownName;
      return "unknown parameter '" + t.name + "'";
    }
    if (t.dtype != DType::Float32) {
      kind = transport::kWrongDtype;
      return "gradient '" + t.name + "' is not float32";
    }
    if (t.shape != e->shape) {
      kind = transport::kWrongShape;
      return "gradient '" + t.name + "' has shape " + shape_text(t.shape) + ", expected " +
             shape_text(e->shape);
    }
    // The optimizer reads the frame itself when it can; a device takes one contiguous upload,
    // and a frame at an odd byte offset cannot be read as floats. The gathered copy is scratch:
    // a push refused later leaves nothing behind.
    const float* gradient = reinterpret_cast<const float*>(data[i].data);
    if (device_ || reinterpret_cast<uintptr_t>(data[i].data) % alignof(float) != 0) {
      float* gathered = gradients_.data() + e->offset;
      std::memcpy(gathered, data[i].data, data[i].size);
      gradient = gathered;
    }
    if (!transport::all_finite(transport::span_of(gradient, size_t(e->size)))) {
      kind = transport::kNonFinite;
      return "gradient '" + t.name + "' holds a non-finite value at element " +
             std::to_string(transport::first_non_finite(data[i])) +
             " (training diverged? try a lower learning rate)";
    }
    staged_.push_back({e, gradient});
  }
  // Names are unique (the decoder checks), all known: every parameter is there iff counts match.
  if (m.tensors.size() != entries_.size()) {
    kind = transport::kMissingGradient;
    for (const auto& e : entries_) {
      bool present = false;
      for (const auto& t : m.tensors) present |= t.name == e.name;
      if (!present) return "push lacks a gradient for '" + e.name + "' (a push carries all)";
    }
  }
  return "";
}

void PsShard::apply_staged() {
  if (device_) {  // every gradient was gathered into gradients_
    staged_.clear();
    step_with_gradients();
    return;
  }
  // The block first: one that cannot be had (no memory) leaves the step uncounted.
  float* w = writable_params(true);
  ++step_;
  const float rate = step_size();
  for (const Staged& s : staged_) {
    // The kernel's vector body may contract to FMA where its scalar tail does not, so an
    // element's bits depend on whether it falls in a whole vector. The trainer sweeps each tensor
    // padded to 16 floats; so does this: whole 16-float groups straight from the frame, then the
    // last part group from a zero-padded copy (the frame ends at the tensor's last float).
    const int64_t whole = s.entry->size / kAlignFloats * kAlignFloats;
    update(w, s.entry->offset, whole, s.gradient, rate);
    if (whole < s.entry->size) {
      alignas(64) float tail[kAlignFloats] = {};
      std::memcpy(tail, s.gradient + whole, size_t(s.entry->size - whole) * sizeof(float));
      update(w, s.entry->offset + whole, kAlignFloats, tail, rate);
    }
  }
  staged_.clear();  // the frames are the caller's again
}

void PsShard::accumulate_staged() {
  float* sum = sum_.data();
  for (const Staged& s : staged_) {
    float* into = sum + s.entry->offset;
    const float* g = s.gradient;
    for (int64_t k = 0; k < s.entry->size; ++k) into[k] += g[k];  // padding stays 0
  }
  staged_.clear();
  ++pending_;
}

bool PsShard::apply_accumulated() {
  const float n = float(pending_);
  for (int64_t k = 0; k < total_; ++k) {
    gradients_.data()[k] = sum_.data()[k] / n;
    sum_.data()[k] = 0.0f;
  }
  pending_ = 0;
  if (!transport::all_finite(transport::span_of(gradients_.data(), size_t(total_)))) return false;
  step_with_gradients();
  return true;
}

void PsShard::step_with_gradients() {
  if (device_) {
    // The same update, by the CUDA twin of the kernel below. The device steps first; only then
    // is a parameter block taken and filled (every value), inside the same failing unit (a
    // block that cannot be had leaves the device a step ahead), and the step counted: a failure
    // leaves the host's parameters and step as they were, and the shard failed.
    on_device("step", [&] {
      const float* updated = device_->step(gradients_.data(), total_);
      std::memcpy(writable_params(false), updated, size_t(total_) * sizeof(float));
    });
    ++step_;
    return;
  }
  float* w = writable_params(true);  // first, as in apply_staged
  ++step_;
  update(w, 0, total_, gradients_.data(), step_size());
}

kernels::AdamHyper PsShard::adam_hyper() const {
  return {optimizer_.learning_rate, optimizer_.beta1, optimizer_.beta2, optimizer_.epsilon};
}

float PsShard::step_size() const {
  return optimizer_.kind == OptimizerKind::Adam ? kernels::adam_step_size(adam_hyper(), step_)
                                                : optimizer_.learning_rate;
}

void PsShard::update(float* w, int64_t offset, int64_t n, const float* g, float rate) {
  if (optimizer_.kind == OptimizerKind::Adam) {
    kernels::adam_update_cpu(w + offset, moments_.data() + offset,
                             moments_.data() + total_ + offset, &g, 1, 0, n, rate, adam_hyper());
  } else {
    kernels::sgd_update_cpu(w + offset, &g, 1, 0, n, rate);
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
    // A reply names each tensor once (the encoder refuses a repeat): without this check a Pull
    // naming one twice got no reply at all, its client waiting out its timeout.
    if (std::find(out.begin(), out.end(), e) != out.end())
      return "parameter '" + n + "' named twice";
    out.push_back(e);
  }
  return "";
}

}  // namespace tandem
