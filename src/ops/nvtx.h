// NVTX ranges for Nsight Systems around the big pieces of a step: each transformer layer's
// forward and backward, each collective, and the trainer's timed sections (forward-backward,
// optimizer, grads-reduce, and at --timing-log-level 2 forward-compute, backward-compute,
// the pipeline's transfers). Off unless enabled, which the --profile window does
// (training/profiler.h), so that `nsys profile -c cudaProfilerApi` captures exactly those
// steps with these ranges on the timeline; no-ops in a build without CUDA.
//
//   { ops::NvtxRange r("layer 3 forward"); ... }   // or nvtx_push(...) / nvtx_pop()
#pragma once
#include <atomic>
#include <cstdint>
#include <string>

namespace mcpp::ops {

inline std::atomic<bool> g_nvtx_enabled{false};
inline bool nvtx_enabled() { return g_nvtx_enabled.load(std::memory_order_relaxed); }
inline void set_nvtx_enabled(bool on) { g_nvtx_enabled = on; }

// The CUDA toolkit's header-only NVTX (ops/cuda/op_profile.cpp); nothing without CUDA.
void nvtx_range_push(const std::string& name);
void nvtx_range_pop();

class NvtxRange {
 public:
  explicit NvtxRange(const char* name) : on_(nvtx_enabled()) {
    if (on_) nvtx_range_push(name);
  }
  explicit NvtxRange(const std::string& name) : on_(nvtx_enabled()) {
    if (on_) nvtx_range_push(name);
  }
  // "<what> <index>" ("layer 3 forward"), formatted only when ranges are on.
  NvtxRange(const char* prefix, int64_t index, const char* suffix) : on_(nvtx_enabled()) {
    if (on_) nvtx_range_push(std::string(prefix) + " " + std::to_string(index) + " " + suffix);
  }
  ~NvtxRange() {
    if (on_) nvtx_range_pop();
  }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;

 private:
  bool on_;
};

}  // namespace mcpp::ops
