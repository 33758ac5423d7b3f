#include "training/profiler.h"

#include "ops/nvtx.h"

#include <algorithm>

#include "base/error.h"
#include "base/log.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::training {

void check_profile_args(const Args& a, Device device, int world_size) {
  if (!a.profile) return;
  MCPP_CHECK_HINT(device == Device::CUDA,
                  "train with --device cuda to profile GPU ops; on the CPU, "
                  "--timing-log-level 2 times the step's sections, and perf or gprof profile "
                  "the process",
                  "--profile needs --device cuda: it measures each op's GPU time with CUDA "
                  "events, and this run trains on the CPU");
  MCPP_CHECK_HINT(a.profile_step_start >= 0 && a.profile_step_end > a.profile_step_start,
                  "e.g. --profile-step-start 10 --profile-step-end 12 profiles iterations 11 "
                  "and 12",
                  "--profile-step-start {} and --profile-step-end {} leave no iteration to "
                  "profile (the window is the iterations after start, up to end)",
                  a.profile_step_start, a.profile_step_end);
  MCPP_CHECK_HINT(!a.profile_ranks.empty(), "e.g. --profile-ranks 0",
                  "--profile-ranks lists no rank");
  for (int64_t r : a.profile_ranks)
    MCPP_CHECK_HINT(r >= 0 && r < world_size,
                    fmt::format("give global ranks in [0, {}]", world_size - 1),
                    "--profile-ranks {}: there is no rank {} in a world of {}", r, r,
                    world_size);
}

StepProfiler::StepProfiler(const Args& a, Device device, int rank, int world_size)
    : a_(a), rank_(rank), world_size_(world_size) {
  check_profile_args(a, device, world_size);
  mine_ = a.profile && std::find(a.profile_ranks.begin(), a.profile_ranks.end(),
                                 int64_t(rank)) != a.profile_ranks.end();
  if (mine_)
    log::info_all("profile: iterations {}-{} on this rank: GPU time per op printed after "
                  "iteration {}; NVTX ranges and cudaProfilerStart/Stop for `nsys profile "
                  "--capture-range=cudaProfilerApi`",
                  a.profile_step_start + 1, a.profile_step_end, a.profile_step_end);
  if (mine_ && a.train_iters < a.profile_step_end)
    log::warn("--profile-step-end {} is beyond --train-iters {}: the window ends with the "
                  "run and no per-op table is printed",
                  a.profile_step_end, a.train_iters);
}

void StepProfiler::before_step(int64_t completed) {
  if (!mine_) return;
#ifdef MCPP_HAVE_CUDA
  if (completed == a_.profile_step_start) {
    ops::cuda::op_profile_collect();  // synchronises; drops anything recorded before
    ops::cuda::set_op_profiling(true);
    ops::cuda::cuda_profiler_capture(true);
    ops::set_nvtx_enabled(true);  // layer, collective and section ranges (ops/nvtx.h)
    active_ = true;
    t0_ = std::chrono::steady_clock::now();
  }
  if (active_) ops::cuda::nvtx_push("iteration " + std::to_string(completed + 1));
#else
  (void)completed;
#endif
}

void StepProfiler::after_step(int64_t completed) {
  if (!active_) return;
#ifdef MCPP_HAVE_CUDA
  ops::cuda::nvtx_pop();
  if (completed != a_.profile_step_end) return;
  const auto times = ops::cuda::op_profile_collect();  // synchronises the device
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  ops::cuda::cuda_profiler_capture(false);
  ops::cuda::set_op_profiling(false);
  active_ = false;
  ops::set_nvtx_enabled(false);
  const int64_t n = a_.profile_step_end - a_.profile_step_start;
  double sum = 0;
  for (const auto& t : times) sum += t.ms;
  std::string out = fmt::format(
      "profile (iterations {}-{}, rank {}): GPU time per op, ms per iteration; {:.2f} of "
      "{:.2f} ms in ops (the rest: host gaps, synchronisation, communication outside ops; "
      "ops on side streams, the MoE experts' GEMMs, count their overlap too)",
      a_.profile_step_start + 1, a_.profile_step_end, rank_, sum / double(n),
      wall_ms / double(n));
  constexpr size_t kShown = 30;
  double rest = 0;
  for (size_t i = 0; i < times.size(); ++i) {
    if (i >= kShown) {
      rest += times[i].ms;
      continue;
    }
    out += fmt::format("\n    {:<56} {:>6} calls {:>9.3f} ms {:>5.1f}%", times[i].name,
                       times[i].calls / n, times[i].ms / double(n),
                       sum > 0 ? 100.0 * times[i].ms / sum : 0.0);
  }
  if (times.size() > kShown)
    out += fmt::format("\n    ({} more ops) {:>26.3f} ms", times.size() - kShown, rest / double(n));
  if (world_size_ > 1)
    log::info_all("{}", out);
  else
    log::info("{}", out);
#else
  (void)completed;
#endif
}

}  // namespace mcpp::training
