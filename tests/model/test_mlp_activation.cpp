// The MLP activations that run as an op after fc1's GEMM, in the dense MLP, the routed experts
// and the shared experts: --squared-relu (Megatron's squared_relu, Primer: relu(x)^2) and the
// exact GELU (torch's F.gelu: Megatron's MLP without the bias_gelu fusion). f64 on the CPU:
// gradients against central differences (GPT- and Llama-style, dense and MoE, dropout on), a
// function other than the tanh-form GELU, keeping / recomputing the activation bit for bit,
// and generation with the KV cache against the full forward.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../inference/inference_test_util.h"
#include "../moe/moe_test_util.h"
#include "tiny_model.h"
#include "base/philox.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;

namespace mlp_activation_test {

using ops::MlpActivation;
const MlpActivation kActs[] = {MlpActivation::SquaredRelu, MlpActivation::GeluErf};

// A tiny model whose MLP activation is act (squared ReLU or the exact GELU).
TransformerConfig with_act(TransformerConfig c, MlpActivation act) {
  c.swiglu = false;
  c.squared_relu = act == MlpActivation::SquaredRelu;
  c.gelu_erf = act == MlpActivation::GeluErf;
  return c;
}
TransformerConfig tiny_act(MlpActivation act, bool llama, int layers, double dropout) {
  return with_act(model::test::tiny(llama, layers, dropout), act);
}
const char* act_name(MlpActivation a) {
  return a == MlpActivation::SquaredRelu ? "squared-relu" : "gelu-erf";
}

void add_moe(TransformerConfig& c, std::vector<int64_t> pattern, int64_t shared) {
  c.add_bias_linear = false;
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  c.moe.aux_loss_coeff = {0.05}, c.moe.layer_pattern = std::move(pattern);
  c.moe.shared_ffn_hidden_size = shared;
}

// The tiny models' random batch (tiny_model.h).
using model::test::random_batch;

// The LM loss plus every MoE layer's aux loss: what backward differentiates.
double total(GPTModel& m, const model::MicroBatch& mb, const model::StepKeys& k) {
  double f = m.forward(mb, k);
  for (auto* l : test::moe_layers(m)) f += l->stats().last_aux_sum() + l->stats().last_z_loss;
  return f;
}

void fd_check(const TransformerConfig& cfg) {
  GPTModel m(cfg);
  test::perturb_norms(m.params());
  const auto mb = random_batch(2, cfg.seq_length, 13, 11);
  model::StepKeys keys;
  keys.iteration = 3;
  auto& ps = m.params();
  ps.zero_grads();
  total(m, mb, keys);
  m.backward(1.0);
  const double h = 1e-5;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    Tensor w = ps.param(i), g = ps.grad(i);
    for (uint64_t k = 0; k < 4; ++k) {
      const int64_t e = int64_t(Philox::u32(9, i, k) % uint64_t(w.numel()));
      double* x = w.data<double>() + e;
      const double x0 = *x;
      *x = x0 + h;
      const double lp = total(m, mb, keys);
      *x = x0 - h;
      const double lm = total(m, mb, keys);
      *x = x0;
      const double fd = (lp - lm) / (2 * h), an = g.data<double>()[e];
      EXPECT_NEAR(an, fd, 2e-6 * std::max(1.0, std::abs(fd)))
          << ps.infos()[i].name << "[" << e << "]";
    }
  }
}


TEST(MlpActivationGrad, DenseFiniteDifferences) {
  for (MlpActivation act : kActs) {
    SCOPED_TRACE(act_name(act));
    fd_check(tiny_act(act, false, 2, 0.2));  // GPT-style: biases, LayerNorm, dropout
    fd_check(tiny_act(act, true, 1, 0.0));   // Llama-style: RoPE, RMSNorm, no biases
  }
}

TEST(MlpActivationGrad, MoeRoutedAndSharedExpertsFiniteDifferences) {
  for (MlpActivation act : kActs) {
    SCOPED_TRACE(act_name(act));
    TransformerConfig c = tiny_act(act, true, 2, 0.2);
    add_moe(c, {0, 1}, 10);  // a dense layer, then routed + shared experts
    fd_check(c);
    c.moe.shared_expert_gate = true;
    fd_check(c);
  }
}

