// MoE on CUDA (ctest label gpu): the MoE ops against the CPU ops on random data (f32, bf16,
// f16; outputs poisoned with NaN first), and a whole tiny MoE model (router, permutation,
// experts, shared gated expert, aux and z losses) on the GPU against the same model on the
// CPU: loss, logits and every parameter gradient. The device routing ops (top-k with every
// score function, the dispatch index, the load-balancing statistics, the routing backward)
// against the CPU ops on the same logits: the same experts, rows and tie-breaks exactly.
// The experts' GEMMs on side streams (ops::StreamFork): the bits of one stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <tuple>
#include <utility>
#include <vector>

#include "../gpu/gpu_test_util.h"
#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"
#include "moe_layer_harness.h"
#include "ops/graph.h"

using namespace mcpp;
using namespace mcpp::test;
using model::GPTModel;
using model::TransformerConfig;

namespace moe_gpu_test {

class GpuMoeOp : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

Tensor index_gpu(const std::vector<int64_t>& v) {
  Tensor h = Tensor::from(v, {int64_t(v.size())});
  Tensor g = Tensor::empty(h.shape(), DType::I64, Device::CUDA);
  gpu::copy(h, g, GS());
  return g;
}


TEST_P(GpuMoeOp, PermuteUnpermuteScaleRowDot) {
  const int64_t T = 37, H = 72, N = 70;
  std::vector<int64_t> src(N), off(T + 1), rows(N);
  for (int64_t n = 0; n < N; ++n) src[size_t(n)] = int64_t(Philox::u32(4, 1, uint64_t(n)) % T);
  // CSR of src: the rows of each token, ascending (some tokens get none).
  std::vector<int64_t> cnt(T, 0);
  for (int64_t t : src) ++cnt[size_t(t)];
  for (int64_t t = 0; t < T; ++t) off[size_t(t + 1)] = off[size_t(t)] + cnt[size_t(t)];
  std::vector<int64_t> fill(off.begin(), off.end() - 1);
  for (int64_t n = 0; n < N; ++n) rows[size_t(fill[size_t(src[size_t(n)])]++)] = n;
  Tensor x = rand_in({T, H}, 1, dt()), y = rand_in({N, H}, 2, dt());
  Tensor p = rand_f32({N}, 3, 0.f, 1.f);
  Tensor sidx = Tensor::from(src, {N}), soff = Tensor::from(off, {T + 1}),
         srows = Tensor::from(rows, {N});
  Tensor px = Tensor::empty({N, H}, DType::F32), uy = Tensor::empty({T, H}, DType::F32);
  Tensor gpx = gpu_nan({N, H}, dt()), guy = gpu_nan({T, H}, dt());
  cpu::gather_rows(x, sidx, px, CS());
  gpu::gather_rows(to_gpu(x, dt()), index_gpu(src), gpx, GS());
  EXPECT_CLOSE(gpx, px, dt());
  cpu::moe_unpermute(y, soff, srows, uy, CS());
  gpu::moe_unpermute(to_gpu(y, dt()), index_gpu(off), index_gpu(rows), guy, GS());
  EXPECT_CLOSE(guy, uy, dt());
  Tensor sy = Tensor::empty({N, H}, DType::F32), gsy = gpu_nan({N, H}, dt());
  cpu::moe_scale_rows(y, p, sy, CS());
  gpu::moe_scale_rows(to_gpu(y, dt()), to_gpu(p, DType::F32), gsy, GS());
  EXPECT_CLOSE(gsy, sy, dt());
  Tensor d = Tensor::empty({N}, DType::F32), gd = gpu_nan({N}, DType::F32);
  cpu::moe_row_dot(px, y, d, CS());
  gpu::moe_row_dot(gpx, to_gpu(y, dt()), gd, GS());
  EXPECT_CLOSE(gd, d, dt());
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMoeOp, ::testing::Values(DType::F32, DType::BF16, DType::F16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });


// Two GPU tensors hold the same bits (as f32 host copies: bf16 and f16 widen exactly), every
// element written (the outputs start as NaN).
::testing::AssertionResult same_bits(const Tensor& g1, const Tensor& g2) {
  const Tensor a = to_cpu(g1), b = to_cpu(g2);
  const float* x = static_cast<const float*>(a.raw());
  const float* y = static_cast<const float*>(b.raw());
  for (int64_t i = 0; i < a.numel(); ++i)
    if (!std::isfinite(x[i]) || std::memcmp(&x[i], &y[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << x[i] << " vs " << y[i];
  return ::testing::AssertionSuccess();
}

// dtype, the activation (with a gated unit's offset and clamp), F.
using ops::MlpAct;
using ops::MlpActivation;
using ActScaleCase = std::tuple<DType, MlpAct, int64_t>;

void act_forward(MlpAct a, const Tensor& x, Tensor& y) {
  if (a.plain_swiglu())
    gpu::swiglu_forward(x, y, GS());
  else if (a.gated())
    gpu::glu_forward(x, a, y, GS());
  else if (a.kind == MlpActivation::Gelu)
    gpu::gelu_forward(x, y, GS());
  else
    gpu::squared_relu_forward(x, y, GS());
}
void act_backward(MlpAct a, const Tensor& dy, const Tensor& x, Tensor& dx) {
  if (a.plain_swiglu())
    gpu::swiglu_backward(dy, x, dx, GS());
  else if (a.gated())
    gpu::glu_backward(dy, x, a, dx, GS());
  else if (a.kind == MlpActivation::Gelu)
    gpu::gelu_backward(dy, x, dx, GS());
  else
    gpu::squared_relu_backward(dy, x, dx, GS());
}
// gpt-oss's quick-GEGLU (offset 1, a clamp that cuts the inputs in [-4, 4]) and a clamped SwiGLU.
MlpAct glu(MlpActivation k, double offset, double clamp) {
  ops::GluParams p;
  p.offset = offset, p.clamp = clamp;
  return {k, p};
}


class GpuMoeActScale : public ::testing::TestWithParam<ActScaleCase> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
};

TEST_P(GpuMoeActScale, FusedEqualsUnfusedBitwiseAndCpu) {
  // The fused ops against the CUDA ops they replace (ap and dfc1 bit for bit, dp to f32
  // summation order) and against the CPU ops (f32, to the dtype's tolerance). The widths
  // take every path: F = 4096 and 1024 the 16-byte packs with 256 and 128 threads a row,
  // 96 a warp a row, 99 the scalar fallback. Rows 1 and N-2 have p = 0.
  const auto [dt, act, F] = GetParam();
  const int64_t N = 37, W = (act.gated() ? 2 : 1) * F;
  const Tensor fc1 = rand_in({N, W}, 31, dt, -4.f, 4.f), dap = rand_in({N, F}, 32, dt);
  Tensor p = rand_f32({N}, 33, 0.f, 1.f);
  p.data<float>()[1] = p.data<float>()[N - 2] = 0.f;
  const Tensor gfc1 = to_gpu(fc1, dt), gdap = to_gpu(dap, dt), gp = to_gpu(p, DType::F32);

  // Forward: fused, unfused (the activation, then moe_scale_rows), CPU.
  Tensor gap = gpu_nan({N, F}, dt), gact = gpu_nan({N, F}, dt), gap_ref = gpu_nan({N, F}, dt);
  gpu::moe_act_scale_forward(gfc1, gp, act, gap, GS());
  act_forward(act, gfc1, gact);
  gpu::moe_scale_rows(gact, gp, gap_ref, GS());
  EXPECT_TRUE(same_bits(gap, gap_ref));
  Tensor ap = Tensor::empty({N, F}, DType::F32);
  cpu::moe_act_scale_forward(fc1, p, act, ap, CS());
  EXPECT_CLOSE(gap, ap, dt);

  // Backward: fused, unfused (moe_row_dot, moe_scale_rows, the activation's backward), CPU.
  Tensor gdfc1 = gpu_nan({N, W}, dt), gdp = gpu_nan({N}, DType::F32), none;
  gpu::moe_act_scale_backward(gdap, gfc1, gp, act, gdfc1, gdp, none, GS());
  Tensor gdact = gpu_nan({N, F}, dt), gdfc1_ref = gpu_nan({N, W}, dt),
         gdp_ref = gpu_nan({N}, DType::F32);
  gpu::moe_row_dot(gdap, gact, gdp_ref, GS());
  gpu::moe_scale_rows(gdap, gp, gdact, GS());
  act_backward(act, gdact, gfc1, gdfc1_ref);
  EXPECT_TRUE(same_bits(gdfc1, gdfc1_ref));
  EXPECT_LE(rel_err(to_cpu(gdp), to_cpu(gdp_ref)), 1e-5);
  // With the forward's ap recomputed (the experts' backward when ap was not kept): into its
  // own tensor and in place over dap, the forward's bits, dfc1 and dp unchanged.
  {
    Tensor gap2 = gpu_nan({N, F}, dt), gdfc1_2 = gpu_nan({N, W}, dt), gdp2 = gpu_nan({N}, DType::F32);
    gpu::moe_act_scale_backward(gdap, gfc1, gp, act, gdfc1_2, gdp2, gap2, GS());
    EXPECT_TRUE(same_bits(gap2, gap));
    EXPECT_TRUE(same_bits(gdfc1_2, gdfc1));
    EXPECT_TRUE(same_bits(gdp2, gdp));
    Tensor ginplace = to_gpu(dap, dt);
    gpu::moe_act_scale_backward(ginplace, gfc1, gp, act, gdfc1_2, gdp2, ginplace, GS());
    EXPECT_TRUE(same_bits(ginplace, gap));
    EXPECT_TRUE(same_bits(gdfc1_2, gdfc1));
    EXPECT_TRUE(same_bits(gdp2, gdp));
  }
  Tensor dfc1 = Tensor::empty({N, W}, DType::F32), dp = Tensor::empty({N}, DType::F32), cnone;
  cpu::moe_act_scale_backward(dap, fc1, p, act, dfc1, dp, cnone, CS());
  EXPECT_CLOSE(gdfc1, dfc1, dt);
  EXPECT_CLOSE(gdp, dp, dt);
}

INSTANTIATE_TEST_SUITE_P(Cases, GpuMoeActScale,
                         ::testing::Combine(::testing::Values(DType::F32, DType::BF16, DType::F16),
                                            ::testing::Values(
                                                MlpAct(MlpActivation::Swiglu),
                                                MlpAct(MlpActivation::Gelu),
                                                MlpAct(MlpActivation::SquaredRelu),
                                                glu(MlpActivation::QuickGeglu, 1.0, 2.5),
                                                glu(MlpActivation::QuickGeglu, 0.0, INFINITY),
                                                glu(MlpActivation::Swiglu, 0.0, 2.5)),
                                            ::testing::Values<int64_t>(4096, 1024, 96, 99)),
                         [](const auto& i) {
                           const MlpAct a = std::get<1>(i.param);
                           const char* k = a.kind == MlpActivation::Swiglu       ? "_swiglu"
                                           : a.kind == MlpActivation::QuickGeglu ? "_qgeglu"
                                           : a.kind == MlpActivation::Gelu       ? "_gelu"
                                                                                 : "_relu2";
                           return std::string(dtype_name(std::get<0>(i.param))) + k +
                                  (a.glu.plain() ? "_" : "_offset_clamp_") +
                                  std::to_string(std::get<2>(i.param));
                         });


struct RouteCase {
  const char* name;
  TransformerConfig::Moe m;
  bool bias;
  int64_t cp = 1;  // a CP group of cp ranks with the same tokens (the counts times cp)
};

std::vector<RouteCase> route_cases() {
  auto base = [](int64_t E, int64_t k) {
    TransformerConfig::Moe m;
    m.num_experts = E, m.topk = k, m.ffn_hidden_size = 4, m.aux_loss_coeff = {1e-2};
    m.z_loss_coeff = 1e-3;
    return m;
  };
  std::vector<RouteCase> v;
  v.push_back({"mixtral_softmax_top2", base(8, 2), false});
  v.push_back({"pre_softmax_scaled_seq_aux", base(16, 4), false});
  v.back().m.pre_softmax = true, v.back().m.topk_scaling_factor = 2.5;
  v.back().m.balance = {TransformerConfig::Moe::Balance::SeqAuxLoss}, v.back().cp = 2;
  v.push_back({"deepseek_sigmoid_bias_groups", base(32, 6), true});
  v.back().m.score = TransformerConfig::Moe::Score::Sigmoid;
  v.back().m.num_groups = 8, v.back().m.group_topk = 3;
  v.back().m.topk_scaling_factor = 2.0, v.back().cp = 2;
  v.push_back({"sigmoid_top1_no_balance", base(64, 1), true});
  v.back().m.score = TransformerConfig::Moe::Score::Sigmoid;
  v.back().m.balance = {TransformerConfig::Moe::Balance::None};
  // sqrtsoftplus, and every aux loss at once (global_aux_loss's counts over a DP x CP group
  // of cp ranks with the same tokens).
  using Bal = TransformerConfig::Moe::Balance;
  v.push_back({"sqrtsoftplus_bias_groups_every_aux", base(32, 6), true});
  v.back().m.score = TransformerConfig::Moe::Score::SqrtSoftplus;
  v.back().m.num_groups = 8, v.back().m.group_topk = 3, v.back().cp = 2;
  v.back().m.balance = {Bal::AuxLoss, Bal::SeqAuxLoss, Bal::GlobalAuxLoss};
  v.back().m.aux_loss_coeff = {1e-2, 2e-2, 3e-2};
  v.push_back({"sqrtsoftplus_top1_global_aux", base(16, 1), false});
  v.back().m.score = TransformerConfig::Moe::Score::SqrtSoftplus;
  v.back().m.balance = {Bal::GlobalAuxLoss};
  v.push_back({"softmax_seq_and_global_aux", base(8, 2), false});
  v.back().m.balance = {Bal::SeqAuxLoss, Bal::GlobalAuxLoss}, v.back().cp = 2;
  v.back().m.aux_loss_coeff = {1e-2, 2e-2};
  return v;
}


// Tensors of n i64 -7 (CPU, or copied to the GPU): entries an op forgot to write show.
Tensor i64_poison(int64_t n, Device d) {
  Tensor h = Tensor::empty({n}, DType::I64);
  std::fill(h.data<int64_t>(), h.data<int64_t>() + n, int64_t(-7));
  if (d == Device::CPU) return h;
  Tensor g = Tensor::empty({n}, DType::I64, Device::CUDA);
  gpu::copy(h, g, GS());
  return g;
}

// moe_route_index of the experts idx [T, k] with their weights prob [T, k] f32 (gidx, gprob:
// the same on the GPU; prob undefined without capacity) on both backends: every output the
// same, element for element (the row arrays' first N), and with capacity the weights after
// it (dropped ones 0) the same bits. Returns the row_slot of each (CPU, GPU), N long.
std::pair<Tensor, Tensor> expect_index_matches_cpu(const Tensor& idx, const Tensor& gidx,
                                                   Tensor& prob, Tensor& gprob,
                                                   const ops::MoeRouteSpec& spec,
                                                   int64_t blocks = 1) {
  const int64_t T = idx.size(0), Nk = idx.numel(), E = spec.E;
  const int64_t Nmax = ops::moe_route_max_rows(spec, T, blocks);
  Tensor cnt = i64_poison(E, Device::CPU), bc = i64_poison(E, Device::CPU);
  Tensor src = i64_poison(Nmax, Device::CPU), rs = i64_poison(Nmax, Device::CPU);
  Tensor sr = i64_poison(Nk, Device::CPU), off = i64_poison(T + 1, Device::CPU);
  Tensor rows = i64_poison(Nmax, Device::CPU);
  Tensor gcnt = i64_poison(E, Device::CUDA), gbc = i64_poison(E, Device::CUDA);
  Tensor gsrc = i64_poison(Nmax, Device::CUDA), grs = i64_poison(Nmax, Device::CUDA);
  Tensor gsr = i64_poison(Nk, Device::CUDA), goff = i64_poison(T + 1, Device::CUDA);
  Tensor grows = i64_poison(Nmax, Device::CUDA);
  cpu::moe_route_index(idx, prob, spec, blocks, cnt, bc, src, rs, sr, off, rows, CS());
  gpu::moe_route_index(gidx, gprob, spec, blocks, gcnt, gbc, gsrc, grs, gsr, goff, grows, GS());
  int64_t N = 0;
  for (int64_t e = 0; e < E; ++e) N += cnt.data<int64_t>()[e];
  EXPECT_LE(N, Nmax);
  for (auto [h, g, name, n] :
       {std::tuple{&cnt, &gcnt, "counts", E}, {&bc, &gbc, "bias_counts", E},
        {&src, &gsrc, "src", N}, {&rs, &grs, "row_slot", N}, {&sr, &gsr, "slot_row", Nk},
        {&off, &goff, "offsets", T + 1}, {&rows, &grows, "rows", N}}) {
    Tensor gh = to_cpu(*g);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += gh.data<int64_t>()[i] != h->data<int64_t>()[i];
    for (int64_t i = 0; i < n; ++i) bad += h->data<int64_t>()[i] == -7;  // written
    EXPECT_EQ(bad, 0) << name;
  }
  if (spec.drops()) {
    Tensor gp = to_cpu(gprob);
    EXPECT_EQ(std::memcmp(gp.raw(), prob.raw(), size_t(Nk) * sizeof(float)), 0)
        << "weights after dropping";
  }
  return {rs.narrow(0, N), grs.narrow(0, N)};
}

class GpuMoeRoute : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
};

TEST_P(GpuMoeRoute, MatchesCpuOps) {
  const DType dt = GetParam();
  const int64_t S = 300, B = 2, T = S * B;  // three tiles of the counting sort
  for (const auto& c : route_cases()) {
    SCOPED_TRACE(c.name);
    const int64_t E = c.m.num_experts, k = c.m.topk, N = T * k;
    const ops::MoeRouteSpec spec = model::moe::route_spec(c.m);
    const int64_t R = ops::moe_aux_rows(spec, B);
    // Logits in dt (bf16: many exact ties), the CPU op on the same values in f32.
    Tensor l = rand_in({T, E}, 21, dt, -3.f, 3.f), gl = to_gpu(l, dt);
    Tensor bias = rand_f32({E}, 22, 0.f, 0.5f), gbias = to_gpu(bias, DType::F32);
    Tensor b = c.bias ? bias : Tensor(), gb = c.bias ? gbias : Tensor();
    Tensor idx = Tensor::empty({T, k}, DType::I64), prob = Tensor::empty({T, k}, DType::F32);
    Tensor gidx = Tensor::empty({T, k}, DType::I64, Device::CUDA), gprob = gpu_nan({T, k}, DType::F32);
    cpu::moe_route_topk(l, b, spec, idx, prob, CS());
    gpu::moe_route_topk(gl, gb, spec, gidx, gprob, GS());
    Tensor hidx = to_cpu(gidx);
    int64_t differ = 0;
    for (int64_t i = 0; i < N; ++i) differ += hidx.data<int64_t>()[i] != idx.data<int64_t>()[i];
    EXPECT_EQ(differ, 0) << "selected experts differ from the CPU op's";
    EXPECT_LE(rel_err(to_cpu(gprob), prob), 1e-6);

    const auto [rs, grs] = expect_index_matches_cpu(idx, gidx, prob, gprob, spec);
    Tensor pr = Tensor::empty({N}, DType::F32), gpr = gpu_nan({N}, DType::F32);
    cpu::moe_gather(prob, rs, pr, CS());
    gpu::moe_gather(gprob, grs, gpr, GS());
    EXPECT_LE(rel_err(to_cpu(gpr), pr), 1e-6);

    const int64_t Rn = std::max<int64_t>(R, 1);
    Tensor ac = Tensor::empty({Rn * E}, DType::F32), ls = Tensor::empty({4}, DType::F32);
    Tensor gac = gpu_nan({Rn * E}, DType::F32), gls = gpu_nan({4}, DType::F32);
    ops::MoeRouteSpec cspec = spec;  // the CP (and DP x CP) group's token count
    cspec.cp = c.cp, cspec.global_ranks = c.cp;
    if (spec.any_aux()) {
      cpu::moe_route_counts(l, cspec, B, ac, CS());
      gpu::moe_route_counts(gl, cspec, B, gac, GS());
      EXPECT_EQ(rel_err(to_cpu(gac), ac), 0.0) << "aux counts";
      const Tensor one = ac.clone(), gone = to_gpu(to_cpu(gac), DType::F32);
      for (int64_t r = 1; r < c.cp; ++r) {  // the other ranks' (the same) counts
        cpu::add(ac, one, ac, CS());
        gpu::add(gac, gone, gac, GS());
      }
    }
    cpu::moe_route_stats(l, ac, cspec, B, ls, CS());
    gpu::moe_route_stats(gl, gac, cspec, B, gls, GS());
    const bool on[4] = {spec.aux, spec.seq_aux, spec.global_aux, spec.z};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(ls.data<float>()[i] > 0.f, on[i]) << "loss " << i;
    EXPECT_LE(rel_err(to_cpu(gls), ls), 1e-5) << "losses";

    Tensor dp = rand_f32({T, k}, 23), gdp = to_gpu(dp, DType::F32);
    Tensor dl = Tensor::empty({T, E}, DType::F32), gdl = gpu_nan({T, E}, dt);
    cpu::moe_route_backward(l, idx, dp, ac, cspec, B, 0.5, 100, 500, dl, CS());
    gpu::moe_route_backward(gl, gidx, gdp, gac, cspec, B, 0.5, 100, 500, gdl, GS());
    EXPECT_LE(rel_err(to_cpu(gdl), rounded(dl, dt)), dt == DType::F32 ? 1e-5 : tol(dt))
        << "dlogits";
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMoeRoute, ::testing::Values(DType::F32, DType::BF16),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });


TransformerConfig moe_cfg(Device dev, DType dt) {
  TransformerConfig c;
  c.num_layers = 2, c.kv_channels = 64, c.seq_length = 64, c.max_position_embeddings = 64;
  c.padded_vocab_size = 128, c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  c.seed = 5, c.init_method_std = 0.05, c.device = dev, c.dtype = dt;
  c.hidden_size = 128, c.num_attention_heads = 2, c.num_query_groups = 2;
  c.ffn_hidden_size = 256, c.rope = true, c.rmsnorm = true, c.swiglu = true;
  c.tie_embeddings = false, c.add_bias_linear = false;
  c.moe.num_experts = 8, c.moe.topk = 2, c.moe.ffn_hidden_size = 64;
  c.moe.aux_loss_coeff = {1e-2}, c.moe.z_loss_coeff = 1e-3;
  c.moe.shared_ffn_hidden_size = 96, c.moe.shared_expert_gate = true;
  c.moe.layer_pattern = {1, 1};
  return c;
}

model::MicroBatch batch(uint64_t seed, int64_t B, int64_t S) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(seed, 1, uint64_t(i)) % 120);
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(seed, 2, uint64_t(i)) % 120);
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  return mb;
}



