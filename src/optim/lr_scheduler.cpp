#include "optim/lr_scheduler.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "base/error.h"

namespace mcpp::optim {

LrDecayStyle parse_lr_decay_style(const std::string& s) {
  if (s == "constant") return LrDecayStyle::Constant;
  if (s == "linear") return LrDecayStyle::Linear;
  if (s == "cosine") return LrDecayStyle::Cosine;
  if (s == "inverse-square-root") return LrDecayStyle::InverseSquareRoot;
  if (s == "WSD") return LrDecayStyle::WSD;
  throw Error(fmt::format("--lr-decay-style: '{}' is not one of constant, linear, cosine, "
                          "inverse-square-root, WSD",
                          s),
              "pick one of the listed styles");
}

WsdDecayStyle parse_wsd_decay_style(const std::string& s) {
  if (s == "exponential") return WsdDecayStyle::Exponential;
  if (s == "linear") return WsdDecayStyle::Linear;
  if (s == "cosine") return WsdDecayStyle::Cosine;
  if (s == "minus_sqrt") return WsdDecayStyle::MinusSqrt;
  throw Error(fmt::format("--lr-wsd-decay-style: '{}' is not one of exponential, linear, "
                          "cosine, minus_sqrt",
                          s),
              "pick one of the listed styles");
}

WdIncrStyle parse_wd_incr_style(const std::string& s) {
  if (s == "constant") return WdIncrStyle::Constant;
  if (s == "linear") return WdIncrStyle::Linear;
  if (s == "cosine") return WdIncrStyle::Cosine;
  throw Error(fmt::format("--weight-decay-incr-style: '{}' is not one of constant, linear, "
                          "cosine",
                          s),
              "pick one of the listed styles");
}

const char* to_string(LrDecayStyle s) {
  switch (s) {
    case LrDecayStyle::Constant:
      return "constant";
    case LrDecayStyle::Linear:
      return "linear";
    case LrDecayStyle::Cosine:
      return "cosine";
    case LrDecayStyle::InverseSquareRoot:
      return "inverse-square-root";
    case LrDecayStyle::WSD:
      return "WSD";
  }
  return "?";
}
const char* to_string(WsdDecayStyle s) {
  switch (s) {
    case WsdDecayStyle::Exponential:
      return "exponential";
    case WsdDecayStyle::Linear:
      return "linear";
    case WsdDecayStyle::Cosine:
      return "cosine";
    case WsdDecayStyle::MinusSqrt:
      return "minus_sqrt";
  }
  return "?";
}
const char* to_string(WdIncrStyle s) {
  switch (s) {
    case WdIncrStyle::Constant:
      return "constant";
    case WdIncrStyle::Linear:
      return "linear";
    case WdIncrStyle::Cosine:
      return "cosine";
  }
  return "?";
}

OptimizerParamScheduler::OptimizerParamScheduler(const SchedulerConfig& c) : c_(c) {
  MCPP_CHECK_HINT(c.min_lr >= 0.0, "give --min-lr >= 0", "LR schedule: min_lr {} is negative",
                  c.min_lr);
  MCPP_CHECK_HINT(c.max_lr >= c.min_lr, "lower --min-lr or raise --lr",
                  "LR schedule: --min-lr {} is larger than --lr {}", c.min_lr, c.max_lr);
  MCPP_CHECK_HINT(c.init_lr <= c.max_lr, "lower --lr-warmup-init or raise --lr",
                  "LR schedule: --lr-warmup-init {} is larger than --lr {}", c.init_lr, c.max_lr);
  MCPP_CHECK_HINT(c.decay_steps > 0, "give --lr-decay-iters/--lr-decay-samples > 0",
                  "LR schedule: decay length is {} samples; it must be positive", c.decay_steps);
  MCPP_CHECK_HINT(c.warmup_steps < static_cast<double>(c.decay_steps),
                  "shorten the warmup or lengthen --lr-decay-iters/--lr-decay-samples",
                  "LR schedule: warmup ({} samples) is not shorter than decay ({} samples)",
                  c.warmup_steps, c.decay_steps);
  if (c.decay_style == LrDecayStyle::WSD) {
    MCPP_CHECK_HINT(c.wsd_decay_steps.has_value(),
                    "give --lr-wsd-decay-iters (or --lr-wsd-decay-samples)",
                    "--lr-decay-style WSD needs the length of its decay phase");
    MCPP_CHECK_HINT(*c.wsd_decay_steps > 0 && *c.wsd_decay_steps <= c.decay_steps,
                    "give --lr-wsd-decay-iters between 1 and --lr-decay-iters",
                    "WSD decay phase of {} samples must lie in (0, {}]", *c.wsd_decay_steps,
                    c.decay_steps);
  }
  MCPP_CHECK_HINT(c.start_wd >= 0.0 && c.end_wd >= c.start_wd,
                  "give 0 <= --start-weight-decay <= --end-weight-decay",
                  "weight-decay schedule: start {} / end {} are invalid", c.start_wd, c.end_wd);
  if (c.wd_incr_style == WdIncrStyle::Constant)
    MCPP_CHECK_HINT(c.start_wd == c.end_wd, "use --weight-decay alone for a constant weight decay",
                    "constant weight decay needs start == end (got {} and {})", c.start_wd,
                    c.end_wd);
  step(0);
}

void OptimizerParamScheduler::step(int64_t increment) {
  num_steps_ += increment;
  lr_ = lr_for(c_.max_lr, c_.min_lr);
  wd_ = compute_wd();
}

double OptimizerParamScheduler::compute_wd() const {
  if (num_steps_ > c_.wd_incr_steps) return c_.end_wd;
  if (c_.wd_incr_style == WdIncrStyle::Constant) return c_.end_wd;
  const double r = static_cast<double>(num_steps_) / static_cast<double>(c_.wd_incr_steps);
  const double coeff = c_.wd_incr_style == WdIncrStyle::Linear
                           ? r
                           : 0.5 * (std::cos(std::numbers::pi * (1.0 - r)) + 1.0);
  return c_.start_wd + coeff * (c_.end_wd - c_.start_wd);
}

double OptimizerParamScheduler::lr_for(double max_lr, double min_lr) const {
  const double n = static_cast<double>(num_steps_);
  const double warmup = c_.warmup_steps, decay = static_cast<double>(c_.decay_steps);
  // 1. Linear warmup from init_lr.
  if (warmup > 0.0 && n <= warmup) return c_.init_lr + (max_lr - c_.init_lr) * n / warmup;
  // 2. Constant ignores the decay length; everything else ends at min_lr.
  if (c_.decay_style == LrDecayStyle::Constant) return max_lr;
  if (n > decay) return min_lr;
  // 3. Inverse square root, anchored at the end of warmup.
  if (c_.decay_style == LrDecayStyle::InverseSquareRoot) {
    const double w = std::max(warmup, 1.0), s = std::max(n, 1.0);
    return std::max(min_lr, max_lr * std::sqrt(w) / std::sqrt(s));
  }
  // 4. Decay over (warmup, decay].
  const double r = (n - warmup) / (decay - warmup);
  double coeff = 1.0;
  switch (c_.decay_style) {
    case LrDecayStyle::Linear:
      coeff = 1.0 - r;
      break;
    case LrDecayStyle::Cosine:
      coeff = 0.5 * (std::cos(std::numbers::pi * r) + 1.0);
      break;
    case LrDecayStyle::WSD: {
      const double wsd = static_cast<double>(*c_.wsd_decay_steps);
      const double anneal_start = decay - wsd;
      if (n > anneal_start) {
        const double w = (n - anneal_start) / wsd;
        switch (c_.wsd_decay_style) {
          case WsdDecayStyle::Linear:
            coeff = 1.0 - w;
            break;
          case WsdDecayStyle::Cosine:
            coeff = 0.5 * (std::cos(std::numbers::pi * w) + 1.0);
            break;
          case WsdDecayStyle::Exponential:
            coeff = 2.0 * std::pow(0.5, w) - 1.0;
            break;
          case WsdDecayStyle::MinusSqrt:
            coeff = 1.0 - std::sqrt(w);
            break;
        }
      }
      break;
    }
    default:
      break;
  }
  return min_lr + coeff * (max_lr - min_lr);
}

SchedulerState OptimizerParamScheduler::state() const {
  return {c_.max_lr,   c_.min_lr, c_.warmup_steps,  c_.decay_steps,   c_.decay_style,
          c_.start_wd, c_.end_wd, c_.wd_incr_steps, c_.wd_incr_style, num_steps_};
}

namespace {
// Megatron's _check_and_set: which of (flags, checkpoint) wins, or an error when they differ.
template <typename T, typename Show>
T check_and_set(T ours, T theirs, const char* name, SchedulerLoadPolicy p, Show show) {
  if (p == SchedulerLoadPolicy::OverrideFromArgs) return ours;
  if (p == SchedulerLoadPolicy::RequireMatch && !(ours == theirs))
    throw Error(fmt::format("LR scheduler: the flags give {} = {} but the checkpoint has {}", name,
                            show(ours), show(theirs)),
                "pass --use-checkpoint-opt_param-scheduler to take the checkpoint's schedule, "
                "or --override-opt_param-scheduler to take the flags'");
  return theirs;
}
}  // namespace

void OptimizerParamScheduler::load_state(const SchedulerState& s, SchedulerLoadPolicy p) {
  auto num = [](auto v) { return fmt::format("{}", v); };
  auto str = [](auto v) { return std::string(to_string(v)); };
  SchedulerConfig c = c_;
  c.max_lr = check_and_set(c_.max_lr, s.max_lr, "learning rate", p, num);
  c.min_lr = check_and_set(c_.min_lr, s.min_lr, "minimum learning rate", p, num);
  c.warmup_steps = check_and_set(c_.warmup_steps, s.lr_warmup_steps, "warmup samples", p, num);
  c.decay_steps = check_and_set(c_.decay_steps, s.lr_decay_steps, "decay samples", p, num);
  c.decay_style = check_and_set(c_.decay_style, s.lr_decay_style, "decay style", p, str);
  c.start_wd = check_and_set(c_.start_wd, s.start_wd, "start weight decay", p, num);
  c.end_wd = check_and_set(c_.end_wd, s.end_wd, "end weight decay", p, num);
  c.wd_incr_steps = check_and_set(c_.wd_incr_steps, s.wd_incr_steps,
                                  "total number of weight "
                                  "decay samples",
                                  p, num);
  c.wd_incr_style =
      check_and_set(c_.wd_incr_style, s.wd_incr_style, "weight decay incr style", p, str);
  c_ = c;
  num_steps_ = 0;
  step(s.num_steps);
}

}  // namespace mcpp::optim
