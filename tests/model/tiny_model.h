// The tiny GPT-2 / Llama configurations the model tests share (f64 on the CPU), their
// random batches and perturbed norms, and the f64 finite-difference check.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "base/philox.h"
#include "model/config.h"
#include "model/gpt_model.h"

namespace mcpp::model::test {

inline TransformerConfig tiny(bool llama, int layers, double dropout) {
  TransformerConfig c;
  c.num_layers = layers, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 2;
  c.seq_length = 6, c.max_position_embeddings = 8, c.padded_vocab_size = 16;
  c.hidden_dropout = dropout, c.attention_dropout = dropout, c.dtype = DType::F64;
  c.init_method_std = 0.3;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = llama ? 12 : 32;
  c.rope = llama, c.rmsnorm = llama, c.swiglu = llama, c.tie_embeddings = !llama;
  c.add_bias_linear = !llama;
  return c;
}

// Random tokens and labels below V, every fifth loss-mask entry 0.
inline MicroBatch random_batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, uint64_t(i)) % uint64_t(V));
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, uint64_t(i)) % uint64_t(V));
    mb.loss_mask.data<float>()[i] = i % 5 == 2 ? 0.f : 1.f;
  }
  return mb;
}

// Norm weights and biases randomised too (f64), so that their gradients are non-trivial.
inline void perturb_norms(ParamStore& ps) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    if (p.init == Init::Normal) continue;
    Tensor t = ps.param(i);
    for (int64_t e = 0; e < t.numel(); ++e)
      t.data<double>()[e] += 0.2 * Philox::normal(3, hash_name(p.name), uint64_t(e));
  }
}

// Central differences (h = 1e-5) of objective() at four elements of every parameter of ps
// against the gradients ps holds (what backward left), within 1e-6 relative (f64).
template <class F>
void expect_finite_differences(ParamStore& ps, F&& objective) {
  const double h = 1e-5;
  int checked = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    Tensor w = ps.param(i), g = ps.grad(i);
    for (int64_t k = 0; k < 4; ++k) {  // a few elements, spread over the parameter
      const int64_t e = int64_t(Philox::u32(9, i, uint64_t(k)) % uint64_t(w.numel()));
      double* x = w.data<double>() + e;
      const double x0 = *x;
      *x = x0 + h;
      const double lp = objective();
      *x = x0 - h;
      const double lm = objective();
      *x = x0;
      const double fd = (lp - lm) / (2 * h), an = g.data<double>()[e];
      EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::abs(fd)))
          << ps.infos()[i].name << "[" << e << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, 4 * int(ps.infos().size()));
}

// The whole-model check: cfg's model with perturbed norms, two random sequences of token ids
// below V, iteration 3's dropout keys; backward()'s gradients against finite differences.
inline void expect_model_finite_differences(const TransformerConfig& cfg, int64_t V) {
  GPTModel m(cfg);
  perturb_norms(m.params());
  const MicroBatch mb = random_batch(2, cfg.seq_length, V, 11);
  StepKeys keys;
  keys.iteration = 3;
  m.params().zero_grads();
  m.forward(mb, keys);
  m.backward(1.0);
  expect_finite_differences(m.params(), [&] { return m.forward(mb, keys); });
}

}  // namespace mcpp::model::test
