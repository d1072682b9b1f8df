// The CUDA backend.
//
// Parameters, gradients and Adam's moments live in three device arenas laid out as the CPU
// backend's (one ParameterLayout), so one optimizer launch covers every tensor. Each step runs on
// one compute stream: gather + uint8->float, forward, fused softmax/cross-entropy, backward, Adam.
// After a shape's first (eager) step, the whole step is captured once as a CUDA Graph and
// replayed; the step counter and Adam's step size live on the device, so a replay needs nothing
// from the host. Batches that are not resident on the device are copied on a second stream into
// one of two device slots, so the copy of step k+1 overlaps step k's compute. The host waits only
// for those copies (so the caller may reuse its buffer at once), or when it asks for the loss.
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "backend.h"
#include "cuda/adam_cuda.h"
#include "cuda/dense_cuda.h"
#include "cuda/device_buffer.h"
#include "cuda/softmax_xent_cuda.h"
#include "parameter_layout.h"

namespace tandem {

struct CudaBackendOptions {
  int device = 0;
  Precision precision = Precision::Fp32;
  bool use_graphs = true;  // false: every step launched eagerly (TANDEM_CUDA_GRAPHS=0 too)
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(const ModelConfig& model, const OptimizerConfig& opt, const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override;
  int threads() const override { return 1; }
  void set_parameters(const Model& model) override;
  void set_parameters(const ParameterRuns& runs) override;
  void get_parameters(Model& model) const override;
  void set_optimizer_state(const OptimizerState& state, int64_t step) override;
  void get_optimizer_state(OptimizerState& state) const override;
  int64_t step() const override { return step_; }
  BatchStats compute_gradients(const DatasetView& data, const int32_t* rows,
                               int64_t count) override;
  void apply_gradients() override;
  void get_gradients(std::vector<NamedTensor>& out) const override;
  void train_step(const DatasetView& data, const int32_t* rows, int64_t count) override;
  BatchStats take_stats() override;
  void keep_resident(const DatasetView& data) override;
  void release_resident() override;
  BatchStats evaluate(const DatasetView& data) override;
  void predict(const DatasetView& data, uint8_t* out) override;
  // predict() plus the last layer's outputs, copied back beside the classes (one backend may be
  // called in turn from several threads; not at the same time).
  void predict_logits(const DatasetView& data, uint8_t* classes, float* logits) override;
  // A worker group summing on GPUs (backend.h): the arenas, and the gradients queued with one
  // event per layer recorded as the backward pass finishes that layer.
  DeviceBuffers device_buffers() override;
  const std::vector<GradientPiece>& enqueue_gradients(const DatasetView& data,
                                                      const int32_t* rows,
                                                      int64_t count) override;
  BatchStats finish_gradients() override;

  // Waits for all queued work (a benchmark's timer, or before reading results).
  void synchronize();
  // Graphs captured so far (tests check that replay is used).
  size_t graphs_captured() const { return graphs_.size(); }

 private:
  // The constructor's streams, events, pinned memory, kernels and arenas; release_device_state
  // frees whatever of them exists (after a failed create_device_state too).
  void create_device_state();
  void release_device_state() noexcept;
  void use_device() const;  // makes options_.device the calling thread's current device
  void queue_zero_gradients();  // the gradient arena set to 0 on the stream (a batch of no rows)
  // Where a batch's pixels and labels are on the device, and which rows to take.
  struct DeviceBatch {
    PixelType pixel_type = PixelType::UInt8;
    const void* pixels = nullptr;
    const uint8_t* labels = nullptr;
    const int32_t* rows = nullptr;  // device row list, or null for rows 0..n-1
    int64_t n = 0;
  };
  // A data set copied to the device by keep_resident().
  struct Resident {
    DatasetView host;
    kernels::DeviceBuffer<uint8_t> pixels;
    kernels::DeviceBuffer<uint8_t> labels;
  };
  // Page-locked host memory that grows on demand (its old contents are not kept).
  struct PinnedStaging {
    void* data = nullptr;
    size_t capacity = 0;
    void* reserve(size_t bytes);  // throws on a CUDA error
    void release() noexcept;
  };
  // One of the two device slots a non-resident batch (or a row list) is copied into.
  struct Slot {
    kernels::DeviceBuffer<uint8_t> pixels;
    kernels::DeviceBuffer<uint8_t> labels;
    kernels::DeviceBuffer<int32_t> rows;
    // Pinned staging, so a copy from it is queued without the host waiting for it: a row list
    // over resident data, or the rows a row list picks from host data (then their labels).
    PinnedStaging host_rows;
    PinnedStaging host_gather;
    cudaEvent_t copied = nullptr;  // on the copy stream: the slot's data has arrived
    cudaEvent_t used = nullptr;    // on the compute stream: the step reading the slot is done
  };
  using GraphKey = std::tuple<const void*, const void*, const void*, int64_t, int, bool>;

  void check_data(const DatasetView& data, bool need_labels) const;
  void ensure_capacity(int64_t rows);
  // Puts `count` rows of (data, rows) where the device can read them: a resident view plus a
  // row list (staged in pinned memory and queued, so the host does not wait), or the rows
  // themselves uploaded into the next slot: a row list's rows gathered into pinned memory and
  // queued, a contiguous batch copied from the caller's memory (returning once the copy has read
  // it, so the caller may reuse it).
  // for_graph: the batch runs in a CUDA graph (train_step), keyed on its device addresses.
  DeviceBatch stage(const DatasetView& data, const int32_t* rows, int64_t count, Slot*& slot,
                    bool for_graph = false);
  const Resident* find_resident(const DatasetView& data, int64_t& first_row) const;
  void enqueue_forward(const DeviceBatch& batch);
  // predict() and predict_logits(): the classes of every row, and its logits unless null.
  void predict_pieces(const DatasetView& data, uint8_t* classes, float* logits);
  // With layer_ready (one event per layer), each is recorded once its layer's gradients are
  // written (enqueue_gradients); null for the training step and its graphs.
  void enqueue_forward_backward(const DeviceBatch& batch, kernels::DeviceStats* totals,
                                const std::vector<cudaEvent_t>* layer_ready = nullptr);
  void enqueue_optimizer();
  void enqueue_train_step(const DeviceBatch& batch);
  void launch_train_step(const DeviceBatch& batch);
  void clear_graphs();
  // Queues the copy of `totals` into `into` (pinned) and their reset; read_and_reset queues it
  // into host_totals_[0] and waits.
  void queue_read_and_reset(kernels::DeviceStats* totals, kernels::DeviceStats* into);
  kernels::DeviceStats read_and_reset(kernels::DeviceStats* totals);
  // The checks of a batch of `count` rows (at least `min_count`; an empty one need not fit the
  // model): compute_gradients, enqueue_gradients and train_step.
  void check_batch(const DatasetView& data, const int32_t* rows, int64_t count,
                   int64_t min_count = 0) const;
  // Stages `count` (> 0) rows and queues their forward and backward pass (layer_ready: as in
  // enqueue_forward_backward), the batch's statistics added to call_totals_.
  void queue_gradients(const DatasetView& data, const int32_t* rows, int64_t count,
                       const std::vector<cudaEvent_t>* layer_ready);

  ModelConfig config_;
  OptimizerConfig optimizer_;
  CudaBackendOptions options_;
  ParameterLayout layout_;
  cudaStream_t stream_ = nullptr;       // all compute
  cudaStream_t copy_stream_ = nullptr;  // host-to-device copies of batches and row lists
  std::unique_ptr<kernels::DenseCuda> dense_;

  kernels::DeviceBuffer<float> params_, grads_, adam_m_, adam_v_;
  // Pinned host copies of the parameter arena: what set_parameters uploads and get_parameters
  // reads back, and what get_gradients reads back (apart: each is used by its own calls only).
  float* host_parameters_ = nullptr;
  float* host_gradients_ = nullptr;
  kernels::DeviceBuffer<kernels::AdamDeviceStep> adam_step_;
  kernels::DeviceBuffer<kernels::DeviceStats> train_totals_, call_totals_;
  kernels::DeviceStats* host_totals_ = nullptr;  // pinned, two, for reading totals back
  // enqueue_gradients: per layer, recorded when the backward pass has written its gradients;
  // the rows queued, for finish_gradients' statistics (-1: nothing queued).
  std::vector<cudaEvent_t> layer_ready_;
  std::vector<GradientPiece> gradient_pieces_;  // what enqueue_gradients returns, set up once
  int64_t queued_rows_ = -1;

  int64_t capacity_ = 0;  // rows the buffers below hold
  std::vector<kernels::DeviceBuffer<float>> activations_;  // [0] input, [l] layer l's output
  std::vector<kernels::DeviceBuffer<float>> deltas_;
  kernels::DeviceBuffer<uint8_t> batch_labels_;
  kernels::DeviceBuffer<uint8_t> predictions_;
  kernels::DeviceBuffer<kernels::SoftmaxXentPartial> partials_;

  Slot slots_[2];
  int next_slot_ = 0;
  std::vector<std::unique_ptr<Resident>> resident_;
  std::vector<int32_t> slice_rows_;   // a slice of resident data as a row list (stage)

  std::map<GraphKey, cudaGraphExec_t> graphs_;
  std::map<GraphKey, int> eager_runs_;  // a shape runs eagerly once (warm-up) before capture

  int64_t step_ = 0;
  int64_t pending_samples_ = 0;
};

}  // namespace tandem
