// One linear layer's FP8 operands and their scaling state (Transformer Engine's per-module
// fp8_meta), owned by ColumnParallelLinear / RowParallelLinear (model/linear.*). Docs:
// docs/fp8.md.
//
// Operands (the columns of the state): 0 the input x, 1 the weight w (E4M3 both), 2 the
// output gradient dy (E5M2 under --fp8-format hybrid, else E4M3). Each GEMM reads Q(v), v
// rounded to the FP8 grid after scaling, then scaled back (ops::fp8_quantize):
//   fprop  y  = Q(x) @ Q(w)^T + b
//   dgrad  dx = Q(dy) @ Q(w)
//   wgrad  dw += Q(dy)^T @ Q(x)       (dy^T @ x with --no-fp8-wgrad);  db += sum dy
// On the CPU this is the arithmetic itself (the emulation: f32, or f64 for gradient
// checks); the backward is the straight-through one (quantisation counts as the identity).
// On CUDA the operands are real FP8 tensors (ops::fp8_cast_transpose: one read of the bf16
// tensor writes the row-wise copy, the column-wise (transposed) copy and the amax) and the
// GEMMs are cuBLASLt's FP8 GEMMs (ops::fp8_gemm) in Hopper's one layout: fprop X·Wᵀ,
// dgrad G·(Wᵀ)ᵀ, wgrad Gᵀ·(Xᵀ)ᵀ. Every operand, the weight included, is cast into scratch
// shared by all layers, the copy its GEMM reads, right before it (no FP8 weight copy is
// kept: FP8 adds no weight-sized memory). Under the delayed recipe on CUDA the element
// functions next to a GEMM are taken in the cast (precast_*: GELU into fc2's input, its
// derivative into fc1's output gradient) and every bias gradient in its gradient's cast.
//
// Scaling, per tensor:
//   delayed (default): scale = fp8_max / amax / 2^margin from the amax history, persistent
//     buffers <linear>.fp8_amax_history [L, 3] (row 0: this step's amax, max over its
//     micro-batches) and <linear>.fp8_scale [3], checkpointed and resharded with the model
//     (duplicated on every TP rank). The step's amaxes are max-reduced over TP x DP (x CP)
//     and the scales updated once per step, after the backward (parallel/fp8_amax.h):
//     every rank holds the same scales, which are those of the serial run.
//   tensorwise (current scaling): the tensor's own amax, max-reduced over TP when the
//     tensor is TP-split (the gathered input of a column-parallel layer, the gathered
//     gradient of a row-parallel one are whole already), no state kept.
//   blockwise (Transformer Engine's Float8BlockScaling, DeepSeek-V3): one power-of-two
//     scale per block from the block's own amax, nothing kept, nothing reduced: x and dy
//     in 1x128 blocks along the K of the GEMM that reads them (fprop and dgrad: along
//     their rows; wgrad, K = the tokens: along their columns, a second quantisation of the
//     same tensor), w in 128x128 blocks (one set serving fprop and dgrad). Blocks are a
//     rank's own, so a TP run equals the serial one when the TP-split dimensions are
//     multiples of 128 (docs/fp8.md). No fused casts (their scale is per tensor).
#pragma once
#include <string>
#include <vector>

#include "model/module.h"
#include "model/params.h"
#include "ops/fp8_grid.h"

namespace mcpp::model {

struct Fp8ParamWeight;  // --fp8-param-gather (model/fp8/fp8_param.h)

enum Fp8Operand : int { kFp8Input = 0, kFp8Weight = 1, kFp8Grad = 2 };

// The FP8 format of operand k: E5M2 for gradients under the hybrid format, else E4M3.
ops::Fp8Format fp8_format_of(const Fp8Config& f, Fp8Operand k);
// t as a matrix: [numel / last dimension, last dimension].
Tensor as_2d(const Tensor& t);

// The linears of global layer `layer` that run in FP8 when the layer does, by name (their
// weight's without ".weight"): attention's (QKV, or MLA's down and up projections; the
// output projection) and the dense MLP's (a MoE layer's shared experts'), not the routed
// experts' (moe::GroupedExperts).
std::vector<std::string> fp8_linear_prefixes(const TransformerConfig& c, int layer);

// The persistent buffers of a linear layer named `prefix` (e.g.
// decoder.layers.3.mlp.linear_fc1): registered for every FP8 linear under the delayed
// recipe.
std::string fp8_history_name(const std::string& prefix);
std::string fp8_scale_name(const std::string& prefix);
// Registers them for the FP8 layers of the stage (nothing without --fp8-format or with the
// tensorwise recipe). Call before ParamStore::allocate.
void add_fp8_buffers(const TransformerConfig& c, const std::vector<int>& layers, ParamStore& store);
// The delayed-scaling histories held by `store`, in registration order: the dense linears'
// (experts false) or the routed experts' GEMMs' (experts true; BufferInfo::expert >= 0).
std::vector<Tensor> fp8_histories(const ParamStore& store, bool experts = false);
// Once per training step, after the amaxes are reduced: every scale from its history,
// then the histories roll (row 0 cleared for the next step).
void fp8_update_scales(const TransformerConfig& c, ParamStore& store, Stream& s);

class Fp8Linear {
 public:
  Fp8Linear() = default;
  // weight: the layer's weight name; binds the state buffers when registered. An MTP
  // depth's weights (eh_proj's and its layer's, registered under layer -1) run as the
  // depth's layer id (mtp_layer_of).
  Fp8Linear(const ParamStore* store, const std::string& weight);

