#include "cuda/cuda_device.h"
#include "backend.h"
#include "tandem/error.h"

namespace tandem {

std::unique_ptr<Backend> make_backend(BackendKind kind, const ModelConfig& model,
                                      const OptimizerConfig& opt, int threads) {
  if (kind == BackendKind::Cpu) return make_cpu_backend(model, opt, threads);
  const int devices = kernels::cuda_device_count();
  if (kind == BackendKind::Auto) {
    // The CUDA training backend is the next layer of work; until it is built in, a GPU present
    // does not change what auto picks.
    return make_cpu_backend(model, opt, threads);
  }
  if (devices == 0)
    throw InputError(
        "--backend cuda: no usable CUDA device (no GPU, no driver, or this build has no CUDA); "
        "use --backend cpu or auto");
  throw InputError("--backend cuda: this version of tandem has no CUDA training backend yet "
                   "(found " + kernels::cuda_device_description(0) + "); use --backend cpu or auto");
}

}  // namespace tandem
