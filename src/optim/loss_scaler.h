// Loss scaling for fp16 training, as Megatron's optimizer/grad_scaler.py: the loss (and
// so every gradient) is multiplied by `scale()` before backward; after backward the
// optimizer divides the gradients by it and checks them for Inf/NaN. An overflow skips
// the step (and the LR scheduler's step) and, after `hysteresis` overflows, halves the
// scale (never below min_scale); `window` clean steps in a row double it.
// bf16 needs none (its exponent range is f32's); Megatron's --loss-scale gives a
// constant scale.
#pragma once
#include <cstdint>

namespace mcpp::optim {

struct LossScalerConfig {
  double loss_scale = 0;                   // --loss-scale: > 0 means constant
  double initial_scale = 4294967296.0;     // --initial-loss-scale (2^32)
  double min_scale = 1.0;                  // --min-loss-scale
  int64_t window = 1000;                   // --loss-scale-window
  int64_t hysteresis = 2;                  // --hysteresis
};

class LossScaler {
 public:
  explicit LossScaler(LossScalerConfig cfg);
  double scale() const { return scale_; }
  double inv_scale() const { return 1.0 / scale_; }
  // Records one step's overflow check and adjusts the scale (dynamic mode only).
  void update(bool found_inf);
  int64_t skipped_iterations() const { return skipped_; }
  bool dynamic() const { return cfg_.loss_scale <= 0; }

  // What a bit-exact resume needs (Megatron's grad_scaler state_dict).
  struct State {
    double scale = 1;
    int64_t growth_tracker = 0, hysteresis_tracker = 0;
  };
  State state() const { return {scale_, growth_tracker_, hysteresis_tracker_}; }
  void load_state(const State& s);

 private:
  LossScalerConfig cfg_;
  double scale_;
  int64_t growth_tracker_ = 0, hysteresis_tracker_, skipped_ = 0;
};

}  // namespace mcpp::optim
