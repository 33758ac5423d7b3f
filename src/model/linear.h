// Column- and row-parallel linear layers (Megatron-Core's ColumnParallelLinear /
// RowParallelLinear): the one owner of every weight GEMM in the model (plain, bias, GELU
// epilogue, residual epilogue, the bias after the TP reduction), so a change to how
// weights multiply (FP8, a new epilogue) lands here. Weights are stored [out, in].
//
//   column:  y[T, out/TP] = x_full @ w^T + b        x_full = copy_to_tp(x) | gather_from_sp(x)
//            backward: dx = column dual of (dy @ w); dw += dy^T @ x_full; db += sum dy
//   row:     y[Tl, H] = reduce(x[T, in/TP] @ w^T) + b   reduce = reduce_from_tp |
//                                                    reduce_scatter_to_sp; b once, after it
//            backward: g = row dual of dy; dx = g @ w; dw += g^T @ x; db += sum g
//
// The region transitions are parallel/tensor_parallel/mappings.h's; at TP 1 they are the
// identity and the *_full tensors are the local ones. Row-parallel bias gradients come
// from the gathered gradient, so they are complete (and equal) on every TP rank.
//
// FP8 (--fp8-format, inside the transformer layers): the same GEMMs on quantised operands
// Q(x), Q(w), Q(dy), the bias gradient from the unquantised dy (model/fp8/fp8_linear.h).
#pragma once
#include <string>
#include <vector>

#include "model/fp8/fp8_linear.h"
#include "model/module.h"
#include "model/norm.h"
#include "model/params.h"

namespace mcpp::model {

class ColumnParallelLinear {
 public:
  // Registers `prefix`.weight [out, in] split by rows (SwigluRows for a SwiGLU fc1) and,
  // with `bias`, `prefix`.bias [out].
  static void add_params(const TransformerConfig& c, const std::string& prefix, int layer,
                         int64_t out, int64_t in, TpSplit split, double init_std, bool bias,
                         std::vector<ParamInfo>& params);
  ColumnParallelLinear() = default;
  // Views of the weight and (when registered) the bias; store null: shape only.
  ColumnParallelLinear(const ParamStore* store, const std::string& weight, const std::string& bias);

  struct Saved {
    // Nothing under SP either: the gathered input [T,in] is not kept (backward gathers the
    // caller's saved shard again); the member stays for the callers' Saved layouts.
    Tensor x_full;
  };
  static void saved_specs(const Dims& d, int64_t in, Saved& s, const TensorVisitor& v);
  // dln_full [T,H] (SP): the gathered input in forward and backward, then the partial input
  // gradient before its reduce-scatter.
  static void scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v);

  // x [Tl,in] -> y [T,out/TP]. x must stay alive until backward (the caller saves it).
  void forward(const Tensor& x, Saved& s, Tensor& y, Workspace& ws, const StepContext& cx) const;
  // pre = x_full @ w^T + b, act = gelu(pre) in the GEMM's epilogue.
  void forward_gelu(const Tensor& x, Saved& s, Tensor& pre, Tensor& act, Workspace& ws,
                    const StepContext& cx) const;
  // A SwiGLU fc1 in generation (cx.pos set): act [T, out/TP/2] = swiglu(x @ w^T + b) through
  // ops::linear_swiglu_decode (pre [T, out/TP] its fallback's buffer); otherwise forward into
  // pre, then swiglu_forward.
  void forward_swiglu(const Tensor& x, Saved& s, Tensor& pre, Tensor& act, Workspace& ws,
                      const StepContext& cx) const;
  // Generation: y = this layer (SwiGLU'd when swiglu; pre its fallback's fc1 buffer) of the
  // folded norm `f` of x (Norm::fold), the norm in this layer's kernel where the GPU takes it
  // (ops::rmsnorm_linear_decode); FP8: the norm, then forward / forward_swiglu.
  void forward_folded(const Tensor& x, const Norm::Fold& f, bool swiglu, Tensor& pre, Tensor& y,
                      const StepContext& cx) const;
  // dy [T,out/TP] -> dx [Tl,in] (=), through dx_full (the workspace's dln_full under SP).
  void backward(const Tensor& dy, const Tensor& x, const Saved& s, Tensor& dx, Workspace& ws,
                const StepContext& cx);

