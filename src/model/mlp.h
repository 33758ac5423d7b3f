// The MLP contract (what TransformerLayer needs of its MLP submodule, as Megatron-Core's
// transformer_layer takes `mlp` as a submodule so MoELayer stands in for MLP), and the
// dense MLP: column-parallel fc1, GELU, SwiGLU, squared ReLU or quick-GEGLU, row-parallel fc2.
//
//   forward:  y = fc2(act(fc1(x))) (+ residual)      x, y [Tl,H]; fc1 [T,FC1W]; act [T,F]
//   backward: g = fc2's region dual of dy
//             dact = g @ w2; dfc1 = act'(fc1) * dact; dw2 += g^T act; dx = fc1'(dfc1)
//
// Keep-or-recompute (--keep-mlp-activations): the activation act = gelu|(q)glu|relu^2(fc1) is by
// default written to one shared workspace buffer for fc2 and recomputed from the saved
// fc1 output in backward (one [T,F] per layer saved for one elementwise pass; with SwiGLU
// no extra pass: swiglu_backward_recompute writes it with the gradient). A layer asked
// to keep it saves it instead. Both run the same element functions and GEMMs.
// --recompute-modules mlp (selective recomputation) keeps fc1's output neither: forward
// writes it to the shared Workspace::fc1, and backward runs fc1's forward again into it
// from the kept input (one more fc1 GEMM a layer; the same kernels, the same bits).
#pragma once
#include <memory>
#include <vector>

#include "model/linear.h"

namespace mcpp::model {

// What an MLP-contract module saves: its own struct behind this base.
struct MlpSaved {
  virtual ~MlpSaved() = default;
};

class MlpModule {
 public:
  virtual ~MlpModule() = default;
  virtual std::unique_ptr<MlpSaved> new_saved() const = 0;
  // keep_activation: this layer keeps what it would otherwise recompute in backward.
  virtual void saved_specs(const Dims& d, bool keep_activation, MlpSaved& s,
                           const TensorVisitor& v) const = 0;
  // The workspace entries; uses_scratch_activation: some layer does not keep its own.
  virtual void scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                             const TensorVisitor& v) const = 0;
  // x [Tl,H] (normed) -> y [Tl,H] = mlp(x), or residual + mlp(x) in the last GEMM's
  // epilogue when `residual` is given (TP 1 only).
  virtual void forward(const Tensor& x, MlpSaved& s, const Tensor* residual, Tensor& y,
                       Workspace& ws, const StepContext& cx) const = 0;
  // Generation: forward of the folded norm `f` of x (Norm::fold; x its input). Here the
  // norm, then forward; the dense SwiGLU MLP takes the norm into fc1's kernel.
  virtual void forward_folded(const Tensor& x, const Norm::Fold& f, MlpSaved& s,
                              const Tensor* residual, Tensor& y, Workspace& ws,
                              const StepContext& cx) const;
  // dy [Tl,H] -> dx [Tl,H] (=); parameter gradients +=.
  virtual void backward(const Tensor& dy, const Tensor& x, MlpSaved& s, Tensor& dx, Workspace& ws,
                        const StepContext& cx) = 0;
  // The weight a generation step's forward reads first, which the attention before it asks
  // the GPU to bring into L2 ahead (Attention::forward_cached); null: none worth it (MoE).
  virtual const Tensor* first_weight() const { return nullptr; }
};

class DenseMlp final : public MlpModule {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  DenseMlp(const TransformerConfig& c, int layer, const ParamStore* store);

  struct Saved final : MlpSaved {
    ColumnParallelLinear::Saved fc1_in;  // the gathered x (SP)
    Tensor fc1;                          // [T,FC1W] fc1's output (GELU: before the GELU)
    Tensor act;                          // [T,F] kept activation, or undefined: recomputed
  };
  std::unique_ptr<MlpSaved> new_saved() const override { return std::make_unique<Saved>(); }
  void saved_specs(const Dims& d, bool keep_activation, MlpSaved& s,
                   const TensorVisitor& v) const override;
  void scratch_specs(const Dims& d, bool uses_scratch_activation, Workspace& ws,
                     const TensorVisitor& v) const override;
  void forward(const Tensor& x, MlpSaved& s, const Tensor* residual, Tensor& y, Workspace& ws,
               const StepContext& cx) const override;
  void forward_folded(const Tensor& x, const Norm::Fold& f, MlpSaved& s, const Tensor* residual,
                      Tensor& y, Workspace& ws, const StepContext& cx) const override;
  void backward(const Tensor& dy, const Tensor& x, MlpSaved& s, Tensor& dx, Workspace& ws,
                const StepContext& cx) override;
  const Tensor* first_weight() const override { return &fc1_.weight(); }

 private:
  void fc1_act(const Tensor& x, ColumnParallelLinear::Saved& s, Tensor& pre, Tensor& act,
               Workspace& ws, const StepContext& cx) const;
  const TransformerConfig* cfg_;
  ColumnParallelLinear fc1_;
  RowParallelLinear fc2_;
  bool recompute_ = false;  // --recompute-modules mlp
  bool swiglu_ = false;     // plain SwiGLU: its fused GEMM, decode and FP8 paths
  // Squared ReLU, quick-GEGLU, SwiGLU with an offset or clamp: fc1's GEMM, then the
  // activation op (ops::mlp_activation_forward / _backward) in the model precision; under
  // FP8 the GEMMs run in FP8 and fc2 casts the activation (no fused cast for them).
  bool act_op_ = false;
};

}  // namespace mcpp::model
