// The MoE router (Megatron-Core's TopKRouter): logits = x @ W^T (+ b) on the model's device,
// in --moe-router-dtype when given (x, W and b cast to it, as Megatron upcasts), then the
// routing on the host (routing.h). Parameters: mlp.router.weight [E, H] (duplicated over
// TP; under SP its gradient is a partial sum over TP), with --add-bias-linear
// mlp.router.bias [E] (likewise; drawn as the weight is, not decayed), and with
// --moe-router-enable-expert-bias the persistent buffer mlp.router.expert_bias [E] f32
// (checkpointed, never optimised; it enters the selection only, the bias the logits).
//
//   forward:  logits [Tl,E] = x [Tl,H] @ W^T + b
//   backward: dx [Tl,H] += dlogits @ W;  dW += dlogits^T @ x;  db += colsum(dlogits)
//
// --moe-input-jitter-eps e (Megatron's apply_input_jitter): the gating GEMM reads x_j = x u,
// u in [1 - e, 1 + e) per element, drawn from Philox at the element's global coordinates
// (s, b, h) keyed by the iteration and layer (every layout the serial run's values; Megatron
// draws per rank), in every pass, as Megatron (it jitters evaluation passes too);
// backward: dW += dlogits^T x_j, dx += (dlogits W) u.
//
// Megatron's benchmark modes (its RandomSTE): --moe-router-force-load-balancing replaces the
// logits by standard normals, drawn from Philox at each token's global coordinates (s, b, e)
// (ops::random_normal; the iteration and layer key the stream), so that every layout and a
// recomputed forward see the serial run's values (Megatron draws per rank). The routing, the
// aux and z losses then read these logits, and the backward is straight-through: dlogits
// enters the gating GEMM's backward as it is. --moe-router-force-biased std adds a bias
// N(0, |std|) per expert, the same for every token of a micro-batch: drawn for each
// micro-batch (keyed by its first sample, so again layout-independent) when std > 0, once
// per layer (keyed by the layer alone) when std < 0; it implies the random logits, as in
// Megatron.
#pragma once
#include <string>
#include <vector>

#include "model/module.h"
#include "model/params.h"

namespace mcpp::model::moe {

class Router {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  static void add_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out);
  Router() = default;
  Router(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved {
    Tensor x_cast;  // [Tl,H] x in the router dtype (only when it differs from the model's)
    Tensor x_jit;   // [Tl,H] the jittered input (--moe-input-jitter-eps)
    Tensor logits;  // [Tl,E] router dtype
  };
  DType dtype() const { return dtype_; }
  static DType router_dtype(const TransformerConfig& c);
  static void saved_specs(const TransformerConfig& c, const Dims& d, Saved& s,
                          const TensorVisitor& v);
  void forward(const Tensor& x, Saved& s, const StepContext& cx) const;
  // dlogits [Tl,E] in the router dtype; dx [Tl,H] accumulates (+=).
  void backward(const Tensor& dlogits, const Tensor& x, const Saved& s, Tensor& dx,
                const StepContext& cx);
  // The expert bias on the host ([E], empty without the buffer) and writing it back.
  std::vector<double> expert_bias() const;
  void set_expert_bias(const std::vector<double>& b) const;
  bool has_expert_bias() const { return bias_.defined(); }
  // The buffer itself (f32 [E] on the model's device; undefined without it), for the
  // device routing.
  const Tensor& expert_bias_tensor() const { return bias_; }

 private:
  ParamView w_, b_;  // b_: --add-bias-linear's (undefined without)
  Tensor bias_;  // the expert-bias buffer (f32 [E]), undefined without it
  DType dtype_ = DType::F32;
  int layer_ = -1;
  bool random_ = false;  // the benchmark modes: random logits
  void random_logits(Tensor& logits, const StepContext& cx) const;
  double jitter_ = 0;  // --moe-input-jitter-eps
  // The router-dtype GEMM's backward from s.x_cast: dx += dxc (model dtype), dW, db +=.
  void cast_backward(const Tensor& dlogits, const Saved& s, Tensor& dx, Stream& st);
  // y = x u (the jitter's factors; y may alias x).
  void jitter(const Tensor& x, Tensor& y, const StepContext& cx) const;
};

}  // namespace mcpp::model::moe