// The fine-grained (DeepSeek-style) router: sigmoid scores with the expert bias buffer,
// group-limited top-k, scaling, seq_aux_loss; GELU experts, no shared expert.
TransformerConfig sigmoid_cfg(Device dev, DType dt) {
  TransformerConfig c = moe_cfg(dev, dt);
  c.swiglu = false;
  c.moe.num_experts = 16, c.moe.topk = 4, c.moe.expert_bias = true;
  c.moe.score = TransformerConfig::Moe::Score::Sigmoid;
  c.moe.num_groups = 4, c.moe.group_topk = 2, c.moe.topk_scaling_factor = 2.0;
  c.moe.balance = {TransformerConfig::Moe::Balance::SeqAuxLoss};
  c.moe.shared_ffn_hidden_size = 0, c.moe.shared_expert_gate = false;
  return c;
}

std::vector<model::moe::MoeLayer*> moe_layers(GPTModel& m) {
  std::vector<model::moe::MoeLayer*> out;
  auto& b = m.stage().block(0);
  for (int i = 0; i < b.size(); ++i)
    if (auto* l = dynamic_cast<model::moe::MoeLayer*>(&b.layer(i).mlp())) out.push_back(l);
  return out;
}

// The GPU model (routing where MoeLayer chooses; device: whether that must be the routing
// ops, whose statistics live on the device) against the CPU model (host routing).
void f32_matches_cpu(const TransformerConfig& ccfg, const TransformerConfig& gcfg,
                     const char* name, bool device = true) {
  GPTModel cm(ccfg);
  GPTModel gm(gcfg);
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  auto mb = batch(17, 2, 64);
  model::StepKeys k;
  k.iteration = 2;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  for (auto* l : moe_layers(gm)) EXPECT_EQ(l->stats().dev_sum.defined(), device) << name;
  // The expert-bias counts (after capacity, before the FP8 padding) and the aux / z losses.
  const auto cl = moe_layers(cm), gl = moe_layers(gm);
  ASSERT_EQ(cl.size(), gl.size());
  for (size_t i = 0; i < cl.size(); ++i) {
    gl[i]->sync_stats();
    EXPECT_EQ(gl[i]->stats().tokens_per_expert, cl[i]->stats().tokens_per_expert) << i;
    EXPECT_NEAR(gl[i]->stats().last_aux_sum(), cl[i]->stats().last_aux_sum(),
                1e-5 * cl[i]->stats().last_aux_sum()) << i;
    EXPECT_NEAR(gl[i]->stats().last_z_loss, cl[i]->stats().last_z_loss,
                1e-5 * cl[i]->stats().last_z_loss) << i;
  }
  EXPECT_NEAR(lg, lc, 1e-5 * std::abs(lc));
  EXPECT_LE(rel_err(to_cpu(gm.logits()), cm.logits()), 1e-5);
  cm.backward(1.0 / 128), gm.backward(1.0 / 128);
  double worst = 0;
  for (size_t i = 0; i < cm.params().infos().size(); ++i) {
    const double e = rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i));
    EXPECT_LE(e, 1e-4) << cm.params().infos()[i].name;
    worst = std::max(worst, e);
  }
  std::printf("[moe f32 %s] loss %.6f vs cpu %.6f, worst grad rel %.2e\n", name, lg, lc, worst);
}


