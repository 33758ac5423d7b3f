// The tiny models of the golden tests (GPT-2 style, Llama style, and two multi-latent
// attention variants of the Llama one; the Hugging Face golden check adds Qwen2, Qwen3 and
// Mistral variants), their batch, and the perturbed weights that make every parameter matter.
#pragma once
#include <string>

#include "base/philox.h"
#include "model/gpt_model.h"

namespace mcpp::golden {

inline model::TransformerConfig golden_config(const std::string& family, DType dt) {
  model::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 4, c.kv_channels = 4;
  c.seq_length = 8, c.max_position_embeddings = 12, c.padded_vocab_size = 64;
  c.hidden_dropout = 0, c.attention_dropout = 0, c.dtype = dt, c.seed = 77;
  if (family == "gpt") {
    c.num_query_groups = 4, c.ffn_hidden_size = 64;
  } else {  // llama
    c.num_query_groups = 2, c.ffn_hidden_size = 24, c.rope = true, c.rotary_base = 10000;
    c.rmsnorm = true, c.swiglu = true, c.tie_embeddings = false, c.add_bias_linear = false;
    if (family == "qwen2") {  // q/k/v biases (--add-qkv-bias), tied, Qwen's RoPE base
      c.add_qkv_bias = true, c.tie_embeddings = true, c.rotary_base = 1e6;
    } else if (family == "qwen3") {  // q/k norms, head_dim != hidden / heads
      c.qk_layernorm = true, c.kv_channels = 8, c.norm_epsilon = 1e-6, c.rotary_base = 1e6;
    } else if (family == "llama_interleaved") {  // --rotary-interleaved: pairs (2i, 2i + 1)
      c.rotary_interleaved = true;
    } else if (family == "mistral") {  // multi-query attention
      c.num_query_groups = 1, c.rotary_base = 1e6;
    } else if (family == "mla" || family == "mla_rope") {
      // Multi-latent attention; the core sees NH heads of Dq = Dn + Dr (as model_config sets).
      auto& m = c.mla;
      m.on = true, m.kv_lora_rank = 6, m.qk_head_dim = 4, m.qk_pos_emb_head_dim = 4;
      if (family == "mla") {  // query latent, latent norms, YaRN with mscale != mscale_all_dim
        m.q_lora_rank = 8, m.v_head_dim = 3, c.qk_layernorm = true;
        m.yarn = true, m.rotary_scaling_factor = 40, m.mscale = 0.9, m.mscale_all_dim = 0.8;
      } else {  // linear_q_proj, no latent norms, plain RoPE, Dn < Dv < Dq
        m.q_lora_rank = 0, m.v_head_dim = 5, m.yarn = false;
      }
      c.num_query_groups = c.num_attention_heads, c.kv_channels = m.q_head_dim();
    } else {
      MCPP_CHECK(family == "llama", "golden_config: unknown family {}", family);
    }
  }
  return c;
}

constexpr int64_t kGoldenB = 3, kGoldenS = 8, kGoldenVocab = 61;  // real vocab < padded 64

// Overwrites every parameter with values of order 1 (norm weights around 1).
inline void perturb(model::ParamStore& ps) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    Tensor t = ps.param(i);
    const bool norm = p.name.find("layernorm") != std::string::npos;
    const bool bias = p.name.size() > 5 && p.name.substr(p.name.size() - 5) == ".bias";
    for (int64_t e = 0; e < t.numel(); ++e) {
      double r = Philox::normal(99, hash_name(p.name), uint64_t(e));
      double v = norm && !bias ? 1.0 + 0.1 * r : bias ? 0.1 * r : 0.3 * r;
      if (t.dtype() == DType::F32) t.data<float>()[e] = float(v);
      else t.data<double>()[e] = v;
    }
  }
}

inline model::MicroBatch golden_batch() {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({kGoldenB, kGoldenS}, DType::I64);
  mb.labels = Tensor::empty({kGoldenB, kGoldenS}, DType::I64);
  mb.loss_mask = Tensor::empty({kGoldenB, kGoldenS}, DType::F32);
  for (int64_t i = 0; i < kGoldenB * kGoldenS; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(5, 1, i) % kGoldenVocab);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(5, 2, i) % kGoldenVocab);
    mb.loss_mask.data<float>()[i] = (i % 7 == 3) ? 0.0f : 1.0f;  // some masked tokens
  }
  return mb;
}

}  // namespace mcpp::golden
