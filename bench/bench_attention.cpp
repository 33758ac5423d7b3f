// CPU attention forward and backward, f32, B=8, NH=8 (MHA), causal.
// FLOP convention of the FlashAttention papers: the forward is two S x S x HD GEMMs per
// head (4 S^2 HD), halved by the causal mask; the backward is 2.5 times the forward.
// Run: OMP_NUM_THREADS=<cores> build/bench/bench_attention
// On a machine shared with other jobs, OpenMP's spinning barriers make the real time
// of a multi-threaded run mostly a measure of the neighbours: use OMP_WAIT_POLICY=passive,
// or OMP_NUM_THREADS=1 and divide the FLOPs by the CPU column for a per-core rate.
#include <benchmark/benchmark.h>

#include <cmath>

#include "base/philox.h"
#include "ops/ops.h"

namespace {

using mcpp::DType;
using mcpp::Stream;
using mcpp::Tensor;
namespace cpu = mcpp::ops::cpu;

// Uniform in [-1, 1): cheap enough for the 25M-element inputs of the large shapes.
void fill_uniform(Tensor& t, uint64_t stream) {
  float* p = t.data<float>();
  const int64_t n = t.numel();
  for (int64_t i = 0; i < n; ++i)
    p[i] = 2.0f * mcpp::Philox::uniform(1, stream, uint64_t(i)) - 1.0f;
}

struct Setup {
  mcpp::ops::AttentionDims d;
  Tensor qkv, out, lse, dout, dqkv;
  double scale;
  Setup(int64_t S, int64_t HD) {
    d.S = S, d.B = 8, d.NH = 8, d.NG = 8, d.HD = HD;
    qkv = Tensor::empty({S, d.B, d.qkv_width()}, DType::F32);
    dout = Tensor::empty({S, d.B, d.NH * HD}, DType::F32);
    fill_uniform(qkv, 1);
    fill_uniform(dout, 2);
    out = Tensor::empty({S, d.B, d.NH * HD}, DType::F32);
    lse = Tensor::empty({d.B, d.NH, S}, DType::F32);
    dqkv = Tensor::empty(qkv.shape(), DType::F32);
    scale = 1.0 / std::sqrt(double(HD));
  }
  double fwd_flops() const { return 2.0 * double(d.B * d.NH) * double(d.S * d.S) * double(d.HD); }
};

void BM_AttentionForward(benchmark::State& st) {
  Setup x(st.range(0), st.range(1));
  const double p = double(st.range(2)) / 100.0;
  for (auto _ : st)
    cpu::attention_forward(x.qkv, x.d, x.scale, p, {1, 2}, x.out, x.lse, Stream::cpu());
  st.counters["GFLOP/s"] =
      benchmark::Counter(x.fwd_flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionBackward(benchmark::State& st) {
  Setup x(st.range(0), st.range(1));
  const double p = double(st.range(2)) / 100.0;
  cpu::attention_forward(x.qkv, x.d, x.scale, p, {1, 2}, x.out, x.lse, Stream::cpu());
  for (auto _ : st)
    cpu::attention_backward(x.dout, x.qkv, x.out, x.lse, x.d, x.scale, p, {1, 2}, x.dqkv,
                            Stream::cpu());
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.5 * x.fwd_flops() * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Args: S, HD, dropout percent.
void shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"S", "HD", "p%"});
  b->Args({256, 32, 0})->Args({1024, 32, 0})->Args({1024, 128, 0})->Args({1024, 32, 10});
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_AttentionForward)->Apply(shapes);
BENCHMARK(BM_AttentionBackward)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
