// cuBLASLt is loaded when a GPU dense layer first needs it, not with the program
// (kernels/cuda/cublaslt_api.h). Runs without a GPU: loading the library and finding its
// functions need none.
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "cuda/cublaslt_api.h"
#include "cuda/cuda_device.h"

namespace tandem::kernels {
namespace {

bool mapped_in_this_process(const std::string& library) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(library) != std::string::npos) return true;
  return false;
}

TEST(CublasLtApi, LoadedByTheFirstCallWithEveryFunction) {
  // Without a device, no other test of this program ran a GPU dense layer (and CTest runs each
  // test in a process of its own): nothing has loaded the library yet.
  if (cuda_device_count() == 0) {
    EXPECT_FALSE(mapped_in_this_process("libcublasLt")) << "loaded before anything used it";
  }
  const CublasLtApi& lt = cublaslt();
  EXPECT_TRUE(mapped_in_this_process("libcublasLt"));
  EXPECT_EQ(&lt, &cublaslt()) << "loaded once";
  for (const void* function :
       {reinterpret_cast<const void*>(lt.Create), reinterpret_cast<const void*>(lt.Destroy),
        reinterpret_cast<const void*>(lt.GetStatusString),
        reinterpret_cast<const void*>(lt.Matmul),
        reinterpret_cast<const void*>(lt.MatmulAlgoGetHeuristic),
        reinterpret_cast<const void*>(lt.MatmulDescCreate),
        reinterpret_cast<const void*>(lt.MatmulDescDestroy),
        reinterpret_cast<const void*>(lt.MatmulDescSetAttribute),
        reinterpret_cast<const void*>(lt.MatmulPreferenceCreate),
        reinterpret_cast<const void*>(lt.MatmulPreferenceDestroy),
        reinterpret_cast<const void*>(lt.MatmulPreferenceSetAttribute),
        reinterpret_cast<const void*>(lt.MatrixLayoutCreate),
        reinterpret_cast<const void*>(lt.MatrixLayoutDestroy)})
    EXPECT_NE(function, nullptr);
  // The library's own answer, through the table: the functions are the library's.
  EXPECT_STREQ(lt.GetStatusString(CUBLAS_STATUS_NOT_SUPPORTED),
               "the requested functionality is not supported");
  // What TANDEM_CUBLAS_CHECK's errors say.
  EXPECT_STREQ(cublas_status_text(CUBLAS_STATUS_NOT_SUPPORTED),
               "the requested functionality is not supported");
}

}  // namespace
}  // namespace tandem::kernels
