// Training-step benchmark on one GPU: a full step (zero grads, forward, backward,
// grad-norm clipping, AdamW with fp32 main params, bf16 copy-back) of GPT-2 124M and
// 350M (S 1024), GPT-3 XL 1.3B and a Llama-style 1B (S 2048), bf16, synthetic tokens.
// Each model runs in the configurations of --variants (default "base,dropout,accum"):
//   base     no dropout, the whole batch as one micro-batch;
//   dropout  Megatron's defaults --attention-dropout 0.1 --hidden-dropout 0.1;
//   accum    the same global batch as 4 micro-batches of a quarter (gradient accumulation,
//            as the trainer runs it: one zero_grads, 4 forward/backward, one step);
//   dropout+accum  both;
//   fp8      the base run with the transformer layers' GEMMs in FP8 (--fp8-format hybrid,
//            delayed scaling: docs/fp8.md); fp8-tensorwise with current scaling;
//            fp8-blockwise with 1x128 / 128x128 block scales. A table of
//            each FP8 variant's tokens/s over its model's base run follows the main table.
// The PyTorch columns are the same configuration's numbers (torch_reference.py writes
// them under "NAME" for base, "NAME|dropout", "NAME|accum", "NAME|dropout+accum"). Prints one table: step time, tokens/s, TFLOP/s by Megatron's
// formula, MFU by the 6N + 12·L·H·S convention (989 TFLOP/s peak), peak memory, and the
// PyTorch numbers: those of bench/gpu/torch_reference.py run in the same gpu-check call
// (--torch FILE, its JSON), else the ones measured earlier on the same kind of GPU
// (shared/reference/gpu-machine.md, marked "ref").
// With --profile, one more step per model runs under the op profiler (ops/cuda/device.h)
// and a table of GPU time per op (GEMMs by weight shape) follows the main table; after an
// FP8 run's table comes the FP8 GEMM ceiling (each FP8 GEMM of one layer timed alone at
// the step's shapes) against the step's FP8 GEMM and cast times. The FP8 GEMMs' tuning
// report follows the bf16 GEMMs' on stderr.
// --keep NAME=N sets --keep-mlp-activations N for the models whose name contains NAME
// (defaults 8, 24, 18, 11: as many layers as fit under PyTorch compiled's peak memory;
// 0: every layer recomputes its MLP activation in backward); the model column shows it.
// Usage: bench_gpu_train [--steps N] [--warmup N] [--only NAME] [--mb NAME=MB ...]
//                        [--keep NAME=N ...] [--torch torch.json] [--profile]
//                        [--variants base,dropout,accum,dropout+accum]
//                        [--gemm-tune short|sustained] [--loss-sync]
// --loss-sync reads each micro-batch's loss before queueing its backward (the trainer
// reads them all after the last backward; for timing the difference). Each run's stderr
// lines give the step time and the host's share of it: the time from a step's start until
// its last backward is queued (near the step time, the host sets the pace).
// --gemm-tune sustained ranks GEMM candidates at the power-capped clock (gemm_sustained.h)
// instead of the library's short runs; the report after the table shows both times.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/philox.h"
#include "model/fp8/fp8_linear.h"
#include "model/gpt_model.h"
#include "ops/attention_backend.h"
#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/device.h"
#include "ops/cuda/fp8.h"
#include "gemm_sustained.h"
#include "profile_rows.h"
#include "ops/ops.h"
#include "optim/optimizer.h"
#include "training/flops.h"

using namespace mcpp;
namespace gpu = mcpp::ops::cuda;

