// Tiny GPT-2 and Llama configurations for the inference tests, and the full-forward
// oracle: model::GPTModel::forward (dropout off) on the whole sequence so far.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

#include <gtest/gtest.h>

#include "base/philox.h"
#include "inference/generator.h"
#include "model/gpt_model.h"

namespace mcpp::test {

inline model::TransformerConfig tiny_config(bool llama, DType dt) {
  model::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 32, c.num_attention_heads = 4, c.kv_channels = 8;
  c.seq_length = 32, c.max_position_embeddings = 32, c.padded_vocab_size = 64;
  c.hidden_dropout = 0, c.attention_dropout = 0, c.dtype = dt;
  c.init_method_std = 0.3;  // spread logits: no near-ties for argmax to fall on
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = llama ? 48 : 128;
  c.rope = llama, c.rmsnorm = llama, c.swiglu = llama, c.tie_embeddings = !llama;
  c.add_bias_linear = !llama;
  return c;
}

// The Llama config with multi-latent attention: query and key/value latents with their norms,
// YaRN on the shared position key, values (6) narrower than queries and keys (4 + 4).
inline void to_mla(model::TransformerConfig& c) {
  c.num_query_groups = c.num_attention_heads;
  c.mla.on = true, c.mla.q_lora_rank = 12, c.mla.kv_lora_rank = 10;
  c.mla.qk_head_dim = 4, c.mla.qk_pos_emb_head_dim = 4, c.mla.v_head_dim = 6;
  c.mla.rotary_scaling_factor = 40, c.mla.mscale = 0.9, c.mla.mscale_all_dim = 0.7;
  c.mla.original_max_positions = 16;
  c.kv_channels = c.mla.q_head_dim(), c.qk_layernorm = true;
}

// Norm weights and biases start at 1 and 0; move them so they matter.
inline void perturb_norms(model::ParamStore& ps) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    if (p.init == model::Init::Normal) continue;
    Tensor t = ps.param(i);
    for (int64_t e = 0; e < t.numel(); ++e) {
      const double d = 0.2 * Philox::normal(5, hash_name(p.name), uint64_t(e));
      if (t.dtype() == DType::F64)
        t.data<double>()[e] += d;
      else
        t.data<float>()[e] += float(d);
    }
  }
}

// Logits [B, Vp] (as f64) at the last position of seqs (B sequences of one length),
// from the training model's full forward.
inline std::vector<std::vector<double>> full_forward_last_logits(
    model::GPTModel& m, const std::vector<std::vector<int64_t>>& seqs) {
  const int64_t B = int64_t(seqs.size()), S = int64_t(seqs[0].size());
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::zeros({B, S}, DType::I64);
  mb.loss_mask = Tensor::zeros({B, S}, DType::F32);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      mb.tokens.data<int64_t>()[b * S + s] = seqs[size_t(b)][size_t(s)];
  model::StepKeys keys;
  keys.training = false;
  m.forward(mb, keys);
  const Tensor& lg = m.logits();  // [S*B, Vp]
  const int64_t V = lg.size(-1);
  std::vector<std::vector<double>> out(static_cast<size_t>(B),
                                       std::vector<double>(static_cast<size_t>(V)));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t v = 0; v < V; ++v) {
      const int64_t e = ((S - 1) * B + b) * V + v;
      out[size_t(b)][size_t(v)] =
          lg.dtype() == DType::F64 ? lg.data<double>()[e] : double(lg.data<float>()[e]);
    }
  return out;
}

inline double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-300);
}

// Greedy decoding of cfg's model m with the KV cache (2 rows, a 4-token Philox prompt, 6
// steps) against the full-forward oracle at every step (f64 models: within 1e-12).
inline void expect_greedy_decode_matches_full_forward(model::GPTModel& m,
                                                      const model::TransformerConfig& cfg) {
  inference::Generator gen(m.params(), cfg);
  const int64_t B = 2, P = 4, steps = 6;
  inference::KVCache cache(cfg, cfg.max_position_embeddings, B);
  std::vector<std::vector<int64_t>> seqs(B);
  Tensor tokens = Tensor::empty({B, P}, DType::I64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < P; ++s) {
      seqs[size_t(b)].push_back(Philox::u32(9, uint64_t(b), uint64_t(s)) % 60);
      tokens.data<int64_t>()[b * P + s] = seqs[size_t(b)].back();
    }
  const Tensor* logits = &gen.forward(tokens, cache);
  for (int64_t step = 0; step < steps; ++step) {
    const auto want = full_forward_last_logits(m, seqs);
    Tensor next = Tensor::empty({B, 1}, DType::I64);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t V = logits->size(-1);
      std::vector<double> got(logits->data<double>() + b * V,
                              logits->data<double>() + (b + 1) * V);
      ASSERT_LE(rel_diff(got, want[size_t(b)]), 1e-12) << "step " << step;
      const int64_t id = int64_t(std::max_element(got.begin(), got.end()) - got.begin());
      seqs[size_t(b)].push_back(id);
      next.data<int64_t>()[b] = id;
    }
    logits = &gen.forward(next, cache);
  }
}

