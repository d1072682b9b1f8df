// The CPU backend.
//
// Data-parallel inside one process: each thread takes a contiguous share of the batch's rows and
// walks it in blocks of `block_rows` (gather + uint8->float, forward, loss, backward), adding into
// its own gradient arena with single-threaded sgemm calls. A block's inputs are still in cache
// when its weight gradient is taken, no thread ever waits on another inside a step, and the
// partial gradients are summed inside the optimizer's one sweep over the parameters. Threads are
// joined in a fixed order, so the same thread count gives the same bits. Evaluation and prediction
// share out whole blocks, so a row's logits are the same bits whatever the thread count.
#pragma once

#include <memory>
#include <vector>

#include "aligned_buffer.h"
#include "backend.h"
#include "parameter_layout.h"
#include "thread_pool.h"

namespace tandem {

class CpuBackend final : public Backend {
 public:
  static constexpr int64_t kDefaultBlockRows = 128;

  CpuBackend(const ModelConfig& model, const OptimizerConfig& opt, int threads,
             int64_t block_rows = kDefaultBlockRows);

  std::string name() const override { return "cpu"; }
  int threads() const override { return pool_.size(); }
  void set_parameters(const Model& model) override;
  void set_parameters(const ParameterRuns& runs) override;
  void get_parameters(Model& model) const override;
  void set_optimizer_state(const OptimizerState& state, int64_t step) override;
  void get_optimizer_state(OptimizerState& state) const override;
  int64_t step() const override { return step_; }
  BatchStats compute_gradients(const DatasetView& data, const int32_t* rows,
                               int64_t count) override;
  void apply_gradients() override;
  void rest() override { pool_.rest(); }
  BatchStats evaluate(const DatasetView& data) override;
  void predict(const DatasetView& data, uint8_t* out) override;
  void predict_logits(const DatasetView& data, uint8_t* classes, float* logits) override;

  // The summed gradient of the last compute_gradients(), in the model's tensor order.
  void get_gradients(std::vector<NamedTensor>& out) const override;

 private:
  // One thread's scratch space, sized for one block of rows.
  struct Workspace {
    std::vector<AlignedBuffer<float>> activations;  // [0]: input block, [l]: output of layer l
    std::vector<AlignedBuffer<float>> deltas;       // [l]: loss gradient w.r.t. layer l's output
    AlignedBuffer<uint8_t> labels;
    AlignedBuffer<float> gradients;  // this thread's partial gradient arena
    BatchStats stats;
  };

  void check_data(const DatasetView& data, bool need_labels) const;
  // Forward pass of rows [begin, end) of (data, rows) through the block loop; `backward` also
  // accumulates gradients, `predictions` (if set) receives arg-max classes and `logits` (if set)
  // the last layer's outputs, [count, classes].
  void run_rows(Workspace& ws, const DatasetView& data, const int32_t* rows, int64_t begin,
                int64_t end, bool backward, uint8_t* predictions, float* logits = nullptr);
  void forward_block(Workspace& ws, int64_t n);
  // Splits `count` rows across the threads, runs run_rows on each share and sums the stats.
  BatchStats run_partitioned(const DatasetView& data, const int32_t* rows, int64_t count,
                             bool backward, uint8_t* predictions, float* logits = nullptr);

  ModelConfig config_;
  OptimizerConfig optimizer_;
  ParameterLayout layout_;
  int64_t block_rows_;
  ThreadPool pool_;
  AlignedBuffer<float> params_;
  AlignedBuffer<float> adam_m_;
  AlignedBuffer<float> adam_v_;
  std::vector<Workspace> workspaces_;
  std::vector<const float*> gradient_parts_;
  int64_t step_ = 0;
};

}  // namespace tandem
