// The routed experts' FP8 GEMMs on CUDA (model/moe/experts.h; docs/fp8.md "Routed
// experts") against the CPU emulation, all three passes: a GroupedExperts of six GELU
// experts in bf16 with 0, 1, 15, 16, 33 and 400 rows (all but 16 and 400 padded to a
// multiple of 16 rows for cuBLASLt), under current (tensorwise) and delayed scaling. Each
// expert GEMM is recomputed on the host from the GPU's own bf16 operands (its input, its
// output gradient) quantised by the CPU's fp8_quantize with the scale that recipe gives
// (tensorwise: from the operand's own amax; delayed: the expert's stored scale), and plain
// f32 GEMMs: fc1 and fc2 fprop, their dgrad and their wgrad, expert by expert. Delayed
// scaling also records each expert's amaxes in its own history (the zero-row expert none).
// Tolerances as tests/gpu/test_fp8_gpu.cpp's: bf16 outputs 5e-3, f32 weight gradients 2e-4.
#include <cmath>

#include "../gpu/gpu_test_util.h"
#include "model/fp8/fp8_linear.h"
#include "model/moe/experts.h"

using namespace mcpp;
using namespace mcpp::test;
using model::Fp8Config;
using ops::Fp8Format;

namespace moe_fp8_gpu_test {

constexpr int64_t kH = 128, kI = 64;
const std::vector<int64_t> kCounts = {0, 1, 15, 16, 33, 400};

std::string w1(int64_t e) {
  return "decoder.layers.0.mlp.experts.linear_fc1.weight" + std::to_string(e);
}
std::string w2(int64_t e) {
  return "decoder.layers.0.mlp.experts.linear_fc2.weight" + std::to_string(e);
}

model::TransformerConfig cfg(Fp8Config::Recipe recipe) {
  model::TransformerConfig c;
  c.num_layers = 1, c.hidden_size = kH, c.num_attention_heads = 2, c.kv_channels = 64;
  c.num_query_groups = 2, c.ffn_hidden_size = 256, c.seq_length = 16;
  c.max_position_embeddings = 16, c.padded_vocab_size = 128, c.init_method_std = 0.05;
  c.device = Device::CUDA, c.dtype = DType::BF16, c.add_bias_linear = false;
  c.moe.num_experts = int64_t(kCounts.size()), c.moe.topk = 1, c.moe.ffn_hidden_size = kI;
  c.fp8.format = Fp8Config::Format::Hybrid, c.fp8.recipe = recipe;
  c.fp8.amax_history_len = 2;
  return c;
}

float amax(const Tensor& v) {
  float m = 0;
  for (int64_t i = 0; i < v.numel(); ++i) m = std::max(m, std::fabs(v.data<float>()[i]));
  return m;
}
// As fp8_scale_update (margin 0); an operand of zeros keeps scale 1 (tensorwise's first use).
float scale_of(Fp8Format f, float a) {
  return a > 0 ? float((f == Fp8Format::E4M3 ? 448.0 : 57344.0) / double(a)) : 1.f;
}
Tensor q(const Tensor& v, Fp8Format f, float scale) {
  Tensor y = Tensor::empty(v.shape(), DType::F32);
  cpu::fp8_quantize(v, f, Tensor::from(std::vector<float>{scale}, {1}), y, CS());
  return y;
}
Tensor rows(const Tensor& t, int64_t off, int64_t n) { return t.narrow(off, n).clone(); }
// a [n, k] b [m, k] -> a b^T [n, m]; ta: a^T b with a [k, n], b [k, m] -> [n, m].
Tensor nt(const Tensor& a, const Tensor& b) {
  Tensor y = Tensor::empty({a.size(0), b.size(0)}, DType::F32);
  cpu::gemm(false, true, 1.0, a, b, 0.0, y, CS());
  return y;
}
Tensor nn(const Tensor& a, const Tensor& b) {
  Tensor y = Tensor::empty({a.size(0), b.size(1)}, DType::F32);
  cpu::gemm(false, false, 1.0, a, b, 0.0, y, CS());
  return y;
}
Tensor tn(const Tensor& a, const Tensor& b) {
  Tensor y = Tensor::empty({a.size(1), b.size(1)}, DType::F32);
  cpu::gemm(true, false, 1.0, a, b, 0.0, y, CS());
  return y;
}

struct Gpu {
  model::TransformerConfig c;
  model::ParamStore store;
  explicit Gpu(Fp8Config::Recipe r) : c(cfg(r)) {
    std::vector<model::ParamInfo> params;
    model::moe::GroupedExperts::add_params(c, 0, params);
    for (auto& p : params) store.add(p);
    model::add_fp8_buffers(c, {0}, store);
    store.allocate(DType::BF16, DType::F32, Device::CUDA, 0, 1);
    store.initialize(9);
  }
  // Scale of operand k of weight w's GEMM as the recipe gives it for operand values v.
  float scale(const std::string& w, int k, const Tensor& v, Fp8Format f) {
    if (c.fp8.recipe == Fp8Config::Recipe::Tensorwise) return scale_of(f, amax(v));
    return to_cpu(store.buffer(model::fp8_scale_name(w))).data<float>()[k];
  }
};

struct Step {
  Tensor y, dx, h, ap, dap, dfc1;  // host copies (f32)
};

Step step(Gpu& g, const Tensor& x, const Tensor& p, const Tensor& G) {
  const int64_t N = x.size(0);
  model::moe::GroupedExperts ge(g.c, 0, &g.store);
  model::moe::GroupedExperts::Saved s;
  model::moe::GroupedExperts::Scratch w;
  s.fc1 = gpu_nan({N, kI}, DType::BF16), s.ap = gpu_nan({N, kI}, DType::BF16);
  for (Tensor* t : {&w.dap, &w.dfc1}) *t = gpu_nan({N, kI}, DType::BF16);
  Tensor y = gpu_nan({N, kH}, DType::BF16), dx = gpu_nan({N, kH}, DType::BF16);
  Tensor dp = gpu_nan({N}, DType::F32);
  model::StepKeys k;
  k.training = true;
  model::StepContext cx = model::make_step_context(g.c, g.c.seq_length, 1, k, nullptr);
  g.store.zero_grads();
  const Tensor xg = to_gpu(x, DType::BF16), pg = to_gpu(p, DType::F32), gg = to_gpu(G, DType::BF16);
  ge.forward(xg, pg, kCounts, s, y, w, cx, nullptr);
  Step r{to_cpu(y), Tensor(), to_cpu(s.fc1), to_cpu(s.ap)};
  ge.backward(gg, xg, pg, kCounts, s, dx, dp, w, cx, nullptr);
  r.dx = to_cpu(dx), r.dap = to_cpu(w.dap), r.dfc1 = to_cpu(w.dfc1);
  return r;
}

void check(Fp8Config::Recipe recipe) {
  Gpu g(recipe);
  int64_t N = 0;
  for (int64_t n : kCounts) N += n;
  const Tensor x = rand_in({N, kH}, 1, DType::BF16, -2.f, 2.f);
  const Tensor p = rand_f32({N}, 2, 0.2f, 0.9f);
  const Tensor G = rand_in({N, kH}, 3, DType::BF16, -1e-2f, 1e-2f);
  if (recipe == Fp8Config::Recipe::Delayed) {  // a first step sets the scales
    step(g, x, p, G);
    model::fp8_update_scales(g.c, g.store, GS());
  }
  const Step r = step(g, x, p, G);
  const Fp8Format E4 = Fp8Format::E4M3, E5 = Fp8Format::E5M2;
  int64_t off = 0;
  for (int64_t e = 0; e < int64_t(kCounts.size()); ++e) {
    const int64_t n = kCounts[size_t(e)];
    const Tensor W1 = to_cpu(g.store.param(w1(e))), W2 = to_cpu(g.store.param(w2(e)));
    const Tensor dW1 = to_cpu(g.store.grad(w1(e))), dW2 = to_cpu(g.store.grad(w2(e)));
    if (n == 0) {  // no GEMM, no gradient, no amax
      EXPECT_EQ(amax(dW1), 0.f);
      EXPECT_EQ(amax(dW2), 0.f);
      if (recipe == Fp8Config::Recipe::Delayed)
        EXPECT_EQ(amax(to_cpu(g.store.buffer(model::fp8_history_name(w1(e))))), 0.f);
      continue;
    }
    const std::string tag = "expert " + std::to_string(e) + " (" + std::to_string(n) + " rows)";
    const Tensor xe = rows(x, off, n), Ge = rows(G, off, n), ap = rows(r.ap, off, n);
    const Tensor dh = rows(r.dfc1, off, n);
    // fc1 fprop: h = Q(x) Q(W1)^T
    const Tensor qx = q(xe, E4, g.scale(w1(e), 0, xe, E4));
    const Tensor qw1 = q(W1, E4, g.scale(w1(e), 1, W1, E4));
    EXPECT_LT(rel_err(rows(r.h, off, n), nt(qx, qw1)), 5e-3) << "fc1 fprop, " << tag;
    // fc2 fprop: y = Q(a p) Q(W2)^T
    const Tensor qap = q(ap, E4, g.scale(w2(e), 0, ap, E4));
    const Tensor qw2 = q(W2, E4, g.scale(w2(e), 1, W2, E4));
    EXPECT_LT(rel_err(rows(r.y, off, n), nt(qap, qw2)), 5e-3) << "fc2 fprop, " << tag;
    // fc2 dgrad and wgrad: d(ap) = Q(G) Q(W2); dW2 = Q(G)^T Q(ap)
    const Tensor qg = q(Ge, E5, g.scale(w2(e), 2, Ge, E5));
    EXPECT_LT(rel_err(rows(r.dap, off, n), nn(qg, qw2)), 5e-3) << "fc2 dgrad, " << tag;
    EXPECT_LT(rel_err(dW2, tn(qg, qap)), 2e-4) << "fc2 wgrad, " << tag;
    // fc1 dgrad and wgrad: dx = Q(dh) Q(W1); dW1 = Q(dh)^T Q(x)
    const Tensor qdh = q(dh, E5, g.scale(w1(e), 2, dh, E5));
    EXPECT_LT(rel_err(rows(r.dx, off, n), nn(qdh, qw1)), 5e-3) << "fc1 dgrad, " << tag;
    EXPECT_LT(rel_err(dW1, tn(qdh, qx)), 2e-4) << "fc1 wgrad, " << tag;
    // The emulation is not the unquantised expert (the comparison can tell them apart).
    EXPECT_GT(rel_err(nt(xe, W1), nt(qx, qw1)), 1e-3) << tag;
    if (recipe == Fp8Config::Recipe::Delayed) {  // this step's amaxes, this expert's own
      const Tensor h1 = to_cpu(g.store.buffer(model::fp8_history_name(w1(e))));
      const Tensor h2 = to_cpu(g.store.buffer(model::fp8_history_name(w2(e))));
      EXPECT_EQ(h1.data<float>()[0], amax(xe)) << tag;
      EXPECT_EQ(h1.data<float>()[1], amax(W1)) << tag;
      EXPECT_EQ(h1.data<float>()[2], amax(dh)) << tag;
      EXPECT_EQ(h2.data<float>()[0], amax(ap)) << tag;
      EXPECT_EQ(h2.data<float>()[2], amax(Ge)) << tag;
    }
    off += n;
  }
}


TEST(MoeFp8Gpu, TensorwiseExpertGemmsAgainstTheEmulation) {
  MCPP_REQUIRE_GPU();
  check(Fp8Config::Recipe::Tensorwise);
}

TEST(MoeFp8Gpu, DelayedExpertGemmsAgainstTheEmulation) {
  MCPP_REQUIRE_GPU();
  check(Fp8Config::Recipe::Delayed);
}

}  // namespace moe_fp8_gpu_test
