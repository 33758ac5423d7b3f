// Tiny GPT-2 and Llama configurations for the inference tests, and the full-forward
// oracle: model::GPTModel::forward (dropout off) on the whole sequence so far.
#pragma once
#include <cmath>
#include <vector>

#include "base/philox.h"
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

}  // namespace mcpp::test
