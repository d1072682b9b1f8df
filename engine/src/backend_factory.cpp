#include "cuda/cuda_device.h"

#include <cstdio>
#include <mutex>

#include "backend.h"
#include "tandem/error.h"
#include "tandem/version.h"

namespace tandem {

void check_model_data(const ModelConfig& config, const DatasetView& data, bool need_labels) {
  if (data.rows < 0)
    throw InputError("a data view of " + std::to_string(data.rows) + " rows (a count >= 0)");
  if (need_labels && data.labels == nullptr && data.rows > 0)
    throw InputError("data without labels: training and evaluation need them");
  if (data.features != config.inputs())
    throw InputError("data has " + std::to_string(data.features) + " features per row, model " +
                     config.describe() + " expects " + std::to_string(config.inputs()));
  if (data.num_classes > config.classes()) {
    // The first label past the model's classes, named (scanned only now, on the error).
    std::string which;
    for (int64_t i = 0; data.labels != nullptr && i < data.rows && which.empty(); ++i)
      if (data.labels[i] >= config.classes())
        which = " (label " + std::to_string(int(data.labels[i])) + " at row " +
                std::to_string(i) + " names none of them)";
    throw InputError("data has " + std::to_string(data.num_classes) + " classes, model " +
                     config.describe() + " has " + std::to_string(config.classes()) +
                     " outputs" + which);
  }
  if (data.rows > 0 && data.pixels == nullptr) throw InputError("data view without pixels");
}

void Backend::predict_logits(const DatasetView&, uint8_t*, float*) {
  throw InputError("the " + name() + " backend cannot give logits (prediction with "
                   "probabilities runs on the CPU and CUDA backends)");
}

const std::vector<Backend::GradientPiece>& Backend::enqueue_gradients(const DatasetView&,
                                                                      const int32_t*, int64_t) {
  throw InputError("the " + name() + " backend keeps its gradients in host memory; a worker "
                   "group summing on GPUs needs CUDA backends");
}

BatchStats Backend::finish_gradients() {
  throw InputError("the " + name() + " backend keeps its gradients in host memory; a worker "
                   "group summing on GPUs needs CUDA backends");
}

void check_backend_precision(BackendKind kind, Precision precision) {
  if (kind == BackendKind::Cpu && precision != Precision::Fp32)
    throw InputError(std::string("precision ") + to_string(precision) +
                     " needs the CUDA backend; the CPU backend computes in fp32");
}

std::unique_ptr<Backend> make_backend(BackendKind kind, const ModelConfig& model,
                                      const OptimizerConfig& opt, int threads,
                                      Precision precision, int device) {
  check_backend_precision(kind, precision);
  if (kind == BackendKind::Cpu) return make_cpu_backend(model, opt, threads);
  const int devices = TANDEM_WITH_CUDA ? kernels::cuda_device_count() : 0;
  // A device the kernels were not compiled for: auto trains on the CPU instead (saying why, once
  // per process), an explicit CUDA backend is refused with the rebuild to make.
  const std::string unusable = devices > 0 && device >= 0 && device < devices
                                   ? kernels::cuda_kernels_unusable_on(device)
                                   : std::string();
  if (!unusable.empty()) {
    if (kind != BackendKind::Auto || precision != Precision::Fp32)
      throw InputError(unusable + (precision == Precision::Fp32 ? "; or use --backend cpu" : ""));
    static std::once_flag said;
    std::call_once(said, [&] { std::fprintf(stderr, "tandem: %s; training on the CPU\n",
                                            unusable.c_str()); });
    return make_cpu_backend(model, opt, threads);
  }
  const bool have_device = devices > 0;
  if (kind == BackendKind::Auto && !have_device) {
    if (precision != Precision::Fp32)
      throw InputError(std::string("precision ") + to_string(precision) +
                       " needs a CUDA device, and none is usable here");
    return make_cpu_backend(model, opt, threads);
  }
  if (!have_device)
    throw InputError(std::string("--backend cuda: ") +
                     (TANDEM_WITH_CUDA ? "no usable CUDA device (no GPU, no driver, or a driver "
                                         "older than this build's CUDA runtime)"
                                       : "this build of tandem has no CUDA") +
                     "; use --backend cpu or auto");
  return make_cuda_backend(model, opt, precision, device);
}

}  // namespace tandem
