#include "cuda_backend.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <utility>

#include "cpu/convert_cpu.h"
#include "cuda/convert_cuda.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_device.h"
#include "parameter_arena.h"
#include "tandem/error.h"

namespace tandem {

namespace {

// Evaluation and prediction walk a data set in pieces of this many rows (the buffers of a step
// of this size are what they need on the device).
constexpr int64_t kEvalChunkRows = 16384;

kernels::MatmulPrecision matmul_precision(Precision precision) {
  switch (precision) {
    case Precision::Fp32: return kernels::MatmulPrecision::Fp32;
    case Precision::Tf32: return kernels::MatmulPrecision::Tf32;
    case Precision::Bf16: return kernels::MatmulPrecision::Bf16;
  }
  return kernels::MatmulPrecision::Fp32;
}

kernels::AdamHyper hyper_of(const OptimizerConfig& opt) {
  return {opt.learning_rate, opt.beta1, opt.beta2, opt.epsilon};
}

bool graphs_disabled_by_environment() {
  const char* value = std::getenv("TANDEM_CUDA_GRAPHS");
  return value != nullptr && std::strcmp(value, "0") == 0;
}

}  // namespace

CudaBackend::CudaBackend(const ModelConfig& model, const OptimizerConfig& opt,
                         const CudaBackendOptions& options)
    : config_(model),
      optimizer_(opt),
      options_(options),
      layout_(ParameterLayout::for_model(model)) {
  config_.validate();
  const int devices = kernels::cuda_device_count();
  if (devices == 0)
    throw InputError("CUDA backend: no usable CUDA device (no GPU, no driver, or a driver older "
                     "than this build's CUDA runtime)");
  if (options_.device < 0 || options_.device >= devices)
    throw InputError("CUDA backend: device " + std::to_string(options_.device) + " asked for, " +
                     std::to_string(devices) + " present");
  if (graphs_disabled_by_environment()) options_.use_graphs = false;
  // A destructor does not run for a constructor that throws: what was made before the failure
  // (streams, events, pinned memory, a cuBLASLt handle) is released here, or a process that
  // catches the error and goes on (a predictor, a worker that retries) would keep it.
  try {
    create_device_state();
  } catch (...) {
    release_device_state();
    throw;
  }
}

void CudaBackend::create_device_state() {
  TANDEM_CUDA_CHECK(cudaSetDevice(options_.device));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  TANDEM_CUDA_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
  for (Slot& slot : slots_) {
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.copied, cudaEventDisableTiming));
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&slot.used, cudaEventDisableTiming));
  }
  // Two: [0] for the calls that read their totals at once, [1] for enqueue_gradients, whose
  // totals finish_gradients reads later (a take_stats or evaluate between them must not
  // overwrite them).
  TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_totals_),
                                   2 * sizeof(kernels::DeviceStats)));
  // Pinned, so that parameters and gradients cross in one DMA each, without the driver staging
  // them through its own buffer. Zeroed: the padding between tensors stays zero, since nothing
  // else is ever written there (fills write tensors only, and the copies back of params_ and
  // grads_ bring their padding, which no step writes).
  const size_t arena_bytes = sizeof(float) * static_cast<size_t>(layout_.total);
  for (float** arena : {&host_parameters_, &host_gradients_}) {
    TANDEM_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(arena), arena_bytes));
    std::memset(*arena, 0, arena_bytes);
  }
  layer_ready_.assign(config_.layers.size() - 1, nullptr);
  for (cudaEvent_t& event : layer_ready_)
    TANDEM_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
  // enqueue_gradients' pieces, last layer first: layer l's runs from its weight to the next
  // layer's weight (or the arena's end), so they cover the arena, padding included.
  for (size_t l = layer_ready_.size(); l-- > 0;) {
    const int64_t begin = l == 0 ? 0 : layout_.weight(l).offset;
    const int64_t end = l + 1 < layer_ready_.size() ? layout_.weight(l + 1).offset : layout_.total;
    gradient_pieces_.push_back({begin, end - begin, static_cast<void*>(layer_ready_[l])});
  }
  dense_ = std::make_unique<kernels::DenseCuda>(stream_, matmul_precision(options_.precision));

  const size_t total = static_cast<size_t>(layout_.total);
  params_ = kernels::DeviceBuffer<float>(total);
  grads_ = kernels::DeviceBuffer<float>(total);
  adam_m_ = kernels::DeviceBuffer<float>(total);
  adam_v_ = kernels::DeviceBuffer<float>(total);
  adam_step_ = kernels::DeviceBuffer<kernels::AdamDeviceStep>(1);
  train_totals_ = kernels::DeviceBuffer<kernels::DeviceStats>(1);
  call_totals_ = kernels::DeviceBuffer<kernels::DeviceStats>(1);
  // Zeros everywhere: the padding between tensors is never written by a step, and Adam sweeps
  // it (zero gradient keeps zero moments and unchanged zero parameters).
  for (auto* buffer : {&params_, &grads_, &adam_m_, &adam_v_})
    TANDEM_CUDA_CHECK(cudaMemsetAsync(buffer->data(), 0, buffer->bytes(), stream_));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(adam_step_.data(), 0, adam_step_.bytes(), stream_));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(train_totals_.data(), 0, train_totals_.bytes(), stream_));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(call_totals_.data(), 0, call_totals_.bytes(), stream_));
  activations_.resize(config_.layers.size());
  deltas_.resize(config_.layers.size());
  synchronize();
}