TEST(GpuMoeModel, F32SigmoidGroupsBiasMatchesCpu) {
  MCPP_REQUIRE_GPU();
  f32_matches_cpu(sigmoid_cfg(Device::CPU, DType::F32), sigmoid_cfg(Device::CUDA, DType::F32),
                  "sigmoid");
}

// --moe-apply-probs-on-input (top-1, sigmoid routing, with and without the experts' biases;
// the exact-GELU experts too): the rows scaled before fc1 on the device as on the CPU.
TEST(GpuMoeModel, F32ProbsOnInputMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (int variant = 0; variant < 3; ++variant) {
    auto cc = moe_cfg(Device::CPU, DType::F32), gc = moe_cfg(Device::CUDA, DType::F32);
    for (auto* c : {&cc, &gc}) {
      c->moe.topk = 1, c->moe.score = TransformerConfig::Moe::Score::Sigmoid;
      c->moe.apply_probs_on_input = true;
      c->moe.shared_ffn_hidden_size = 0, c->moe.shared_expert_gate = false;
      if (variant == 1) c->add_bias_linear = true;
      if (variant == 2) c->swiglu = false, c->gelu_erf = true;
    }
    f32_matches_cpu(cc, gc, variant == 0 ? "probs on input" : variant == 1
                                ? "probs on input, biases" : "probs on input, exact GELU");
  }
}

