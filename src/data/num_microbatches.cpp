#include "data/num_microbatches.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <sstream>

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

namespace {

constexpr const char* kScheduleHint =
    "give --step-batch-size-schedule as THRESHOLD:BATCH pairs, thresholds in tokens "
    "ascending from 0 (suffixes K, M, B, T), e.g. \"0:768 250B:1536 500B:3072\"";

// Megatron's _parse_numeric_value: int(float(digits) * suffix).
int64_t schedule_number(std::string s, const std::string& entry) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::toupper(c); });
  double mult = 1;
  if (!s.empty()) {
    const char last = s.back();
    mult = last == 'T' ? 1e12 : last == 'B' ? 1e9 : last == 'M' ? 1e6 : last == 'K' ? 1e3 : 1;
    if (mult != 1) s.pop_back();
  }
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  MCPP_CHECK_HINT(used == s.size() && used > 0 && std::isfinite(v * mult) &&
                      std::abs(v * mult) < 9e18,
                  kScheduleHint, "--step-batch-size-schedule: '{}' in entry '{}' is not a number",
                  s, entry);
  return int64_t(v * mult);
}

}  // namespace

int64_t StepBatchSchedule::batch_at(int64_t consumed_samples) const {
  int64_t bs = steps.front().second;
  for (const auto& [threshold, b] : steps) {
    if (consumed_samples < threshold) break;
    bs = b;
  }
  return bs;
}

StepBatchSchedule parse_step_batch_schedule(const std::string& text, int64_t seq_length) {
  std::string t = text;
  std::replace(t.begin(), t.end(), ',', ' ');
  std::istringstream in(t);
  StepBatchSchedule s;
  for (std::string entry; in >> entry;) {
    const size_t colon = entry.find(':');
    MCPP_CHECK_HINT(colon != std::string::npos, kScheduleHint,
                    "--step-batch-size-schedule: invalid entry '{}', expected THRESHOLD:BATCH_SIZE",
                    entry);
    int64_t threshold = schedule_number(entry.substr(0, colon), entry);
    const int64_t bs = schedule_number(entry.substr(colon + 1), entry);
    if (seq_length > 0) threshold /= seq_length;  // tokens -> samples
    s.steps.emplace_back(threshold, bs);
  }
  std::sort(s.steps.begin(), s.steps.end());
  MCPP_CHECK_HINT(!s.steps.empty(), kScheduleHint, "--step-batch-size-schedule '{}' has no entry",
                  text);
  MCPP_CHECK_HINT(s.steps.front().first == 0, kScheduleHint,
                  "--step-batch-size-schedule: the first entry must have threshold 0, got {} "
                  "samples",
                  s.steps.front().first);
  for (size_t i = 1; i < s.steps.size(); ++i)
    MCPP_CHECK_HINT(s.steps[i].first > s.steps[i - 1].first, kScheduleHint,
                    "--step-batch-size-schedule: thresholds must be strictly increasing (in "
                    "samples: {} then {})",
                    s.steps[i - 1].first, s.steps[i].first);
  for (const auto& [threshold, bs] : s.steps)
    MCPP_CHECK_HINT(bs > 0, kScheduleHint,
                    "--step-batch-size-schedule: batch size must be positive, got {}", bs);
  return s;
}

NumMicroBatchesCalculator::NumMicroBatchesCalculator(int64_t micro_batch_size, int64_t dp,
                                                     StepBatchSchedule schedule)
    : global_(schedule.final_batch()), mbs_dp_(micro_batch_size * dp),
      schedule_(std::move(schedule)) {
  MCPP_CHECK(mbs_dp_ > 0, "batch sizes must be positive");
  current_ = schedule_.batch_at(0);
}

void NumMicroBatchesCalculator::check_from(int64_t consumed, int64_t total) const {
  for (size_t i = 0; i < schedule_.steps.size(); ++i) {
    const auto [threshold, bs] = schedule_.steps[i];
    const bool before = i + 1 < schedule_.steps.size() && schedule_.steps[i + 1].first <= consumed;
    if (before || threshold >= total) continue;  // never used by this run
    MCPP_CHECK_HINT(bs % mbs_dp_ == 0,
                    fmt::format("make every batch size of the schedule a multiple of {}",
                                mbs_dp_),
                    "--step-batch-size-schedule: batch size {} (from sample {}) is not a "
                    "multiple of --micro-batch-size x data-parallel size = {}",
                    bs, threshold, mbs_dp_);
  }
}

void NumMicroBatchesCalculator::update(int64_t consumed_samples) {
  if (!schedule_.steps.empty()) {
    current_ = schedule_.batch_at(consumed_samples);
    check_from(consumed_samples, consumed_samples + 1);
    return;
  }
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

int64_t samples_for_iters(int64_t iters, const StepBatchSchedule& schedule) {
  int64_t consumed = 0;
  for (int64_t i = 0; i < iters; ++i) {
    const int64_t bs = schedule.batch_at(consumed);
    if (bs == schedule.final_batch() && consumed >= schedule.steps.back().first) {
      consumed += (iters - i) * bs;  // constant from here on
      break;
    }
    consumed += bs;
  }
  return consumed;
}

int64_t schedule_train_iters(int64_t train_samples, const StepBatchSchedule& schedule) {
  int64_t iterations = 0, consumed = 0;
  while (consumed < train_samples) {
    const int64_t bs = schedule.batch_at(consumed);
    if (consumed >= schedule.steps.back().first)  // the last stage: whole batches at once
      return iterations + (train_samples - consumed + bs - 1) / bs;
    consumed += bs, ++iterations;
  }
  return iterations;
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
