// cuBLASLt, opened when the first GEMM asks for it instead of when the program starts.
//
// Why: loading libcublasLt runs its static initialisers, ~0.35 s of CPU (page faults over
// its tables) in every process that merely links it: every CPU training run, every
// `megatron --help`, every rank of an mpirun on the CPU, every test binary. The library's
// GEMMs use 15 cuBLASLt entry points, and CUBLAS_CHECK (device.h) cuBLAS's two status-text
// functions, answered here by cuBLASLt's equivalents; this file defines each of them with the
// header's signature and forwards to the real one, looked up with dlsym the first time it is
// called. The library therefore does not link libcublas/libcublasLt at all (CMakeLists.txt), and a
// CUDA build also starts on a machine without them, failing with a hint only when a GEMM runs on
// the GPU.
//
// The definitions are hidden (compiled with -fvisibility=hidden): they serve the calls
// inside libmegatron_core.so only and do not interpose on the real symbols for anything
// else in the process (cuDNN, or a benchmark that links cuBLAS itself).
#include "ops/cuda/cublaslt_loader.h"

#include <cublasLt.h>
#include <cublas_api.h>
#include <dlfcn.h>

#include <mutex>
#include <string>

#include "base/error.h"

namespace mcpp::ops::cuda {
namespace {

void* cublaslt_handle() {
  static void* handle = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    // The soname of the toolkit we compiled against first (found through the loader's
    // usual search: LD_LIBRARY_PATH, ld.so.cache, this library's RUNPATH), then the
    // toolkit's own library folder as configured.
    std::string tried;
    for (const char* path : {MCPP_CUBLASLT_SONAME, MCPP_CUBLASLT_PATH}) {
      handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
      if (handle) return;
      const char* why = dlerror();
      tried += std::string("\n  ") + path + ": " + (why ? why : "not found");
    }
    fail_at(__FILE__, __LINE__,
            "cannot load cuBLASLt, which every GEMM on the GPU uses; tried:" + tried,
            "install the CUDA toolkit's cuBLAS (the one this build was configured with, "
            "CUDA " MCPP_CUDA_MAJOR ") or put its lib folder on LD_LIBRARY_PATH");
  });
  return handle;
}

template <typename Fn>
Fn entry_point(const char* name) {
  void* p = dlsym(cublaslt_handle(), name);
  if (!p) {
    const char* why = dlerror();
    fail_at(__FILE__, __LINE__,
            std::string("the loaded cuBLASLt has no ") + name + " (" + (why ? why : "?") + ")",
            "the cuBLAS found at run time is older than the CUDA " MCPP_CUDA_MAJOR
            " toolkit this build was configured with: put that toolkit's lib folder first on "
            "LD_LIBRARY_PATH");
  }
  return reinterpret_cast<Fn>(p);
}

}  // namespace