namespace {

struct Case {
  std::string name;
  model::TransformerConfig cfg;
  int64_t mb;
  double torch_compiled, torch_eager;  // tokens/s, gpu-machine.md (2026-11-29)
};

model::TransformerConfig base(int64_t L, int64_t H, int64_t NH, int64_t S) {
  model::TransformerConfig c;
  c.num_layers = L, c.hidden_size = H, c.num_attention_heads = NH, c.num_query_groups = NH;
  c.kv_channels = H / NH, c.ffn_hidden_size = 4 * H, c.seq_length = S;
  c.max_position_embeddings = S, c.padded_vocab_size = 50304;
  c.hidden_dropout = 0, c.attention_dropout = 0;
  c.device = Device::CUDA, c.dtype = DType::BF16;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  // keep-mlp-activations: as many layers keep their MLP activation as fit under PyTorch
  // compiled's peak memory at the same micro-batch (29169, 66981, 76717, 64238 MB).
  auto keep = [](model::TransformerConfig c, int64_t n) {
    c.keep_mlp_activations = n;
    return c;
  };
  v.push_back({"GPT-2 124M", keep(base(12, 768, 12, 1024), 8), 64, 525e3, 409e3});
  v.push_back({"GPT-2 350M", keep(base(24, 1024, 16, 1024), 24), 64, 200e3, 170e3});
  v.push_back({"GPT-3 XL 1.3B", keep(base(24, 2048, 16, 2048), 18), 16, 62.1e3, 57.0e3});
  auto l = base(16, 2048, 32, 2048);
  l.num_query_groups = 8, l.ffn_hidden_size = 8192, l.padded_vocab_size = 32000;
  l.rope = true, l.rmsnorm = true, l.swiglu = true, l.tie_embeddings = false;
  l.add_bias_linear = false;
  l.keep_mlp_activations = 11;
  v.push_back({"Llama-style 1B", l, 16, 78.1e3, 63.0e3});
  return v;
}

// N of the 6N convention: no position embeddings, no untied input embedding.
double flops_params(const model::ParamStore& ps, const model::TransformerConfig& c) {
  double n = 0;
  for (const auto& p : ps.infos()) {
    if (p.name == "embedding.position_embeddings.weight") continue;
    if (!c.tie_embeddings && p.name == "embedding.word_embeddings.weight") continue;
    n += double(p.numel());
  }
  return n;
}

std::string mem_line(int64_t iters) {
  auto m = gpu::memory_stats();
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "[after %lld iterations] memory (MB) | allocated: %.1f | max allocated: %.1f | "
                "reserved: %.1f | max reserved: %.1f",
                (long long)iters, m.in_use / 1048576.0, m.peak / 1048576.0,
                m.reserved / 1048576.0, m.reserved_peak / 1048576.0);
  return buf;
}


