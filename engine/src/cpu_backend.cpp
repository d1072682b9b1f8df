#include "cpu_backend.h"

#include <cblas.h>

#include <algorithm>

#include "cpu/adam_cpu.h"
#include "cpu/convert_cpu.h"
#include "cpu/dense_cpu.h"
#include "cpu/softmax_xent_cpu.h"
#include "parameter_arena.h"
#include "tandem/error.h"

namespace tandem {

namespace {

int resolve_threads(int threads) {
  // A negative count ran on every core, silently (Model.evaluate(threads=-1), say), where
  // training refuses it.
  if (threads < 0) throw InputError("threads must be >= 0, got " + std::to_string(threads));
  return threads > 0 ? threads : ThreadPool::available_cores();
}

}  // namespace

CpuBackend::CpuBackend(const ModelConfig& model, const OptimizerConfig& opt, int threads,
                       int64_t block_rows)
    : config_(model),
      optimizer_(opt),
      layout_(ParameterLayout::for_model(model)),
      block_rows_(block_rows),
      pool_(resolve_threads(threads)),
      params_(static_cast<size_t>(layout_.total)),
      adam_m_(static_cast<size_t>(layout_.total)),
      adam_v_(static_cast<size_t>(layout_.total)) {
  if (block_rows_ < 1) throw InputError("CPU block rows must be >= 1");
  // Parallelism comes from splitting the batch across our own threads; OpenBLAS threads on top
  // would oversubscribe the cores (and each sgemm here is sized for one core's caches).
  openblas_set_num_threads(1);
  workspaces_.resize(static_cast<size_t>(pool_.size()));
  for (auto& ws : workspaces_) {
    for (int64_t width : config_.layers) {
      ws.activations.emplace_back(static_cast<size_t>(block_rows_ * width));
      ws.deltas.emplace_back(static_cast<size_t>(block_rows_ * width));
    }
    ws.labels = AlignedBuffer<uint8_t>(static_cast<size_t>(block_rows_));
    ws.gradients = AlignedBuffer<float>(static_cast<size_t>(layout_.total));
    gradient_parts_.push_back(ws.gradients.data());
  }
}

void CpuBackend::set_parameters(const Model& model) {
  if (model.config().layers != config_.layers)
    throw InputError("model " + model.config().describe() + " does not match the backend's " +
                     config_.describe());
  copy_tensors_in(model.parameters(), layout_, params_.data(), "parameters");
}

void CpuBackend::set_parameters(const ParameterRuns& runs) {
  copy_runs_in(runs, layout_, params_.data(), "parameters");
}

void CpuBackend::get_parameters(Model& model) const {
  if (model.config().layers != config_.layers) model = Model(config_);
  copy_tensors_out(layout_, params_.data(), model.parameters(), "");
}

void CpuBackend::set_optimizer_state(const OptimizerState& state, int64_t step) {
  if (step < 0) throw InputError("optimizer step must be >= 0, got " + std::to_string(step));
  if (optimizer_.kind == OptimizerKind::Adam) {
    // Both checked before either is copied: a refused state leaves the moments as they were.
    check_tensors_fit(state.v, layout_, "Adam second moments");
    copy_tensors_in(state.m, layout_, adam_m_.data(), "Adam first moments");
    copy_tensors_in(state.v, layout_, adam_v_.data(), "Adam second moments");
  }
  step_ = step;
}

void CpuBackend::get_optimizer_state(OptimizerState& state) const {
  state = OptimizerState{};
  if (optimizer_.kind != OptimizerKind::Adam) return;
  copy_tensors_out(layout_, adam_m_.data(), state.m, "");
  copy_tensors_out(layout_, adam_v_.data(), state.v, "");
}

void CpuBackend::get_gradients(std::vector<NamedTensor>& out) const {
  copy_tensors_out(layout_, workspaces_[0].gradients.data(), out, "");
  for (size_t t = 1; t < workspaces_.size(); ++t)
    for (size_t i = 0; i < out.size(); ++i) {
      const float* part = workspaces_[t].gradients.data() + layout_.entries[i].offset;
      for (size_t k = 0; k < out[i].values.size(); ++k) out[i].values[k] += part[k];
    }
}

void CpuBackend::check_data(const DatasetView& data, bool need_labels) const {
  check_model_data(config_, data, need_labels);
}

void CpuBackend::forward_block(Workspace& ws, int64_t n) {
  const size_t num_layers = config_.layers.size() - 1;
  for (size_t l = 0; l < num_layers; ++l)
    kernels::dense_forward_cpu(ws.activations[l].data(), params_.data() + layout_.weight(l).offset,
                               params_.data() + layout_.bias(l).offset,
                               ws.activations[l + 1].data(), n, config_.layers[l],
                               config_.layers[l + 1], l + 1 < num_layers);
}

void CpuBackend::run_rows(Workspace& ws, const DatasetView& data, const int32_t* rows,
                          int64_t begin, int64_t end, bool backward, uint8_t* predictions,
                          float* logits_out) {
  const size_t num_layers = config_.layers.size() - 1;
  const int64_t classes = config_.classes();
  kernels::SoftmaxXentStats stats;
  for (int64_t start = begin; start < end; start += block_rows_) {
    const int64_t n = std::min(block_rows_, end - start);
    const int32_t* block_rows = rows ? rows + start : nullptr;
    // Without a row list the block is rows [start, start + n) of the data.
    const int64_t base = rows ? 0 : start;
    if (data.pixel_type == PixelType::UInt8)
      kernels::gather_rows_u8_cpu(static_cast<const uint8_t*>(data.pixels) + base * data.features,
                                  data.features, block_rows, n, ws.activations[0].data());
    else
      kernels::gather_rows_f32_cpu(static_cast<const float*>(data.pixels) + base * data.features,
                                   data.features, block_rows, n, ws.activations[0].data());
    forward_block(ws, n);
    const float* logits = ws.activations[num_layers].data();
    if (data.labels != nullptr) {  // prediction needs no labels; loss and gradients do
      kernels::gather_labels_cpu(data.labels + base, block_rows, n, ws.labels.data());
      kernels::softmax_xent_cpu(logits, ws.labels.data(),
                                backward ? ws.deltas[num_layers].data() : nullptr, n, classes,
                                stats);
    }
    if (predictions) kernels::argmax_rows_cpu(logits, predictions + start, n, classes);
    if (logits_out)
      std::copy(logits, logits + n * classes, logits_out + start * classes);
    if (!backward) continue;
    for (size_t l = num_layers; l-- > 0;) {
      float* grads = ws.gradients.data();
      kernels::dense_backward_params_cpu(ws.activations[l].data(), ws.deltas[l + 1].data(),
                                         grads + layout_.weight(l).offset,
                                         grads + layout_.bias(l).offset, n, config_.layers[l],
                                         config_.layers[l + 1], /*accumulate=*/true);
      if (l > 0)
        kernels::dense_backward_input_relu_cpu(
            ws.deltas[l + 1].data(), params_.data() + layout_.weight(l).offset,
            ws.activations[l].data(), ws.deltas[l].data(), n, config_.layers[l],
            config_.layers[l + 1]);
    }
  }
  ws.stats.loss_sum += stats.loss_sum;
  ws.stats.correct += stats.correct;
  ws.stats.samples += end - begin;
}

BatchStats CpuBackend::compute_gradients(const DatasetView& data, const int32_t* rows,
                                         int64_t count) {
  check_data(data, true);
  check_batch_rows(data, rows, count, config_.classes());
  return run_partitioned(data, rows, count, /*backward=*/true, nullptr);
}

BatchStats CpuBackend::run_partitioned(const DatasetView& data, const int32_t* rows, int64_t count,
                                       bool backward, uint8_t* predictions, float* logits) {
  const int parts = pool_.size();
  // Without a backward pass the shares start on whole blocks, so each row is computed in the same
  // block, at the same offset, whatever the thread count: OpenBLAS's sgemm (its AVX2 kernels at
  // least) gives a row bits that depend on the block's row count and the row's place in it, and a
  // prediction must not change with the threads (a rerun of one chunk splits it, the first run
  // did not). Training keeps row-exact shares: its gradient sums depend on the thread count
  // anyway, and a batch of a block or two must still use every thread.
  const int64_t unit = backward ? 1 : block_rows_;
  const int64_t units = (count + unit - 1) / unit;
  auto share_begin = [&](int t) { return std::min(count, split_begin(units, parts, t) * unit); };
  pool_.run([&](int t) {
    Workspace& ws = workspaces_[static_cast<size_t>(t)];
    ws.stats = BatchStats{};
    if (backward) std::fill(ws.gradients.data(), ws.gradients.data() + layout_.total, 0.0f);
    run_rows(ws, data, rows, share_begin(t), share_begin(t + 1), backward, predictions, logits);
  });
  // Summed in member order, so the same thread count gives the same bits.
  BatchStats total;
  for (const auto& ws : workspaces_) {
    total.loss_sum += ws.stats.loss_sum;
    total.correct += ws.stats.correct;
    total.samples += ws.stats.samples;
  }
  return total;
}

void CpuBackend::apply_gradients() {
  ++step_;
  const kernels::AdamHyper hyper{optimizer_.learning_rate, optimizer_.beta1, optimizer_.beta2,
                                 optimizer_.epsilon};
  const float lr_t = kernels::adam_step_size(hyper, step_);
  const int parts = pool_.size();
  const int64_t chunks = layout_.total / ParameterLayout::kAlignFloats;
  pool_.run([&](int t) {
    const int64_t begin = split_begin(chunks, parts, t) * ParameterLayout::kAlignFloats;
    const int64_t end = split_begin(chunks, parts, t + 1) * ParameterLayout::kAlignFloats;
    if (optimizer_.kind == OptimizerKind::Adam)
      kernels::adam_update_cpu(params_.data(), adam_m_.data(), adam_v_.data(),
                               gradient_parts_.data(), parts, begin, end, lr_t, hyper);
    else
      kernels::sgd_update_cpu(params_.data(), gradient_parts_.data(), parts, begin, end,
                              optimizer_.learning_rate);
  });
}

BatchStats CpuBackend::evaluate(const DatasetView& data) {
  check_data(data, true);
  check_batch_rows(data, nullptr, data.rows, config_.classes());
  return run_partitioned(data, nullptr, data.rows, /*backward=*/false, nullptr);
}

// Prediction reads no labels: a view that has some is run without them, since their values are
// not checked here and the loss would index the logits by each of them (a label past the model's
// classes read beyond the block's logits).
namespace {
DatasetView without_labels(const DatasetView& data) {
  DatasetView rows = data;
  rows.labels = nullptr;
  return rows;
}
}  // namespace

void CpuBackend::predict(const DatasetView& data, uint8_t* out) {
  check_data(data, false);
  run_partitioned(without_labels(data), nullptr, data.rows, /*backward=*/false, out);
}

void CpuBackend::predict_logits(const DatasetView& data, uint8_t* classes, float* logits) {
  check_data(data, false);
  run_partitioned(without_labels(data), nullptr, data.rows, /*backward=*/false, classes, logits);
}

std::unique_ptr<Backend> make_cpu_backend(const ModelConfig& model, const OptimizerConfig& opt,
                                          int threads) {
  return std::make_unique<CpuBackend>(model, opt, threads);
}

}  // namespace tandem
