// What the trainer prints while it trains (Megatron's training_log and its neighbours):
//
//   * the iteration line every --log-interval (log_line.h formats it), with the loss
//     averaged over the iterations of the interval that stepped;
//   * --timing-log-level >= 1: Megatron's timers ("forward-backward", "optimizer",
//     "grads-reduce"), as "(min, max) time across ranks (ms)": every rank's time per
//     iteration reduced over the world (every rank calls log_interval together);
//   * the memory lines: the plan at start-up ("Theoretical memory footprints"), the saved
//     activations after the first iteration, the CUDA allocator once after the first log
//     line;
//   * --timing-log-level >= 1 also: one line of our own with each parallel group's exposed
//     communication share of the interval (see comm_share);
//   * --log-straggler: Megatron's straggler report after the iteration line (straggler.h),
//     collective over the world;
//   * --logging-level 10: every group's communication calls and bytes per iteration;
//   * --tensorboard-dir: Megatron's TensorBoard scalars (training/tensorboard.h), written
//     by the last rank: per iteration every --tensorboard-log-interval ("learning-rate",
//     "batch-size", "lm loss", "loss-scale", "grad-norm", "world-size", "mem-*", each also
//     "... vs samples" with the consumed samples as step), per log interval
//     ("iteration-time", "<timer>-time", "throughput"), per evaluation ("lm loss
//     validation", "lm loss validation ppl"); flushed at every log interval.
// (--profile's per-op GPU times are training/profiler.h's.)
#pragma once
#include <optional>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/timer.h"
#include "comm/communicator.h"
#include "model/gpt_model.h"
#include "parallel/parallel_state.h"
#include "training/arguments.h"
#include "training/memory_plan.h"
#include "training/straggler.h"
#include "training/tensorboard.h"

namespace mcpp::training {

// The lines under "(min, max) time across ranks (ms):", one per timer:
// "    forward-backward ............................: (12.30, 14.10)".
std::vector<std::string> format_timer_lines(
    const std::vector<std::string>& names,
    const std::vector<std::pair<double, double>>& min_max_ms);
// --timing-log-option: "minmax" as above under "(min, max) time across ranks (ms):";
// "max": "    forward-backward ...: 14.10" under "max time across ranks (ms):"; "all":
// "  forward-backward:" then "     rank  0: 12.30" per rank under "times across ranks (ms):".
// per_rank_ms[rank][timer], NaN where a rank lacks the timer (left out). Header line first.
std::vector<std::string> format_timers(const std::string& option,
                                       const std::vector<std::string>& names,
                                       const std::vector<std::vector<double>>& per_rank_ms);
// Each timer's milliseconds per iteration since the last call (the timers are reset),
// reduced to (min, max) over `group` (collective: every member calls it with the same
// timer names).
std::vector<std::pair<std::string, std::pair<double, double>>> timers_min_max(
    Timers& timers, int64_t iterations, comm::Communicator& group);

// The numbers of an interval's log line that the trainer owns.
struct IntervalState {
  int64_t consumed_samples = 0;
  double learning_rate = 0;
  double loss_scale = 1.0;
  int64_t skipped_iterations = 0, nan_iterations = 0;
  double flops_per_iteration = 0;
  // ---- compat
  int64_t global_batch_size = 0;                  // this step's (a ramp-up); 0: the flag's
  std::optional<double> decoupled_learning_rate;  // --decoupled-lr
  std::optional<int64_t> num_zeros_in_grad;       // --log-num-zeros-in-grad
  std::optional<double> params_norm;              // --log-params-norm
  int64_t skipped_samples = 0;  // --iterations-to-skip's, "skipped samples" when > 0
};

// Megatron's report_memory line: "(after N iterations) memory (MB) | allocated: ... | max
// allocated: ... | reserved: ... | max reserved: ..." from the CUDA allocator's bytes, and
// " | total device memory used: ..." when device_used is given (--log-device-memory-used).
std::string format_memory_line(int64_t iteration, uint64_t allocated, uint64_t max_allocated,
                               uint64_t reserved, uint64_t max_reserved,
                               std::optional<uint64_t> device_used);

class TrainingLog {
 public:
  TrainingLog(const Args& a, Device device, comm::Communicator& world,
              const parallel::ParallelState& ps);
  ~TrainingLog();
  // --timing-log-level >= 1: starts or stops a timed section. Megatron's timers
  // synchronise the device at start and stop so that GPU time is measured, not launch
  // time (this costs the host's run-ahead at each section boundary; the default level 0
  // adds no synchronisation and times nothing).
  // level: Megatron's timer log level (1: forward-backward, optimizer, grads; 2 adds
  // forward-compute, backward-compute, batch-generator and the pipeline's send/recv).
  void section(std::string_view name, bool start, int level = 1);
  // One iteration done; skipped: its update was skipped (its loss is not averaged).
  void record(double loss, double grad_norm, bool skipped);
  // ---- mixture of experts: Megatron's load_balancing_loss / z_loss fields (moe_step.h),
  // averaged over the interval's iterations that stepped, after the lm loss.
  void record_moe(const std::vector<std::pair<std::string, double>>& values, bool skipped);
  // Whether iteration `it` ends a logging interval.
  bool due(int64_t it) const { return it % a_.log_interval == 0 || it == a_.train_iters; }
  // The iteration line and what goes with it; starts the next interval. Collective over
  // the world with --timing-log-level >= 1.
  void log_interval(int64_t iteration, const IntervalState& s);
  // Time from here on is the interval's again (evaluation time is not training time).
  void restart_interval();
  // After record(): the per-iteration TensorBoard scalars when `iteration` is a multiple of
  // --tensorboard-log-interval (nothing without --tensorboard-dir or off the last rank).
  void tensorboard_iteration(int64_t iteration, const IntervalState& s);
  // An evaluation's loss: "lm loss validation" (and "... ppl") at `iteration` and vs samples.
  // suffix: one of several validation sets ("-wiki"), in the tags as Megatron writes them.
  void tensorboard_validation(int64_t iteration, int64_t consumed_samples, double loss,
                              const std::string& suffix = "");