// gpt-oss's MLP: quick-GEGLU with offset 1 and a clamp that cuts (0.3: these layers' fc1
// outputs are ~0.5), the router's and the experts' linear biases (fc2's times the routing
// weight), a dense quick-GEGLU layer first; f32 against the CPU model, then bf16 close to it.
TransformerConfig gpt_oss_cfg(Device dev, DType dt) {
  TransformerConfig c = moe_cfg(dev, dt);
  c.swiglu = false, c.quick_geglu = true, c.glu_linear_offset = 1.0;
  c.activation_func_clamp_value = 0.3, c.add_bias_linear = true;
  c.moe.shared_ffn_hidden_size = 0, c.moe.shared_expert_gate = false;  // (no biases there)
  c.moe.layer_pattern = {0, 1};
  return c;
}

TEST(GpuMoeModel, F32GptOssMatchesCpu) {
  MCPP_REQUIRE_GPU();
  f32_matches_cpu(gpt_oss_cfg(Device::CPU, DType::F32), gpt_oss_cfg(Device::CUDA, DType::F32),
                  "gpt-oss");
  // A clamped SwiGLU (MoE only) in the same layers, no biases.
  auto cc = moe_cfg(Device::CPU, DType::F32), gc = moe_cfg(Device::CUDA, DType::F32);
  cc.activation_func_clamp_value = gc.activation_func_clamp_value = 0.3;
  f32_matches_cpu(cc, gc, "clamped swiglu");
}

