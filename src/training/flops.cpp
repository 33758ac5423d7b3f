#include "training/flops.h"

#include "base/error.h"

namespace mcpp::training {

FlopsShape FlopsShape::from_args(const Args& a) {
  MCPP_CHECK_HINT(a.padded_vocab_size.has_value(),
                  "set args.padded_vocab_size = padded_vocab_size(vocab, divisible_by, TP) "
                  "once the tokenizer is built",
                  "FLOPs need the padded vocabulary size, which is not known yet");
  MCPP_CHECK_HINT(a.kv_channels > 0 && a.ffn_hidden_size > 0, "call validate_args first",
                  "FLOPs need validated arguments (kv_channels / ffn_hidden_size are unset)");
  FlopsShape f{a.num_layers,          a.hidden_size,        a.ffn_hidden_size,
          a.num_attention_heads, a.num_query_groups,   a.kv_channels,
          a.seq_length,          *a.padded_vocab_size, a.swiglu};
  if (a.num_experts) {  // mixture of experts
    for (int64_t x : a.moe_layer_pattern) f.num_moe_layers += x;
    f.moe_ffn_hidden_size = a.moe_ffn_hidden_size.value_or(a.ffn_hidden_size);
    f.moe_topk = a.moe_router_topk;
    f.shared_ffn_hidden_size = a.moe_shared_expert_intermediate_size.value_or(0);
    f.last_layer_moe = !a.moe_layer_pattern.empty() && a.moe_layer_pattern.back() == 1;
  }
  f.mtp_num_layers = a.mtp_num_layers.value_or(0);
  if (a.multi_latent_attention) {  // the core's padded values are not counted (Megatron's)
    f.mla = true, f.q_lora_rank = a.q_lora_rank.value_or(0), f.kv_lora_rank = a.kv_lora_rank;
    f.qk_head_dim = a.qk_head_dim, f.qk_pos_emb_head_dim = a.qk_pos_emb_head_dim;
    f.v_head_dim = a.v_head_dim;
  }
  return f;
}

double num_floating_point_operations(const FlopsShape& m, int64_t batch_size) {
  // fb = 3 (forward, input grad, weight grad) GEMMs per weight; fma = 2 FLOPs per MAC.
  const double fb_fma = 3.0 * 2.0;
  const double h = static_cast<double>(m.hidden_size);
  const double D = static_cast<double>(m.mtp_num_layers);
  const double L = static_cast<double>(m.num_layers) + D;  // the MTP layers' too
  const double s = static_cast<double>(m.seq_length);
  const double V = static_cast<double>(m.padded_vocab_size);
  const double F = static_cast<double>(m.ffn_hidden_size);
  // SwiGLU: gate, up and down GEMMs. Squared ReLU counts as GELU (Megatron's scale_factor
  // is 3/2 for SwiGLU only): the same two GEMMs, and the activation's own FLOPs are not counted.
  // Quick-GEGLU, though gated, counts as GELU too: Megatron's count reads args.swiglu alone.
  const double ffn_expansion = m.swiglu ? 3.0 : 2.0;
  const double q = static_cast<double>(m.kv_channels * m.num_attention_heads);
  const double kv = static_cast<double>(m.kv_channels * m.num_query_groups);
  const double T = static_cast<double>(batch_size) * s;       // tokens in the batch
  const double Q2 = static_cast<double>(batch_size) * s * s;  // sum of squared lengths
  // Per layer: QKV projection (q + k + v outputs) and output projection.
  double attn_linear = fb_fma * (h * (q + kv + kv) + q * h);
  // Per layer and token pair: QK^T and PV, halved for the causal mask.
  double attn_core = fb_fma * q / 2.0 * 2.0;
  if (m.mla) {  // Megatron's MLA terms: the latents (with their norms' "+ 1"), RoPE's key part
    const double nh = double(m.num_attention_heads);
    const double dq = double(m.qk_head_dim + m.qk_pos_emb_head_dim);
    const double rq = double(m.q_lora_rank), rkv = double(m.kv_lora_rank);
    const double q_term = m.q_lora_rank ? rq * (h + nh * dq + 1) : h * nh * dq;
    attn_linear = fb_fma * (q_term + rkv * (h + nh * double(m.qk_head_dim + m.v_head_dim) + 1) +
                            h * double(m.qk_pos_emb_head_dim) + nh * double(m.v_head_dim) * h);
    attn_core = fb_fma * (nh * dq / 2 + nh * double(m.v_head_dim) / 2);
  }
  const double moe = static_cast<double>(m.num_moe_layers) + (m.last_layer_moe ? D : 0.0);
  const double moe_width = static_cast<double>(m.moe_ffn_hidden_size * m.moe_topk +
                                               m.shared_ffn_hidden_size);
  const double mlp = fb_fma * h * ffn_expansion * (F * (L - moe) + moe_width * moe);
  const double logits = fb_fma * h * V * (D + 1);
  const double mtp = fb_fma * D * (3 * h + 2 * h * h);  // MTP norms and eh_proj
  return T * (mlp + attn_linear * L + logits + mtp) + Q2 * attn_core * L;
}

double num_floating_point_operations(const Args& args, int64_t batch_size) {
  return num_floating_point_operations(FlopsShape::from_args(args), batch_size);
}

double throughput_tflops_per_gpu(double flops, double seconds, int64_t world_size) {
  MCPP_CHECK(seconds > 0.0 && world_size > 0, "throughput: bad time {} s or world size {}", seconds,
             world_size);
  return flops / (seconds * 1e12 * static_cast<double>(world_size));
}

}  // namespace mcpp::training
