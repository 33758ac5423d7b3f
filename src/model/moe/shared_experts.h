// Shared experts (Megatron-Core's SharedExpertMLP): a dense MLP of width
// --moe-shared-expert-intermediate-size that every token passes through, tensor-parallel
// over the attention TP group (not ETP), optionally gated:
//
//   forward:  y = fc2(act(fc1(x)))  [* sigmoid(x @ g^T) with --moe-shared-expert-gate]
//   backward: the dense MLP's; with the gate  dz = rowsum(dy * y0) * s (1 - s),
//             dg += dz^T x, dx += dz g,  dy0 = dy * s
//
// Keep-or-recompute, as the dense MLP (mlp.h, --keep-mlp-activations): the activation
// act(fc1) is kept for fc2's weight gradient only in a layer that keeps its MLP
// activations (and under FP8); otherwise the forward writes it to scratch and the
// backward recomputes it from the kept fc1 output in the pass that takes the activation's
// gradient (swiglu_backward_recompute; GELU: one gelu_forward). The same element
// functions and GEMMs either way, so the same bits; [T, Is/TP] fewer kept a layer.
// --recompute-modules shared_experts (selective recomputation) keeps neither fc1's output
// nor the activation: the backward runs fc1 again from the layer's input (the same GEMM,
// so the same bits; under SP it gathers the input again); the gate's output, value and
// logits stay kept.
//
// Parameters: mlp.shared_experts.linear_fc1.weight [(2)Is, H] (column), linear_fc2.weight
// [H, Is] (row), gate_weight [1, H] (duplicated over TP; a partial sum under SP).
#pragma once
#include <vector>

#include "model/linear.h"

namespace mcpp::model::moe {

class SharedExperts {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  SharedExperts() = default;
  SharedExperts(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved {
    ColumnParallelLinear::Saved fc1_in;
    Tensor fc1;   // [T, (2)Is/TP], or undefined: recomputed (Scratch::fc1)
    Tensor act;   // [T, Is/TP] kept activation, or undefined: recomputed (Scratch::act)
    Tensor y0;    // [Tl, H] output before the gate (gate only)
    Tensor gate;  // [Tl] sigmoid(x g^T), statistics dtype (gate only)
    Tensor z;     // [Tl, 1] gate logits (gate only)
  };
  struct Scratch {
    Tensor dact, dfc1, dy0, dz;  // [T,Is/TP], [T,(2)Is/TP], [Tl,H], [Tl,1]
    Tensor dgate;                // [Tl] statistics dtype
    Tensor act;                  // [T,Is/TP] the activation when the layer does not keep it
    Tensor fc1;                  // [T,(2)Is/TP] fc1's output under shared_experts recompute
  };
  // keep_activation: the layer keeps its MLP activations (--keep-mlp-activations).
  void saved_specs(const Dims& d, bool keep_activation, Saved& s, const TensorVisitor& v) const;
  void scratch_specs(const Dims& d, Scratch& w, Workspace& ws, const TensorVisitor& v) const;

  // y [Tl,H] (=).
  // w: the scratch (its act holds the activation when s.act is undefined).
  void forward(const Tensor& x, Saved& s, Tensor& y, Scratch& w, Workspace& ws,
               const StepContext& cx) const;
  // dx [Tl,H] (=); parameter gradients +=.
  void backward(const Tensor& dy, const Tensor& x, Saved& s, Tensor& dx, Scratch& w, Workspace& ws,
                const StepContext& cx);

 private:
  const TransformerConfig* cfg_ = nullptr;
  int64_t Is_local_ = 0;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
  ParamView gate_;
  bool recompute_ = false;  // --recompute-modules shared_experts
};

}  // namespace mcpp::model::moe