  // Whether this layer's GEMMs run in FP8 in this pass.
  bool on(const StepContext& cx) const;

  // fprop: y = Q(x) Q(w)^T (+ b) (+ residual, when defined). x_split: x is this rank's part
  // of a TP-split tensor (the row-parallel input).
  void forward(const Tensor& x, bool x_split, const Tensor& w, const Tensor& b,
               const Tensor& residual, Tensor& y, const StepContext& cx) const;
  // dgrad dx = Q(dy) Q(w) (when dx is defined); with `weights`, wgrad dw += Q(dy)^T Q(x)
  // (dy^T x under --no-fp8-wgrad) and db += sum dy (from the unquantised dy). x gives only
  // the shape when !weights.
  void backward(const Tensor& dy, bool dy_split, const Tensor& x, bool x_split, const ParamView& w,
                const ParamView& b, Tensor& dx, bool weights, const StepContext& cx) const;
  // Q(v) of operand `k` into a scratch tensor of this layer (valid until the next call
  // for the same operand). tp_split: v is this rank's part of a TP-split tensor (current
  // scaling reduces the amax over TP then). record: add v's amax to this step's (delayed,
  // training passes only; the backward re-quantising the saved input passes false).
  const Tensor& quantize(const Tensor& v, Fp8Operand k, bool tp_split, bool record,
                         const StepContext& cx) const;
  bool wgrad(const StepContext& cx) const { return cx.cfg->fp8.wgrad; }

  // The fused casts (CUDA, bf16, delayed scaling: the scale is known before the tensor is
  // read, so the element function, the cast and the amax are one pass; ops' fp8_*_cast).
  // Whether they apply to v (a [.., C] bf16 tensor) in this pass.
  bool fused(const Tensor& v, const StepContext& cx) const;
  // fc2 of a GELU MLP: its input a = gelu(pre) cast from pre by fp8_gelu_cast, used by the
  // next forward (row-wise copy, amax recorded; act, when defined, gets a in bf16 too, or,
  // when act is FP8 [C, R], the kept column-wise copy: keeps_input_t) or, with `backward`,
  // by the next backward's wgrad (column-wise copy, nothing recorded).
  void precast_gelu_input(const Tensor& pre, Tensor& act, bool backward,
                          const StepContext& cx) const {
    precast_act_input(pre, act, backward, false, cx);
  }
  // The same for fc2 of a SwiGLU MLP: a = swiglu(pre), pre [T, 2F] (fp8_swiglu_cast).
  void precast_swiglu_input(const Tensor& pre, Tensor& act, bool backward,
                            const StepContext& cx) const {
    precast_act_input(pre, act, backward, true, cx);
  }
  // Whether the SwiGLU casts apply to pre [T, 2F] in this pass: fused(), FP8 wgrad (the
  // bf16 activation and gradient are never written) and F a multiple of 64.
  bool fused_swiglu(const Tensor& pre, const StepContext& cx) const;
  // fc1 of a GELU MLP: its output gradient g = gelu_backward(dact, pre) cast by
  // fp8_dgelu_cast (both copies, amax recorded) with the bias gradient b.g += sum g; g is
  // written to dpre only when the next backward still reads the bf16 gradient
  // (--no-fp8-wgrad). dpre may be dact (in place).
  void precast_dgelu_grad(const Tensor& dact, const Tensor& pre, Tensor& dpre, const ParamView& b,
                          const StepContext& cx) const {
    precast_act_grad(dact, pre, dpre, b, false, cx);
  }
  // fc1 of a SwiGLU MLP: g = swiglu_backward(dact, pre) [T, 2F] cast by fp8_dswiglu_cast
  // (both copies, amax recorded, db); with FP8 wgrad only (fused_swiglu): no bf16 g.
  void precast_dswiglu_grad(const Tensor& dact, const Tensor& pre, const ParamView& b,
                            const StepContext& cx) const {
    Tensor none;
    precast_act_grad(dact, pre, none, b, true, cx);
  }
  // Forget the precast operands (the caller, once the GEMMs that read them are issued).
  void clear_precast() const { precast_ = 0; }

