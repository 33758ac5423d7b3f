// AdamW over the parameter registry's flat buffers, with Megatron's parameter
// groups (no weight decay on biases and norm weights) and global-norm clipping.
// The state (exp_avg, exp_avg_sq) is kept per element in two flat buffers laid
// out like the parameters, so sharding it (distributed optimizer) and writing it
// to a checkpoint are offset arithmetic on the registry.
//
// Mixed precision as Megatron's Float16OptimizerWithFloat16Params: when the model's
// parameters are bf16/f16, the optimizer holds fp32 main parameters (a copy made at
// construction), steps them with the fp32 main gradients, and writes them back to the
// model's parameters, rounded to nearest even, in the same pass (adamw_step's model_param
// output). f32 and f64 parameters are stepped in place. Everything lives on the
// parameters' device.
#pragma once
#include <cstdint>

#include "model/params.h"

namespace mcpp::optim {

struct AdamWConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
};

class AdamW {
 public:
  AdamW(model::ParamStore& params, AdamWConfig cfg);

  // L2 norm of all gradients (fp64 accumulation). With model parallelism the
  // caller all-reduces the squared norm, counting TP-duplicated params once.
  double grad_sq_norm() const;
  // Megatron's clip_grad_norm: scale by max_norm / (norm + 1e-6) when that is < 1.
  void clip(double max_norm, double total_norm);
  // One AdamW step with learning rate lr and weight decay wd (decay only on
  // parameters whose registry entry says so).
  void step(double lr, double wd);

  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }
  // Multiplies the gradients by inv_scale and reports whether any is NaN/Inf (fp16
  // loss scaling: the step must then be skipped). Synchronises.
  bool unscale_and_check(double inv_scale);

  // fp32 main parameters (undefined when the parameters are stepped in place).
  Tensor& main_params() { return main_; }
  const Tensor& main_params() const { return main_; }
  // Sets the parameters from `values`, a flat [total] tensor on any device (a checkpoint's
  // host copy): the fp32 main parameters exactly when they exist, and the model's
  // parameters from them (rounded to bf16/f16), as after a step.
  void set_params(const Tensor& values);
  Tensor& exp_avg() { return m_; }
  Tensor& exp_avg_sq() { return v_; }
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  const AdamWConfig& config() const { return cfg_; }

 private:
  model::ParamStore& ps_;
  AdamWConfig cfg_;
  Tensor main_, m_, v_;
  int64_t step_ = 0;
};

}  // namespace mcpp::optim
