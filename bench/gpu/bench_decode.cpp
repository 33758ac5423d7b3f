// Where a decode step's time goes on the GPU (issue 21), for a checkpoint served in bf16:
//
//   bench_decode CKPT [ROWS="1,8,64"] [PROMPT=128]
//
// 1. The step's GEMMs, layer 0's four weights and the output layer: linear_forward
//    (cuBLASLt) against linear_decode's CUDA-core GEMV (up to 8 rows), its tensor-core
//    kernel (ops/cuda/gemv.cu) and its split-K kernel (ops/cuda/gemv_splitk.cu) at each row
//    count, each timed over 50 back-to-back launches after a warm-up; the rate is the weight
//    bytes read once per call.
// 2. For each row count A: A prompts of PROMPT random tokens prefilled together (the
//    prefill's wall time and op profile), then (a) the op profile of one eager greedy step
//    (ops::cuda op profiler: every catalogue op between two CUDA events; their sum against
//    the time to read the weights once at the copy rate), (b) the wall time of a greedy step
//    as the server runs it (forward_greedy: tokens and positions to the device, the step's
//    CUDA graph, the ids back) over 64 steps, and the same without CUDA graphs.
// 3. With BENCH_DECODE_VARIANTS="V1,V2,..." -- each V a ';'-separated list of NAME=VALUE
//    settings of the environment, or "base" for none (e.g. "base,MCPP_DECODE_L2_AHEAD_MB=0;
//    MCPP_DECODE_ATTN_PREFETCH=0") -- the graph-replayed step at each row count under each
//    setting, a fresh generator (graphs captured anew) per setting, every name any setting
//    names unset before each, the settings interleaved over three rounds; one table.
// BENCH_DECODE_GEMMS=0 skips the GEMM table of part 1.
// BENCH_DECODE_NCU=A: only A prompts prefilled and three greedy steps (graph captured and
//    checked), then one graph-replayed step between cudaProfilerStart and Stop -- for
//    `ncu --profile-from-start off --graph-profiling node`, each of the step's kernels
//    measured on its own -- and exit.
// Prints markdown tables. Needs a CUDA build and a GPU; measures, asserts nothing.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/weights.h"
#include "inference/generator.h"
#include "inference/kv_cache.h"
#include "ops/cuda/device.h"
#include "ops/cuda/gemv.h"
#include "ops/ops.h"

using namespace mcpp;
using Clock = std::chrono::steady_clock;

namespace {

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string tok;
  while (std::getline(ss, tok, ',')) v.push_back(std::stoll(tok));
  return v;
}

// Mean GPU time of fn over n launches (after two untimed), microseconds.
template <typename F>
double time_us(F&& fn, int n = 50) {
  fn(), fn();
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  cudaEventRecord(a, static_cast<cudaStream_t>(ops::default_stream(Device::CUDA).handle));
  for (int i = 0; i < n; ++i) fn();
  cudaEventRecord(b, static_cast<cudaStream_t>(ops::default_stream(Device::CUDA).handle));
  cudaEventSynchronize(b);
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return 1e3 * ms / n;
}

// A prompts of P deterministic tokens, [A, P], and one step's tokens, [A, 1].
Tensor prompts(int64_t A, int64_t P) {
  Tensor t = Tensor::empty({A, P}, DType::I64);
  for (int64_t i = 0; i < A * P; ++i) t.data<int64_t>()[i] = 100 + (i * 7919) % 30000;
  return t;
}
Tensor step_tokens(int64_t A) {
  Tensor t = Tensor::empty({A, 1}, DType::I64);
  for (int64_t a = 0; a < A; ++a) t.data<int64_t>()[a] = 1000 + a;
  return t;
}

