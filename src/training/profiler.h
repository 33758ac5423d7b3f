// --profile: where a training step's GPU time goes, over Megatron's profiling window.
//
// Megatron's train() starts profiling before the step taken when `iteration` (the count of
// completed iterations) equals --profile-step-start and stops after the step that brings it
// to --profile-step-end, on the global ranks of --profile-ranks. Counted as the log line
// counts (1-based), the window is iterations start+1 .. end: with the defaults 10 and 12,
// iterations 11 and 12. A run resumed past the start never opens the window (as Megatron).
//
// Inside the window, on a profiled rank: cudaProfilerStart/Stop bracket it (so
// `nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop` records just the
// window), every catalogue op gets an NVTX range and two CUDA events (ops/cuda/device.h's op
// profiler), every iteration an NVTX range "iteration N"; at the end the rank prints the GPU
// time per op averaged over the window's iterations, largest first.
//
// --profile needs --device cuda: it measures GPU ops with CUDA events. On the CPU backend it
// is an error (the HINT points at --timing-log-level, which times the step's sections on
// any device), never a silent no-op.
#pragma once
#include <chrono>
#include <cstdint>

#include "tensor/tensor.h"
#include "training/arguments.h"

namespace mcpp::training {

// Checks the --profile flags for a run on `device` with `world_size` ranks; throws
// mcpp::Error naming the flag. Nothing to check without --profile.
void check_profile_args(const Args& a, Device device, int world_size);

class StepProfiler {
 public:
  // rank: this process's global rank. Calls check_profile_args.
  StepProfiler(const Args& a, Device device, int rank, int world_size);
  // Around each training step; completed: iterations completed before the step.
  void before_step(int64_t completed);
  void after_step(int64_t completed);
  bool active() const { return active_; }

 private:
  const Args& a_;
  bool mine_ = false;    // --profile given and this rank is in --profile-ranks
  bool active_ = false;  // inside the window
  int rank_ = 0, world_size_ = 1;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace mcpp::training
