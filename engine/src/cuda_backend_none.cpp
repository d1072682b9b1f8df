// make_cuda_backend in a build without CUDA: a clear refusal instead of a missing symbol.
#include "backend.h"
#include "tandem/error.h"

namespace tandem {

std::unique_ptr<Backend> make_cuda_backend(const ModelConfig&, const OptimizerConfig&, Precision,
                                           int) {
  throw InputError("CUDA backend: this build of tandem has no CUDA (configured with "
                   "-DTANDEM_CUDA=OFF or without nvcc); use --backend cpu or auto");
}

}  // namespace tandem