CudaBackend::~CudaBackend() { release_device_state(); }

void* CudaBackend::PinnedStaging::reserve(size_t bytes) {
  if (capacity >= bytes) return data;
  release();
  TANDEM_CUDA_CHECK(cudaMallocHost(&data, bytes));
  capacity = bytes;
  return data;
}

void CudaBackend::PinnedStaging::release() noexcept {
  if (data != nullptr && cudaFreeHost(data) != cudaSuccess)
    std::fprintf(stderr, "tandem: CUDA backend: cudaFreeHost of a staging buffer failed\n");
  data = nullptr;
  capacity = 0;
}

void CudaBackend::release_device_state() noexcept {
  // Logs instead of throwing (it runs in the destructor). The device first: a group member's
  // backend may be destroyed by a thread whose current device is another member's.
  cudaSetDevice(options_.device);
  if (stream_ && cudaStreamSynchronize(stream_) != cudaSuccess)
    std::fprintf(stderr, "tandem: CUDA backend: work failed before shutdown\n");
  if (copy_stream_) cudaStreamSynchronize(copy_stream_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (Slot& slot : slots_) {
    slot.host_rows.release();
    slot.host_gather.release();
    if (slot.copied) cudaEventDestroy(slot.copied);
    if (slot.used) cudaEventDestroy(slot.used);
  }
  if (host_totals_) cudaFreeHost(host_totals_);
  if (host_parameters_) cudaFreeHost(host_parameters_);
  if (host_gradients_) cudaFreeHost(host_gradients_);
  for (cudaEvent_t event : layer_ready_)
    if (event) cudaEventDestroy(event);
  graphs_.clear();
  for (Slot& slot : slots_) slot = Slot{};
  host_totals_ = nullptr;
  host_parameters_ = nullptr;
  host_gradients_ = nullptr;
  layer_ready_.clear();
  dense_.reset();
  if (copy_stream_) cudaStreamDestroy(copy_stream_);
  if (stream_) cudaStreamDestroy(stream_);
  copy_stream_ = stream_ = nullptr;
}

std::string CudaBackend::name() const { return "cuda"; }

void CudaBackend::use_device() const {
  // Every entry point sets its device first: the thread that calls may not be the one that built
  // the backend (a worker group's member threads, the predictor's workers, a server's thread), or
  // may have used another GPU since (a group worker builds one backend per GPU in a loop). A
  // launch into this backend's streams, or an allocation, from another current device would fail
  // or land on the wrong GPU. cudaSetDevice to the current device costs next to nothing.
  TANDEM_CUDA_CHECK(cudaSetDevice(options_.device));
}

void CudaBackend::synchronize() {
  use_device();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(copy_stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

void CudaBackend::set_parameters(const Model& model) {
  if (model.config().layers != config_.layers)
    throw InputError("model " + model.config().describe() + " does not match the backend's " +
                     config_.describe());
  use_device();
  // Every call that copies from or into the pinned arena waits for the copy before it returns,
  // so the arena is free here; a step still queued reads params_, which the copy waits for.
  copy_tensors_in(model.parameters(), layout_, host_parameters_, "parameters");
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(params_.data(), host_parameters_, params_.bytes(),
                                    cudaMemcpyHostToDevice, stream_));
  synchronize();
}

void CudaBackend::set_parameters(const ParameterRuns& runs) {
  use_device();
  copy_runs_in(runs, layout_, host_parameters_, "parameters");  // checks all before it writes
  // Only what the runs cover changes, as on the CPU backend: each run's values go from the
  // pinned arena to their place on the device (a handful of copies: a run per tensor part).
  for (const auto& run : runs.runs) {
    const int64_t at = layout_.entries[run.tensor].offset + run.offset;
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(params_.data() + at, host_parameters_ + at,
                                      sizeof(float) * static_cast<size_t>(run.count),
                                      cudaMemcpyHostToDevice, stream_));
  }
  synchronize();
}

void CudaBackend::get_parameters(Model& model) const {
  use_device();
  if (model.config().layers != config_.layers) model = Model(config_);
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_parameters_, params_.data(), params_.bytes(),
                                    cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  copy_tensors_out(layout_, host_parameters_, model.parameters(), "");
}

void CudaBackend::get_gradients(std::vector<NamedTensor>& out) const {
  // Once per step for a cluster worker: into the pinned arena kept for it, then the tensors.
  use_device();
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(host_gradients_, grads_.data(), grads_.bytes(),
                                    cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  copy_tensors_out(layout_, host_gradients_, out, "");
}

void CudaBackend::set_optimizer_state(const OptimizerState& state, int64_t step) {
  use_device();
  if (step < 0) throw InputError("optimizer step must be >= 0, got " + std::to_string(step));
  std::vector<float> m, v;
  if (optimizer_.kind == OptimizerKind::Adam) {
    m.assign(static_cast<size_t>(layout_.total), 0.0f);
    v.assign(static_cast<size_t>(layout_.total), 0.0f);
    copy_tensors_in(state.m, layout_, m.data(), "Adam first moments");
    copy_tensors_in(state.v, layout_, v.data(), "Adam second moments");
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(adam_m_.data(), m.data(), adam_m_.bytes(),
                                      cudaMemcpyHostToDevice, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(adam_v_.data(), v.data(), adam_v_.bytes(),
                                      cudaMemcpyHostToDevice, stream_));
  }
  const kernels::AdamDeviceStep device_step{
      step, step > 0 ? kernels::adam_step_size(hyper_of(optimizer_), step) : 0.0f};
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(adam_step_.data(), &device_step, sizeof(device_step),
                                    cudaMemcpyHostToDevice, stream_));
  synchronize();
  step_ = step;
}

void CudaBackend::get_optimizer_state(OptimizerState& state) const {
  use_device();
  state = OptimizerState{};
  if (optimizer_.kind != OptimizerKind::Adam) return;
  std::vector<float> m(static_cast<size_t>(layout_.total)), v(static_cast<size_t>(layout_.total));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(m.data(), adam_m_.data(), adam_m_.bytes(),
                                    cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(v.data(), adam_v_.data(), adam_v_.bytes(),
                                    cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  copy_tensors_out(layout_, m.data(), state.m, "");
  copy_tensors_out(layout_, v.data(), state.v, "");
}

void CudaBackend::check_data(const DatasetView& data, bool need_labels) const {
  check_model_data(config_, data, need_labels);
}

void CudaBackend::ensure_capacity(int64_t rows) {
  if (rows <= capacity_) return;
  synchronize();  // queued work may still read the buffers about to be replaced
  clear_graphs();  // captured graphs point at them
  // Round up so a run whose batch sizes vary a little does not reallocate at every new size.
  int64_t capacity = 1;
  while (capacity < rows) capacity *= 2;
  const auto cap = static_cast<size_t>(capacity);
  // reserve frees each old buffer before its new one is made: growing near the device's limit
  // needs room for the new sizes, not for the old and the new together. Until every buffer is
  // made the capacity is none, so a growth that failed part-way is tried again, never taken
  // for done (with some buffers freed).
  capacity_ = 0;
  for (size_t l = 0; l < config_.layers.size(); ++l) {
    activations_[l].reserve(cap * static_cast<size_t>(config_.layers[l]));
    // No gradient is taken for the input images, so layer 0 has no delta buffer.
    if (l > 0) deltas_[l].reserve(cap * static_cast<size_t>(config_.layers[l]));
  }
  batch_labels_.reserve(cap);
  predictions_.reserve(cap);
  partials_.reserve(static_cast<size_t>(kernels::softmax_xent_partials_needed(capacity)));
  dense_->reserve_rows(capacity);
  capacity_ = capacity;
  synchronize();
}

const CudaBackend::Resident* CudaBackend::find_resident(const DatasetView& data,
                                                        int64_t& first_row) const {
  for (const auto& r : resident_) {
    const DatasetView& h = r->host;
    if (h.pixel_type != data.pixel_type || h.features != data.features) continue;
    const auto* base = static_cast<const uint8_t*>(h.pixels);
    const auto* p = static_cast<const uint8_t*>(data.pixels);
    const int64_t row_bytes = h.features * static_cast<int64_t>(h.pixel_bytes());
    if (p < base || p >= base + h.rows * row_bytes || (p - base) % row_bytes != 0) continue;
    const int64_t first = (p - base) / row_bytes;
    if (first + data.rows > h.rows) continue;
    if (data.labels != nullptr && (h.labels == nullptr || data.labels != h.labels + first)) continue;
    first_row = first;
    return r.get();
  }
  return nullptr;
}

void CudaBackend::keep_resident(const DatasetView& data) {
  use_device();
  if (data.rows == 0) return;
  int64_t first = 0;
  const Resident* existing = find_resident(data, first);
  if (existing != nullptr && existing->host.rows == data.rows && first == 0) return;
  auto r = std::make_unique<Resident>();
  r->host = data;
  const size_t pixel_bytes = static_cast<size_t>(data.rows * data.features) * data.pixel_bytes();
  // Residency is a hint: a data set that fits in host memory but not on the device is staged
  // batch by batch instead, as data that was never made resident is, not a failed run.
  r->pixels = kernels::DeviceBuffer<uint8_t>::if_memory(pixel_bytes);
  if (data.labels != nullptr)
    r->labels = kernels::DeviceBuffer<uint8_t>::if_memory(static_cast<size_t>(data.rows));
  if (r->pixels.size() != pixel_bytes || (data.labels != nullptr && r->labels.size() == 0)) {
    std::fprintf(stderr,
                 "tandem: %lld rows (%.1f MB) do not fit on GPU %d beside the model: their "
                 "batches are copied to it step by step instead\n",
                 static_cast<long long>(data.rows), double(pixel_bytes) / 1e6, options_.device);
    return;
  }
  // On the compute stream, not with cudaMemcpy: that one runs on the legacy default stream, which
  // the non-blocking streams do not wait for, and from pageable memory it may return before its
  // last transfer lands; a step queued next could read a partly copied array. The wait at the end
  // also lets the caller free or change its host copy at once.
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(r->pixels.data(), data.pixels, pixel_bytes,
                                    cudaMemcpyHostToDevice, stream_));
  if (data.labels != nullptr) {
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(r->labels.data(), data.labels,
                                      static_cast<size_t>(data.rows), cudaMemcpyHostToDevice,
                                      stream_));
  }
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  resident_.push_back(std::move(r));
}

void CudaBackend::release_resident() {
  synchronize();
  clear_graphs();
  resident_.clear();
}

CudaBackend::DeviceBatch CudaBackend::stage(const DatasetView& data, const int32_t* rows,
                                            int64_t count, Slot*& slot, bool for_graph) {
  Slot& s = slots_[next_slot_];
  next_slot_ ^= 1;
  slot = &s;
  DeviceBatch batch;
  batch.pixel_type = data.pixel_type;
  batch.n = count;
  const size_t row_bytes = static_cast<size_t>(data.features) * data.pixel_bytes();
  int64_t first = 0;
  const Resident* resident = find_resident(data, first);
  if (for_graph && options_.use_graphs && resident && rows == nullptr &&
      count < resident->host.rows && first + count <= INT32_MAX) {
    // A slice of resident data (training without shuffle: every batch another slice) is staged
    // as a row list over the whole array, so the batch's device addresses, and with them the
    // CUDA graph it runs in, stay the same from batch to batch. Keyed on the slice's own address
    // it would capture a graph for every batch of the epoch and keep them all.
    slice_rows_.resize(static_cast<size_t>(count));
    std::iota(slice_rows_.begin(), slice_rows_.end(), static_cast<int32_t>(first));
    rows = slice_rows_.data();
    first = 0;
  }

  // Growing a slot replaces its buffers: nothing queued may still read them.
  const bool slot_too_small =
      (resident && rows && s.rows.size() < static_cast<size_t>(count)) ||
      (!resident && (s.pixels.size() < row_bytes * count || s.labels.size() < static_cast<size_t>(count)));
  if (slot_too_small) {
    synchronize();
    clear_graphs();
    if (resident) {
      s.rows.reserve(static_cast<size_t>(count));
    } else {
      s.pixels.reserve(row_bytes * static_cast<size_t>(count));
      s.labels.reserve(static_cast<size_t>(count));
    }
  }
  // The step that last read this slot must be done before its buffers are overwritten.
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(copy_stream_, s.used, 0));
  if (resident) {
    batch.pixels = resident->pixels.data() + static_cast<size_t>(first) * row_bytes;
    batch.labels = data.labels ? resident->labels.data() + first : nullptr;
    if (rows) {
      // The pinned staging buffer was last read by this slot's copy two steps ago; that copy is
      // long done unless the host runs far ahead, in which case waiting here is the brake.
      TANDEM_CUDA_CHECK(cudaEventSynchronize(s.copied));
      const size_t bytes = sizeof(int32_t) * static_cast<size_t>(count);
      void* staged = s.host_rows.reserve(bytes);
      std::memcpy(staged, rows, bytes);
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(s.rows.data(), staged, bytes, cudaMemcpyHostToDevice,
                                        copy_stream_));
      batch.rows = s.rows.data();
    }
    TANDEM_CUDA_CHECK(cudaEventRecord(s.copied, copy_stream_));
    TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, s.copied, 0));
    return batch;
  }
  // Not resident: the rows themselves go to the slot.
  const void* pixels_from = data.pixels;
  const uint8_t* labels_from = data.labels;
  if (rows) {
    // A row list over host data: gather the rows on the host into this slot's pinned staging
    // (the device sees a contiguous batch), to be sent in one copy that nothing waits for. The
    // staging was last read by this slot's copy two steps ago, long done unless the host runs
    // far ahead (then waiting here is the brake).
    TANDEM_CUDA_CHECK(cudaEventSynchronize(s.copied));
    const size_t pixel_bytes = row_bytes * static_cast<size_t>(count);
    auto* gathered = static_cast<uint8_t*>(
        s.host_gather.reserve(pixel_bytes + static_cast<size_t>(count)));
    uint8_t* gathered_labels = gathered + pixel_bytes;
    const auto* src = static_cast<const uint8_t*>(data.pixels);
    for (int64_t i = 0; i < count; ++i) {
      std::memcpy(gathered + static_cast<size_t>(i) * row_bytes,
                  src + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
      if (data.labels) gathered_labels[i] = data.labels[rows[i]];
    }
    pixels_from = gathered;
    labels_from = data.labels ? gathered_labels : nullptr;
  }
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(s.pixels.data(), pixels_from, row_bytes * count,
                                    cudaMemcpyHostToDevice, copy_stream_));
  if (labels_from)
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(s.labels.data(), labels_from, static_cast<size_t>(count),
                                      cudaMemcpyHostToDevice, copy_stream_));
  batch.pixels = s.pixels.data();
  batch.labels = labels_from ? s.labels.data() : nullptr;
  TANDEM_CUDA_CHECK(cudaEventRecord(s.copied, copy_stream_));
  // A contiguous batch is copied from the caller's memory, which the caller may reuse as soon as
  // this returns: wait for the copies (not for the compute stream, which keeps running the
  // previous step meanwhile). A gathered batch's host reads are done already.
  if (!rows) TANDEM_CUDA_CHECK(cudaEventSynchronize(s.copied));
  TANDEM_CUDA_CHECK(cudaStreamWaitEvent(stream_, s.copied, 0));
  return batch;
}

