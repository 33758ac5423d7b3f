// LayerNorm / RMSNorm over the hidden dim of x [Tl,H] (TransformerConfig::rmsnorm):
//   LayerNorm: y = (x - mean) * rstd * w + b      RMSNorm: y = x * rstd * w
//   backward: dx (= or +=, see backward) from dy, x and the saved statistics;
//             dw += sum_t dy * xhat, db += sum_t dy.
// --apply-layernorm-1p (TransformerConfig::zero_centered_gamma): the stored weight is
// w - 1 (initialised to zeros) and the op is given 1 + stored, as Megatron's
// zero-centred gamma; d(1 + stored) = d(stored), so dw accumulates unchanged.
// Norm weights act on the rank's sequence shard under SP: registered sequence_parallel,
// so their gradients are partial sums over TP that finalize_model_grads all-reduces.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "model/module.h"
#include "model/params.h"

namespace mcpp::model {

class Norm {
 public:
  // `prefix`.weight [H] (ones) and, for LayerNorm, `prefix`.bias [H] (zeros).
  static void add_params(const TransformerConfig& c, const std::string& prefix, int layer,
                         std::vector<ParamInfo>& params);
  Norm() = default;
  Norm(const TransformerConfig& c, const ParamStore* store, const std::string& prefix);

  struct Saved {
    Tensor y;     // [Tl,H] the output (the next linear's input)
    Tensor mean;  // [Tl] LayerNorm only
    Tensor rstd;  // [Tl]
  };
  // keep_y false: y is not kept (selective recomputation of the norms: the caller points
  // y at a workspace buffer and re-runs forward before y's reader in backward).
  static void saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                          const TensorVisitor& v, bool keep_y = true);

  void forward(const Tensor& x, Saved& s, const StepContext& cx) const;

  // Generation on one rank (no TP): an RMSNorm's output is only the next linear layer's
  // input, so that layer takes the norm into its own kernel (ops::rmsnorm_linear_decode; on
  // the GPU one kernel fewer per norm in a decode step, the same bits). What the op needs:
  // the weight, epsilon, and this norm's buffers for the composition it falls back to.
  struct Fold {
    const Tensor* w = nullptr;
    double eps = 0;
    Saved* s = nullptr;
  };
  // This norm's fold at this step, or none (LayerNorm, training, TP): then forward as usual.
  std::optional<Fold> fold(Saved& s, const StepContext& cx) const;
  // dy [Tl,H] -> dx [Tl,H]: += when accumulate (the residual stream's gradient), else =.
  void backward(const Tensor& dy, const Tensor& x, const Saved& s, Tensor& dx, bool accumulate,
                const StepContext& cx);

 private:
  // The weight the op multiplies by: w_.w itself, or 1 + w_.w (zero-centred gamma).
  const Tensor& gamma(const StepContext& cx) const;
  bool rms_ = false;
  bool one_plus_ = false;
  mutable Tensor gamma_;  // 1 + stored weight, refreshed at every use
  double eps_ = 0;
  ParamView w_, b_;
};

}  // namespace mcpp::model