bool cublaslt_loaded() {
  void* h = dlopen(MCPP_CUBLASLT_SONAME, RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen(MCPP_CUBLASLT_PATH, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // NOLOAD took a reference
  return h != nullptr;
}

size_t cublaslt_version() { return cublasLtGetVersion(); }

}  // namespace mcpp::ops::cuda

// Each entry point: the real function, looked up once (a function-local static: thread-safe),
// then called with the same arguments.
#define MCPP_CUBLASLT_CALL(name, ...)                                              \
  static const auto real = ::mcpp::ops::cuda::entry_point<decltype(&name)>(#name); \
  return real(__VA_ARGS__)

extern "C" {

cublasStatus_t cublasLtCreate(cublasLtHandle_t* handle) {
  MCPP_CUBLASLT_CALL(cublasLtCreate, handle);
}

size_t cublasLtGetVersion(void) { MCPP_CUBLASLT_CALL(cublasLtGetVersion); }

const char* cublasLtGetStatusName(cublasStatus_t status) {
  MCPP_CUBLASLT_CALL(cublasLtGetStatusName, status);
}

const char* cublasLtGetStatusString(cublasStatus_t status) {
  MCPP_CUBLASLT_CALL(cublasLtGetStatusString, status);
}

// cuBLAS's names for the same status codes (CUBLAS_CHECK), without loading libcublas.
const char* cublasGetStatusName(cublasStatus_t status) { return cublasLtGetStatusName(status); }

const char* cublasGetStatusString(cublasStatus_t status) { return cublasLtGetStatusString(status); }

cublasStatus_t cublasLtMatmul(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha,
                              const void* A, cublasLtMatrixLayout_t Adesc, const void* B,
                              cublasLtMatrixLayout_t Bdesc, const void* beta, const void* C,
                              cublasLtMatrixLayout_t Cdesc, void* D, cublasLtMatrixLayout_t Ddesc,
                              const cublasLtMatmulAlgo_t* algo, void* workspace,
                              size_t workspace_bytes, cudaStream_t stream) {
  MCPP_CUBLASLT_CALL(cublasLtMatmul, handle, desc, alpha, A, Adesc, B, Bdesc, beta, C, Cdesc, D,
                     Ddesc, algo, workspace, workspace_bytes, stream);
}

cublasStatus_t cublasLtMatmulAlgoCheck(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                       cublasLtMatrixLayout_t Adesc, cublasLtMatrixLayout_t Bdesc,
                                       cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
                                       const cublasLtMatmulAlgo_t* algo,
                                       cublasLtMatmulHeuristicResult_t* result) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulAlgoCheck, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, algo,
                     result);
}

cublasStatus_t cublasLtMatmulAlgoConfigGetAttribute(const cublasLtMatmulAlgo_t* algo,
                                                    cublasLtMatmulAlgoConfigAttributes_t attr,
                                                    void* buf, size_t size, size_t* written) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulAlgoConfigGetAttribute, algo, attr, buf, size, written);
}

cublasStatus_t cublasLtMatmulAlgoGetHeuristic(
    cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t Adesc,
    cublasLtMatrixLayout_t Bdesc, cublasLtMatrixLayout_t Cdesc, cublasLtMatrixLayout_t Ddesc,
    cublasLtMatmulPreference_t pref, int requested, cublasLtMatmulHeuristicResult_t results[],
    int* returned) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulAlgoGetHeuristic, handle, desc, Adesc, Bdesc, Cdesc, Ddesc, pref,
                     requested, results, returned);
}

cublasStatus_t cublasLtMatmulDescCreate(cublasLtMatmulDesc_t* desc, cublasComputeType_t compute,
                                        cudaDataType_t scale) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulDescCreate, desc, compute, scale);
}

cublasStatus_t cublasLtMatmulDescDestroy(cublasLtMatmulDesc_t desc) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulDescDestroy, desc);
}

cublasStatus_t cublasLtMatmulDescSetAttribute(cublasLtMatmulDesc_t desc,
                                              cublasLtMatmulDescAttributes_t attr, const void* buf,
                                              size_t size) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulDescSetAttribute, desc, attr, buf, size);
}

cublasStatus_t cublasLtMatmulPreferenceCreate(cublasLtMatmulPreference_t* pref) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulPreferenceCreate, pref);
}

cublasStatus_t cublasLtMatmulPreferenceDestroy(cublasLtMatmulPreference_t pref) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulPreferenceDestroy, pref);
}

cublasStatus_t cublasLtMatmulPreferenceSetAttribute(cublasLtMatmulPreference_t pref,
                                                    cublasLtMatmulPreferenceAttributes_t attr,
                                                    const void* buf, size_t size) {
  MCPP_CUBLASLT_CALL(cublasLtMatmulPreferenceSetAttribute, pref, attr, buf, size);
}

cublasStatus_t cublasLtMatrixLayoutCreate(cublasLtMatrixLayout_t* layout, cudaDataType type,
                                          uint64_t rows, uint64_t cols, int64_t ld) {
  MCPP_CUBLASLT_CALL(cublasLtMatrixLayoutCreate, layout, type, rows, cols, ld);
}

cublasStatus_t cublasLtMatrixLayoutDestroy(cublasLtMatrixLayout_t layout) {
  MCPP_CUBLASLT_CALL(cublasLtMatrixLayoutDestroy, layout);
}

cublasStatus_t cublasLtMatrixLayoutSetAttribute(cublasLtMatrixLayout_t layout,
                                                cublasLtMatrixLayoutAttribute_t attr,
                                                const void* buf, size_t size) {
  MCPP_CUBLASLT_CALL(cublasLtMatrixLayoutSetAttribute, layout, attr, buf, size);
}

}  // extern "C"
