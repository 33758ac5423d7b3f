// The routed experts (Megatron-Core's GroupedMLP / TEGroupedMLP): E independent MLPs over
// the permuted rows, grouped by expert (rows [off_e, off_e + n_e) belong to expert e), with
// the routing probability applied after the activation, as Megatron does:
//
//   forward:  h_e = x_e @ W1_e^T;  a_e = act(h_e);  y_e = (a_e * p_e) @ W2_e^T
//   backward: d(ap) = dy_e @ W2_e;  dW2_e += dy_e^T (a_e * p_e);  dp = rowsum(d(ap) * a_e)
//             da = d(ap) * p_e;  dh = act'(h_e) da;  dW1_e += dh^T x_e;  dx_e = dh @ W1_e
//
// Parameters (grouped form, global expert index e): mlp.experts.linear_fc1.weight{e}
// [(2)I, H] (SwiGLU: [gate; up], each ETP rank its rows of both) and
// mlp.experts.linear_fc2.weight{e} [H, I] (split by columns), grad_group Expert. With expert
// parallelism a rank holds its El = E/EP experts only (still named by global index e =
// ep_rank*El + j) and counts are per local expert. An expert
// with no rows runs no GEMM and its gradients stay as they are.
#pragma once
#include <vector>

#include "model/module.h"
#include "model/params.h"

namespace mcpp::model::moe {

class GroupedExperts {
 public:
  static void add_params(const TransformerConfig& c, int layer, std::vector<ParamInfo>& params);
  GroupedExperts() = default;
  GroupedExperts(const TransformerConfig& c, int layer, const ParamStore* store);

  // Rows of the N-row buffers this batch uses, one slice per expert.
  struct Saved {
    Tensor fc1;  // [Nmax, FC1W/ETP] fc1 outputs
    Tensor act;  // [Nmax, I/ETP] activations (before the probabilities)
  };
  struct Scratch {
    Tensor ap, dap, dact, dfc1;  // [Nmax, I/ETP] x3, [Nmax, FC1W/ETP]
  };
  static void saved_specs(const TransformerConfig& c, int64_t Nmax, DType dt, Saved& s,
                          const TensorVisitor& v);
  static void scratch_specs(const TransformerConfig& c, int64_t Nmax, DType dt, Scratch& w,
                            const TensorVisitor& v);

  // xp [N,H], p [N] (statistics dtype) -> yp [N,H]; counts [El] rows per local expert
  // (sum N).
  void forward(const Tensor& xp, const Tensor& p, const std::vector<int64_t>& counts, Saved& s,
               Tensor& yp, Scratch& w, Stream& st) const;
  // dyp [N,H] -> dxp [N,H] (=), dp [N] (=); weight gradients +=.
  void backward(const Tensor& dyp, const Tensor& xp, const Tensor& p,
                const std::vector<int64_t>& counts, const Saved& s, Tensor& dxp, Tensor& dp,
                Scratch& w, Stream& st);

 private:
  const TransformerConfig* cfg_ = nullptr;
  std::vector<ParamView> w1_, w2_;
};

}  // namespace mcpp::model::moe