// ---- FP8: the FP8 GEMM ceiling of a model's layer shapes (docs/fp8.md)
// Each FP8 GEMM of one transformer layer (QKV, projection, fc1, fc2 in fprop, dgrad and
// wgrad, the operands and epilogues the step uses: fprop E4M3 x E4M3 -> bf16 with fast
// accumulation, dgrad E5M2 x E4M3 -> bf16, wgrad E5M2 x E4M3 accumulating into f32) timed
// alone on random FP8 data, the same tuned algorithm choice as the step: the time the
// step's FP8 GEMMs would take at the rate the GPU gives them in isolation. Returns the
// table and sets *layer_ms to one layer's sum.
std::string fp8_gemm_ceiling(const model::TransformerConfig& c, int64_t T, Stream& st,
                             double* layer_ms) {
  const int64_t H = c.hidden_size, HD = c.kv_channels;
  const int64_t qkv = (c.num_attention_heads + 2 * c.num_query_groups) * HD;
  const int64_t fc1 = (c.swiglu ? 2 : 1) * c.ffn_hidden_size, F = c.ffn_hidden_size;
  struct Lin { const char* name; int64_t out, in; bool bias; };
  const Lin lins[] = {{"qkv", qkv, H, c.add_bias_linear}, {"proj", H, H, c.add_bias_linear},
                      {"fc1", fc1, H, c.add_bias_linear}, {"fc2", H, F, c.add_bias_linear}};
  // Random finite FP8 bytes (no E5M2 Inf/NaN, no E4M3 NaN), 16 MiB tiled over each operand.
  const int64_t chunk = int64_t(1) << 24;
  Tensor dev_chunk[2];  // the same bytes as E4M3 and as E5M2
  for (int j = 0; j < 2; ++j) {
    const DType dt = j ? DType::FP8E5M2 : DType::FP8E4M3;
    Tensor host = Tensor::empty({chunk}, dt);
    auto* hb = static_cast<uint8_t*>(host.raw());
    for (int64_t i = 0; i < chunk; ++i)  // exponent's top bit cleared: finite in both formats
      hb[i] = uint8_t(Philox::u32(7, 3, uint64_t(i)) & 0xbbu);
    dev_chunk[j] = Tensor::empty({chunk}, dt, Device::CUDA);
    ops::copy(host, dev_chunk[j], st);
  }
  auto rnd = [&](int64_t r, int64_t k, DType dt) {
    const Tensor& src = dev_chunk[dt == DType::FP8E5M2 ? 1 : 0];
    Tensor t = Tensor::empty({r * k}, dt, Device::CUDA);
    for (int64_t o = 0; o < r * k; o += chunk) {
      Tensor dst = t.narrow(o, std::min(chunk, r * k - o));
      ops::copy(src.narrow(0, dst.numel()), dst, st);
    }
    return t.view({r, k});
  };
  Tensor one = Tensor::empty({1}, DType::F32, Device::CUDA);
  ops::fill(one, 1.0, st);
  std::string out = fmt::format(
      "\n### FP8 GEMM ceiling, {} (tokens {}): each GEMM of one layer alone, random FP8 data\n\n"
      "| GEMM | [M x K] x [N x K]^T | ms | TFLOP/s |\n|---|---|---:|---:|\n",
      c.swiglu ? "SwiGLU layer" : "GELU layer", T);
  double sum = 0, flops = 0;
  for (const Lin& l : lins) {
    for (int pass = 0; pass < 3; ++pass) {
      // fprop [T,in] x [out,in]; dgrad [T,out] x [in,out]; wgrad [out,T] x [in,T]
      const int64_t M = pass == 2 ? l.out : T, K = pass == 0 ? l.in : pass == 1 ? l.out : T,
                    N = pass == 0 ? l.out : l.in;
      Tensor a = rnd(M, K, pass == 0 ? DType::FP8E4M3 : DType::FP8E5M2);
      Tensor b = rnd(N, K, DType::FP8E4M3);
      Tensor cc = Tensor::empty({M, N}, pass == 2 ? DType::F32 : DType::BF16, Device::CUDA);
      ops::fill(cc, 0.0, st);
      Tensor bias;
      if (pass == 0 && l.bias) {
        bias = Tensor::empty({N}, DType::BF16, Device::CUDA);
        ops::fill(bias, 0.01, st);
      }
      Tensor none;
      auto run = [&] { ops::fp8_gemm(a, one, b, one, bias, none, pass == 2, pass == 0, cc, st); };
      for (int i = 0; i < 3; ++i) run();  // tunes on the first call
      gpu::synchronize(st);
      const int reps = 20;
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < reps; ++i) run();
      gpu::synchronize(st);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
              .count() / reps;
      const double f = 2.0 * double(M) * double(N) * double(K);
      sum += ms, flops += f;
      out += fmt::format("| {} {} | [{} x {}] x [{} x {}]^T | {:.3f} | {:.0f} |\n", l.name,
                         pass == 0 ? "fprop" : pass == 1 ? "dgrad" : "wgrad", M, K, N, K, ms,
                         f / ms / 1e9);
    }
  }
  out += fmt::format("| one layer | | {:.3f} | {:.0f} |\n| x {} layers | | {:.1f} | |\n", sum,
                     flops / sum / 1e9, c.num_layers, sum * double(c.num_layers));
  *layer_ms = sum;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 6, warmup = 2;
  std::string only, torch_file;
  bool profile = false;
  bool loss_sync = false;  // read each micro-batch's loss before its backward (as before)
  std::string variants = "base,dropout,accum";
  std::string profiles;  // the per-op tables, printed after the main table
  std::map<std::string, int64_t> mb_override, keep_override;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--torch" && i + 1 < argc) torch_file = argv[++i];
    else if (a == "--profile") profile = true;
    else if (a == "--loss-sync") loss_sync = true;
    else if (a == "--variants" && i + 1 < argc) variants = argv[++i];
    else if (a == "--gemm-tune" && i + 1 < argc) {
      // sustained: rank GEMM candidates at the power-capped clock (gemm_sustained.h).
      const std::string v = argv[++i];
      if (v == "sustained")
        gpu::set_gemm_tune_ranker(mcpp::bench::rank_gemm_sustained);
      else if (v != "short") {
        std::fprintf(stderr, "bench_gpu_train: --gemm-tune wants short or sustained, got '%s'\n",
                     v.c_str());
        return 2;
      }
    }
    else if ((a == "--mb" || a == "--keep") && i + 1 < argc) {
      std::string kv = argv[++i];
      auto eq = kv.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "bench_gpu_train: %s wants NAME=N, got '%s'\n", a.c_str(), kv.c_str());
        return 2;
      }
      (a == "--mb" ? mb_override : keep_override)[kv.substr(0, eq)] =
          std::atoll(kv.c_str() + eq + 1);
    }
  }
  gpu::init_device();
  Stream& st = gpu::default_stream();
  std::fprintf(stderr, "bench_gpu_train: attention: %s\n", gpu::cudnn_attention_status().c_str());
  // PyTorch measured in this run: {"GPT-2 124M": {"compiled": tok/s, "eager": tok/s,
  // "compiled_peak_mb": MB, ...}, ...}
  nlohmann::json torch = nlohmann::json::object();
  if (!torch_file.empty()) {
    std::ifstream f(torch_file);
    if (f) torch = nlohmann::json::parse(f, nullptr, false);
    if (torch.is_discarded() || !torch.is_object()) torch = nlohmann::json::object();
  }
  struct Row {
    std::string name, model, variant;
    int64_t mb;
    double ms, tps, tflops, mfu, peak_mb, torch_c, torch_e, torch_peak;
    bool measured, measured_e;  // PyTorch compiled / eager from this run (else the references)
  };
  std::vector<Row> rows;
  std::vector<std::string> vlist;
  for (size_t a = 0; a <= variants.size();) {
    size_t e = variants.find(',', a);
    if (e == std::string::npos) e = variants.size();
    std::string v = variants.substr(a, e - a);
    if (v != "base" && v != "dropout" && v != "accum" && v != "dropout+accum" && v != "fp8" &&
        v != "fp8-tensorwise" && v != "fp8-blockwise") {
      std::fprintf(stderr, "bench_gpu_train: --variants: unknown '%s' (base, dropout, accum, "
                   "dropout+accum, fp8, fp8-tensorwise, fp8-blockwise)\n", v.c_str());
      return 2;
    }
    vlist.push_back(v);
    a = e + 1;
  }
  std::vector<std::pair<Case, std::string>> runs;
  for (auto& c : cases())
    for (auto& v : vlist) runs.push_back({c, v});
  for (auto& [c, variant] : runs) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    const bool drop = variant.find("dropout") != std::string::npos;
    const int64_t nmb = variant.find("accum") != std::string::npos ? 4 : 1;
    if (drop) c.cfg.attention_dropout = 0.1, c.cfg.hidden_dropout = 0.1;
    if (variant.rfind("fp8", 0) == 0) {  // ---- FP8 variants
      c.cfg.fp8.format = model::Fp8Config::Format::Hybrid;
      c.cfg.fp8.recipe = variant == "fp8-tensorwise"  ? model::Fp8Config::Recipe::Tensorwise
                         : variant == "fp8-blockwise" ? model::Fp8Config::Recipe::Blockwise
                                                      : model::Fp8Config::Recipe::Delayed;
    }
    for (auto& [k, v] : mb_override)
      if (c.name.find(k) != std::string::npos) c.mb = v;
    for (auto& [k, v] : keep_override)
      if (c.name.find(k) != std::string::npos) c.cfg.keep_mlp_activations = v;
    // The name shown in the tables; c.name stays the key of the PyTorch numbers.
    std::string shown =
        c.cfg.keep_mlp_activations > 0
            ? fmt::format("{} (keep-mlp-activations {})", c.name, c.cfg.keep_mlp_activations)
            : c.name;
    if (drop) shown += ", dropout 0.1/0.1";
    if (nmb > 1) shown += fmt::format(", {} x {} accumulation", c.mb / nmb, nmb);
    if (c.cfg.fp8.enabled())
      shown += variant == "fp8"             ? ", FP8 hybrid delayed"
               : variant == "fp8-blockwise" ? ", FP8 hybrid blockwise"
                                            : ", FP8 hybrid tensorwise";
    const std::string key = variant == "base" ? c.name : c.name + "|" + variant;
    gpu::trim_memory_pool();
    gpu::reset_peak_memory();
    const int64_t B = c.mb, S = c.cfg.seq_length, V = c.cfg.padded_vocab_size;
    if (B % nmb) {
      std::fprintf(stderr, "bench_gpu_train: %s: batch %lld does not split into %lld "
                   "micro-batches\n", shown.c_str(), (long long)B, (long long)nmb);
      return 2;
    }
    const int64_t Bm = B / nmb;  // sequences per micro-batch
    std::fprintf(stderr, "bench_gpu_train: %s, batch %lld, seq %lld\n", shown.c_str(),
                 (long long)B, (long long)S);
    std::fprintf(stderr, "bench_gpu_train: %s\n",
                 ops::describe_attention_backend(Device::CUDA, c.cfg.dtype, c.cfg.kv_channels,
                                                 c.cfg.attention_dropout, c.cfg.num_layers)
                     .c_str());
    double ms = 0, n6 = 0, mega_flops = 0;
    double prof_fp8_gemm_ms = 0, prof_fp8_cast_ms = 0;  // ---- FP8: the profiled step's
    {
      model::GPTModel m(c.cfg);
      optim::AdamW opt(m.params(), {});
      std::vector<model::MicroBatch> mbs(static_cast<size_t>(nmb));
      Tensor tok = Tensor::empty({B, S}, DType::I64), lab = Tensor::empty({B, S}, DType::I64);
      Tensor mask = Tensor::empty({B, S}, DType::F32);
      // Random tokens; labels are the next token, as a language-model batch.
      for (int64_t i = 0; i < B * S; ++i)
        tok.data<int64_t>()[i] = int64_t(Philox::u32(1, 1, uint64_t(i)) % uint64_t(V - 64));
      for (int64_t i = 0; i < B * S; ++i) {
        lab.data<int64_t>()[i] = (i + 1) % S ? tok.data<int64_t>()[i + 1]
                                             : int64_t(Philox::u32(1, 2, uint64_t(i)) % 50);
        mask.data<float>()[i] = 1.f;
      }
      // The batch lives on the device, as a data loader's pinned prefetch would put it;
      // micro-batch j holds sequences [j Bm, (j + 1) Bm).
      for (int64_t j = 0; j < nmb; ++j) {
        auto& mb = mbs[size_t(j)];
        mb.tokens = Tensor::empty({Bm, S}, DType::I64, Device::CUDA);
        mb.labels = Tensor::empty({Bm, S}, DType::I64, Device::CUDA);
        mb.loss_mask = Tensor::empty({Bm, S}, DType::F32, Device::CUDA);
        ops::copy(tok.narrow(j * Bm, Bm), mb.tokens, st);
        ops::copy(lab.narrow(j * Bm, Bm), mb.labels, st);
        ops::copy(mask.narrow(j * Bm, Bm), mb.loss_mask, st);
      }
      double loss = 0, first_loss = 0;
      std::string trace;  // every step's loss, to compare runs (e.g. MCPP_ATTENTION_FALLBACK=1)
      // Host time from a step's start until its last backward is queued (summed over the
      // timed steps): near the step time, the host and not the GPU sets the pace.
      double queue_ms = 0;
      auto step = [&](int64_t it) {
        const auto q0 = std::chrono::steady_clock::now();
        model::StepKeys k;
        k.iteration = it, k.global_batch = B;
        m.params().zero_grads();
        loss = 0;
        // As the trainer (training/forward_backward.cpp): the losses read after the last
        // backward is queued.
        std::vector<model::PendingLoss> pending;
        for (int64_t j = 0; j < nmb; ++j) {
          k.sample_offset = j * Bm;
          pending.push_back(m.forward_pending(mbs[size_t(j)], k));
          if (loss_sync) pending.back().value();  // the GPU then waits for the host
          m.backward(1.0 / double(B * S));
        }
        queue_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() -
                                                              q0).count();
        for (const auto& l : pending) loss += l.value() / double(B * S);
        // FP8 delayed scaling: the step's amaxes -> next step's scales (one GPU: no reduction)
        model::fp8_update_scales(m.config(), m.params(), st);
        opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
        opt.step(1e-4, 0.1);
        char b[32];
        std::snprintf(b, sizeof b, " %.4f", loss);
        trace += b;
      };
      for (int i = 0; i < warmup; ++i) step(i), first_loss = i == 0 ? loss : first_loss;
      gpu::synchronize(st);
      auto t0 = std::chrono::steady_clock::now();
      queue_ms = 0;
      for (int i = 0; i < steps; ++i) step(warmup + i);
      gpu::synchronize(st);
      auto t1 = std::chrono::steady_clock::now();
      ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
      const double queue_step_ms = queue_ms / steps;
      if (profile) {
        gpu::op_profile_collect();  // drop anything recorded before
        gpu::set_op_profiling(true);
        auto p0 = std::chrono::steady_clock::now();
        step(warmup + steps);
        gpu::synchronize(st);
        auto p1 = std::chrono::steady_clock::now();
        gpu::set_op_profiling(false);
        const double pms = std::chrono::duration<double, std::milli>(p1 - p0).count();
        auto times = gpu::op_profile_collect();
        double sum = 0;
        for (auto& t : times) sum += t.ms;
        profiles += fmt::format(
            "\n### {} (micro-batch {}): GPU time per op, one profiled step of {:.1f} ms "
            "(unprofiled {:.1f} ms)\n\n| op | calls | ms | % of step |\n|---|---:|---:|---:|\n",
            shown, B, pms, ms);
        double fp8_gemm_ms = 0, fp8_cast_ms = 0;  // ---- FP8: the step's FP8 GEMMs and casts
        for (auto& t : times) {
          profiles += fmt::format("| {} | {} | {:.2f} | {:.1f}% |\n", t.name, t.calls, t.ms,
                                  100 * t.ms / pms);
          if (t.name.rfind("fp8_gemm", 0) == 0 || t.name.rfind("fp8_block_gemm", 0) == 0)
            fp8_gemm_ms += t.ms;
          else if (t.name.rfind("fp8_", 0) == 0)
            fp8_cast_ms += t.ms;
        }
        prof_fp8_gemm_ms = fp8_gemm_ms, prof_fp8_cast_ms = fp8_cast_ms;
        profiles += bench::profile_remainder_row(pms, sum);
      }
      n6 = flops_params(m.params(), c.cfg);
      training::FlopsShape fs;
      fs.num_layers = c.cfg.num_layers, fs.hidden_size = c.cfg.hidden_size;
      fs.ffn_hidden_size = c.cfg.ffn_hidden_size;
      fs.num_attention_heads = c.cfg.num_attention_heads;
      fs.num_query_groups = c.cfg.num_query_groups, fs.kv_channels = c.cfg.kv_channels;
      fs.seq_length = S, fs.padded_vocab_size = V, fs.swiglu = c.cfg.swiglu;
      mega_flops = training::num_floating_point_operations(fs, B);
      std::fprintf(stderr,
                   "  losses:%s\n  %.1f ms/step (the host queued its forward and backward "
                   "passes in %.1f ms)\n  %s\n",
                   trace.c_str(), ms, queue_step_ms, mem_line(warmup + steps).c_str());
      (void)first_loss;
    }
    const double tps = double(B * S) / (ms / 1e3);
    const double per_tok = 6 * n6 + 12.0 * c.cfg.num_layers * c.cfg.hidden_size * S;
    if (variant != "base") c.torch_compiled = c.torch_eager = 0;  // no reference numbers
    Row r{shown, c.name, variant, B, ms, tps, mega_flops / (ms / 1e3) / 1e12, tps * per_tok / 989e12,
          gpu::memory_stats().peak / 1048576.0, c.torch_compiled, c.torch_eager, 0, false, false};
    // Each measured number replaces its reference number (a run of torch_reference.py with
    // --modes compiled, or one cut short, has only some of them).
    if (torch.contains(key) && torch[key].value("mb", int64_t(0)) == B) {
      const auto& t = torch[key];
      if (t.value("compiled", 0.0) > 0) {
        r.torch_c = t.value("compiled", 0.0), r.measured = true;
        r.torch_peak = t.value("compiled_peak_mb", 0.0);
      }
      if (t.value("eager", 0.0) > 0) r.torch_e = t.value("eager", 0.0), r.measured_e = true;
    }
    rows.push_back(r);
    if (prof_fp8_gemm_ms > 0) {  // ---- FP8: the GEMM ceiling, after the peak is read
      double layer_ms = 0;
      profiles += fp8_gemm_ceiling(c.cfg, B * S / nmb, st, &layer_ms);
      const int64_t fp8_layers = c.cfg.num_layers - c.cfg.fp8.bf16_start - c.cfg.fp8.bf16_end;
      const double ceil_ms = layer_ms * double(fp8_layers * nmb);
      profiles += fmt::format(
          "\nFP8 GEMMs in the profiled step: {:.1f} ms against the ceiling's {:.1f} ms ({} FP8 "
          "layers x {} micro-batches: {:+.1f}%); the FP8 casts and fused casts (fp8_* ops but "
          "the GEMM): {:.1f} ms\n",
          prof_fp8_gemm_ms, ceil_ms, fp8_layers, nmb, 100 * (prof_fp8_gemm_ms / ceil_ms - 1),
          prof_fp8_cast_ms);
    }
  }
  std::printf("| model | micro-batch | step (ms) | tokens/s | TFLOP/s (Megatron formula) | MFU "
              "(6N+12LHS) | peak allocated (MB) | PyTorch compiled | PyTorch eager | PyTorch "
              "compiled peak (MB) | megatron.cpp / PyTorch compiled |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto& r : rows) {
    auto tok = [](double v, bool measured) {
      return v > 0 ? fmt::format("{:.1f}K{}", v / 1e3, measured ? "" : " (ref)") : std::string("-");
    };
    std::printf("| %s | %lld | %.1f | %.1fK | %.1f | %.1f%% | %.0f | %s | %s | %s | %s |\n",
                r.name.c_str(), (long long)r.mb, r.ms, r.tps / 1e3, r.tflops, 100 * r.mfu,
                r.peak_mb, tok(r.torch_c, r.measured).c_str(), tok(r.torch_e, r.measured_e).c_str(),
                r.torch_peak > 0 ? fmt::format("{:.0f}", r.torch_peak).c_str() : "-",
                r.torch_c > 0 ? fmt::format("{:.2f}x", r.tps / r.torch_c).c_str() : "-");
  }
  // FP8 against bf16, model by model: the same call, the same micro-batch.
  bool any_fp8 = false;
  for (auto& r : rows) any_fp8 = any_fp8 || r.variant.rfind("fp8", 0) == 0;
  if (any_fp8) {
    std::printf("\n| model | variant | tokens/s | bf16 tokens/s | FP8 / bf16 | peak (MB) | bf16 "
                "peak (MB) |\n|---|---|---:|---:|---:|---:|---:|\n");
    for (auto& r : rows) {
      if (r.variant.rfind("fp8", 0) != 0) continue;
      for (auto& b : rows)
        if (b.model == r.model && b.variant == "base" && b.mb == r.mb)
          std::printf("| %s | %s | %.1fK | %.1fK | %.3fx | %.0f | %.0f |\n", r.model.c_str(),
                      r.variant.c_str(), r.tps / 1e3, b.tps / 1e3, r.tps / b.tps, r.peak_mb,
                      b.peak_mb);
    }
  }
  std::printf("%s", profiles.c_str());
  // What GEMM tuning found (ops/cuda/gemm.cu): per shape, the heuristic's first pick
  // against the fastest bitwise-equal candidate.
  std::fprintf(stderr, "GEMM tuning:\n%s", gpu::gemm_tuning_report().c_str());
  std::fprintf(stderr, "FP8 GEMM tuning:\n%s", gpu::fp8_gemm_tuning_report().c_str());
  return 0;
}
