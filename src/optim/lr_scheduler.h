// Learning-rate and weight-decay schedule, as Megatron-Core's OptimizerParamScheduler
// (megatron/core/optimizer_param_scheduler.py; megatron.md §2.3).
//
// Every "step" counts samples, not iterations: after an optimizer step the trainer calls
// step(global_batch_size). The constructor calls step(0), so iteration k's update uses
// lr(num_steps = (k-1)·GBS) and the learning rate logged at iteration k is lr(k·GBS).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace mcpp::optim {

enum class LrDecayStyle { Constant, Linear, Cosine, InverseSquareRoot, WSD };
enum class WsdDecayStyle { Exponential, Linear, Cosine, MinusSqrt };
enum class WdIncrStyle { Constant, Linear, Cosine };

// Megatron's spellings: "constant", "linear", "cosine", "inverse-square-root", "WSD";
// "exponential", "linear", "cosine", "minus_sqrt". Throw mcpp::Error on anything else.
LrDecayStyle parse_lr_decay_style(const std::string& s);
WsdDecayStyle parse_wsd_decay_style(const std::string& s);
WdIncrStyle parse_wd_incr_style(const std::string& s);
const char* to_string(LrDecayStyle s);
const char* to_string(WsdDecayStyle s);
const char* to_string(WdIncrStyle s);

// All step counts in samples. training::lr_scheduler_config(args) fills this from flags.
struct SchedulerConfig {
  double init_lr = 0.0;       // --lr-warmup-init
  double max_lr = 0.0;        // --lr
  double min_lr = 0.0;        // --min-lr
  double warmup_steps = 0.0;  // may be fractional (--lr-warmup-fraction · decay_steps)
  int64_t decay_steps = 0;    // > warmup_steps
  LrDecayStyle decay_style = LrDecayStyle::Linear;
  std::optional<int64_t> wsd_decay_steps;  // required for WSD
  WsdDecayStyle wsd_decay_style = WsdDecayStyle::Exponential;
  double start_wd = 0.0, end_wd = 0.0;
  int64_t wd_incr_steps = 0;
  WdIncrStyle wd_incr_style = WdIncrStyle::Constant;
};

// What a checkpoint stores (Megatron's state_dict keys).
struct SchedulerState {
  double max_lr = 0.0, min_lr = 0.0;
  double lr_warmup_steps = 0.0;
  int64_t lr_decay_steps = 0;
  LrDecayStyle lr_decay_style = LrDecayStyle::Linear;
  double start_wd = 0.0, end_wd = 0.0;
  int64_t wd_incr_steps = 0;
  WdIncrStyle wd_incr_style = WdIncrStyle::Constant;
  int64_t num_steps = 0;
};

// How load_state treats a checkpoint whose settings differ from the flags:
// RequireMatch (Megatron's default): error; UseCheckpoint (--use-checkpoint-opt_param-scheduler):
// take the checkpoint's; OverrideFromArgs (--override-opt_param-scheduler): keep the flags'.
enum class SchedulerLoadPolicy { RequireMatch, UseCheckpoint, OverrideFromArgs };

class OptimizerParamScheduler {
 public:
  // Checks the settings (min_lr >= 0, max_lr >= min_lr, init_lr <= max_lr, decay_steps > 0,
  // warmup < decay, WSD has wsd_decay_steps, 0 <= start_wd <= end_wd) and calls step(0).
  explicit OptimizerParamScheduler(const SchedulerConfig& config);

  void step(int64_t increment);  // advance by `increment` samples and recompute lr/wd
  double lr() const { return lr_; }
  double wd() const { return wd_; }
  int64_t num_steps() const { return num_steps_; }
  // LR of a parameter group with its own max/min (Megatron's decoupled embedding LR).
  double lr_for(double max_lr, double min_lr) const;
  const SchedulerConfig& config() const { return c_; }

  SchedulerState state() const;
  void load_state(const SchedulerState& s, SchedulerLoadPolicy policy);

 private:
  double compute_wd() const;
  SchedulerConfig c_;
  int64_t num_steps_ = 0;
  double lr_ = 0.0, wd_ = 0.0;
};

}  // namespace mcpp::optim
