// Multi-Latent Attention's tensor ops (ops/mla.h), CUDA against the CPU op on the same
// inputs (see gpu_test_util.h): f32 tight, bf16 loose; rows at pos0 + s and at a positions
// tensor; DeepSeek-V3's head shape (Dn 128, Dr 64, Dv 128) with YaRN and a small one with
// value padding. GPU outputs start as NaN, so an element a kernel skips fails.
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "gpu_test_util.h"
#include "ops/mla.h"

namespace mcpp::test {
namespace mla_gpu_test {

using ops::MlaDims;
using ops::MlaRope;

class GpuMla : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override { MCPP_REQUIRE_GPU(); }
  DType dt() const { return GetParam(); }
};

std::string dtype_param_name(const ::testing::TestParamInfo<DType>& i) {
  return std::string(dtype_name(i.param));
}

struct MlaCase {
  MlaDims d;
  MlaRope r;
  int64_t S = 0, B = 0, pos0 = 0;
  bool positions = false;
  int64_t R() const { return S * B; }
};

MlaRope deepseek_yarn() {
  MlaRope r;
  r.yarn = true;
  r.factor = 40;
  r.original_max_positions = 4096;
  r.mscale = 1.1;  // V3's ratio of two equal mscales is 1; another value tests the scaling
  return r;
}

std::vector<MlaCase> cases() {
  const MlaDims v3{4, 128, 64, 128};
  std::vector<MlaCase> c;
  c.push_back({v3, deepseek_yarn(), 9, 2, 0, true});
  c.push_back({v3, MlaRope{}, 7, 3, 1000, false});
  c.push_back({MlaDims{3, 4, 8, 6}, MlaRope{}, 5, 2, 13, false});  // Dv < Dq: padding
  c.push_back({MlaDims{3, 4, 8, 6}, deepseek_yarn(), 5, 2, 0, true});
  return c;
}

// The CPU positions tensor (undefined with pos0) and its GPU copy.
std::pair<Tensor, Tensor> positions_for(const MlaCase& c) {
  if (!c.positions) return {};
  std::vector<int64_t> p(size_t(c.R()));
  for (size_t r = 0; r < p.size(); ++r) p[r] = int64_t((r * 131 + 7) % 97) * 61;
  Tensor cp = Tensor::from(p, {c.R()});
  Tensor gp = Tensor::empty({c.R()}, DType::I64, Device::CUDA);
  gpu::copy(cp, gp, GS());
  return {cp, gp};
}

TEST_P(GpuMla, QkvForwardBackwardMatchCpu) {
  uint64_t seed = 1;
  int n = 0;
  for (const MlaCase& c : cases()) {
    SCOPED_TRACE(::testing::Message() << "case " << n++);
    const MlaDims& d = c.d;
    const int64_t R = c.R(), Dq = d.Dq();
    auto [cpos, gpos] = positions_for(c);
    Tensor q = rand_in({R, d.heads * Dq}, seed++, dt());
    Tensor kv = rand_in({R, d.heads * (d.Dn + d.Dv)}, seed++, dt());
    Tensor kpe = rand_in({R, d.Dr}, seed++, dt());
    Tensor qkv = Tensor::empty({R, d.heads * 3 * Dq}, DType::F32);
    cpu::mla_qkv_forward(q, kv, kpe, d, c.r, c.B, c.pos0, cpos, qkv, CS());
    Tensor gqkv = gpu_nan(qkv.shape(), dt());
    // Through the dispatching entry point: a CUDA stream reaches the CUDA backend.
    ops::mla_qkv_forward(to_gpu(q, dt()), to_gpu(kv, dt()), to_gpu(kpe, dt()), d, c.r, c.B, c.pos0,
                         gpos, gqkv, GS());
    EXPECT_CLOSE(gqkv, qkv, dt());

    Tensor dqkv = rand_in(qkv.shape(), seed++, dt());
    Tensor dq = Tensor::empty(q.shape(), DType::F32), dkv = Tensor::empty(kv.shape(), DType::F32);
    Tensor dkpe = Tensor::empty(kpe.shape(), DType::F32);
    cpu::mla_qkv_backward(dqkv, d, c.r, c.B, c.pos0, cpos, dq, dkv, dkpe, CS());
    Tensor gdqkv = to_gpu(dqkv, dt());
    Tensor gdq = gpu_nan(q.shape(), dt()), gdkv = gpu_nan(kv.shape(), dt());
    Tensor gdkpe = gpu_nan(kpe.shape(), dt());
    ops::mla_qkv_backward(gdqkv, d, c.r, c.B, c.pos0, gpos, gdq, gdkv, gdkpe, GS());
    EXPECT_CLOSE(gdq, dq, dt());
    EXPECT_CLOSE(gdkv, dkv, dt());
    EXPECT_CLOSE(gdkpe, dkpe, dt());

    // dkpe sums the heads in a fixed order: a second run gives the same bits.
    Tensor gdkpe2 = gpu_nan(kpe.shape(), dt());
    gpu::mla_qkv_backward(gdqkv, d, c.r, c.B, c.pos0, gpos, gdq, gdkv, gdkpe2, GS());
    Tensor a = to_cpu(gdkpe), b = to_cpu(gdkpe2);
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
  }
}

TEST_P(GpuMla, CtxNarrowPadMatchCpu) {
  for (const MlaDims& d : {MlaDims{4, 128, 64, 128}, MlaDims{3, 4, 8, 6}}) {
    const int64_t R = 37;
    Tensor ctx = rand_in({R, d.heads * d.Dq()}, 50, dt());
    Tensor dout = rand_in({R, d.heads * d.Dv}, 51, dt());
    Tensor out = Tensor::empty(dout.shape(), DType::F32),
           dctx = Tensor::empty(ctx.shape(), DType::F32);
    cpu::mla_ctx_narrow(ctx, d, out, CS());
    cpu::mla_ctx_pad(dout, d, dctx, CS());
    Tensor gout = gpu_nan(out.shape(), dt()), gdctx = gpu_nan(dctx.shape(), dt());
    ops::mla_ctx_narrow(to_gpu(ctx, dt()), d, gout, GS());
    ops::mla_ctx_pad(to_gpu(dout, dt()), d, gdctx, GS());
    // Copies of values already representable in dt: exact.
    EXPECT_EQ(rel_err(to_cpu(gout), out), 0.0);
    EXPECT_EQ(rel_err(to_cpu(gdctx), dctx), 0.0);
  }
}

TEST(GpuMlaChecks, BadArgumentsThrow) {
  MCPP_REQUIRE_GPU();
  const MlaDims d{3, 4, 8, 6};
  const int64_t R = 4;
  Tensor q = gpu_nan({R, d.heads * d.Dq()}, DType::BF16);
  Tensor kv = gpu_nan({R, d.heads * (d.Dn + d.Dv)}, DType::BF16);
  Tensor kpe = gpu_nan({R, d.Dr}, DType::BF16);
  Tensor qkv = gpu_nan({R, d.heads * 3 * d.Dq() - 1}, DType::BF16);
  EXPECT_THROW(gpu::mla_qkv_forward(q, kv, kpe, d, MlaRope{}, 2, 0, Tensor(), qkv, GS()), Error);
  Tensor qkv_ok = gpu_nan({R, d.heads * 3 * d.Dq()}, DType::BF16);
  Tensor cpu_pos = Tensor::from(std::vector<int64_t>(size_t(R), 0), {R});
  EXPECT_THROW(gpu::mla_qkv_forward(q, kv, kpe, d, MlaRope{}, 2, 0, cpu_pos, qkv_ok, GS()), Error);
  Tensor kv32 = gpu_nan(kv.shape(), DType::F32);
  EXPECT_THROW(gpu::mla_qkv_forward(q, kv32, kpe, d, MlaRope{}, 2, 0, Tensor(), qkv_ok, GS()),
               Error);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, GpuMla, ::testing::Values(DType::F32, DType::BF16),
                         dtype_param_name);

}  // namespace mla_gpu_test
}  // namespace mcpp::test