  // The input's column-wise (transposed) FP8 copy kept from the forward for the backward's
  // wgrad, in place of a kept bf16 input (half the bytes, and no cast in the backward): a
  // layer that keeps its input (fc2's, --keep-mlp-activations) under delayed scaling with
  // FP8 wgrad on CUDA in bf16, where the scale cannot change between the forward and the
  // backward (it changes after the step), so the kept bytes are those the backward's cast
  // would write. Whether this layer does so for an input of `cols` columns: then the
  // caller saves an FP8 [cols, T] tensor (kept_input_dtype) instead of the bf16 input.
  bool keeps_input_t(const TransformerConfig& c, const Dims& d, int64_t cols) const;
  static DType kept_input_dtype() { return DType::FP8E4M3; }
  // Forward: x cast row-wise for this forward's GEMM (scratch) and column-wise into
  // kept [C, R] in one pass, amax recorded.
  void precast_input(const Tensor& x, Tensor& kept, const StepContext& cx) const;
  // Backward: the wgrad operand is `kept` (written by precast_input or precast_gelu_input
  // in this step's forward); clear_precast() after the GEMMs.
  void use_kept_input(const Tensor& kept, const StepContext& cx) const;

 private:
  void precast_act_input(const Tensor& pre, Tensor& act, bool backward, bool swiglu,
                         const StepContext& cx) const;
  void precast_act_grad(const Tensor& dact, const Tensor& pre, Tensor& dpre, const ParamView& b,
                        bool swiglu, const StepContext& cx) const;
  struct Cast {  // a real FP8 operand (CUDA): row-wise, column-wise, 1/scale
    Tensor q, qt, scale_inv;
    Tensor s_q, s_qt;  // blockwise: the copies' block scale_inv (cuBLASLt's layout)
  };
  // ---- FP8 blockwise (fp8_block_linear.cpp)
  bool blockwise(const StepContext& cx) const { return cx.cfg->fp8.blockwise(); }
  void block_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& residual,
                     Tensor& y, const StepContext& cx) const;
  // dgrad and (fp8_wgrad) wgrad; the --no-fp8-wgrad GEMM and db stay backward()'s.
  void block_backward(const Tensor& dy, const Tensor& x, const ParamView& w, Tensor& dx,
                      bool fp8_wgrad, const StepContext& cx) const;
  // The emulation's Q(v) in br x bc blocks into q_[k] (slot 0) or qb_[k] (slot 1).
  const Tensor& block_quantize(const Tensor& v, Fp8Operand k, int64_t br, int64_t bc, int slot,
                               const StepContext& cx) const;
  // The real cast (CUDA) into the shared scratch: tile for the weight; row / col: the copies.
  const Cast& block_cast(const Tensor& v, Fp8Operand k, bool row, bool col,
                         const StepContext& cx) const;
  mutable Tensor qb_[3];  // blockwise emulation: the second quantisation of x and dy
  // The scale of operand k for v: delayed, the stored one (v's amax recorded into the
  // history when `record`, by the cast kernel when `fused_amax` is given); tensorwise,
  // from v's own amax (over TP when tp_split).
  Tensor scale_for(const Tensor& v, Fp8Operand k, bool tp_split, bool record, Tensor* fused_amax,
                   const StepContext& cx) const;
  // db (an output gradient's cast only): when given and the fused cast applies, db += the
  // column sums of v in the same pass, and *db_done is set.
  // Activation and gradient casts, shared by every layer (operand k's slot).
  static Cast& shared_cast(int k);
  const Cast& cast(const Tensor& v, Fp8Operand k, bool tp_split, bool record, bool rowwise,
                   bool colwise, const StepContext& cx, Tensor* db = nullptr,
                   bool* db_done = nullptr) const;

  int layer_ = -1;
  Tensor history_, scale_;               // delayed: the persistent buffers
  mutable Tensor cur_amax_, cur_scale_;  // tensorwise: [1, 3], [3]
  mutable Tensor q_[3];                  // the quantised operands (emulation)
  mutable Tensor kept_scale_inv_;        // [1]: 1/scale of the kept input copy
  // Bit k: operand k is already cast (precast_*), in the shared scratch; kPrecastDb: the
  // precast gradient's bias gradient is taken.
  static constexpr unsigned kPrecastDb = 1u << 3;
  mutable unsigned precast_ = 0;

  // ---- --fp8-param-gather (model/fp8/fp8_param.h) -------------------------------------
  // The FP8 weight the distributed optimizer keeps for this layer (cast once per step from
  // its fp32 main parameters, all-gathered as FP8 bytes), or nullptr: then the layer casts
  // its own weight. With one, the GEMMs read it (row-wise in fprop, its transpose in dgrad;
  // the emulation its dequantised values) and the forward records no weight amax (the
  // optimizer's cast does, delayed scaling).
  const Fp8ParamWeight* param_weight() const;
  void bind_param_weight(const ParamStore* store, const std::string& weight);
  const ParamStore* pg_store_ = nullptr;
  std::string pg_weight_;
};

}  // namespace mcpp::model