// bf16 against the CPU's f32 (the f32 test above is the exact check). bf16 logits may send a
// token whose top experts are nearly tied to another expert than f32 does: one such token
// moves its experts' weight gradients by a tenth in this small model, so the gradients are
// compared only where both models routed every token alike (the expert counts agree); the
// loss always. The model's gradients then within the dense bf16 tests' 8e-2 (GpuModel), the
// router's weight within 0.2. Returns whether the gradients were compared. gpt-oss: the
// clamp at 1.0, which cuts a few per cent of fc1's outputs (at 0.3 bf16 rounding moves many
// values across the bound, beyond which the gradient is zero).
// loss_scale: --fp16's (StepKeys::loss_scale and the backward's scale), on both models.
bool bf16_grads_close(const TransformerConfig& cc, const TransformerConfig& gc, const char* what,
                      double loss_scale = 1.0) {
  GPTModel cm(cc);
  GPTModel gm(gc);
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  ops::copy(gm.params().flat_params(), cm.params().flat_params(), GS());
  auto mb = batch(19, 2, 64);
  model::StepKeys k;
  k.loss_scale = loss_scale;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  EXPECT_NEAR(lg, lc, 3e-2 * std::abs(lc)) << what;
  double moved = 0;  // by the expert counts: tokens routed differently, counted twice
  const auto cl = moe_layers(cm), gl = moe_layers(gm);
  for (size_t i = 0; i < cl.size(); ++i) {
    const auto& a = cl[i]->stats().tokens_per_expert;
    const auto& b = gl[i]->stats().tokens_per_expert;
    EXPECT_EQ(a.size(), b.size());
    for (size_t e = 0; e < a.size() && e < b.size(); ++e) moved += std::abs(a[e] - b[e]);
  }
  cm.backward(loss_scale / 128), gm.backward(loss_scale / 128);
  double router = 0, worst = 0;
  std::string worst_name;
  for (size_t i = 0; i < cm.params().infos().size(); ++i) {
    const std::string& name = cm.params().infos()[i].name;
    const double e = rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i));
    if (name.find(".router.weight") != std::string::npos) router = std::max(router, e);
    else if (name.find(".router.bias") == std::string::npos && e > worst) worst = e, worst_name = name;
  }
  std::printf("[moe bf16 %s] loss %.6f vs cpu f32 %.6f; expert counts differ by %.0f; router "
              "weight grad %.3f, worst other %.3f (%s)\n", what, lg, lc, moved, router, worst,
              worst_name.c_str());
  if (moved > 0) return false;
  EXPECT_LE(worst, 8e-2) << what << ": " << worst_name;
  EXPECT_LE(router, 0.2) << what;
  return true;
}

TEST(GpuMoeModel, Bf16GptOssCloseToCpu) {
  MCPP_REQUIRE_GPU();
  TransformerConfig cc = gpt_oss_cfg(Device::CPU, DType::F32),
                    gc = gpt_oss_cfg(Device::CUDA, DType::BF16);
  cc.activation_func_clamp_value = gc.activation_func_clamp_value = 1.0;
  const bool compared = bf16_grads_close(cc, gc, "gpt-oss");
  // Plain SwiGLU experts in the same layers: routed alike (measured: router weight 0.010,
  // worst other gradient 0.011 from the CPU), so at least this comparison always runs.
  TransformerConfig pc = moe_cfg(Device::CPU, DType::F32), pg = moe_cfg(Device::CUDA, DType::BF16);
  pc.moe.layer_pattern = pg.moe.layer_pattern = {0, 1};
  EXPECT_TRUE(bf16_grads_close(pc, pg, "swiglu")) << "routing differed: nothing compared";
  if (!compared) std::printf("[moe bf16 gpt-oss] routing differed: gradients not compared\n");
}

// --fp16 MoE training: an f16 model at loss scale 4096 (the aux and z losses' gradients
// scaled with the LM loss's: MoeModelGrad.Fp16LossScaleScalesTheAuxLossGradients checks that
// on the CPU) against the CPU's f32 at the same scale, as the bf16 test compares.
TEST(GpuMoeModel, F16LossScaledCloseToCpu) {
  MCPP_REQUIRE_GPU();
  EXPECT_TRUE(bf16_grads_close(moe_cfg(Device::CPU, DType::F32), moe_cfg(Device::CUDA, DType::F16),
                               "f16", 4096.0))
      << "routing differed: nothing compared";
}

// Sinkhorn routing (top-2 and top-1) routes on the host on both backends: the GPU model's
// loss and gradients are the CPU model's.
TEST(GpuMoeModel, F32SinkhornMatchesCpu) {
  MCPP_REQUIRE_GPU();
  for (int64_t k : {2, 1}) {
    auto cc = moe_cfg(Device::CPU, DType::F32), gc = moe_cfg(Device::CUDA, DType::F32);
    for (auto* c : {&cc, &gc})
      c->moe.balance = {TransformerConfig::Moe::Balance::Sinkhorn}, c->moe.aux_loss_coeff = {0},
      c->moe.topk = k;
    f32_matches_cpu(cc, gc, k == 2 ? "sinkhorn top-2" : "sinkhorn top-1", false);
  }
}

