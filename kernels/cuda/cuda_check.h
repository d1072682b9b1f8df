// Every CUDA call goes through one of these macros (cuBLAS calls through cublas_check.h's; the
// cuDNN baseline in bench/ has its own): a failure throws CudaError naming the call, the file and
// the line, so an error surfaces where it happened
// instead of at the next unrelated synchronisation.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "tandem/error.h"

namespace tandem::kernels {

// A tandem::Error: the library's one error policy holds for device failures too, so a caller of
// the public API (or Python's tandem.Error) catches them with everything else.
class CudaError : public ::tandem::Error {
 public:
  using ::tandem::Error::Error;
};

[[noreturn]] void throw_cuda_error(const char* library, const char* call, const char* file,
                                   int line, int code, const char* message);

}  // namespace tandem::kernels

#define TANDEM_CUDA_CHECK(call)                                                               \
  do {                                                                                        \
    const cudaError_t tandem_status_ = (call);                                                \
    if (tandem_status_ != cudaSuccess)                                                        \
      ::tandem::kernels::throw_cuda_error("CUDA", #call, __FILE__, __LINE__,                  \
                                          static_cast<int>(tandem_status_),                   \
                                          cudaGetErrorString(tandem_status_));                \
  } while (0)

// After a kernel launch: launch-configuration errors are reported here, not by the launch.
#define TANDEM_CUDA_CHECK_LAUNCH() TANDEM_CUDA_CHECK(cudaGetLastError())