void CudaBackend::enqueue_forward(const DeviceBatch& batch) {
  const size_t num_layers = config_.layers.size() - 1;
  if (batch.pixel_type == PixelType::UInt8)
    kernels::gather_rows_u8_cuda(static_cast<const uint8_t*>(batch.pixels), config_.inputs(),
                                 batch.rows, batch.n, activations_[0].data(), batch.labels,
                                 batch.labels ? batch_labels_.data() : nullptr, stream_);
  else
    kernels::gather_rows_f32_cuda(static_cast<const float*>(batch.pixels), config_.inputs(),
                                  batch.rows, batch.n, activations_[0].data(), batch.labels,
                                  batch.labels ? batch_labels_.data() : nullptr, stream_);
  for (size_t l = 0; l < num_layers; ++l)
    dense_->forward(activations_[l].data(), params_.data() + layout_.weight(l).offset,
                    params_.data() + layout_.bias(l).offset, activations_[l + 1].data(), batch.n,
                    config_.layers[l], config_.layers[l + 1], l + 1 < num_layers);
}

void CudaBackend::enqueue_forward_backward(const DeviceBatch& batch, kernels::DeviceStats* totals,
                                           const std::vector<cudaEvent_t>* layer_ready) {
  const size_t num_layers = config_.layers.size() - 1;
  enqueue_forward(batch);
  kernels::softmax_xent_cuda(activations_[num_layers].data(), batch_labels_.data(),
                             deltas_[num_layers].data(), nullptr, batch.n, config_.classes(),
                             partials_.data(), totals, stream_);
  float* grads = grads_.data();
  for (size_t l = num_layers; l-- > 0;) {
    dense_->backward_params(activations_[l].data(), deltas_[l + 1].data(),
                            grads + layout_.weight(l).offset, grads + layout_.bias(l).offset,
                            batch.n, config_.layers[l], config_.layers[l + 1],
                            /*accumulate=*/false);
    if (layer_ready) TANDEM_CUDA_CHECK(cudaEventRecord((*layer_ready)[l], stream_));
    if (l > 0)
      dense_->backward_input_relu(deltas_[l + 1].data(), params_.data() + layout_.weight(l).offset,
                                  activations_[l].data(), deltas_[l].data(), batch.n,
                                  config_.layers[l], config_.layers[l + 1]);
  }
}

