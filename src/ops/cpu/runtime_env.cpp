#include "ops/cpu/runtime_env.h"

#include <cblas.h>

#include <cstdlib>
#include <cstring>
#include <unistd.h>

#include <cstdio>

extern "C" char* openblas_get_corename(void);
// OpenBLAS's own pool shutdown (its fork handler uses it); weak: absent in other builds.
extern "C" int blas_thread_shutdown_(void) __attribute__((weak));

namespace mcpp::ops::cpu {

std::string blas_core_name() {
  const char* n = openblas_get_corename();
  return n ? n : "unknown";
}

std::vector<EnvFix> recommended_runtime_env() {
  std::vector<EnvFix> fixes;
  if (!std::getenv("OPENBLAS_CORETYPE")) {
    const std::string core = blas_core_name();
    const bool generic = core == "Prescott" || core == "Core2" || core == "Penryn" ||
                         core == "Nehalem" || core == "Sandybridge" || core == "Unknown";
    const char* want = nullptr;
    if (__builtin_cpu_supports("avx512f")) want = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) want = "Haswell";
    if (generic && want)
      fixes.push_back({"OPENBLAS_CORETYPE", want,
                       "OpenBLAS chose its " + core + " kernels on a CPU that supports " + want});
  }
  if (!std::getenv("OMP_WAIT_POLICY"))
    fixes.push_back({"OMP_WAIT_POLICY", "passive",
                     "idle OpenMP threads must not spin while OpenBLAS computes"});
  return fixes;
}

void release_blas_threads() {
  if (blas_thread_shutdown_) blas_thread_shutdown_();
}

void reexec_with_runtime_env(char** argv) {
  if (std::getenv("MCPP_RUNTIME_ENV_APPLIED")) return;
  auto fixes = recommended_runtime_env();
  if (fixes.empty()) return;
  for (const auto& f : fixes) {
    if (f.name == "OPENBLAS_CORETYPE")  // stderr: stdout may be generated text
      std::fprintf(stderr, "> %s: setting %s=%s (set it yourself to override)\n", f.reason.c_str(),
                   f.name.c_str(), f.value.c_str());
    setenv(f.name.c_str(), f.value.c_str(), 1);
  }
  setenv("MCPP_RUNTIME_ENV_APPLIED", "1", 1);
  execv("/proc/self/exe", argv);  // returns only on failure: then run as we are
}

}  // namespace mcpp::ops::cpu
