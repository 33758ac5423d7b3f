// The routed experts (Megatron-Core's GroupedMLP / TEGroupedMLP): E independent MLPs over
// the permuted rows, grouped by expert (rows [off_e, off_e + n_e) belong to expert e), with
// the routing probability applied after the activation, as Megatron does:
//
//   forward:  h_e = x_e @ W1_e^T + b1_e;  a_e = act(h_e);  y_e = (a_e * p_e) @ W2_e^T + p_e b2_e
//   backward: d(ap) = dy_e @ W2_e;  dW2_e += dy_e^T (a_e * p_e);  dp = rowsum(d(ap) * a_e)
//             da = d(ap) * p_e;  dh = act'(h_e) da;  dW1_e += dh^T x_e;  dx_e = dh @ W1_e
//             db1_e += colsum(dh);  db2_e += p_e^T dy_e;  dp += dy_e b2_e
//
// The biases (--add-bias-linear; Megatron's TEGroupedMLP and SequentialMLP alike): fc1's
// inside its GEMM, before the activation (and its clamp); fc2's scaled by the probability,
// y = p (W2 a + b2), which both of Megatron's expert forms compute (TEGroupedMLP's
// _apply_bias adds b2 p after the GEMM, SequentialMLP output_bias * per_token_scale), so a
// row's bias counts with its routing weight and d(loss)/dp sees it. Whole experts only
// (ETP 1, as Megatron requires): a split fc2 would add its bias once per ETP rank.
//
// --moe-apply-probs-on-input (top-1 only, as Megatron asserts; Llama 4's experts): the rows
// are scaled by their probability before fc1 and the experts then see probabilities of one
// (Megatron's experts.py: permuted_probs * hidden, cast to the model's dtype, probs reset to
// ones), so y_e = W2_e act(W1_e (p_e x_e) + b1_e) + b2_e. Backward: the experts' backward
// with xs = p x (recomputed) and ones gives dxs; dp = rowsum(dxs * x), dx = dxs * p.
//
// The activation and the probabilities are one op each way over all rows
// (moe_act_scale_forward / _backward: ap from h; dp and dh from d(ap) and h, a recomputed),
// bit for bit the unfused activation and moe_scale_rows / moe_row_dot ops.
//
// Parameters (grouped form, global expert index e): mlp.experts.linear_fc1.weight{e}
// [(2)I, H] (a gated unit: [gate; up], each ETP rank its rows of both) and
// mlp.experts.linear_fc2.weight{e} [H, I] (split by columns), with --add-bias-linear
// mlp.experts.linear_fc1.bias{e} [(2)I] and mlp.experts.linear_fc2.bias{e} [H] (zeros, not
// decayed), all grad_group Expert. With expert
// parallelism a rank holds its El = E/EP experts only (still named by global index e =
// ep_rank*El + j) and counts are per local expert. An expert
// with no rows runs no GEMM and its gradients stay as they are.
//
// FP8 (--fp8-format, docs/fp8.md "Routed experts"): each expert GEMM is an Fp8Linear of its
// own (fc1_e, fc2_e: fprop, dgrad and wgrad as a dense linear's, every recipe), with its own
// scaling state (delayed: buffers named after the expert's weight, add_fp8_buffers below).
// fc1_e is column-parallel over the ETP group (its input whole, its output gradient split),
// fc2_e row-parallel (its input split): current scaling reduces a split tensor's amax over
// the ETP group, the expert's `etp` communicator (null when the experts are not split). The
// routing probability stays outside the GEMMs (applied in the model's dtype). On CUDA an
// expert's rows are copied into a zero-padded scratch of a multiple of 16 rows (128 under
// blockwise) when its count is not one: cuBLASLt's FP8 GEMMs need every dimension such a
// multiple, and zero rows change no amax, no output row and no weight gradient.
#pragma once
#include <vector>

#include "model/fp8/fp8_linear.h"
#include "model/module.h"
#include "model/params.h"

namespace mcpp::comm {
class Communicator;
}

namespace mcpp::model::moe {

class GroupedExperts {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  // The delayed-scaling buffers of this rank's experts' GEMMs (FP8 layers, delayed recipe),
  // carrying the expert index: checkpointed and resharded as the expert weights are.
  static void add_fp8_buffers(const TransformerConfig& c, int layer, std::vector<BufferInfo>& out);
  GroupedExperts() = default;
  GroupedExperts(const TransformerConfig& c, int layer, const ParamStore* store);