  // The memory plan before the first step (per pipeline stage, on TP rank 0 of DP rank 0),
  // and a warning when the allocated weights, gradients and optimizer state differ from it.
  void memory_plan(const StageMemory& plan, int64_t allocated_bytes);
  // Saved activations after the first iteration, one line per pipeline stage.
  void activation_memory(int64_t iteration, const model::ActivationMemory& m);

 private:
  void cuda_memory(int64_t iteration);
  void comm_volumes();
  void timers(int64_t iteration);
  struct CommPart {
    std::string name;  // TP, SP, PP, DP, CP, EP
    comm::Communicator* c;
    bool sp_only;  // TP group: the all-gathers and reduce-scatters only
    bool tp_only;  // TP group: everything else
  };
  std::vector<CommPart> comm_parts() const;
  void snapshot_comm();
  void comm_share(double elapsed_seconds);

  const Args& a_;
  Device device_;
  comm::Communicator& world_;
  const parallel::ParallelState& ps_;
  Timers timers_;
  Timer interval_;
  double loss_ = 0, last_grad_norm_ = 0;
  int64_t iters_ = 0, advanced_ = 0;
  // The run's skipped / NaN iteration counts at the last log line: the line shows this
  // interval's (Megatron zeroes them after each line).
  int64_t logged_skipped_ = 0, logged_nan_ = 0;
  std::vector<std::pair<std::string, double>> moe_sums_;  // ---- mixture of experts
  bool report_memory_ = true;
  std::map<std::string, comm::CommStats> comm_seen_;
  std::map<std::string, comm::CommStats> share_seen_;  // blocked time at the last line
  double last_loss_ = 0;                // the latest iteration's (TensorBoard's "lm loss")
  std::unique_ptr<EventWriter> tb_;     // the last rank's event file, with --tensorboard-dir
  std::unique_ptr<StragglerDetector> straggler_;  // --log-straggler
  std::unique_ptr<GpuTelemetry> nvml_;  // --log-device-memory-used, --log-energy
  // --log-energy: the device's energy counter (millijoules) when the interval started.
  uint64_t energy_start_mj_ = 0;
  void start_energy();
};

}  // namespace mcpp::training