// The server's pipelined decode (Generator::launch_greedy / greedy_ids) against steps run one
// at a time (forward_greedy) on the same prompts: `pip` launches each step before it
// collects the one before, its rows feeding that step's ids by kFromLastStep -- except row 1,
// which at step 4 feeds a host token instead (a sequence that joined), and row 3, which
// from step 6 is a hole (its slot emptied, token 0 at position 0). `ref` feeds the same
// tokens from the host after waiting for each step. Every step's ids are equal (the same
// kernels on the same inputs); the rows stay in lock step, steps enough for a GPU bucket's
// eager, captured and checked steps to pass before the replays that run queued.
inline void check_pipelined_greedy(inference::Generator& ref, inference::KVCache& rc,
                                   inference::Generator& pip, inference::KVCache& pc,
                                   int64_t V) {
  const int64_t A = 4, P = 3, steps = 10;
  for (int64_t b = 0; b < A; ++b) {
    Tensor pr = Tensor::empty({1, P}, DType::I64);
    for (int64_t j = 0; j < P; ++j) pr.data<int64_t>()[j] = 1 + (7 * b + 3 * j) % (V - 1);
    ref.prefill(pr, rc, b), pip.prefill(pr, pc, b);
  }
  Tensor rt = Tensor::empty({A, 1}, DType::I64), pt = Tensor::empty({A, 1}, DType::I64);
  for (int64_t b = 0; b < A; ++b) rt.data<int64_t>()[b] = pt.data<int64_t>()[b] = 2 + b;
  std::vector<std::vector<int64_t>> want, got;
  for (int64_t s = 0; s < steps; ++s) {
    if (s >= 6) rc.reset_slot(3), rt.data<int64_t>()[3] = 0;
    if (s == 4) rt.data<int64_t>()[1] = 11;
    want.push_back(ref.forward_greedy(rt, rc, V));
    for (int64_t b = 0; b < A; ++b) rt.data<int64_t>()[b] = want.back()[size_t(b)];
  }
  for (int64_t s = 0; s < steps; ++s) {
    if (s > 0)
      for (int64_t b = 0; b < A; ++b) pt.data<int64_t>()[b] = inference::Generator::kFromLastStep;
    if (s == 4) pt.data<int64_t>()[1] = 11;
    if (s >= 6) {
      pc.reset_slot(3);
      pt.data<int64_t>()[3] = 0;
    }
    pip.launch_greedy(pt, pc, V);
    if (s > 0) got.push_back(pip.greedy_ids());
  }
  got.push_back(pip.greedy_ids());
  ASSERT_EQ(got.size(), want.size());
  for (int64_t s = 0; s < steps; ++s) EXPECT_EQ(got[size_t(s)], want[size_t(s)]) << "step " << s;
  for (int64_t b = 0; b < A; ++b) EXPECT_EQ(pc.length(b), rc.length(b)) << "slot " << b;
  // Two steps in flight at most, and a row of kFromLastStep needs the last step to have it.
  pip.launch_greedy(pt, pc, V);
  pip.launch_greedy(pt, pc, V);
  EXPECT_THROW(pip.launch_greedy(pt, pc, V), Error);
  EXPECT_THROW(pip.forward_greedy(pt, pc, V), Error);
  pip.greedy_ids(), pip.greedy_ids();
  EXPECT_THROW(pip.greedy_ids(), Error);
  Tensor wide = Tensor::empty({A + 1, 1}, DType::I64);
  for (int64_t b = 0; b <= A; ++b) wide.data<int64_t>()[b] = inference::Generator::kFromLastStep;
  EXPECT_THROW(pip.launch_greedy(wide, pc, V), Error);
}

}  // namespace mcpp::test