  // Rows of the N-row buffers this batch uses, one slice per expert.
  // The activation a itself is always recomputed from fc1 inside moe_act_scale_backward (dp
  // needs it). fc2's input ap is kept only where the layer keeps its MLP activation
  // (--keep-mlp-activations, as the dense MLP): otherwise the forward writes it into the
  // backward-only scratch dap, and the backward recomputes it in the same pass as dfc1 (bf16
  // and f16: fc2's data-gradient GEMMs, then moe_act_scale_backward writing ap over dap,
  // then fc2's weight-gradient GEMMs; FP8, whose expert GEMMs take both gradients in one
  // call: moe_act_scale_forward into dfc1's rows first). The same bits either way; the
  // Mixtral-style model at micro-batch 16 keeps 537 MB a layer fewer.
  struct Saved {
    Tensor fc1;  // [Nmax, FC1W/ETP] fc1 outputs
    Tensor ap;   // [Nmax, I/ETP] activations times the probabilities (fc2's input), kept
  };
  struct Scratch {
    Tensor dap, dfc1;  // [Nmax, I/ETP], [Nmax, FC1W/ETP]
    Tensor xs, ones;   // --moe-apply-probs-on-input: [Nmax, H] the scaled rows, [Nmax] ones
  };
  static void saved_specs(const TransformerConfig& c, int64_t Nmax, DType dt, bool keep_ap,
                          Saved& s, const TensorVisitor& v);
  // sdt: the probabilities' (statistics) dtype
  static void scratch_specs(const TransformerConfig& c, int64_t Nmax, DType dt, DType sdt,
                            Scratch& w, const TensorVisitor& v);

  // xp [N,H], p [N] (statistics dtype) -> yp [N,H]; counts [El] rows per local expert
  // (sum N). etp: the group the experts are split over (null when whole).
  void forward(const Tensor& xp, const Tensor& p, const std::vector<int64_t>& counts, Saved& s,
               Tensor& yp, Scratch& w, const StepContext& cx, comm::Communicator* etp) const;
  // dyp [N,H] -> dxp [N,H] (=), dp [N] (=); weight gradients +=.
  void backward(const Tensor& dyp, const Tensor& xp, const Tensor& p,
                const std::vector<int64_t>& counts, const Saved& s, Tensor& dxp, Tensor& dp,
                Scratch& w, const StepContext& cx, comm::Communicator* etp);

  // Rows an FP8 expert GEMM's operands are padded to a multiple of; 0 (default): 16 on CUDA
  // (128 under blockwise), none on the CPU. Tests set it on the CPU to check that the padding
  // changes nothing.
  void set_fp8_row_multiple(int64_t m) { pad_rows_ = m; }

 private:
  // One FP8 expert GEMM pass over rows [off, off + n) (padded on CUDA): fprop into y, or the
  // backward (dgrad into dx, wgrad into the weight's gradient).
  void fp8_forward(const Fp8Linear& f, const Tensor& x, bool x_split, const ParamView& w,
                   const ParamView& b, Tensor& y, const StepContext& cx) const;
  void fp8_backward(const Fp8Linear& f, const Tensor& dy, bool dy_split, const Tensor& x,
                    bool x_split, const ParamView& w, const ParamView& b, Tensor& dx,
                    const StepContext& cx) const;
  int64_t row_multiple(const StepContext& cx, Device dev) const;
  // backward's GEMMs and activation over the rows as the experts saw them
  void backward_rows(const Tensor& dyp, const Tensor& xp, const Tensor& p,
                     const std::vector<int64_t>& counts, const Saved& s, Tensor& dxp,
                     Tensor& dp, Scratch& w, const StepContext& cx, comm::Communicator* etp);

  const TransformerConfig* cfg_ = nullptr;
  std::vector<ParamView> w1_, w2_;
  std::vector<ParamView> b1_, b2_;  // --add-bias-linear (undefined views without)
  std::vector<Fp8Linear> f1_, f2_;  // one per local expert and GEMM
  int64_t pad_rows_ = 0;
};

}  // namespace mcpp::model::moe
