// Multi-latent attention in FP8, on the CPU emulation in f64, hybrid format, tensorwise
// scaling (each operand's scale from its own amax): every projection is its own FP8 linear.
// Each GEMM of the layer's forward and backward is checked against a hand-written reference
// of its FP8 semantics, fed with the layer's own inputs to that GEMM (the norms, the packing
// with RoPE and the attention core between them run in the model precision and have their
// own tests):
//   q_lat = Q(x) Q(Wqd)^T      q = Q(q_ln) Q(Wqu)^T      (without a query latent:
//   [kv_lat | kpe] = Q(x) Q(Wkvd)^T  (one GEMM, one scale)  q = Q(x) Q(Wq)^T)
//   kv = Q(kv_ln) Q(Wkvu)^T    y = Q(ctx) Q(Wo)^T
// backward: d ctx = Q(G) Q(Wo), dWo = Q(G)^T Q(ctx); dWkvu = Q(dkv)^T Q(kv_ln),
//   d kv_ln = Q(dkv) Q(Wkvu) (the same for the query latent); dWkvd = Q(dkvd)^T Q(x) with
//   dkvd = [d kv_lat | d kpe]; dx = Q(dq_lat) Q(Wqd) + Q(dkvd) Q(Wkvd).
// And the layer without FP8 gives another output: the test tells the two apart.
#include <gtest/gtest.h>

#include <string>

#include "fp8_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/mla_attention.h"

using namespace mcpp;
using namespace mcpp::model;
using ops::Fp8Format;

namespace fp8_mla_test {

using fp8_test::amax;
using fp8_test::max_rel;
using fp8_test::mm_t;
using fp8_test::q;
using fp8_test::randn;
using fp8_test::scale_of;
using fp8_test::transpose;

Tensor Q4(const Tensor& v) { return q(v, scale_of(448, amax(v)), Fp8Format::E4M3); }
Tensor Q5(const Tensor& v) { return q(v, scale_of(57344, amax(v)), Fp8Format::E5M2); }
// y = Q(a) Q(W)^T (fprop), Q(g) Q(W) (dgrad, g E5M2), Q(g)^T Q(a) (wgrad).
Tensor fprop(const Tensor& a, const Tensor& W) { return mm_t(Q4(a), Q4(W)); }
Tensor dgrad(const Tensor& g, const Tensor& W) { return mm_t(Q5(g), transpose(Q4(W))); }
Tensor wgrad(const Tensor& g, const Tensor& a) {
  return mm_t(transpose(Q5(g)), transpose(Q4(a)));
}
Tensor cols(const Tensor& a, int64_t c0, int64_t n) {
  return transpose(transpose(a).narrow(c0, n));
}
Tensor plus(Tensor a, const Tensor& b) {
  for (int64_t i = 0; i < a.numel(); ++i) a.data<double>()[i] += b.data<double>()[i];
  return a;
}

std::string W(const char* n) {
  return "decoder.layers.0.self_attention." + std::string(n) + ".weight";
}

struct Fixture {
  TransformerConfig c;  // FP8: hybrid, tensorwise
  ParamStore store;
  int64_t S = 3, B = 2, T = 6, H = 8;