// Capacity on the device (Megatron's Mixtral recipe runs --moe-expert-capacity-factor 1.0):
// both drop policies, pad-to-capacity and the FP8 router padding, against the CPU model's
// host routing. (The device decides on f32 weights, the host on f64: a near tie at an
// expert's capacity could order differently; with these random weights none does.)
TEST(GpuMoeModel, F32CapacityMatchesCpu) {
  MCPP_REQUIRE_GPU();
  struct V {
    const char* name;
    double cf;
    bool position, pad;
    int64_t multiple;
  };
  for (V v : {V{"probs cf 1.0 pad to capacity", 1.0, false, true, 0},
              V{"probs cf 1.0", 1.0, false, false, 0}, V{"position cf 0.5", 0.5, true, false, 0},
              V{"position cf 1.25 pad to capacity", 1.25, true, true, 0},
              V{"probs cf 1.0 FP8 padding", 1.0, false, false, 16}}) {
    auto cc = moe_cfg(Device::CPU, DType::F32), gc = moe_cfg(Device::CUDA, DType::F32);
    for (auto* c : {&cc, &gc}) {
      c->moe.capacity_factor = v.cf, c->moe.drop_by_position = v.position;
      c->moe.pad_to_capacity = v.pad, c->moe.pad_multiple = v.multiple;
    }
    f32_matches_cpu(cc, gc, v.name);
  }
}

TEST(GpuMoeModel, F32MatchesCpu) {
  MCPP_REQUIRE_GPU();
  GPTModel cm(moe_cfg(Device::CPU, DType::F32));
  GPTModel gm(moe_cfg(Device::CUDA, DType::F32));
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  auto mb = batch(17, 2, 64);
  model::StepKeys k;
  k.iteration = 2;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  EXPECT_NEAR(lg, lc, 1e-5 * std::abs(lc));
  EXPECT_LE(rel_err(to_cpu(gm.logits()), cm.logits()), 1e-5);
  cm.backward(1.0 / 128), gm.backward(1.0 / 128);
  double worst = 0;
  for (size_t i = 0; i < cm.params().infos().size(); ++i) {
    const double e = rel_err(to_cpu(gm.params().grad(i)), cm.params().grad(i));
    EXPECT_LE(e, 1e-4) << cm.params().infos()[i].name;
    worst = std::max(worst, e);
  }
  std::printf("[moe f32] loss %.6f vs cpu %.6f, worst grad rel %.2e\n", lg, lc, worst);
}

TEST(GpuMoeModel, Bf16CloseToCpu) {
  MCPP_REQUIRE_GPU();
  GPTModel cm(moe_cfg(Device::CPU, DType::F32));
  GPTModel gm(moe_cfg(Device::CUDA, DType::BF16));
  ops::copy(cm.params().flat_params(), gm.params().flat_params(), GS());
  ops::copy(gm.params().flat_params(), cm.params().flat_params(), GS());
  auto mb = batch(19, 2, 64);
  model::StepKeys k;
  cm.params().zero_grads(), gm.params().zero_grads();
  const double lc = cm.forward(mb, k), lg = gm.forward(mb, k);
  EXPECT_NEAR(lg, lc, 3e-2 * std::abs(lc));
  gm.backward(1.0 / 128);
  double sq = 0;
  for (size_t i = 0; i < gm.params().infos().size(); ++i)
    sq += ops::sum_squares(gm.params().grad(i), GS());
  EXPECT_TRUE(std::isfinite(sq) && sq > 0);
  std::printf("[moe bf16] loss %.6f vs cpu f32 %.6f, grad sq %.3e\n", lg, lc, sq);
}

// --recompute-modules moe on the GPU (device routing, grouped GEMMs on side streams): the
// MoE layers' forward re-run in backward gives the bits of keeping it -- losses, every
// gradient, and the routing statistics, each micro-batch counted once.
TEST(GpuMoeModel, Bf16RecomputeMoeGivesTheBitsOfKeepingIt) {
  MCPP_REQUIRE_GPU();
  for (bool sigmoid : {false, true}) {
    TransformerConfig c = sigmoid ? sigmoid_cfg(Device::CUDA, DType::BF16)
                                  : moe_cfg(Device::CUDA, DType::BF16);
    c.recompute = TransformerConfig::Recompute::Selective;
    GPTModel ref(c);
    c.recompute_moe = true;
    GPTModel rc(c);
    ops::copy(ref.params().flat_params(), rc.params().flat_params(), GS());
    ref.params().zero_grads(), rc.params().zero_grads();
    for (int j = 0; j < 2; ++j) {
      auto mb = batch(23 + j, 2, 64);
      model::StepKeys k;
      k.iteration = 1, k.sample_offset = 2 * j, k.global_batch = 4;
      const double a = ref.forward(mb, k), b = rc.forward(mb, k);
      EXPECT_EQ(a, b) << "micro-batch " << j;
      ref.backward(1.0 / 256), rc.backward(1.0 / 256);
    }
    const Tensor ga = to_cpu(ref.params().flat_grads()), gb = to_cpu(rc.params().flat_grads());
    ASSERT_EQ(ga.nbytes(), gb.nbytes());
    EXPECT_EQ(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()), 0) << (sigmoid ? "sigmoid" : "");
    const auto la = moe_layers(ref), lb = moe_layers(rc);
    ASSERT_EQ(la.size(), lb.size());
    for (size_t i = 0; i < la.size(); ++i) {
      la[i]->sync_stats(), lb[i]->sync_stats();
      EXPECT_EQ(la[i]->stats().tokens_per_expert, lb[i]->stats().tokens_per_expert) << i;
      EXPECT_EQ(la[i]->stats().aux_loss, lb[i]->stats().aux_loss) << i;
      EXPECT_EQ(la[i]->stats().z_loss, lb[i]->stats().z_loss) << i;
    }
    EXPECT_LT(rc.activation_memory().per_slot_max, ref.activation_memory().per_slot_max);
  }
}

// --moe-shared-expert-overlap on the GPU: the shared expert on a side stream beside the
// router, the routing's host wait and the routed experts (forward and backward) gives the
// bits of the serial layer -- losses and every gradient over two accumulated micro-batches
// -- with the gated shared expert (its own host wait on the side stream) and without the
// gate, and with the MoE layers recomputed (the overlap again in the backward's forward).
TEST(GpuMoeModel, Bf16SharedExpertOverlapGivesTheBitsOfSerial) {
  MCPP_REQUIRE_GPU();
  for (int v = 0; v < 3; ++v) {
    TransformerConfig c = moe_cfg(Device::CUDA, DType::BF16);
    c.moe.alltoall = true;
    c.moe.shared_expert_gate = v != 1;
    if (v == 2) c.recompute = TransformerConfig::Recompute::Selective, c.recompute_moe = true;
    GPTModel ref(c);
    c.moe.shared_expert_overlap = true;
    GPTModel ov(c);
    ops::copy(ref.params().flat_params(), ov.params().flat_params(), GS());
    ref.params().zero_grads(), ov.params().zero_grads();
    for (int j = 0; j < 2; ++j) {
      auto mb = batch(31 + j, 2, 64);
      model::StepKeys k;
      k.iteration = 1, k.sample_offset = 2 * j, k.global_batch = 4;
      const double a = ref.forward(mb, k), b = ov.forward(mb, k);
      EXPECT_EQ(a, b) << "variant " << v << " micro-batch " << j;
      ref.backward(1.0 / 256), ov.backward(1.0 / 256);
    }
    const Tensor ga = to_cpu(ref.params().flat_grads()), gb = to_cpu(ov.params().flat_grads());
    ASSERT_EQ(ga.nbytes(), gb.nbytes());
    EXPECT_EQ(std::memcmp(ga.raw(), gb.raw(), ga.nbytes()), 0) << "variant " << v;
  }
}

