#include "data/num_microbatches.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/error.h"

namespace mcpp::data {

NumMicroBatchesCalculator::NumMicroBatchesCalculator(int64_t global_batch_size,
                                                     int64_t micro_batch_size, int64_t dp,
                                                     std::optional<BatchRampup> rampup)
    : global_(global_batch_size), mbs_dp_(micro_batch_size * dp), rampup_(rampup) {
  MCPP_CHECK(mbs_dp_ > 0 && global_ > 0, "batch sizes must be positive");
  if (rampup_) {
    const auto& r = *rampup_;
    const char* hint = "give --rampup-batch-size START INCREMENT SAMPLES with 0 < START < "
                       "--global-batch-size, (GBS - START) a multiple of INCREMENT";
    MCPP_CHECK_HINT(r.start > 0, hint, "--rampup-batch-size: start batch size {} must be positive",
                    r.start);
    MCPP_CHECK_HINT(r.increment > 0, hint,
                    "--rampup-batch-size: batch size increment {} must be positive", r.increment);
    MCPP_CHECK_HINT(r.samples >= 0, hint, "--rampup-batch-size: ramp-up samples {} is negative",
                    r.samples);
    const int64_t diff = global_ - r.start;
    MCPP_CHECK_HINT(diff > 0, hint,
                    "--rampup-batch-size: start batch size {} is not below --global-batch-size "
                    "{} (Megatron divides by the number of increments, zero here)",
                    r.start, global_);
    MCPP_CHECK_HINT(diff % r.increment == 0, hint,
                    "--rampup-batch-size: --global-batch-size {} minus start batch size {} = {} is "
                    "not divisible by the increment {}",
                    global_, r.start, diff, r.increment);
    for (int64_t b = r.start; b <= global_; b += r.increment)
      MCPP_CHECK_HINT(b % mbs_dp_ == 0,
                      fmt::format("make START and INCREMENT multiples of {}", mbs_dp_),
                      "--rampup-batch-size: the ramp-up reaches a global batch size of {}, not a "
                      "multiple of --micro-batch-size x data-parallel size = {}",
                      b, mbs_dp_);
    samples_per_increment_ = double(r.samples) / double(diff / r.increment);
  }
  update(0);
}

void NumMicroBatchesCalculator::update(int64_t consumed_samples) {
  if (!rampup_ || consumed_samples > rampup_->samples) {
    current_ = global_;
    return;
  }
  // int(consumed / per_increment) in Python floats, as Megatron.
  const auto steps = int64_t(double(consumed_samples) / samples_per_increment_);
  current_ = std::min(global_, rampup_->start + steps * rampup_->increment);
}

int64_t rampup_train_iters(int64_t train_samples, int64_t global_batch_size,
                           int64_t micro_batch_size, int64_t dp, const BatchRampup& rampup) {
  NumMicroBatchesCalculator calc(global_batch_size, micro_batch_size, dp, rampup);
  int64_t iterations = 0, consumed = 0;
  while (consumed <= rampup.samples && consumed <= train_samples) {
    calc.update(consumed);
    consumed += calc.current_global_batch_size();
    ++iterations;
  }
  if (train_samples > consumed) iterations += (train_samples - consumed) / global_batch_size;
  return iterations;
}

int64_t samples_for_iters(int64_t iters, int64_t global_batch_size, int64_t micro_batch_size,
                          int64_t dp, const std::optional<BatchRampup>& rampup) {
  if (!rampup) return iters * global_batch_size;
  NumMicroBatchesCalculator calc(global_batch_size, micro_batch_size, dp, rampup);
  int64_t consumed = 0;
  for (int64_t i = 0; i < iters; ++i) {
    calc.update(consumed);
    if (calc.current_global_batch_size() == global_batch_size) {
      consumed += (iters - i) * global_batch_size;  // constant from here on
      break;
    }
    consumed += calc.current_global_batch_size();
  }
  return consumed;
}

int64_t validation_samples(int64_t train_iters, int64_t eval_interval, int64_t eval_iters,
                           int64_t eval_global_batch_size,
                           std::optional<int64_t> start_eval_at_iter) {
  int64_t points = train_iters / eval_interval + 1;
  if (start_eval_at_iter)
    points = std::max<int64_t>(0, points - *start_eval_at_iter / eval_interval);
  return points * eval_iters * eval_global_batch_size;
}

}  // namespace mcpp::data
