// Small value types shared by the op catalogue.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "tensor/tensor.h"

namespace mcpp::ops {

// The MLP's activation (model/mlp.h, the MoE experts; Megatron's config.activation_func):
// GELU in its tanh form (Megatron's bias_gelu fusion), SwiGLU (gated: fc1 [., 2F] =
// [gate | up]), squared ReLU (Primer, Nemotron-4: relu(x)^2, not gated), quick-GEGLU (gpt-oss:
// quick_gelu(x) = x sigmoid(1.702 x) gating, fc1 as SwiGLU's) or the exact GELU
// x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (torch's F.gelu: Megatron's MLP without the fusion).
enum class MlpActivation : uint8_t { Gelu, Swiglu, SquaredRelu, QuickGeglu, GeluErf };

// A gated unit's two parameters (Megatron's glu_linear_offset and activation_func_clamp_value,
// mlp.py's glu()): with C the clamp (+inf: none), of fc1's [gate | up]
//   g = min(gate, C), u = min(max(up, -C), C),   y = act(g) * (u + offset).
// torch.clamp's bounds: with C < 0 every u is C; its gradient passes at the bounds themselves.
struct GluParams {
  double offset = 0;
  double clamp = std::numeric_limits<double>::infinity();
  bool clamped() const { return clamp != std::numeric_limits<double>::infinity(); }
  // Neither: SwiGLU's own ops (swiglu_forward, the fused GEMM and FP8 paths) compute it.
  bool plain() const { return offset == 0 && !clamped(); }
  bool operator==(const GluParams&) const = default;
};

// The MLP activation as the ops take it: the kind and, for the gated kinds (SwiGLU,
// quick-GEGLU), its GluParams. A bare kind converts to one without offset or clamp.
struct MlpAct {
  MlpActivation kind = MlpActivation::Gelu;
  GluParams glu;
  MlpAct() = default;
  MlpAct(MlpActivation k, GluParams g = {})  // NOLINT(google-explicit-constructor)
      : kind(k), glu(g) {}
  // fc1 is [gate | up], twice the activation's width.
  bool gated() const { return kind == MlpActivation::Swiglu || kind == MlpActivation::QuickGeglu; }
  // SwiGLU without offset or clamp: the plain swiglu_* ops and their fused forms apply.
  bool plain_swiglu() const { return kind == MlpActivation::Swiglu && glu.plain(); }
  bool operator==(const MlpAct&) const = default;
};

// Dropout and other random draws: a counter-based key. `stream` identifies the
// site (iteration, micro-batch, layer, which dropout); the element's global index
// is the Philox counter, so any partition of the tensor draws the same mask.
struct DropoutKey {
  uint64_t seed = 0;
  uint64_t stream = 0;
};

// Global index of local element (i0, i1, i2) of a local [d0, d1, d2] tensor that is a
// block of a global [G0, G1, G2] tensor starting at (o0, o1, o2):
//   ((i0 + o0) * G1 + (i1 + o1)) * G2 + (i2 + o2).
// For [S, B, H] activations: S sharded by SP/CP, B by DP (o1 = first sample of this
// micro-batch in the global batch), H by TP.
// Context parallelism holds two chunks of the sequence that are not adjacent: local rows
// i0 >= split0 sit jump0 further along dim 0 ((i0 + o0 + jump0) instead); split0 =
// INT64_MAX (the default) for one contiguous block.
struct GlobalIndex3 {
  int64_t offset[3] = {0, 0, 0};
  int64_t global[3] = {0, 0, 0};
  int64_t split0 = INT64_MAX, jump0 = 0;
  int64_t row0(int64_t i0) const { return i0 + offset[0] + (i0 >= split0 ? jump0 : 0); }
  static GlobalIndex3 whole(int64_t d0, int64_t d1, int64_t d2) {
    return {{0, 0, 0}, {d0, d1, d2}};
  }
};

// Attention shapes. qkv is linear_qkv's output in Megatron's grouped layout
// [S, B, NG, NH/NG + 2, HD]: per query group its NH/NG query heads, then one key
// head, then one value head. NH and NG are local (per TP rank) counts.
struct AttentionDims {
  int64_t S = 0, B = 0, NH = 0, NG = 0, HD = 0;
  // Global coordinates for attention dropout: element (b, h, q, k) has global index
  // (((b + b_offset) * NH_global + h + h_offset) * S_global + q + q_offset) * S_global
  //   + k + k_offset.
  int64_t b_offset = 0, h_offset = 0, NH_global = 0, q_offset = 0, k_offset = 0, S_global = 0;
  // Document masking (--reset-attention-mask): [B, S] i64 on the op's device, the first
  // GLOBAL key position query row (b, q) may see (the first token of its document); keys
  // before it are masked as well as the causal ones. Undefined: causal only.
  Tensor key_start;
  // A context-parallel block (ops::attention_block_*) may be rectangular: S query rows
  // against S_kv key/value rows (0: S). Its lse may be a view into a wider [B, NH, lse_ld]
  // tensor whose first S columns of each row are this call's (0: lse_ld = S). Both other
  // than their defaults only where ops::attention_block_rect_supported says so (cuDNN's
  // fused attention, no dropout, no document mask): the ring's fused steps
  // (parallel/context_parallel/cp_attention.cpp).
  int64_t S_kv = 0, lse_ld = 0;
  // Attention dropout's keep bits from forward to backward (device bytes, at least
  // flash_dropout_mask_bytes(B, NH, S): attention_backend.h), or undefined. Where the own
  // flash kernel runs with dropout on its aligned path, the forward writes the bits it
  // draws and the backward reads them instead of drawing the mask again; every other
  // kernel ignores it. The model's layers keep one per layer (model/core_attention.h).
  Tensor keep_bits;
  // Attention sinks (--softmax-type; model/core_attention.h) for the generation ops
  // (attention_kv_cache_forward, decode_attention, rope_attention_decode, attention_prefill):
  // [NH] sink logits of this call's heads, each a softmax logit with no value. Undefined:
  // none. The training ops refuse it: there the core applies attention_sink_forward.
  Tensor sink;
  // Sliding-window attention (--window-size L,0) for the same generation ops: the query at
  // position q sees the keys [max(0, q - window_left), q]. -1: no window. The training ops
  // refuse it: there a window layer's key_start carries it (model/core_attention.cpp).
  int64_t window_left = -1;
  // The first key the query at position q sees under window_left (0 without a window).
  int64_t first_key(int64_t q) const {
    return window_left >= 0 && q > window_left ? q - window_left : 0;
  }
  int64_t qkv_width() const { return NG * (NH / NG + 2) * HD; }
  int64_t kv_rows() const { return S_kv > 0 ? S_kv : S; }
  int64_t lse_stride() const { return lse_ld > 0 ? lse_ld : S; }
  bool rectangular() const { return kv_rows() != S || lse_stride() != S; }
  // The elements an lse view of this call spans: [B, NH] rows of lse_stride(), the last
  // row's first S.
  int64_t lse_span() const { return B * NH == 0 ? 0 : (B * NH - 1) * lse_stride() + S; }
};

// cuDNN's deterministic attention backward keeps dP of every (sequence, head) in its
// workspace, NH*S*S*2 bytes a sequence; above a cap (MCPP_ATTENTION_BWD_WORKSPACE_MB,
// default 8192) the batch runs in chunks of sequences: the largest divisor of B whose
// workspace fits. When one sequence alone is over the cap (the Llama-style 1B at S 32K:
// 32 heads x 32K^2 x 2 = 64 GiB), that sequence runs in chunks of whole key/value groups
// (the query heads of a group with their K/V head, so dK/dV of a group come from its own
// heads only): the largest divisor of NG whose heads' dP fits (at least 1 group). Shared
// by the CUDA op and the memory plan.
inline int64_t attention_bwd_workspace_cap_from_env() {
  const char* e = std::getenv("MCPP_ATTENTION_BWD_WORKSPACE_MB");
  const int64_t mb = e ? std::atoll(e) : 8192;
  return (mb > 0 ? mb : 0) << 20;
}
// The largest divisor of n (at least 1) whose `n_c * unit` fits `cap`.
inline int64_t attention_bwd_chunk(int64_t n, int64_t unit, int64_t cap) {
  int64_t c = n;
  while (c > 1 && c * unit > cap) {
    --c;
    while (n % c) --c;
  }
  return c;
}
// dP of one sequence: NH (local) heads of S x S_kv (a rectangular context-parallel block;
// S_kv 0: S x S), 2 bytes each.
inline int64_t attention_bwd_per_seq_bytes(int64_t NH, int64_t S, int64_t S_kv = 0) {
  return NH * S * (S_kv > 0 ? S_kv : S) * 2;
}
// One cuDNN backward call: `seqs` sequences of `groups` key/value groups each (groups < NG
// only with seqs == 1).
struct AttentionBwdChunk {
  int64_t seqs = 1, groups = 1;
};
inline AttentionBwdChunk attention_bwd_chunking(int64_t B, int64_t NH, int64_t NG, int64_t S,
                                                int64_t cap, int64_t S_kv = 0) {
  const int64_t per_seq = attention_bwd_per_seq_bytes(NH, S, S_kv);
  AttentionBwdChunk c{attention_bwd_chunk(B, per_seq, cap), NG};
  if (c.seqs == 1 && per_seq > cap) c.groups = attention_bwd_chunk(NG, per_seq / NG, cap);
  return c;
}
// The workspace cuDNN's deterministic backward asks for in one call over Bc sequences of
// NHc heads in NGc groups: dP, Bc*NHc*S*S*2 bytes, plus, with grouped-query attention
// (NGc < NHc), an f32 [Bc, NHc, S_kv, HD] buffer in which it sums the heads of a group before
// reducing to dK/dV. This is the size cuDNN 9 reports for these graphs (measured on 9.19,
// H200, for square calls); the op compares every backward plan's workspace with it and
// warns, naming the linked cuDNN version, if a cuDNN asks for more
// (ops/cuda/cudnn_attention.cpp), so the memory plan's figure is checked against whichever
// cuDNN the run links. S_kv 0: S (a square call).
inline int64_t cudnn_attention_bwd_call_workspace_bytes(int64_t Bc, int64_t NHc, int64_t NGc,
                                                        int64_t S, int64_t HD, int64_t S_kv = 0) {
  const int64_t skv = S_kv > 0 ? S_kv : S;
  return Bc * attention_bwd_per_seq_bytes(NHc, S, skv) + (NGc < NHc ? Bc * NHc * skv * HD * 4 : 0);
}
// The same for a batch of B sequences under `cap`: that of one chunk.
inline int64_t cudnn_attention_bwd_workspace_bytes(int64_t B, int64_t NH, int64_t NG,
                                                   int64_t S, int64_t HD, int64_t cap,
                                                   int64_t S_kv = 0) {
  const AttentionBwdChunk c = attention_bwd_chunking(B, NH, NG, S, cap, S_kv);
  return cudnn_attention_bwd_call_workspace_bytes(c.seqs, NH / NG * c.groups, c.groups, S, HD,
                                                  S_kv);
}

// RoPE's frequencies, as the rope ops take them: inv_freq_i = base^(-2i / rot_dim) for rotary
// pair i < rot_dim / 2; with `scaled`, rescaled by wavelength as Llama 3.x does (Megatron's
// --use-rope-scaling, Hugging Face's rope_type "llama3"); then all divided by
// `interpolation`, linear position interpolation (Megatron's
// --rotary-seq-len-interpolation-factor, Hugging Face's rope_type "linear"): position p
// rotates as p / interpolation did. ops/rope_math.h has the formula.
// A bare base converts to plain RoPE, so a caller without scaling passes its base as before.
struct RopeFreqs {
  double base = 10000;
  bool scaled = false;
  double factor = 8;                      // the longest wavelengths' divisor
  double low_freq_factor = 1;             // wavelengths above original / low: divided by factor
  double high_freq_factor = 4;            // wavelengths below original / high: unchanged
  int64_t original_max_positions = 8192;  // the context the unscaled model was trained for
  double interpolation = 1;               // every frequency's divisor; 1: none (exactly)
  // YaRN (Megatron's --position-embedding-type yarn, Hugging Face's rope_type "yarn"): the
  // frequencies of ops/rope_math.h's yarn_inv_freq from base, factor, original_max_positions
  // and these; exclusive with `scaled`.
  bool yarn = false;
  double beta_fast = 32, beta_slow = 1;
  bool yarn_round_to_int = true;  // the correction range's bounds floored and ceiled
  double mscale = 1;              // multiplies cos and sin (YaRN's concentration factor)
  RopeFreqs() = default;
  RopeFreqs(double b) : base(b) {}  // NOLINT(google-explicit-constructor): plain RoPE
  bool operator==(const RopeFreqs&) const = default;
};

struct AdamWParams {
  double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  int64_t step = 1;  // 1-based step number, for bias correction
  // The gradient is read as grad * grad_scale (rounded to grad's dtype, as ops::scale would
  // leave it): gradient clipping folded into the step's one pass (optim::Optimizer::clip).
  double grad_scale = 1.0;
};

}  // namespace mcpp::ops