  explicit Fixture(bool q_latent) {
    c.num_layers = 1, c.hidden_size = H, c.num_attention_heads = 4, c.num_query_groups = 4;
    c.seq_length = S, c.max_position_embeddings = 8, c.padded_vocab_size = 16;
    c.ffn_hidden_size = 12, c.dtype = DType::F64, c.init_method_std = 0.4;
    c.rope = true, c.rmsnorm = true, c.add_bias_linear = false;
    c.mla.on = true, c.mla.q_lora_rank = q_latent ? 6 : 0, c.mla.kv_lora_rank = 5;
    c.mla.qk_head_dim = 2, c.mla.qk_pos_emb_head_dim = 4, c.mla.v_head_dim = 3;
    c.kv_channels = c.mla.q_head_dim();
    c.qk_layernorm = q_latent;
    c.fp8.format = Fp8Config::Format::Hybrid, c.fp8.recipe = Fp8Config::Recipe::Tensorwise;
    std::vector<ParamInfo> params;
    MlaAttention::add_params(c, 0, params);
    for (auto& p : params) store.add(p);
    store.allocate(DType::F64, 0, 1);
    store.initialize(23);
  }
  Tensor w(const char* n) { return store.param(W(n)).clone(); }
  Tensor g(const char* n) { return store.grad(W(n)).clone(); }
};

// What one forward and backward leave: the output, dx, and the layer's intermediates.
struct Run {
  Tensor y, dx;
  MlaAttention::Saved s;
  Workspace ws;
  Tensor q, kv, kpe, ctx;  // after the forward (the backward reuses their buffers)
};

void run(Fixture& fx, const TransformerConfig& k, const Tensor& x, const Tensor& G, Run& r) {
  StepKeys keys;
  keys.training = true;
  const StepContext cx = make_step_context(k, fx.S, fx.B, keys, nullptr);
  const Dims d = make_dims(k, fx.S, fx.B);
  allocate([&](const TensorVisitor& v) { MlaAttention::saved_specs(k, d, r.s, v); }, Device::CPU,
           true);
  allocate([&](const TensorVisitor& v) { MlaAttention::scratch_specs(k, d, r.ws, v); },
           Device::CPU, false);
  MlaAttention mla(k, 0, &fx.store);
  fx.store.zero_grads();
  r.y = Tensor::empty({fx.T, fx.H}, DType::F64), r.dx = Tensor::empty({fx.T, fx.H}, DType::F64);
  mla.forward(x, r.s, nullptr, r.y, r.ws, cx);
  r.q = r.ws.mla_q.clone(), r.kv = r.ws.mla_kv.clone(), r.kpe = r.ws.mla_kpe.clone();
  r.ctx = r.ws.mla_ctx.clone();
  mla.prepare_backward(r.s, r.ws, cx);
  mla.backward(G, x, r.s, r.dx, r.ws, cx);
}

void check(bool q_latent) {
  Fixture fx(q_latent);
  const auto& m = fx.c.mla;
  const int64_t rkv = m.kv_lora_rank, Dr = m.qk_pos_emb_head_dim;
  const Tensor x = randn({fx.T, fx.H}, 3, 1.5), G = randn({fx.T, fx.H}, 4, 1e-2);
  Run r;
  run(fx, fx.c, x, G, r);
  const double tol = 1e-12;
  // ---- forward
  const Tensor kvd = fprop(x, fx.w("linear_kv_down_proj"));
  const Tensor kv_ln = q_latent ? r.s.kv_ln : r.s.kv_lat;
  EXPECT_LT(max_rel(r.s.kv_lat, cols(kvd, 0, rkv)), tol);
  EXPECT_LT(max_rel(r.kpe, cols(kvd, rkv, Dr)), tol);
  EXPECT_LT(max_rel(r.kv, fprop(kv_ln, fx.w("linear_kv_up_proj"))), tol);
  if (q_latent) {
    EXPECT_LT(max_rel(r.s.q_lat, fprop(x, fx.w("linear_q_down_proj"))), tol);
    EXPECT_LT(max_rel(r.q, fprop(r.s.q_ln, fx.w("linear_q_up_proj"))), tol);
  } else {
    EXPECT_LT(max_rel(r.q, fprop(x, fx.w("linear_q_proj"))), tol);
  }
  EXPECT_LT(max_rel(r.y, fprop(r.ctx, fx.w("linear_proj"))), tol);
  // ---- backward (the unpacked gradients are left in the q / kv / kpe buffers)
  EXPECT_LT(max_rel(fx.g("linear_proj"), wgrad(G, r.ctx)), tol);
  EXPECT_LT(max_rel(r.ws.mla_dctx, dgrad(G, fx.w("linear_proj"))), tol);
  const Tensor &dkv = r.ws.mla_kv, &dq = r.ws.mla_q;
  EXPECT_LT(max_rel(fx.g("linear_kv_up_proj"), wgrad(dkv, kv_ln)), tol);
  const Tensor& dkv_ln = q_latent ? r.ws.mla_dkvln : r.ws.mla_dkvl;
  EXPECT_LT(max_rel(dkv_ln, dgrad(dkv, fx.w("linear_kv_up_proj"))), tol);
  Tensor dkvd = transpose(r.ws.mla_kvd);  // [d kv_lat | d kpe], checked column by column
  EXPECT_EQ(max_rel(transpose(dkvd.narrow(0, rkv)), r.ws.mla_dkvl), 0.0);
  EXPECT_EQ(max_rel(transpose(dkvd.narrow(rkv, Dr)), r.ws.mla_kpe), 0.0);
  EXPECT_LT(max_rel(fx.g("linear_kv_down_proj"), wgrad(r.ws.mla_kvd, x)), tol);
  Tensor want_dx = dgrad(r.ws.mla_kvd, fx.w("linear_kv_down_proj"));
  if (q_latent) {
    EXPECT_LT(max_rel(fx.g("linear_q_up_proj"), wgrad(dq, r.s.q_ln)), tol);
    EXPECT_LT(max_rel(r.ws.mla_dqln, dgrad(dq, fx.w("linear_q_up_proj"))), tol);
    EXPECT_LT(max_rel(fx.g("linear_q_down_proj"), wgrad(r.ws.mla_dql, x)), tol);
    want_dx = plus(want_dx, dgrad(r.ws.mla_dql, fx.w("linear_q_down_proj")));
  } else {
    EXPECT_LT(max_rel(fx.g("linear_q_proj"), wgrad(dq, x)), tol);
    want_dx = plus(want_dx, dgrad(dq, fx.w("linear_q_proj")));
  }
  EXPECT_LT(max_rel(r.dx, want_dx), 1e-11);
  // ---- the same layer without FP8: the quantisation shows in every output
  TransformerConfig plain = fx.c;
  plain.fp8 = Fp8Config{};
  Run p;
  run(fx, plain, x, G, p);
  EXPECT_GT(max_rel(r.y, p.y), 1e-3);
  EXPECT_GT(max_rel(r.dx, p.dx), 1e-3);
  EXPECT_GT(max_rel(r.kpe, p.kpe), 1e-3);
}

TEST(Fp8Mla, WithQueryLatentEveryGemmAgainstTheReference) { check(true); }
TEST(Fp8Mla, WithoutQueryLatentEveryGemmAgainstTheReference) { check(false); }

// At TP > 1 a layer in FP8 forms its latents' gradients whole on every rank: the down
// projections' and latent norms' gradients are then not partial sums over TP.
TEST(Fp8Mla, LatentGradientsAreWholeOverTpInFp8Layers) {
  Fixture fx(true);
  TransformerConfig c = fx.c;
  c.tp_size = 2, c.num_layers = 3;
  c.fp8.bf16_start = 1;  // layer 0 in the model precision
  auto partial = [&](int layer, const char* n) {
    std::vector<ParamInfo> ps;
    MlaAttention::add_params(c, layer, ps);
    for (const ParamInfo& p : ps)
      if (p.name == layer_param_name(layer, std::string("self_attention.") + n))
        return p.tp_partial;
    ADD_FAILURE() << n << " not registered";
    return false;
  };
  for (const char* n : {"linear_q_down_proj.weight", "linear_kv_down_proj.weight",
                        "q_layernorm.weight", "kv_layernorm.weight"}) {
    EXPECT_TRUE(partial(0, n)) << n;
    EXPECT_FALSE(partial(1, n)) << n;
  }
  EXPECT_FALSE(partial(1, "linear_q_up_proj.weight"));  // split by heads: never partial
}

}  // namespace fp8_mla_test