void CudaBackend::enqueue_optimizer() {
  const auto total = layout_.total;
  if (optimizer_.kind == OptimizerKind::Adam) {
    const kernels::AdamHyper hyper = hyper_of(optimizer_);
    kernels::adam_advance_step_cuda(adam_step_.data(), hyper, stream_);
    kernels::adam_update_cuda(params_.data(), adam_m_.data(), adam_v_.data(), grads_.data(), total,
                              adam_step_.data(), hyper, stream_);
  } else {
    kernels::sgd_update_cuda(params_.data(), grads_.data(), total, optimizer_.learning_rate,
                             stream_);
  }
}

void CudaBackend::enqueue_train_step(const DeviceBatch& batch) {
  enqueue_forward_backward(batch, train_totals_.data());
  enqueue_optimizer();
}

void CudaBackend::launch_train_step(const DeviceBatch& batch) {
  if (!options_.use_graphs) {
    enqueue_train_step(batch);
    return;
  }
  const GraphKey key{batch.pixels, batch.labels, batch.rows, batch.n,
                     static_cast<int>(batch.pixel_type), true};
  if (auto found = graphs_.find(key); found != graphs_.end()) {
    TANDEM_CUDA_CHECK(cudaGraphLaunch(found->second, stream_));
    return;
  }
  // A new shape runs eagerly once: cuBLASLt chooses its algorithms then, outside any capture.
  if (eager_runs_[key]++ == 0) {
    enqueue_train_step(batch);
    return;
  }
  TANDEM_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
  cudaGraph_t graph = nullptr;
  try {
    enqueue_train_step(batch);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // leave the stream usable
    if (graph) cudaGraphDestroy(graph);
    throw;
  }
  TANDEM_CUDA_CHECK(cudaStreamEndCapture(stream_, &graph));
  cudaGraphExec_t exec = nullptr;
  const cudaError_t status = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  TANDEM_CUDA_CHECK(status);
  graphs_.emplace(key, exec);
  TANDEM_CUDA_CHECK(cudaGraphLaunch(exec, stream_));
}