// Wall time of a greedy step as the engine runs it, us: three untimed (graph capture and
// check), then the mean of 64.
double greedy_step_us(inference::Generator& g, inference::KVCache& cache, const Tensor& tok,
                      int64_t V) {
  for (int i = 0; i < 3; ++i) g.forward_greedy(tok, cache, V);
  const int steps = 64;
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) g.forward_greedy(tok, cache, V);
  return std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: bench_decode CKPT [ROWS=1,8,64] [PROMPT=128]\n");
    return 2;
  }
  const std::vector<int64_t> rows_list = parse_list(argc > 2 ? argv[2] : "1,8,64");
  const int64_t P = argc > 3 ? std::atoll(argv[3]) : 128;
  checkpoint::WeightsOptions wo;
  wo.device = Device::CUDA, wo.dtype = DType::BF16;
  checkpoint::ModelWeights mw = checkpoint::load_model_weights(argv[1], std::nullopt, wo);
  model::TransformerConfig cfg = mw.config;
  cfg.hidden_dropout = cfg.attention_dropout = 0;
  Stream& st = ops::default_stream(Device::CUDA);
  int64_t weight_bytes = 0;
  for (const auto& p : mw.params.infos())
    if (p.name.find("embedding") == std::string::npos)  // (a step gathers A embedding rows)
      weight_bytes += mw.params.param(p.name).numel() * 2;
  std::printf(
      "## bench_decode: %d layers, hidden %lld, ffn %lld, vocab %lld; %.3f GB of bf16 "
      "weights read per step (the embedding table excluded)\n\n",
      cfg.num_layers, (long long)cfg.hidden_size, (long long)cfg.ffn_hidden_size,
      (long long)cfg.padded_vocab_size, weight_bytes / 1e9);

  if (const char* ncu = std::getenv("BENCH_DECODE_NCU"); ncu && *ncu) {
    const int64_t A = std::atoll(ncu);
    inference::Generator g(mw.params, cfg);
    inference::KVCache kv(cfg, std::min<int64_t>(cfg.max_position_embeddings, P + 160), A,
                          Device::CUDA);
    g.prefill_batch(prompts(A, P), kv, 0);
    const Tensor tok = step_tokens(A);
    for (int i = 0; i < 3; ++i) g.forward_greedy(tok, kv, cfg.padded_vocab_size);
    cudaDeviceSynchronize();
    cudaProfilerStart();
    g.forward_greedy(tok, kv, cfg.padded_vocab_size);
    cudaDeviceSynchronize();
    cudaProfilerStop();
    std::printf("bench_decode: one profiled step of %lld rows\n", (long long)A);
    return 0;
  }

  // ---- 1. the GEMMs
  const char* names[] = {"decoder.layers.0.self_attention.linear_qkv.weight",
                         "decoder.layers.0.self_attention.linear_proj.weight",
                         "decoder.layers.0.mlp.linear_fc1.weight",
                         "decoder.layers.0.mlp.linear_fc2.weight", "output_layer.weight"};
  std::printf(
      "| weight [out, in] | rows | cuBLASLt us | GB/s | GEMV us | GB/s | tensor-core "
      "us | GB/s | split-K us | GB/s |\n|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  // Split-K needs K in steps of 64 and an sm_90 GPU (elsewhere linear_decode_with would time
  // cuBLASLt under its name: the column shows 0).
  int dev = 0, major = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  const bool sm90 = major >= 9;
  const char* gemms_env = std::getenv("BENCH_DECODE_GEMMS");
  const bool gemms = !(gemms_env && std::string(gemms_env) == "0");
  for (const char* name : names) {
    if (!gemms) break;
    if (!mw.params.has(name)) continue;
    const Tensor w = mw.params.param(name);
    const int64_t N = w.size(0), K = w.size(1);
    for (int64_t M : {1, 2, 4, 8, 16, 64}) {
      Tensor x = Tensor::empty({M, K}, DType::BF16, Device::CUDA);
      Tensor y = Tensor::empty({M, N}, DType::BF16, Device::CUDA);
      ops::fill(x, 0.01, st);
      const double gb = double(N * K * 2) / 1e9;
      using ops::cuda::DecodeGemm;
      auto run = [&](DecodeGemm p) {
        return time_us([&] { ops::cuda::linear_decode_with(p, x, w, Tensor(), Tensor(), y, st); });
      };
      const double t0 = run(DecodeGemm::Library);
      const double t1 = M <= 8 ? run(DecodeGemm::Gemv) : 0;
      const double t2 = run(DecodeGemm::TensorCore);
      const double t3 = K % 64 == 0 && sm90 ? run(DecodeGemm::SplitK) : 0;
      std::printf(
          "| %s [%lld, %lld] | %lld | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f | %.1f | %.0f |\n",
          std::string(name).substr(0, std::string(name).rfind('.')).c_str(), (long long)N,
          (long long)K, (long long)M, t0, gb / (t0 * 1e-6), t1, t1 > 0 ? gb / (t1 * 1e-6) : 0.0,
          t2, gb / (t2 * 1e-6), t3, t3 > 0 ? gb / (t3 * 1e-6) : 0.0);
    }
  }
  // The copy rate (read + write), for the floor below.
  Tensor big_a = Tensor::empty({int64_t(1) << 29}, DType::BF16, Device::CUDA);
  Tensor big_b = Tensor::empty({int64_t(1) << 29}, DType::BF16, Device::CUDA);
  ops::fill(big_a, 1.0, st);
  const double copy_us = time_us([&] { ops::copy(big_a, big_b, st); }, 10);
  const double copy_gbs = 2.0 * double(big_a.nbytes()) / 1e9 / (copy_us * 1e-6);
  big_a = Tensor(), big_b = Tensor();
  const double floor_us = double(weight_bytes) / 1e9 / copy_gbs * 1e6;
  std::printf("\ncopy rate %.0f GB/s (read + write): reading the weights once takes %.0f us\n\n",
              copy_gbs, floor_us);

  // ---- 2. the step
  const int64_t slots = *std::max_element(rows_list.begin(), rows_list.end());
  inference::Generator gen(mw.params, cfg);
  inference::KVCache cache(cfg, std::min<int64_t>(cfg.max_position_embeddings, P + 160), slots,
                           Device::CUDA);
  const int64_t V = cfg.padded_vocab_size;
  for (int64_t A : rows_list) {
    cache.reset();
    const Tensor prompt = prompts(A, P);
    // The prefill of the A prompts together (the engine's batched prefill): once untimed
    // (GEMM tuning, cuDNN's graph), its wall time over 5 (logits back on the host), then
    // one under the op profiler.
    gen.prefill_batch(prompt, cache, 0);
    const int reps = 5;
    const auto tp0 = Clock::now();
    for (int i = 0; i < reps; ++i) cache.reset(), gen.prefill_batch(prompt, cache, 0);
    const double pre_ms =
        std::chrono::duration<double, std::milli>(Clock::now() - tp0).count() / reps;
    const double flop = 2.0 * double(weight_bytes / 2) * double(A * P);
    std::printf("### prefill of %lld prompts of %lld tokens: %.2f ms wall (%.1f TFLOP/s of "
                "weight GEMMs, attention excluded)\n\n",
                (long long)A, (long long)P, pre_ms, flop / (pre_ms * 1e-3) / 1e12);
    auto profiled = [&](const char* what, auto&& fn) {
      ops::cuda::op_profile_collect();
      ops::cuda::set_op_profiling(true);
      fn();
      ops::cuda::set_op_profiling(false);
      const auto prof = ops::cuda::op_profile_collect();
      double total = 0;
      int64_t calls = 0;
      for (const auto& o : prof) total += o.ms, calls += o.calls;
      std::printf("### %s, %lld rows: %lld ops, %.0f us of op time (weights once at the copy "
                  "rate: %.0f us)\n\n",
                  what, (long long)A, (long long)calls, total * 1e3, floor_us);
      std::printf("| op | calls | us | share |\n|---|---:|---:|---:|\n");
      for (const auto& o : prof)
        std::printf("| %s | %lld | %.1f | %.1f%% |\n", o.name.c_str(), (long long)o.calls,
                    o.ms * 1e3, 100.0 * o.ms / total);
      std::printf("\n");
    };
    cache.reset();
    profiled("one prefill", [&] { gen.prefill_batch(prompt, cache, 0); });
    const Tensor tok = step_tokens(A);
    // (a) one eager step under the op profiler (after one untimed for the GEMM tuning)
    gen.set_cuda_graphs(false);
    gen.forward_greedy(tok, cache, V);
    profiled("one eager decode step", [&] { gen.forward_greedy(tok, cache, V); });
    // (b) wall time per step, as the engine runs it
    for (bool graphs : {true, false}) {
      gen.set_cuda_graphs(graphs);
      const double us = greedy_step_us(gen, cache, tok, V);
      std::printf("\nstep wall time, %lld rows, CUDA graphs %s: %.0f us (%.0f tokens/s)\n",
                  (long long)A, graphs ? "on" : "off", us, double(A) / (us * 1e-6));
      // back to the prompt's length plus one (the steps above advanced every slot)
      for (int64_t a = 0; a < A; ++a) cache.reset_slot(a), cache.advance(a, 1, P + 1);
    }
    std::printf("\n");
  }

  // ---- 3. the step under each prefetch setting
  const char* variants_env = std::getenv("BENCH_DECODE_VARIANTS");
  if (!variants_env || !*variants_env) return 0;
  std::vector<std::string> variants;
  std::vector<std::vector<std::pair<std::string, std::string>>> settings;
  std::vector<std::string> env_names;  // every name any variant sets
  {
    std::stringstream ss(variants_env);
    std::string v;
    while (std::getline(ss, v, ',')) {
      variants.push_back(v);
      settings.emplace_back();
      if (v == "base") continue;
      std::stringstream vs(v);
      std::string kv;
      while (std::getline(vs, kv, ';')) {
        const size_t e = kv.find('=');
        if (e == std::string::npos || e == 0) {
          std::fprintf(stderr, "BENCH_DECODE_VARIANTS: '%s' is not NAME=VALUE\n", kv.c_str());
          return 2;
        }
        settings.back().emplace_back(kv.substr(0, e), kv.substr(e + 1));
        env_names.push_back(kv.substr(0, e));
      }
    }
  }
  // us[variant][row count]: the best of three rounds' means over 64 steps.
  std::vector<std::vector<double>> best(variants.size(),
                                        std::vector<double>(rows_list.size(), 1e30));
  for (int round = 0; round < 3; ++round)
    for (size_t v = 0; v < variants.size(); ++v) {
      for (const auto& n : env_names) unsetenv(n.c_str());
      for (const auto& [n, val] : settings[v]) setenv(n.c_str(), val.c_str(), 1);
      inference::Generator g2(mw.params, cfg);
      for (size_t r = 0; r < rows_list.size(); ++r) {
        const int64_t A = rows_list[r];
        cache.reset();
        g2.prefill_batch(prompts(A, P), cache, 0);
        best[v][r] = std::min(best[v][r], greedy_step_us(g2, cache, step_tokens(A), V));
      }
    }
  std::printf("### graph-replayed step by setting (best of 3 rounds of 64 steps), us\n\n"
              "| setting |");
  for (int64_t A : rows_list) std::printf(" %lld rows |", (long long)A);
  std::printf("\n|---|");
  for (size_t r = 0; r < rows_list.size(); ++r) std::printf("---:|");
  std::printf("\n");
  for (size_t v = 0; v < variants.size(); ++v) {
    std::printf("| %s |", variants[v].c_str());
    for (size_t r = 0; r < rows_list.size(); ++r) std::printf(" %.0f |", best[v][r]);
    std::printf("\n");
  }
  return 0;
}