TEST(MlpActivation, IsAnotherFunctionThanTanhGeluAndNotGated) {
  // The same parameters (fc1 [F, H] both: not gated) give another loss than the tanh-form
  // GELU's; the exact GELU differs from it by at most ~2e-4 an element, so by less.
  for (MlpActivation act : kActs)
    for (bool moe : {false, true}) {
      TransformerConfig c = tiny_act(act, false, 2, 0.0);
      if (moe) add_moe(c, {1, 1}, 0);
      ASSERT_EQ(c.activation().kind, act);
      GPTModel a(c);
      c = with_act(c, MlpActivation::Gelu);
      ASSERT_EQ(c.activation().kind, MlpActivation::Gelu);
      GPTModel b(c);
      ASSERT_EQ(a.params().flat_params().numel(), b.params().flat_params().numel());
      std::memcpy(b.params().flat_params().raw(), a.params().flat_params().raw(),
                  a.params().flat_params().nbytes());
      const auto mb = random_batch(2, c.seq_length, 13, 4);
      const double la = a.forward(mb, {}), lb = b.forward(mb, {});
      const double tol = act == MlpActivation::SquaredRelu ? 1e-3 : 1e-8;
      EXPECT_GT(std::abs(la - lb), tol * std::abs(lb)) << act_name(act) << " moe " << moe;
    }
  TransformerConfig erf_swiglu = model::test::tiny(true, 1, 0.0);
  erf_swiglu.swiglu = true, erf_swiglu.gelu_erf = true;
  EXPECT_THROW(erf_swiglu.validate(), Error);
  TransformerConfig both = tiny_act(MlpActivation::SquaredRelu, true, 1, 0.0);
  both.swiglu = true;
  try {
    both.validate();
    ADD_FAILURE() << "--squared-relu with --swiglu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--squared-relu and --swiglu"), std::string::npos)
        << e.what();
  }
}


struct Training {
  std::vector<double> losses;
  Tensor params;
};

Training train(const TransformerConfig& c) {
  const int steps = 3, M = 2;
  const int64_t B = 2;
  GPTModel m(c);
  optim::AdamW opt(m.params(), {});
  Training t;
  for (int it = 0; it < steps; ++it) {
    m.params().zero_grads();
    for (int j = 0; j < M; ++j) {
      model::StepKeys k;
      k.iteration = it, k.sample_offset = j * B, k.global_batch = M * B;
      t.losses.push_back(
          m.forward(random_batch(B, c.seq_length, c.padded_vocab_size, uint64_t(10 * it + j)), k));
      m.backward(1.0 / double(M * B * c.seq_length));
    }
    opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
    opt.step(3e-2, 0.1);
  }
  t.params = m.params().flat_params().clone();
  return t;
}

void expect_same(const Training& t, const Training& ref) {
  ASSERT_EQ(t.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_EQ(t.losses[i], ref.losses[i]) << "micro-batch " << i;
  EXPECT_EQ(std::memcmp(t.params.raw(), ref.params.raw(), ref.params.nbytes()), 0)
      << "parameters after the last step";
}


TEST(MlpActivation, KeepingAndRecomputingTrainBitwiseAlike) {
  // --keep-mlp-activations, --recompute-modules mlp and full recomputation run the same
  // element ops and GEMMs as recomputing the activation from fc1's output in backward.
  using RC = TransformerConfig::Recompute;
  for (MlpActivation act : kActs)
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::F64})
      for (bool moe : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {} moe {}", act_name(act), llama ? "llama" : "gpt",
                                 dtype_name(dt), moe));
        TransformerConfig c = tiny_act(act, llama, 3, 0.1);
        c.dtype = dt;
        if (moe) add_moe(c, {0, 1, 0}, 10);
        const Training ref = train(c);
        for (int64_t keep : {1, 3}) {
          TransformerConfig k = c;
          k.keep_mlp_activations = keep;
          expect_same(train(k), ref);
        }
        TransformerConfig r = c;
        r.recompute = RC::Selective, r.recompute_mlp = true;
        expect_same(train(r), ref);
        r.recompute_shared_experts = moe;
        expect_same(train(r), ref);
        TransformerConfig f = c;
        f.recompute = RC::Full, f.recompute_num_layers = 1;
        expect_same(train(f), ref);
      }
}

TEST(MlpActivation, GenerationMatchesTheFullForward) {
  // Greedy decoding with the KV cache (one row a step through linear_decode, then the
  // activation op) against the training model's full forward of the whole sequence.
  for (MlpActivation act : kActs)
  for (bool llama : {false, true})
    for (bool moe : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {} moe {}", act_name(act), llama ? "llama" : "gpt", moe));
      TransformerConfig cfg = with_act(test::tiny_config(llama, DType::F64), act);
      if (moe) {
        cfg.add_bias_linear = false;
        cfg.moe.num_experts = 4, cfg.moe.topk = 2, cfg.moe.ffn_hidden_size = 16;
        cfg.moe.layer_pattern = {1, 0}, cfg.moe.shared_ffn_hidden_size = 16;
      }
      GPTModel m(cfg);
      test::perturb_norms(m.params());
      test::expect_greedy_decode_matches_full_forward(m, cfg);
    }
}

}  // namespace mlp_activation_test