void CudaBackend::clear_graphs() {
  // Out of the map before any is destroyed: a failure part way must not leave destroyed graphs
  // behind for the destructor to destroy again. Every graph is destroyed; the first error is
  // reported after.
  auto graphs = std::move(graphs_);
  graphs_.clear();
  eager_runs_.clear();
  cudaError_t destroy_status = cudaSuccess;
  for (auto& [key, exec] : graphs) {
    const cudaError_t status = cudaGraphExecDestroy(exec);
    if (destroy_status == cudaSuccess) destroy_status = status;
  }
  TANDEM_CUDA_CHECK(destroy_status);  // the first cudaGraphExecDestroy that failed
}

void CudaBackend::queue_read_and_reset(kernels::DeviceStats* totals,
                                       kernels::DeviceStats* into) {
  TANDEM_CUDA_CHECK(cudaMemcpyAsync(into, totals, sizeof(kernels::DeviceStats),
                                    cudaMemcpyDeviceToHost, stream_));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(totals, 0, sizeof(kernels::DeviceStats), stream_));
}

kernels::DeviceStats CudaBackend::read_and_reset(kernels::DeviceStats* totals) {
  queue_read_and_reset(totals, host_totals_);
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return *host_totals_;
}

void CudaBackend::check_batch(const DatasetView& data, const int32_t* rows, int64_t count,
                              int64_t min_count) const {
  if (count > 0) check_data(data, true);  // an empty batch need not fit (a group's idle member)
  if (count < min_count)
    throw InputError("batch of " + std::to_string(count) + " rows from a view of " +
                     std::to_string(data.rows));
  check_batch_rows(data, rows, count, config_.classes());
}

