// The router's math on the host, in fp64 (Megatron's moe_utils.topk_routing_with_score_function,
// router.py's aux losses, apply_router_token_dropping), as pure functions of the logits so
// that tests can check them by finite differences. The logits are small ([T, E]); the
// router GEMM runs on the model's device, this on the host (at least Megatron's fp32
// routing precision).
//
//   softmax (post):  (l_k, idx) = topk(l, k);  p = softmax(l_k)
//   softmax (pre):   s = softmax(l);  (p, idx) = topk(s, k)
//   sigmoid:         s = sigmoid(l);  idx = topk(s + bias);  p = s[idx] / (sum s[idx] + 1e-20)
//                    (k > 1; p = s[idx] for k = 1)
//   sqrtsoftplus:    s = sqrt(softplus(l)), softplus(x) = log1p(exp(-|x|)) + max(x, 0); then
//                    as sigmoid (bias, renormalisation, aux scores); ds/dl = sigmoid(l) / (2 s)
//   group-limited:   a group's score = sum of its top (k / group_topk) scores; only the best
//                    group_topk groups take part in the top-k
//   sinkhorn:        training: idx = topk(sinkhorn(exp(l)), k), from Megatron's Sinkhorn
//                    normalisation of the block's [Tb, E] exp(l) (rows and columns rescaled
//                    in turn until the mean change of the column factors is at most 1e-4;
//                    no gradient); evaluation: idx = topk(a, k); either way p = a[idx] with
//                    a = softmax(l) (k > 1) or sigmoid(l) (k = 1), not renormalised
//   then p *= scaling factor; capacity (per block of tokens: one rank's tokens in Megatron)
//   keeps the cap = ceil(Tb * k / E * cf) highest-probability (or earliest) tokens per expert,
//   and with padding fills every expert to cap with tokens of probability 0.
//   --moe-router-padding-for-fp8 (pad_multiple 16): then each block's rows of every expert
//   are padded to a multiple of 16 with the block's earliest tokens not routed there, at
//   probability 0 (Megatron's pad_routing_map), so the FP8 expert GEMMs need no padding;
//   outputs and gradients are unchanged (FP8 amaxes may see the extra rows).
//
// Aux losses (added to the router's backward, never to the LM loss; T = all tokens routed):
//   aux_loss:         L = coeff * E / (k T^2) * sum_e c_e * sum_t s[t,e]
//   seq_aux_loss:     the same per sequence (T = S), averaged over the B sequences
//   global_aux_loss:  the same with c_e the running mean, over the global batch's
//                     micro-batches so far, of the counts summed over the DP x CP group, and
//                     T = this micro-batch's tokens of that group (Megatron's
//                     global_tokens_per_expert / ga_steps); none in evaluation
//   z_loss:           L = coeff * mean_t logsumexp_e(l[t,e])^2
// where s is the full softmax (sigmoid, sqrtsoftplus: a/sum a of the scores a) and c_e
// counts a separate top-k of s. Every listed type with a positive coefficient applies (the
// gradient is the sum of theirs). Ties in every top-k go to the lower index (deterministic).
//
// Context parallelism splits each sequence over CP ranks: every rank routes its own tokens,
// the counts c_e (per sequence for seq_aux_loss) are summed over the CP group and T (S) is
// the CP group's, so each rank's L and z-loss are its tokens' share of the whole sequences'
// and their sum over the CP ranks, like the gradients' sum, is the one-process value
// (Megatron's TP x CP reduction of the counts; its 1/|CP| on the z-loss). global_aux_loss
// does the same over the DP x CP group (Megatron's TP x DP x CP): a DP run equals the
// one-process run whose micro-batches hold the DP ranks' micro-batches together.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "model/config.h"

