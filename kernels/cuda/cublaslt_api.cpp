// cuBLASLt through dlopen (cublaslt_api.h).
#include "cuda/cublaslt_api.h"

#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "cuda/cuda_check.h"

#ifndef TANDEM_CUBLASLT_DIR
#error "TANDEM_CUBLASLT_DIR: the toolkit's library directory (kernels/CMakeLists.txt)"
#endif

namespace tandem::kernels {
namespace {

#define TANDEM_STRINGIFY_(x) #x
#define TANDEM_STRINGIFY(x) TANDEM_STRINGIFY_(x)
constexpr const char* kSoname = "libcublasLt.so." TANDEM_STRINGIFY(CUBLAS_VER_MAJOR);

void* open_library(std::string& why) {
  // RTLD_LOCAL: its symbols stay out of the way of a libcublasLt another library loads.
  if (void* handle = ::dlopen(kSoname, RTLD_NOW | RTLD_LOCAL)) return handle;
  why = ::dlerror();
  const std::string beside_toolkit = std::string(TANDEM_CUBLASLT_DIR) + "/" + kSoname;
  if (void* handle = ::dlopen(beside_toolkit.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
  why += "; " + std::string(::dlerror());
  return nullptr;
}

template <typename Function>
void resolve(void* library, const char* name, Function& out, std::string& why) {
  out = reinterpret_cast<Function>(::dlsym(library, name));
  if (out == nullptr && why.empty()) why = std::string("it has no function ") + name;
}

struct Loaded {
  CublasLtApi api{};
  std::string error;  // why it could not be loaded; empty once it was
};

Loaded load() {
  Loaded l;
  void* library = open_library(l.error);
  if (library == nullptr) {
    l.error = std::string("cannot load cuBLASLt (") + kSoname + "), which dense layers on a GPU "
              "use: " + l.error;
    return l;
  }
  std::string why;
#define TANDEM_RESOLVE(name) resolve(library, "cublasLt" #name, l.api.name, why)
  TANDEM_RESOLVE(Create);
  TANDEM_RESOLVE(Destroy);
  TANDEM_RESOLVE(GetStatusString);
  TANDEM_RESOLVE(Matmul);
  TANDEM_RESOLVE(MatmulAlgoGetHeuristic);
  TANDEM_RESOLVE(MatmulDescCreate);
  TANDEM_RESOLVE(MatmulDescDestroy);
  TANDEM_RESOLVE(MatmulDescSetAttribute);
  TANDEM_RESOLVE(MatmulPreferenceCreate);
  TANDEM_RESOLVE(MatmulPreferenceDestroy);
  TANDEM_RESOLVE(MatmulPreferenceSetAttribute);
  TANDEM_RESOLVE(MatrixLayoutCreate);
  TANDEM_RESOLVE(MatrixLayoutDestroy);
#undef TANDEM_RESOLVE
  // Left loaded even then: a library a process loaded is not safely unloaded while it runs.
  if (!why.empty()) l.error = std::string("cannot use cuBLASLt (") + kSoname + "): " + why;
  return l;
}

}  // namespace

const CublasLtApi& cublaslt() {
  static const Loaded loaded = load();  // once, whichever thread comes first
  if (!loaded.error.empty()) throw CudaError(loaded.error);
  return loaded.api;
}

const char* cublas_status_text(cublasStatus_t status) noexcept {
  try {
    return cublaslt().GetStatusString(status);
  } catch (...) {
    // Thread-local: the pointer outlives this call, and another thread's error cannot change it.
    thread_local char text[40];
    std::snprintf(text, sizeof text, "cuBLAS status %d", static_cast<int>(status));
    return text;
  }
}

}  // namespace tandem::kernels
