// The last row of the benchmarks' per-op tables (bench_gpu_train, bench_gpu_moe --profile):
// the profiled step's time outside the ops, or, where ops on side streams (the MoE experts'
// GEMMs, ops::StreamFork) overlap and their times add up to more than the step, by how much.
#pragma once
#include <fmt/format.h>

#include <string>

namespace mcpp::bench {

inline std::string profile_remainder_row(double step_ms, double ops_ms) {
  if (ops_ms <= step_ms)
    return fmt::format("| (outside ops: host gaps, syncs) | | {:.2f} | {:.1f}% |\n",
                       step_ms - ops_ms, 100 * (step_ms - ops_ms) / step_ms);
  return fmt::format("| (ops overlapping on side streams: their times add up to {:.2f} ms more "
                     "than the step; MCPP_MOE_GEMM_STREAMS=1 for times that add up) | | | |\n",
                     ops_ms - step_ms);
}

}  // namespace mcpp::bench
