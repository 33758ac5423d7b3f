#include "optim/loss_scaler.h"

#include <algorithm>

#include "base/error.h"

namespace mcpp::optim {

LossScaler::LossScaler(LossScalerConfig cfg)
    : cfg_(cfg),
      scale_(cfg.loss_scale > 0 ? cfg.loss_scale : cfg.initial_scale),
      hysteresis_tracker_(cfg.hysteresis) {
  MCPP_CHECK_HINT(scale_ > 0 && cfg.min_scale > 0 && cfg.window > 0 && cfg.hysteresis > 0,
                  "check --loss-scale, --initial-loss-scale, --min-loss-scale, "
                  "--loss-scale-window and --hysteresis",
                  "loss scaler settings must be positive (scale {}, min {}, window {}, "
                  "hysteresis {})",
                  scale_, cfg.min_scale, cfg.window, cfg.hysteresis);
}

// Megatron's DynamicGradScaler.update, with backoff 0.5 and growth 2.
void LossScaler::update(bool found_inf) {
  if (found_inf) ++skipped_;
  if (!dynamic()) return;
  if (found_inf) {
    growth_tracker_ = 0;
    if (--hysteresis_tracker_ <= 0) scale_ = std::max(scale_ * 0.5, cfg_.min_scale);
  } else if (++growth_tracker_ == cfg_.window) {
    growth_tracker_ = 0;
    hysteresis_tracker_ = cfg_.hysteresis;
    scale_ *= 2.0;
  }
}

void LossScaler::load_state(const State& s) {
  MCPP_CHECK(s.scale > 0, "the checkpoint's loss scale {} is not positive", s.scale);
  // A constant --loss-scale given now wins over the checkpoint's scale.
  if (dynamic()) scale_ = s.scale;
  growth_tracker_ = s.growth_tracker, hysteresis_tracker_ = s.hysteresis_tracker;
}

}  // namespace mcpp::optim
