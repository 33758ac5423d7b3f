// How many micro-batches a training step runs, as Megatron-Core's
// num_microbatches_calculator.py: constant (GBS / (MBS x DP)), or with --rampup-batch-size
// START INCR SAMPLES a global batch that grows from START by INCR every
// SAMPLES / ((GBS - START) / INCR) consumed samples and is GBS once more than SAMPLES
// samples are consumed (RampupBatchsizeNumMicroBatchesCalculator.update).
//
// Or, with --step-batch-size-schedule "THRESHOLD:BS ...", a global batch that is BS from
// THRESHOLD tokens on (StepBatchsizeNumMicroBatchesCalculator): piecewise constant.
//
// The trainer calls update(consumed) before every step (Megatron's train loop does so with
// the consistency check on), runs num_microbatches() micro-batches, and advances the
// consumed samples and the LR schedule by current_global_batch_size().
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mcpp::data {

struct BatchRampup {
  int64_t start = 0;      // global batch size of the first step
  int64_t increment = 0;  // added at each ramp-up stage
  int64_t samples = 0;    // consumed samples over which the ramp-up runs
};

// --step-batch-size-schedule, parsed: (first consumed sample, global batch size), the
// thresholds ascending from 0.
struct StepBatchSchedule {
  std::vector<std::pair<int64_t, int64_t>> steps;
  int64_t batch_at(int64_t consumed_samples) const;
  int64_t final_batch() const { return steps.back().second; }
};

// Megatron's format: whitespace- or comma-separated THRESHOLD:BS pairs, each number with an
// optional K/M/B/T suffix (1e3 ... 1e12, fractions allowed: "1.5K"); thresholds are tokens,
// turned into samples by integer division by seq_length, as Megatron's training passes it.
// Errors (a malformed entry, a first threshold other than 0, thresholds not strictly
// increasing, a batch size not positive) name --step-batch-size-schedule.
StepBatchSchedule parse_step_batch_schedule(const std::string& text, int64_t seq_length);

class NumMicroBatchesCalculator {
 public:
  // Checks the ramp-up as Megatron's constructor does (start > 0, increment > 0,
  // GBS - start a non-negative multiple of increment) and, which Megatron checks only
  // when a step reaches it, that every ramp-up batch size is a multiple of MBS x DP.
  // Errors name --rampup-batch-size.
  NumMicroBatchesCalculator(int64_t global_batch_size, int64_t micro_batch_size, int64_t dp,
                            std::optional<BatchRampup> rampup);
  // --step-batch-size-schedule. As in Megatron the entries are not checked against MBS x
  // DP here (a resumed run on more GPUs never reaches its early ones): update() checks the
  // current one, and check_from() those a run from `consumed` up to `total` samples uses.
  NumMicroBatchesCalculator(int64_t micro_batch_size, int64_t dp, StepBatchSchedule schedule);
  void check_from(int64_t consumed_samples, int64_t total_samples) const;

  void update(int64_t consumed_samples);
  int64_t num_microbatches() const { return current_ / mbs_dp_; }
  int64_t current_global_batch_size() const { return current_; }
  bool ramping() const { return rampup_.has_value() || !schedule_.steps.empty(); }

 private:
  int64_t global_, mbs_dp_;
  std::optional<BatchRampup> rampup_;
  StepBatchSchedule schedule_;  // empty: no step schedule
  double samples_per_increment_ = 0;  // Python float, as Megatron computes it
  int64_t current_ = 0;
};

// Megatron's update_train_iters for --train-samples with a ramp-up: steps while the
// consumed samples are at most the ramp-up length (and the train samples), then whole
// global batches of the remaining samples (a partial last batch is dropped).
int64_t rampup_train_iters(int64_t train_samples, int64_t global_batch_size,
                           int64_t micro_batch_size, int64_t dp, const BatchRampup& rampup);

// The samples the first `iters` steps consume (the train dataset's size for
// --train-iters with a ramp-up).
int64_t samples_for_iters(int64_t iters, int64_t global_batch_size, int64_t micro_batch_size,
                          int64_t dp, const std::optional<BatchRampup>& rampup);
// The same under a step schedule, and Megatron's update_train_iters for --train-samples
// with one: steps while fewer than train_samples samples are consumed.
int64_t samples_for_iters(int64_t iters, const StepBatchSchedule& schedule);
int64_t schedule_train_iters(int64_t train_samples, const StepBatchSchedule& schedule);

// The validation dataset's size by Megatron's rule: an evaluation every `eval_interval`
// iterations and one at the end (train_iters / interval + 1 points), less the
// start_eval_at_iter / interval points before --start-eval-at-iter, each of eval_iters
// batches of eval_global_batch_size samples.
int64_t validation_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                           int64_t eval_global_batch_size,
                           std::optional<int64_t> start_eval_at_iter);

}  // namespace mcpp::data
