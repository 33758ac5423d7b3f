// CPU benchmarks: sgemm at the model's shapes, one full training step (forward + backward +
// AdamW) of the 16M-parameter GPT-2-shaped model (4 layers, hidden 256, 8 heads, seq 256,
// vocab 50304 tied, mb 8), and the optimizer's pass alone for each --optimizer rule.
// Counters: GFLOP/s and tokens/s. Run: build/bench/bench_cpu_train
#include <benchmark/benchmark.h>

#include <cmath>

#include "base/philox.h"
#include "model/gpt_model.h"
#include "ops/cpu/runtime_env.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

using namespace mcpp;

static void BM_Sgemm(benchmark::State& st) {
  const int64_t M = st.range(0), N = st.range(1), K = st.range(2);
  Tensor A = Tensor::zeros({M, K}, DType::F32), B = Tensor::zeros({N, K}, DType::F32),
         C = Tensor::zeros({M, N}, DType::F32);
  for (int64_t i = 0; i < A.numel(); ++i) A.data<float>()[i] = float(i % 7) * 0.1f;
  for (int64_t i = 0; i < B.numel(); ++i) B.data<float>()[i] = float(i % 5) * 0.1f;
  for (auto _ : st) ops::gemm(false, true, 1.0, A, B, 0.0, C, Stream::cpu());
  st.counters["GFLOP/s"] =
      benchmark::Counter(2.0 * M * N * K, benchmark::Counter::kIsIterationInvariantRate,
                         benchmark::Counter::kIs1000);
}
BENCHMARK(BM_Sgemm)->Args({2048, 2048, 2048})->Args({2048, 768, 256})->Args({2048, 50304, 256})
    ->Unit(benchmark::kMillisecond)->UseRealTime();

static void BM_TrainStepGpt16M(benchmark::State& st) {
  model::TransformerConfig c;
  c.num_layers = 4, c.hidden_size = 256, c.num_attention_heads = 8, c.num_query_groups = 8;
  c.kv_channels = 32, c.ffn_hidden_size = 1024, c.seq_length = 256;
  c.max_position_embeddings = 256, c.padded_vocab_size = 50304;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1;
  const int64_t B = 8, S = 256;
  model::GPTModel m(c);
  optim::AdamW opt(m.params(), {});
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = Philox::u32(1, 1, i) % 50257;
    mb.labels.data<int64_t>()[i] = Philox::u32(1, 2, i) % 50257;
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  model::StepKeys k;
  for (auto _ : st) {
    m.params().zero_grads();
    m.forward(mb, k);
    m.backward(1.0 / double(B * S));
    double n = std::sqrt(opt.grad_sq_norm());
    opt.clip(1.0, n);
    opt.step(1e-4, 0.01);
    ++k.iteration;
  }
  st.counters["tokens/s"] = benchmark::Counter(double(B * S), benchmark::Counter::kIsIterationInvariantRate);
  // 6 N per token (N with the tied embedding once) + causal attention 6*L*H*S.
  double N = double(m.params().total_numel());
  double flops_tok = 6.0 * N + 6.0 * c.num_layers * c.hidden_size * S;
  st.counters["GFLOP/s"] = benchmark::Counter(flops_tok * B * S, benchmark::Counter::kIsIterationInvariantRate,
                                              benchmark::Counter::kIs1000);
}
BENCHMARK(BM_TrainStepGpt16M)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(10.0);

// The optimizer's pass alone over the 16M model's parameters (f32, no main copy): AdamW
// (arg 0), SGD with momentum (1), Lion (2); GB/s counts the bytes the rule moves (AdamW:
// p, g, m, v read, p, m, v written; the others one state buffer: 20 bytes an element).
static void BM_OptimizerStep(benchmark::State& st) {
  model::TransformerConfig c;
  c.num_layers = 4, c.hidden_size = 256, c.num_attention_heads = 8, c.num_query_groups = 8;
  c.kv_channels = 32, c.ffn_hidden_size = 1024, c.seq_length = 256;
  c.max_position_embeddings = 256, c.padded_vocab_size = 50304;
  model::GPTModel m(c);
  optim::OptimizerConfig oc;
  oc.rule = st.range(0) == 0   ? optim::UpdateRule::Adam
            : st.range(0) == 1 ? optim::UpdateRule::Sgd
                               : optim::UpdateRule::Lion;
  optim::AdamW opt(m.params(), oc);
  ops::fill(m.params().flat_grads(), 1e-3, Stream::cpu());
  for (auto _ : st) opt.step(1e-4, 0.01);
  st.SetLabel(optim::rule_name(oc.rule));
  const double bytes = double(m.params().total_numel()) * (st.range(0) == 0 ? 28.0 : 20.0);
  st.counters["GB/s"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate,
                                           benchmark::Counter::kIs1000);
}
BENCHMARK(BM_OptimizerStep)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond)->UseRealTime();

int main(int argc, char** argv) {
  ops::cpu::reexec_with_runtime_env(argv);  // the same OpenBLAS/OpenMP set-up as `megatron`
  std::printf("OpenBLAS core: %s\n", ops::cpu::blas_core_name().c_str());
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
