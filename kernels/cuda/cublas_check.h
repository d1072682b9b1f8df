// The cuBLAS / cuBLASLt form of TANDEM_CUDA_CHECK (kept apart so that code without cuBLAS does
// not need its headers). Its message comes from cuBLASLt (cublas_status_text).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include "cuda/cublaslt_api.h"
#include "cuda/cuda_check.h"

#define TANDEM_CUBLAS_CHECK(call)                                                             \
  do {                                                                                        \
    const cublasStatus_t tandem_status_ = (call);                                             \
    if (tandem_status_ != CUBLAS_STATUS_SUCCESS)                                              \
      ::tandem::kernels::throw_cuda_error("cuBLAS", #call, __FILE__, __LINE__,                \
                                          static_cast<int>(tandem_status_),                   \
                                          ::tandem::kernels::cublas_status_text(              \
                                              tandem_status_));                               \
  } while (0)