void CudaBackend::queue_gradients(const DatasetView& data, const int32_t* rows, int64_t count,
                                  const std::vector<cudaEvent_t>* layer_ready) {
  use_device();
  ensure_capacity(count);
  Slot* slot = nullptr;
  const DeviceBatch batch = stage(data, rows, count, slot);
  enqueue_forward_backward(batch, call_totals_.data(), layer_ready);
  TANDEM_CUDA_CHECK(cudaEventRecord(slot->used, stream_));
}

void CudaBackend::queue_zero_gradients() {
  use_device();
  TANDEM_CUDA_CHECK(cudaMemsetAsync(grads_.data(), 0, grads_.bytes(), stream_));
}

BatchStats CudaBackend::compute_gradients(const DatasetView& data, const int32_t* rows,
                                          int64_t count) {
  check_batch(data, rows, count);
  if (count == 0) {
    // No rows, zero gradients, as the CPU twin leaves them: the last batch's, kept, would be
    // read back (get_gradients) or applied (apply_gradients) a second time.
    queue_zero_gradients();
    return {};
  }
  queue_gradients(data, rows, count, nullptr);
  const kernels::DeviceStats totals = read_and_reset(call_totals_.data());
  return {totals.loss_sum, totals.correct, count};
}

Backend::DeviceBuffers CudaBackend::device_buffers() {
  synchronize();
  return {options_.device, params_.data(), grads_.data(), layout_.total};
}