// ops::StreamFork, as the experts use it (model/moe/experts.cpp): per-expert GEMMs of very
// different row counts (none, one, a ragged tile, several waves) spread over four side
// streams, forward and both backward GEMMs, the weight gradients accumulated twice, give the
// bits of the same GEMMs one after another on the main stream, and the main stream's next
// op sees every side's result.
TEST(GpuStreamFork, ExpertGemmsOnSideStreamsGiveTheBitsOfOneStream) {
  MCPP_REQUIRE_GPU();
  const std::vector<int64_t> rows = {0, 1, 37, 3000, 513, 4096, 128, 2};
  const int64_t In = 1024, Out = 768, E = int64_t(rows.size());
  int64_t N = 0;
  for (int64_t r : rows) N += r;
  const Tensor x = to_gpu(rand_in({N, In}, 11, DType::BF16), DType::BF16);
  const Tensor dy = to_gpu(rand_in({N, Out}, 12, DType::BF16), DType::BF16);
  std::vector<Tensor> w;
  for (int64_t e = 0; e < E; ++e)
    w.push_back(to_gpu(rand_in({Out, In}, 100 + uint64_t(e), DType::BF16, -0.05f, 0.05f),
                       DType::BF16));
  struct Out_ {
    Tensor y, dx;
    std::vector<Tensor> dw;
  };
  auto run = [&](int streams) {
    Out_ o;
    o.y = gpu_nan({N, Out}, DType::BF16), o.dx = gpu_nan({N, In}, DType::BF16);
    for (int64_t e = 0; e < E; ++e) {
      o.dw.push_back(Tensor::empty({Out, In}, DType::F32, Device::CUDA));
      ops::fill(o.dw.back(), 0.0, GS());
    }
    for (int pass = 0; pass < 2; ++pass) {
      ops::StreamFork f(GS(), streams);
      int64_t off = 0;
      Tensor none;
      for (int64_t e = 0; e < E; ++e) {
        const int64_t n = rows[size_t(e)];
        if (n == 0) continue;
        Tensor y = o.y.narrow(off, n), dx = o.dx.narrow(off, n);
        ops::linear_forward(x.narrow(off, n), w[size_t(e)], Tensor(), y, f.side(int(e)));
        ops::linear_backward(dy.narrow(off, n), x.narrow(off, n), w[size_t(e)], dx, false,
                             o.dw[size_t(e)], none, f.side(int(e)));
        off += n;
      }
    }
    // Read on the main stream only (joined).
    Out_ c{to_cpu(o.y), to_cpu(o.dx), {}};
    for (auto& t : o.dw) c.dw.push_back(to_cpu(t));
    return c;
  };
  const Out_ one = run(1), four = run(4);
  auto same = [](const Tensor& a, const Tensor& b) {
    return a.numel() == b.numel() &&
           std::memcmp(a.raw(), b.raw(), size_t(a.numel()) * sizeof(float)) == 0;
  };
  EXPECT_TRUE(same(one.y, four.y)) << "forward";
  EXPECT_TRUE(same(one.dx, four.dx)) << "data gradient";
  for (int64_t e = 0; e < E; ++e) EXPECT_TRUE(same(one.dw[size_t(e)], four.dw[size_t(e)])) << e;
  // The GEMMs really ran: outputs of the experts with rows hold no NaN left from gpu_nan.
  double s = 0;
  for (int64_t i = 0; i < four.y.numel(); ++i) s += four.y.data<float>()[i];
  EXPECT_TRUE(std::isfinite(s));
}

// The counting sort at training sizes: more than 32 tiles (the scan's chunks of 32 tiles with
// a carry), ragged last tile, experts that get no rows, one expert that gets most, every
// token on one expert, and 1000 experts (more than the scan's 32 warps): the CPU op's
// index exactly.
TEST(GpuMoeRouteIndex, ManyTilesSkewAndManyExperts) {
  MCPP_REQUIRE_GPU();
  struct C {
    int64_t T, k, E;
    int mode;  // 0 skewed, 1 all on one expert, 2 uniform
  };
  for (C c : {C{256 * 70 + 13, 6, 32, 0}, C{256 * 40 + 1, 2, 8, 1}, C{256 * 9 + 77, 3, 1000, 2}}) {
    SCOPED_TRACE(::testing::Message() << "T=" << c.T << " k=" << c.k << " E=" << c.E
                                      << " mode=" << c.mode);
    const int64_t N = c.T * c.k;
    Tensor idx = Tensor::empty({c.T, c.k}, DType::I64);
    for (int64_t t = 0; t < c.T; ++t)
      for (int64_t j = 0; j < c.k; ++j) {
        const uint64_t r = Philox::u32(7, 3, uint64_t(t * c.k + j));
        int64_t e = int64_t(r % uint64_t(c.E));
        if (c.mode == 0) e = r % 3 == 0 ? 5 : int64_t(r % 16) * 2 % c.E;  // odd experts empty
        if (c.mode == 1) e = 3;
        idx.data<int64_t>()[t * c.k + j] = e;  // duplicates in a token allowed: order decides
      }
    Tensor gidx = Tensor::empty(idx.shape(), DType::I64, Device::CUDA);
    gpu::copy(idx, gidx, GS());
    ops::MoeRouteSpec spec;  // dropless: the counting sort
    spec.E = c.E, spec.k = c.k;
    Tensor none, gnone;
    expect_index_matches_cpu(idx, gidx, none, gnone, spec);
  }
}

