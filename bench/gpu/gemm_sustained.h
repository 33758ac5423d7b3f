// GEMM tuning at the power-capped clock, for benchmarks (bench_gpu_train --gemm-tune
// sustained). The library's tuning (ops/cuda/gemm.cu) times each candidate for a few short
// runs, at whatever clock the GPU has then, usually its boost clock; inside a training step
// the GPU soon sits at its power cap, and the ranking there can differ (a kernel that spends
// less energy per FLOP keeps a higher clock). This ranker brings the GPU to its capped clock
// with ~0.3 s of back-to-back GEMMs, then runs each bitwise-equal candidate for ~120 ms, in
// two passes of opposite order averaged so that a clock still drifting favours none. The
// measured effect on the training step was about 1% (bench/RESULTS.md), so training keeps
// the short-run ranking; this stays a measurement tool.
#pragma once
#include <fmt/format.h>

#include <algorithm>
#include <vector>

#include "ops/cuda/device.h"

namespace mcpp::bench {

inline ops::cuda::GemmTuneChoice rank_gemm_sustained(const ops::cuda::GemmTuneCandidates& c) {
  constexpr float kSustainMs = 120.f, kBurnMs = 300.f;
  auto run_for = [&](size_t j, float target_ms) {
    const int reps = std::max(1, int(target_ms / std::max(c.short_ms[j], 1e-3f)));
    return c.run(j, reps);
  };
  run_for(0, kBurnMs);
  const size_t n = c.short_ms.size();
  std::vector<float> sus(n, 0.f);
  for (int pass = 0; pass < 2; ++pass)
    for (size_t i = 0; i < n; ++i) {
      const size_t j = pass == 0 ? i : n - 1 - i;
      sus[j] += run_for(j, kSustainMs) / 2;
    }
  ops::cuda::GemmTuneChoice out;
  out.label = "sustained";
  for (size_t j = 0; j < n; ++j) {
    if (sus[j] < sus[out.index]) out.index = j;
    out.detail += fmt::format("\n    {}: {:.3f} ms short, {:.3f} ms sustained", c.names[j],
                              c.short_ms[j], sus[j]);
  }
  out.ms = sus[out.index];
  return out;
}

}  // namespace mcpp::bench
