#include "cuda/cuda_check.h"

namespace tandem::kernels {

void throw_cuda_error(const char* library, const char* call, const char* file, int line,
                      int code, const char* message) {
  throw CudaError(std::string(library) + " error " + std::to_string(code) + " (" + message +
                  ") in " + call + " at " + file + ":" + std::to_string(line));
}

}  // namespace tandem::kernels