// The capacity index (moe_route_index with capacity and padding) on CUDA against the CPU op
// on the same experts and weights: segments longer than a block's chunk (the scans'
// carries), several blocks of tokens, both drop policies, exact ties between weights (the
// earlier token first), pad-to-capacity, the FP8 padding (with no token left to pad with),
// every token on one expert, an expert no token picks, and 2048 (expert, block) segments
// (the segment scan's chunks): every output exactly, the dropped weights zeroed alike.
TEST(GpuMoeRouteIndex, CapacityAndPaddingMatchCpuOps) {
  MCPP_REQUIRE_GPU();
  struct C {
    const char* name;
    int64_t T, E, k, blocks;
    double cf;
    bool position, pad;
    int64_t multiple;
    int mode;  // 0 random, 1 every token on expert 3, 2 expert 5 never, 3 tied weights
  };
  for (C c : {C{"probs_cf1", 3000, 8, 2, 2, 1.0, false, false, 0, 0},
              C{"probs_ties_pad_to_capacity", 2048, 16, 4, 4, 0.8, false, true, 0, 3},
              C{"position_cf05", 3000, 8, 2, 3, 0.5, true, false, 0, 0},
              C{"position_pad_to_capacity", 1536, 32, 6, 2, 1.25, true, true, 0, 0},
              C{"pad_multiple_dropless", 3000, 8, 2, 2, 0.0, false, false, 16, 0},
              C{"probs_pad_multiple", 3000, 64, 6, 2, 1.0, false, false, 16, 0},
              C{"all_to_one_probs_pad", 2000, 8, 1, 2, 1.0, false, true, 0, 1},
              C{"all_to_one_position", 2000, 8, 1, 1, 1.0, true, false, 0, 1},
              C{"all_to_one_pad_multiple", 2000, 8, 1, 2, 0.0, false, false, 16, 1},
              C{"zero_token_expert_pad_to_capacity", 1024, 8, 2, 1, 0.5, false, true, 0, 2},
              C{"many_segments", 4096, 256, 8, 8, 1.0, false, true, 16, 0}}) {
    SCOPED_TRACE(c.name);
    TransformerConfig::Moe m;
    m.num_experts = c.E, m.topk = c.k, m.capacity_factor = c.cf;
    m.drop_by_position = c.position, m.pad_to_capacity = c.pad, m.pad_multiple = c.multiple;
    const ops::MoeRouteSpec spec = model::moe::route_spec(m);
    Tensor l = rand_f32({c.T, c.E}, 41, -3.f, 3.f);
    for (int64_t t = 0; t < c.T; ++t) {
      if (c.mode == 1) l.data<float>()[t * c.E + 3] += 100.f;
      if (c.mode == 2) l.data<float>()[t * c.E + 5] -= 100.f;
    }
    Tensor idx = Tensor::empty({c.T, c.k}, DType::I64);
    Tensor prob = Tensor::empty({c.T, c.k}, DType::F32);
    cpu::moe_route_topk(l, Tensor(), spec, idx, prob, CS());
    if (c.mode == 3)  // weights on a grid of 1/8: many exact ties at every capacity
      for (int64_t i = 0; i < prob.numel(); ++i)
        prob.data<float>()[i] = std::round(prob.data<float>()[i] * 8.f) / 8.f;
    Tensor gidx = Tensor::empty(idx.shape(), DType::I64, Device::CUDA);
    gpu::copy(idx, gidx, GS());
    Tensor gprob = to_gpu(prob, DType::F32);
    const auto [rs, grs] = expect_index_matches_cpu(idx, gidx, prob, gprob, spec, c.blocks);
    int64_t padding = 0;
    for (int64_t n = 0; n < rs.numel(); ++n) padding += rs.data<int64_t>()[n] < 0;
    const int64_t dropped = idx.numel() - (rs.numel() - padding);
    std::printf("[moe capacity index %s] %lld rows, %lld dropped, %lld padding\n", c.name,
                (long long)rs.numel(), (long long)dropped, (long long)padding);
    // The weights in row order (padding rows 0), as the layer gathers them.
    Tensor pr = Tensor::empty({rs.numel()}, DType::F32), gpr = gpu_nan({rs.numel()}, DType::F32);
    cpu::moe_gather(prob, rs, pr, CS());
    gpu::moe_gather(gprob, grs, gpr, GS());
    EXPECT_EQ(rel_err(to_cpu(gpr), pr), 0.0);
  }
}

// Context parallelism on the device: one MoE layer (capacity with padding, and dropless with
// seq_aux_loss) in a CP group of two (a stand-in whose other rank holds the same tokens:
// tests/moe/moe_layer_harness.h) routes with the routing ops, sums the aux counts over the
// group once (on the device), and gives the CPU layer's host routing in the same group: the
// output, the input and parameter gradients, the expert-bias counts and the aux / z losses.
// The third variant: sqrtsoftplus with every aux loss at once, global_aux_loss's counts
// summed over a DP x CP stand-in group of two as well (one more all-reduce, on the device).
TEST(GpuMoeLayer, ContextParallelOnTheDeviceMatchesCpuHostRouting) {
  MCPP_REQUIRE_GPU();
  for (int variant : {0, 1, 2}) {
    const bool capacity = variant == 1, every = variant == 2;
    SCOPED_TRACE(capacity ? "capacity" : every ? "sqrtsoftplus, every aux loss" : "dropless");
    auto cc = moe_cfg(Device::CPU, DType::F32), gc = moe_cfg(Device::CUDA, DType::F32);
    using Bal = TransformerConfig::Moe::Balance;
    for (auto* c : {&cc, &gc}) {
      c->cp_size = 2, c->moe.shared_ffn_hidden_size = 0, c->moe.shared_expert_gate = false;
      if (capacity) c->moe.capacity_factor = 1.0, c->moe.pad_to_capacity = true;
      else c->moe.balance = {Bal::SeqAuxLoss};
      if (every) {
        c->moe.score = TransformerConfig::Moe::Score::SqrtSoftplus;
        c->moe.balance = {Bal::AuxLoss, Bal::SeqAuxLoss, Bal::GlobalAuxLoss};
        c->moe.aux_loss_coeff = {1e-2, 2e-2, 3e-2};
      }
    }
    using Place = model::moe::MoeLayer::RoutingPlace;
    MirrorCommunicator ccp, gcp, cdp, gdp;
    const MoeLayerRun h = run_moe_layer(cc, &ccp, Place::Host, 32, 2, 7, nullptr, &cdp);
    const MoeLayerRun d = run_moe_layer(gc, &gcp, Place::Auto, 32, 2, 7, &h.params, &gdp);
    EXPECT_TRUE(d.on_device);
    EXPECT_EQ(ccp.all_reduces, 1);
    EXPECT_EQ(gcp.all_reduces, 1);
    EXPECT_EQ(cdp.all_reduces, every ? 1 : 0);
    EXPECT_EQ(gdp.all_reduces, every ? 1 : 0);
    auto close = [](const std::vector<double>& a, const std::vector<double>& b, const char* what) {
      ASSERT_EQ(a.size(), b.size()) << what;
      double num = 0, den = 0;
      for (size_t i = 0; i < a.size(); ++i)
        num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
      EXPECT_GT(den, 0) << what;
      EXPECT_LE(std::sqrt(num / den), 1e-5) << what;
    };
    close(d.y, h.y, "y");
    close(d.dx, h.dx, "dx");
    close(d.grads, h.grads, "parameter gradients");
    EXPECT_EQ(d.tokens_per_expert, h.tokens_per_expert);
    EXPECT_NEAR(d.aux_loss, h.aux_loss, 1e-5 * h.aux_loss);
    EXPECT_NEAR(d.z_loss, h.z_loss, 1e-5 * h.z_loss);
  }
}

}  // namespace moe_gpu_test
