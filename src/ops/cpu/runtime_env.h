// CPU runtime settings that must be in the environment before OpenBLAS and
// libgomp initialise (they read it in their library constructors, before main).
//
// * OpenBLAS picks its kernels from cpuid; in some VMs that detection fails and it
//   falls back to the generic "Prescott" SSE3 kernels — 5x slower sgemm on a CPU
//   with AVX-512 (measured: 44 vs 241 GFLOP/s, 2048^3, 2 threads). When
//   OPENBLAS_CORETYPE is unset and the chosen core is weaker than what the CPU
//   supports, we name the right one.
// * OpenMP regions and OpenBLAS calls alternate thousands of times per step; with
//   the default active wait policy idle OpenMP threads spin and steal the cores
//   OpenBLAS's own threads need (measured: 912 vs 1458 tokens/s on the 16M GPT).
//   Unless the user set OMP_WAIT_POLICY, we use passive.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace mcpp::ops::cpu {

// Variables to set (name, value) and why; empty when the environment is fine.
struct EnvFix {
  std::string name, value, reason;
};
std::vector<EnvFix> recommended_runtime_env();

// Applies recommended_runtime_env() and re-executes the program once (guarded by
// MCPP_RUNTIME_ENV_APPLIED). Call first thing in main(); returns when nothing is needed.
void reexec_with_runtime_env(char** argv);

// For commands that do no BLAS work (preprocess, merge-datasets): stops OpenBLAS's thread
// pool, whose threads busy-wait (sched_yield) for ~0.1 s after the library loads and so
// compete with the command's own threads. OpenBLAS restarts the pool on its next
// threaded call, so this is only a speed matter.
void release_blas_threads();

// The OpenBLAS core in use, e.g. "SkylakeX" or "Prescott".
std::string blas_core_name();

}  // namespace mcpp::ops::cpu
