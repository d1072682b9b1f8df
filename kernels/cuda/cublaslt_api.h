// cuBLASLt, loaded when the first dense layer on a GPU is made rather than when the
// program starts. Loading libcublasLt costs a process about 150 MB of resident memory, more at
// its peak (its initialisers allocate some 85 MB, and some 60 MB of its pages are touched),
// which every process of a CUDA build paid: the coordinator, the parameter servers, `tandem
// prepare`, and workers on machines without a GPU, though only dense layers on a GPU call it.
#pragma once

#include <cublasLt.h>

namespace tandem::kernels {

// The functions Tandem calls, named without their "cublasLt" prefix.
struct CublasLtApi {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtDestroy) Destroy;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescDestroy) MatmulDescDestroy;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
  decltype(&::cublasLtMatrixLayoutDestroy) MatrixLayoutDestroy;
};

// The library's functions, the library loaded by the first call (from any thread; later calls
// return the same table). It is looked for as the dynamic loader would (LD_LIBRARY_PATH, the
// system's library cache) under the soname of the toolkit this build was compiled with, then
// in that toolkit's library directory. Throws CudaError naming the library and the loader's
// reason when it cannot be loaded or lacks a function; every later call throws the same.
const CublasLtApi& cublaslt();

// cuBLAS's text for `status` (cublasLtGetStatusString), for an error message: never throws, so
// that a cuBLAS error is reported as itself even where cuBLASLt cannot be loaded (a benchmark's
// cuBLAS call; the library gone since): then "cuBLAS status N".
const char* cublas_status_text(cublasStatus_t status) noexcept;

}  // namespace tandem::kernels