  const Tensor& weight() const { return w_.w; }
  const Fp8Linear& fp8() const { return fp8_; }
  // FP8 with the fused casts (a GELU MLP's fc1): the output gradient
  // gelu_backward(dact, pre) cast for the next backward, with the bias gradient
  // (Fp8Linear::precast_dgelu_grad); dpre gets it in bf16 when still needed.
  void fp8_precast_dgelu_grad(const Tensor& dact, const Tensor& pre, Tensor& dpre,
                              const StepContext& cx) const {
    fp8_.precast_dgelu_grad(dact, pre, dpre, b_, cx);
  }
  // The same for a SwiGLU MLP's fc1 (Fp8Linear::precast_dswiglu_grad): no bf16 gradient.
  void fp8_precast_dswiglu_grad(const Tensor& dact, const Tensor& pre, const StepContext& cx) const {
    fp8_.precast_dswiglu_grad(dact, pre, b_, cx);
  }

 private:
  const Tensor& gathered(const Tensor& x, Workspace& ws, const StepContext& cx) const;
  ParamView w_, b_;
  Fp8Linear fp8_;
};

class RowParallelLinear {
 public:
  // Registers `prefix`.weight [out, in] split by columns and, with `bias`, `prefix`.bias
  // [out], duplicated on every TP rank.
  static void add_params(const TransformerConfig& c, const std::string& prefix, int layer,
                         int64_t out, int64_t in, double init_std, bool bias,
                         std::vector<ParamInfo>& params);
  RowParallelLinear() = default;
  RowParallelLinear(const ParamStore* store, const std::string& weight, const std::string& bias);

  // The partial output before its reduce-scatter (SP), the ones of the bias add (TP), the
  // gathered output gradient (SP). Saves nothing of its own: its input is the caller's.
  static void scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v);

  // x [T,in/TP] -> y [Tl,out]: y = reduce(x @ w^T) + b.
  void forward(const Tensor& x, Tensor& y, Workspace& ws, const StepContext& cx) const;
  // y = x @ w^T + b + residual in the GEMM's epilogue. Only without TP (the residual must
  // be added after the reduction otherwise).
  void forward_residual(const Tensor& x, const Tensor& residual, Tensor& y,
                        const StepContext& cx) const;

  // The region transition alone: dy [Tl,out] -> the gradient the local GEMMs read
  // ([T,out]: the workspace's dtmp_full under SP, else dy).
  const Tensor& grad_output(const Tensor& dy, Workspace& ws, const StepContext& cx) const;
  // grad_output, then dx = g @ w (=), dw += g^T @ x, db += sum g.
  void backward(const Tensor& dy, const Tensor& x, Tensor& dx, Workspace& ws,
                const StepContext& cx);
  // The same with x = gelu(pre): dx receives d/d(pre) from the GEMM's epilogue.
  void backward_gelu(const Tensor& dy, const Tensor& x, const Tensor& pre, Tensor& dx,
                     Workspace& ws, const StepContext& cx);
  // The two halves of backward() on an already transitioned g, for callers that work
  // between them (SwiGLU): dx = g @ w (x gives the shape only), then dw, db.
  void backward_data(const Tensor& g, const Tensor& x, Tensor& dx, const StepContext& cx) const;
  void backward_weights(const Tensor& g, const Tensor& x, const StepContext& cx);

  const Fp8Linear& fp8() const { return fp8_; }
  const Tensor& weight() const { return w_.w; }

 private:
  ParamView w_, b_;
  Fp8Linear fp8_;
};

}  // namespace mcpp::model