const std::vector<Backend::GradientPiece>& CudaBackend::enqueue_gradients(const DatasetView& data,
                                                                          const int32_t* rows,
                                                                          int64_t count) {
  check_batch(data, rows, count);
  // A call after one that was never finished (its group failed, and a hung GPU must not hang
  // the caller in a wait) is ordered after it on the stream; finish_gradients reports this one.
  if (count == 0) {
    // No batch for this member: zero gradients, ready in the same pieces as a real step's.
    queue_zero_gradients();
    for (size_t l = layer_ready_.size(); l-- > 0;)
      TANDEM_CUDA_CHECK(cudaEventRecord(layer_ready_[l], stream_));
  } else {
    queue_gradients(data, rows, count, &layer_ready_);
    queue_read_and_reset(call_totals_.data(), host_totals_ + 1);
  }
  queued_rows_ = count;
  return gradient_pieces_;
}

BatchStats CudaBackend::finish_gradients() {
  if (queued_rows_ < 0)
    throw InputError("CUDA backend: finish_gradients called with no enqueue_gradients before it");
  const int64_t rows = std::exchange(queued_rows_, -1);
  use_device();
  TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (rows == 0) return {};
  return {host_totals_[1].loss_sum, host_totals_[1].correct, rows};
}

void CudaBackend::apply_gradients() {
  use_device();
  enqueue_optimizer();
  ++step_;
}