namespace mcpp::model::moe {

struct Routing {
  int64_t T = 0, E = 0, k = 0;
  std::vector<int32_t> idx;   // [T,k] selected experts (top-k order)
  std::vector<double> prob;   // [T,k] routing weights (scaled); 0 when dropped
  std::vector<uint8_t> kept;  // [T,k] survived capacity
  std::vector<double> topk_raw;  // [T,k] what the weights were computed from (see .cpp)
  std::vector<double> scores;    // [T,E] softmax (pre / aux) or sigmoid / sqrtsoftplus values
  // Dispatch: rows grouped by expert (expert-major, tokens ascending), padding included.
  std::vector<int64_t> counts;    // [E] rows per expert
  std::vector<int64_t> row_token; // [N] token of each row
  std::vector<int32_t> row_slot;  // [N] its top-k slot j, or -1 (a padding row: p = 0)
  std::vector<int64_t> tok_offsets, tok_rows;  // CSR: the rows of token t, ascending
  std::vector<double> tokens_per_expert;       // [E] routed (kept) tokens, for the expert bias
  // Aux losses (values with their coefficients) and what their gradients need.
  double aux_loss = 0, seq_aux_loss = 0, global_aux_loss = 0, z_loss = 0;
  std::vector<double> aux_scores;     // [T,E] s of the aux losses (one for every type)
  std::vector<double> aux_counts;     // [E] aux_loss's counts c (summed over CP)
  std::vector<double> seq_counts;     // [B,E] seq_aux_loss's, per sequence
  std::vector<double> global_counts;  // [E] global_aux_loss's running mean
  std::vector<double> lse;            // [T] logsumexp of the logits (z-loss)
  int64_t capacity = 0;               // 0: dropless
  int64_t cp = 1;                     // the CP ranks sharing the aux losses' token count
  int64_t global_ranks = 1;           // the DP x CP ranks sharing global_aux_loss's
};

// The ranks the aux losses count tokens over (see above). Context parallelism: the CP
// group's size and a sum of the aux_loss / seq_aux_loss counts over it. global_aux_loss:
// the DP x CP group's size, and what turns this micro-batch's counts [E] into the running
// mean of their sums over that group (the layer's state, MoeLayer); null: the counts stay.
struct AuxLossGroup {
  int64_t ranks = 1;
  std::function<void(std::vector<double>&)> sum;
  int64_t global_ranks = 1;
  std::function<void(std::vector<double>&)> global;
};

// logits [T,E] (row t = token t of the sequence-first [S,B] order); bias [E] or null.
// blocks: capacity (and sinkhorn's normalisation) apply per block of T/blocks consecutive
// tokens (one SP rank's, as Megatron routes each rank's tokens).
// B: sequences (seq_aux_loss groups token t into sequence t % B).
// training: false in evaluation and generation (sinkhorn then chooses by a = softmax/sigmoid).
Routing route(const TransformerConfig::Moe& m, const double* logits, int64_t T, int64_t B,
              const double* bias, int64_t blocks = 1, const AuxLossGroup& cp = {},
              bool training = true);

// Megatron's sinkhorn (moe_utils.py) on cost = exp(l) [T,E], in f64: d0 = 1/T / (cost d1 +
// 1e-8) by rows, d1 = 1/E / (d0 cost + 1e-8) by columns, repeated until the mean |change| of
// d1 is at most tol; returns d1[e] cost[t,e] d0[t]. An error past 100000 rounds (a positive
// matrix converges; that many rounds mean non-finite logits).
std::vector<double> sinkhorn(const double* logits, int64_t T, int64_t E, double tol = 1e-4);

// dlogits [T,E] (=) from d(loss)/d(prob) dprob [T,k] (rows of dropped slots are ignored);
// aux and z-loss gradients are added for tokens [r0, r1) only (aux_scale multiplies them:
// the schedule's 1/num_microbatches).
void route_backward(const TransformerConfig::Moe& m, const Routing& r, const double* logits,
                    const double* dprob, double aux_scale, int64_t r0, int64_t r1, int64_t B,
                    double* dlogits);

}  // namespace mcpp::model::moe
