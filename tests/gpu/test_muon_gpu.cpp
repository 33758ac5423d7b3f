// Muon on the GPU (optim/muon.h): the Newton-Schulz iteration with bf16 cuBLASLt GEMMs
// against the CPU's emulation (f32 GEMMs of bf16 values, each output rounded), and in fp32
// against the CPU's fp32; the optimizer on a CUDA bf16 model (split main parameters) and on
// a CUDA f32 model against the same optimizer on the CPU's f32 model; batched GEMMs and the
// batched iteration (matrices of one shape together) against one matrix at a time.
#include <array>
#include <string>

#include "gpu_test_util.h"
#include "model/params.h"
#include "optim/muon.h"
#include "optim/optimizer.h"

using namespace mcpp;
using namespace mcpp::test;

namespace muon_gpu_test {

TEST(GpuMuon, NewtonSchulzMatchesTheCpu) {
  MCPP_REQUIRE_GPU();
  for (bool bf16 : {false, true})
    for (auto [r, c] : {std::pair<int64_t, int64_t>{96, 256}, {256, 96}, {128, 128}}) {
      SCOPED_TRACE(fmt::format("{} [{}, {}]", bf16 ? "bf16" : "fp32", r, c));
      optim::MuonConfig cfg;
      cfg.bf16_matmul = bf16;
      const Tensor x = rand_f32({r, c}, 3 + uint64_t(r));
      Tensor gx = Tensor::empty({r, c}, DType::F32, Device::CUDA);
      gpu::copy(x, gx, GS());
      const Tensor want = optim::newton_schulz(x, cfg, nullptr, -1, CS());
      const Tensor got = to_cpu(optim::newton_schulz(gx, cfg, nullptr, -1, GS()));
      // fp32: GEMM summation orders; bf16: one bf16 rounding apart here and there.
      EXPECT_LT(rel_err(got, want), bf16 ? 2e-2 : 1e-4);
      EXPECT_GT(rel_err(got, x), 0.5);  // orthogonalised: far from the input
    }
}

// Batched GEMMs (3-D operands, cuBLASLt strided batches) against the CPU's per-matrix
// products, every transpose case, bf16 and f32, with matrices whose starts are only 2-byte
// aligned ([5, 7] bf16) beside aligned ones.
TEST(GpuMuon, BatchedGemmMatchesTheCpu) {
  MCPP_REQUIRE_GPU();
  for (DType dt : {DType::F32, DType::BF16})
    for (auto [M, N, K] : {std::array<int64_t, 3>{5, 7, 3}, {64, 96, 128}})
      for (int ta = 0; ta < 2; ++ta)
        for (int tb = 0; tb < 2; ++tb) {
          SCOPED_TRACE(fmt::format("{} M{} N{} K{} ta{} tb{}", dtype_name(dt), M, N, K, ta, tb));
          const int64_t n = 4;
          const Tensor A = rand_f32(ta ? Shape{n, K, M} : Shape{n, M, K}, 5);
          const Tensor B = rand_f32(tb ? Shape{n, N, K} : Shape{n, K, N}, 6);
          const Tensor C = rand_f32({n, M, N}, 7);
          // The CPU's reference on the operands as the GPU holds them (bf16-rounded).
          const Tensor ga = to_gpu(A, dt), gb = to_gpu(B, dt);
          Tensor gc = to_gpu(C, dt);
          gpu::gemm(ta, tb, 0.5, ga, gb, 1.5, gc, GS());
          Tensor ca = to_cpu(ga), cb = to_cpu(gb), cc = to_cpu(to_gpu(C, dt));
          cpu::gemm(ta, tb, 0.5, ca, cb, 1.5, cc, CS());
          EXPECT_LT(rel_err(to_cpu(gc), cc), dt == DType::BF16 ? 1e-2 : 1e-5);
          // gemm_add: C read, D written, bit for bit the in-place product.
          const Tensor gc0 = to_gpu(C, dt);
          Tensor gd = Tensor::empty(gc0.shape(), dt, Device::CUDA);
          gpu::gemm_add(ta, tb, 0.5, ga, gb, 1.5, gc0, gd, GS());
          EXPECT_TRUE(equal_bits(gd, gc));
          EXPECT_TRUE(equal_bits(gc0, to_gpu(C, dt)));
        }
}

// A batch of matrices through Newton-Schulz on the GPU: each within rounding of the same
// matrix orthogonalised alone on the GPU, and of the CPU.
TEST(GpuMuon, BatchedNewtonSchulzMatchesOneAtATime) {
  MCPP_REQUIRE_GPU();
  for (bool bf16 : {false, true})
    for (auto [r, c] : {std::pair<int64_t, int64_t>{96, 256}, {256, 96}, {5, 7}}) {
      SCOPED_TRACE(fmt::format("{} [{}, {}]", bf16 ? "bf16" : "fp32", r, c));
      optim::MuonConfig cfg;
      cfg.bf16_matmul = bf16;
      const int64_t n = 3;
      const Tensor x = rand_f32({n, r, c}, 11 + uint64_t(r));
      const Tensor gx = to_gpu(x, DType::F32);
      const Tensor all = to_cpu(optim::newton_schulz(gx, cfg, nullptr, -1, GS()));
      for (int64_t i = 0; i < n; ++i) {
        const Tensor xi = x.narrow(i, 1).view({r, c});
        const Tensor one =
            to_cpu(optim::newton_schulz(to_gpu(xi, DType::F32), cfg, nullptr, -1, GS()));
        const Tensor cpu_one = optim::newton_schulz(xi, cfg, nullptr, -1, CS());
        const Tensor got = all.narrow(i, 1).view({r, c});
        EXPECT_LT(rel_err(got, one), bf16 ? 2e-2 : 1e-4) << "matrix " << i;
        EXPECT_LT(rel_err(got, cpu_one), bf16 ? 2e-2 : 1e-4) << "matrix " << i;
        EXPECT_GT(rel_err(got, xi), 0.5);
      }
    }
}

// The optimizer with Muon on the matrix parameters of a small layer set, on CUDA (f32 and
// bf16 models) against the CPU's f32 model, fp32 Newton-Schulz.
TEST(GpuMuon, OptimizerOnCudaMatchesTheCpu) {
  MCPP_REQUIRE_GPU();
  auto make = [](DType dt, Device dev) {
    model::ParamStore ps;
    for (auto [name, shape] : {std::pair<const char*, Shape>{"decoder.layers.0.mlp.linear_fc1.weight", {256, 64}},
                               {"decoder.layers.0.mlp.linear_fc2.weight", {64, 256}},
                               {"decoder.layers.1.mlp.linear_fc1.weight", {256, 64}},
                               {"decoder.final_layernorm.weight", {64}}}) {
      model::ParamInfo info;
      info.name = name;
      info.global_shape = info.local_shape = shape;
      info.init_std = 0.05;
      info.weight_decay = shape.size() == 2;
      ps.add(info);
    }
    ps.allocate(dt, DType::F32, dev, 0, 1);
    ps.initialize(17);
    return ps;
  };
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    model::ParamStore g = make(dt, Device::CUDA), c = make(DType::F32, Device::CPU);
    optim::OptimizerConfig oc;
    optim::AdamW go(g, oc), co(c, oc);
    optim::MuonConfig mc;
    mc.bf16_matmul = false, mc.nesterov = true;
    go.enable_muon(mc, {}), co.enable_muon(mc, {});
    Tensor start = dt == DType::F32 ? to_cpu(g.flat_params()) : go.full_main_params();
    co.load_state(start, nullptr, nullptr);
    for (int step = 1; step <= 3; ++step) {
      const Tensor grad = rand_f32({g.total_numel()}, 80 + step, -0.01f, 0.01f);
      gpu::copy(grad, g.flat_grads(), GS());
      cpu::copy(grad, c.flat_grads(), CS());
      go.step(1e-2, 0.1), co.step(1e-2, 0.1);
    }
    const Tensor got = dt == DType::F32 ? to_cpu(g.flat_params()) : go.full_main_params();
    EXPECT_LT(rel_err(got, c.flat_params()), 1e-5);
    EXPECT_LT(rel_err(to_cpu(go.exp_avg()), co.exp_avg()), 1e-5);
    // The step moved the weights (by about lr a step, against weights of 0.05).
    EXPECT_GT(rel_err(got, start), 0.05);
  }
}

}  // namespace muon_gpu_test