void CudaBackend::train_step(const DatasetView& data, const int32_t* rows, int64_t count) {
  use_device();
  check_batch(data, rows, count, 1);
  ensure_capacity(count);
  Slot* slot = nullptr;
  const DeviceBatch batch = stage(data, rows, count, slot, /*for_graph=*/true);
  launch_train_step(batch);
  TANDEM_CUDA_CHECK(cudaEventRecord(slot->used, stream_));
  pending_samples_ += count;
  ++step_;
}

BatchStats CudaBackend::take_stats() {
  use_device();
  const kernels::DeviceStats totals = read_and_reset(train_totals_.data());
  return {totals.loss_sum, totals.correct, std::exchange(pending_samples_, 0)};
}

BatchStats CudaBackend::evaluate(const DatasetView& data) {
  use_device();
  check_data(data, true);
  check_batch_rows(data, nullptr, data.rows, config_.classes());
  ensure_capacity(std::min(data.rows, kEvalChunkRows));
  TANDEM_CUDA_CHECK(cudaMemsetAsync(call_totals_.data(), 0, sizeof(kernels::DeviceStats), stream_));
  for (int64_t begin = 0; begin < data.rows; begin += kEvalChunkRows) {
    const int64_t end = std::min(data.rows, begin + kEvalChunkRows);
    Slot* slot = nullptr;
    const DeviceBatch batch = stage(data.slice(begin, end), nullptr, end - begin, slot);
    enqueue_forward(batch);
    const size_t num_layers = config_.layers.size() - 1;
    kernels::softmax_xent_cuda(activations_[num_layers].data(), batch_labels_.data(), nullptr,
                               nullptr, batch.n, config_.classes(), partials_.data(),
                               call_totals_.data(), stream_);
    TANDEM_CUDA_CHECK(cudaEventRecord(slot->used, stream_));
  }
  const kernels::DeviceStats totals = read_and_reset(call_totals_.data());
  return {totals.loss_sum, totals.correct, data.rows};
}

void CudaBackend::predict(const DatasetView& data, uint8_t* out) {
  predict_pieces(data, out, nullptr);
}

void CudaBackend::predict_logits(const DatasetView& data, uint8_t* classes, float* logits) {
  predict_pieces(data, classes, logits);
}

void CudaBackend::predict_pieces(const DatasetView& data, uint8_t* classes, float* logits) {
  check_data(data, false);
  use_device();
  ensure_capacity(std::min(data.rows, kEvalChunkRows));
  const size_t num_layers = config_.layers.size() - 1;
  const auto num_classes = static_cast<size_t>(config_.classes());
  for (int64_t begin = 0; begin < data.rows; begin += kEvalChunkRows) {
    const int64_t end = std::min(data.rows, begin + kEvalChunkRows);
    DatasetView piece = data.slice(begin, end);
    piece.labels = nullptr;  // prediction needs none
    Slot* slot = nullptr;
    const DeviceBatch batch = stage(piece, nullptr, end - begin, slot);
    enqueue_forward(batch);
    // The classes come from the device's arg-max of the very logits copied back below, so with
    // or without logits they are the same bits (first maximum wins, as on the CPU).
    kernels::argmax_rows_cuda(activations_[num_layers].data(), predictions_.data(), batch.n,
                              config_.classes(), stream_);
    TANDEM_CUDA_CHECK(cudaEventRecord(slot->used, stream_));
    TANDEM_CUDA_CHECK(cudaMemcpyAsync(classes + begin, predictions_.data(),
                                      static_cast<size_t>(batch.n), cudaMemcpyDeviceToHost,
                                      stream_));
    if (logits != nullptr)
      TANDEM_CUDA_CHECK(cudaMemcpyAsync(logits + static_cast<size_t>(begin) * num_classes,
                                        activations_[num_layers].data(),
                                        sizeof(float) * static_cast<size_t>(batch.n) * num_classes,
                                        cudaMemcpyDeviceToHost, stream_));
    // The next piece overwrites predictions_ and the logits: this one's must have arrived first.
    TANDEM_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
}

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig& model, const OptimizerConfig& opt,
                                           Precision precision, int device) {
  CudaBackendOptions options;
  options.device = device;
  options.precision = precision;
  return std::make_unique<CudaBackend>(model, opt, options);
}

}  // namespace tandem
