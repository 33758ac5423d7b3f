// MoE training-step benchmark on one GPU (issue 18's models, bf16, synthetic tokens, S 2048):
//   Mixtral-style   16 layers, H 2048, 32 heads, 8 KV groups, 8 SwiGLU experts top-2 of FFN
//                   4096, softmax router, aux loss 1e-2 (micro-batch 16);
//   fine-grained    the same attention, 32 SwiGLU experts top-6 of FFN 1024, one shared
//                   expert of 2048, sigmoid router with the expert bias (micro-batch 8);
//   Llama-style 1B  the dense model of the same active MLP width (8192), micro-batch 16.
// A full step as bench_gpu_train runs it (zero grads, forward, backward, clip, AdamW with
// fp32 main params). Prints one table: step time, tokens/s, MFU over the ACTIVE parameters
// (6 N_active + 12 L H S per token, 989 TFLOP/s), peak memory, the PyTorch reference's
// compiled tokens/s and peak from torch_moe_reference.py's JSON (--torch), and the ratios
// the issue asks for (over PyTorch; MoE over the dense model). --profile adds one profiled
// step per model: GPU time per op. Expert-bias updates (once per global batch, E numbers per
// layer) are outside the step on both sides.
// --gemm-compare first times the experts' forward GEMMs both ways the brief allows: the
// per-expert cuBLASLt GEMMs of ops::linear_forward (what GroupedExperts runs) against one
// cublasGemmGroupedBatchedEx call (cuBLAS >= 12.5; bf16 in and out, fp32 compute), at each
// model's shapes with balanced rows.
// --fp8 RECIPE (delayed | tensorwise | blockwise) runs every model in FP8 (hybrid format:
// the dense layers' GEMMs and each routed expert's, docs/fp8.md; delayed: amax history
// 1024, max, the scales updated after each step as the trainer does), rows named
// "... (FP8 RECIPE)" so that moe_bench.sh can set them against the bf16 rows.
// --keep N sets the MoE models' --keep-mlp-activations (rows "... (keep N)"): the first N
// layers keep the experts' permuted input and fc2 input for backward instead of gathering
// and recomputing them there (model/moe/experts.h; the default keeps none).
// --recompute-modules a,b,... runs the MoE models under selective recomputation of those
// modules (core_attn, layernorm, shared_experts: docs/flags.md; rows "... (recompute a,b)"),
// to set memory against speed.
// --capacity-factor CF runs the MoE models with Megatron's token dropping (Mixtral's recipe
// uses --moe-expert-capacity-factor 1.0; rows "... (capacity CF)"), with --pad-to-capacity
// (--moe-pad-expert-input-to-capacity) and --drop-policy position (else probs).
// --shared-overlap runs the models with a shared expert under --moe-shared-expert-overlap
// (its forward and backward on a side stream beside the routed experts; rows "... (shared
// overlap)").
// --host-routing routes every MoE layer on the host in fp64 (MCPP_MOE_ROUTING=host for this
// process; rows "... (host routing)"), against which the device routing's step is compared:
//   bench_gpu_moe --only Mixtral --capacity-factor 1.0 [--host-routing]
// Usage: bench_gpu_moe [--steps N] [--warmup N] [--only NAME] [--mb NAME=MB] [--fp8 RECIPE]
//                      [--keep N] [--recompute-modules LIST] [--capacity-factor CF]
//                      [--pad-to-capacity] [--drop-policy probs|position] [--host-routing]
//                      [--shared-overlap]
//                      [--torch torch_moe.json] [--profile] [--json-out ours.json]
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <functional>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "base/philox.h"
#include "profile_rows.h"
#include "model/fp8/fp8_linear.h"
#include "model/gpt_model.h"
#include "ops/cuda/device.h"
#include "ops/ops.h"
#include "optim/optimizer.h"

using namespace mcpp;
namespace gpu = mcpp::ops::cuda;

namespace {

struct Case {
  std::string name;
  model::TransformerConfig cfg;
  int64_t mb;
  double torch_ref;  // PyTorch compiled tokens/s measured on the H200 before (the latest,
                     // bench/RESULTS.md), shown "(ref)" when this run did not measure it
};

model::TransformerConfig llama_base() {
  model::TransformerConfig c;
  c.num_layers = 16, c.hidden_size = 2048, c.num_attention_heads = 32, c.num_query_groups = 8;
  c.kv_channels = 64, c.ffn_hidden_size = 8192, c.seq_length = 2048;
  c.max_position_embeddings = 2048, c.padded_vocab_size = 32000;
  c.hidden_dropout = 0, c.attention_dropout = 0;
  c.rope = true, c.rmsnorm = true, c.swiglu = true, c.tie_embeddings = false;
  c.add_bias_linear = false;
  c.device = Device::CUDA, c.dtype = DType::BF16;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> v;
  auto mix = llama_base();
  mix.moe.num_experts = 8, mix.moe.topk = 2, mix.moe.ffn_hidden_size = 4096;
  mix.moe.aux_loss_coeff = {1e-2};
  v.push_back({"Mixtral-style 8x top-2", mix, 16, 60.8e3});
  auto fg = llama_base();
  fg.moe.num_experts = 32, fg.moe.topk = 6, fg.moe.ffn_hidden_size = 1024;
  fg.moe.shared_ffn_hidden_size = 2048, fg.moe.expert_bias = true;
  fg.moe.score = model::TransformerConfig::Moe::Score::Sigmoid;
  fg.moe.balance = {model::TransformerConfig::Moe::Balance::None};
  v.push_back({"Fine-grained 32x top-6 + shared", fg, 8, 50.8e3});
  auto dense = llama_base();
  dense.keep_mlp_activations = 11;  // bench_gpu_train's setting for this model
  v.push_back({"Llama-style 1B (dense)", dense, 16, 78.1e3});
  return v;
}

// Parameters one token meets: everything but the routed experts, plus k/E of those; no
// untied input embedding (the 6N convention of bench_gpu_train).
double active_params(const model::ParamStore& ps, const model::TransformerConfig& c) {
  double n = 0;
  for (const auto& p : ps.infos()) {
    if (!c.tie_embeddings && p.name == "embedding.word_embeddings.weight") continue;
    const bool routed = p.name.find("mlp.experts.") != std::string::npos;
    n += routed ? double(p.numel()) * double(c.moe.topk) / double(c.moe.num_experts)
                : double(p.numel());
  }
  return n;
}

// The experts' GEMMs y_e [n, out] = x_e [n, in] @ w_e^T, E experts of n rows: the loop of
// ops::linear_forward against cublasGemmGroupedBatchedEx, milliseconds per call (median of 9).
std::string gemm_compare(Stream& st) {
  struct Shape {
    const char* what;
    int64_t E, n, out, in;
  };
  const Shape shapes[] = {{"Mixtral fc1", 8, 8192, 8192, 2048},
                          {"Mixtral fc2", 8, 8192, 2048, 4096},
                          {"fine-grained fc1", 32, 3072, 2048, 2048},
                          {"fine-grained fc2", 32, 3072, 2048, 1024}};
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return "cublasCreate failed\n";
  cublasSetStream(h, static_cast<cudaStream_t>(st.handle));
  std::string out =
      "\n| experts' forward GEMMs | E x rows x out x in | per-expert cuBLASLt (ms) | TFLOP/s | "
      "cublasGemmGroupedBatchedEx (ms) | TFLOP/s |\n|---|---|---:|---:|---:|---:|\n";
  for (const auto& sh : shapes) {
    Tensor x = Tensor::empty({sh.E * sh.n, sh.in}, DType::BF16, Device::CUDA);
    Tensor w = Tensor::empty({sh.E, sh.out, sh.in}, DType::BF16, Device::CUDA);
    Tensor y = Tensor::empty({sh.E * sh.n, sh.out}, DType::BF16, Device::CUDA);
    ops::fill(x, 0.01, st), ops::fill(w, 0.02, st);
    std::vector<Tensor> ws;
    for (int64_t e = 0; e < sh.E; ++e) ws.push_back(w.narrow(e, 1).view({sh.out, sh.in}));
    auto loop = [&] {
      for (int64_t e = 0; e < sh.E; ++e) {
        Tensor ye = y.narrow(e * sh.n, sh.n);
        ops::linear_forward(x.narrow(e * sh.n, sh.n), ws[size_t(e)], Tensor(), ye, st);
      }
    };
    // Column-major view: y^T [out, n] = w_e [in, out]^T-as-stored @ x^T [in, n].
    const int G = int(sh.E);
    std::vector<cublasOperation_t> ta(G, CUBLAS_OP_T), tb(G, CUBLAS_OP_N);
    std::vector<int> m(G, int(sh.out)), n(G, int(sh.n)), k(G, int(sh.in)), gs(G, 1);
    std::vector<int> lda(G, int(sh.in)), ldb(G, int(sh.in)), ldc(G, int(sh.out));
    std::vector<float> alpha(G, 1.f), beta(G, 0.f);
    std::vector<const void*> A(G), B(G);
    std::vector<void*> C(G);
    for (int e = 0; e < G; ++e) {
      A[e] = static_cast<const char*>(w.raw()) + size_t(e) * sh.out * sh.in * 2;
      B[e] = static_cast<const char*>(x.raw()) + size_t(e) * sh.n * sh.in * 2;
      C[e] = static_cast<char*>(y.raw()) + size_t(e) * sh.n * sh.out * 2;
    }
    void** dptr = nullptr;
    cudaMalloc(&dptr, 3 * sizeof(void*) * G);
    cudaMemcpy(dptr, A.data(), sizeof(void*) * G, cudaMemcpyHostToDevice);
    cudaMemcpy(dptr + G, B.data(), sizeof(void*) * G, cudaMemcpyHostToDevice);
    cudaMemcpy(dptr + 2 * G, C.data(), sizeof(void*) * G, cudaMemcpyHostToDevice);
    bool grouped_ok = true;
    auto grouped = [&] {
      const cublasStatus_t rc = cublasGemmGroupedBatchedEx(
          h, ta.data(), tb.data(), m.data(), n.data(), k.data(), alpha.data(),
          reinterpret_cast<const void* const*>(dptr), CUDA_R_16BF, lda.data(),
          reinterpret_cast<const void* const*>(dptr + G), CUDA_R_16BF, ldb.data(), beta.data(),
          dptr + 2 * G, CUDA_R_16BF, ldc.data(), G, gs.data(), CUBLAS_COMPUTE_32F);
      grouped_ok = grouped_ok && rc == CUBLAS_STATUS_SUCCESS;
    };
    auto time = [&](const std::function<void()>& f) {
      cudaEvent_t a, b;
      cudaEventCreate(&a), cudaEventCreate(&b);
      std::vector<float> t;
      for (int i = 0; i < 12; ++i) {
        cudaEventRecord(a, static_cast<cudaStream_t>(st.handle));
        f();
        cudaEventRecord(b, static_cast<cudaStream_t>(st.handle));
        cudaEventSynchronize(b);
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        if (i >= 3) t.push_back(ms);
      }
      cudaEventDestroy(a), cudaEventDestroy(b);
      std::sort(t.begin(), t.end());
      return double(t[t.size() / 2]);
    };
    const double fl = 2.0 * double(sh.E * sh.n) * double(sh.out) * double(sh.in);
    const double tl = time(loop), tg = time(grouped);
    cudaFree(dptr);
    out += fmt::format("| {} | {} x {} x {} x {} | {:.3f} | {:.0f} | {} | {} |\n", sh.what, sh.E,
                       sh.n, sh.out, sh.in, tl, fl / tl / 1e9,
                       grouped_ok ? fmt::format("{:.3f}", tg) : std::string("failed"),
                       grouped_ok ? fmt::format("{:.0f}", fl / tg / 1e9) : std::string("-"));
  }
  cublasDestroy(h);
  return out;
}

// The micro-batch a model's reference number was measured at.
int64_t cases_mb(const std::string& name) {
  for (const auto& c : cases())
    if (c.name == name) return c.mb;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // Twenty warm-up steps: the expert GEMMs meet new row-count classes over the first steps
  // (more as the routing grows unbalanced) and tune each once (gemm.cu, gemm_fp8.cu); with
  // eight, the timed Mixtral-style steps still carried some of that tuning (478 against 436
  // ms a step on an H200), with two most of it (736 against 467).
  int steps = 5, warmup = 20;
  std::string only, torch_file, json_out, fp8, recompute, drop_policy = "probs";
  bool profile = false, gemm_cmp = false, pad_to_capacity = false, host_routing = false;
  bool shared_overlap = false;
  double capacity = 0;
  int64_t keep = -1;
  std::map<std::string, int64_t> mb_override;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoi(argv[++i]);
    else if (a == "--warmup" && i + 1 < argc) warmup = std::atoi(argv[++i]);
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--torch" && i + 1 < argc) torch_file = argv[++i];
    else if (a == "--json-out" && i + 1 < argc) json_out = argv[++i];
    else if (a == "--fp8" && i + 1 < argc) fp8 = argv[++i];
    else if (a == "--keep" && i + 1 < argc) keep = std::atoll(argv[++i]);
    else if (a == "--recompute-modules" && i + 1 < argc) recompute = argv[++i];
    else if (a == "--capacity-factor" && i + 1 < argc) capacity = std::atof(argv[++i]);
    else if (a == "--pad-to-capacity") pad_to_capacity = true;
    else if (a == "--drop-policy" && i + 1 < argc) drop_policy = argv[++i];
    else if (a == "--host-routing") host_routing = true;
    else if (a == "--shared-overlap") shared_overlap = true;
    else if (a == "--profile") profile = true;
    else if (a == "--gemm-compare") gemm_cmp = true;
    else if (a == "--mb" && i + 1 < argc) {
      std::string kv = argv[++i];
      auto eq = kv.find('=');
      if (eq == std::string::npos) {
        std::fprintf(stderr, "bench_gpu_moe: --mb wants NAME=N, got '%s'\n", kv.c_str());
        return 2;
      }
      mb_override[kv.substr(0, eq)] = std::atoll(kv.c_str() + eq + 1);
    } else {
      std::fprintf(stderr, "bench_gpu_moe: unknown argument '%s'\n", a.c_str());
      return 2;
    }
  }
  if (!fp8.empty() && fp8 != "delayed" && fp8 != "tensorwise" && fp8 != "blockwise") {
    std::fprintf(stderr, "bench_gpu_moe: --fp8 wants delayed, tensorwise or blockwise, got '%s'\n",
                 fp8.c_str());
    return 2;
  }
  if (drop_policy != "probs" && drop_policy != "position") {
    std::fprintf(stderr, "bench_gpu_moe: --drop-policy wants probs or position, got '%s'\n",
                 drop_policy.c_str());
    return 2;
  }
  if (pad_to_capacity && capacity <= 0) {
    std::fprintf(stderr, "bench_gpu_moe: --pad-to-capacity needs --capacity-factor\n");
    return 2;
  }
  if (host_routing) setenv("MCPP_MOE_ROUTING", "host", 1);  // read as each layer is built
  for (size_t a = 0; a < recompute.size();) {
    size_t e = recompute.find(',', a);
    if (e == std::string::npos) e = recompute.size();
    const std::string m = recompute.substr(a, e - a);
    if (m != "core_attn" && m != "layernorm" && m != "shared_experts") {
      std::fprintf(stderr, "bench_gpu_moe: --recompute-modules: '%s' is not one of core_attn, "
                   "layernorm, shared_experts\n", m.c_str());
      return 2;
    }
    a = e + 1;
  }
  if (!fp8.empty() && recompute.find("shared_experts") != std::string::npos) {
    std::fprintf(stderr, "bench_gpu_moe: --recompute-modules shared_experts with --fp8 is not "
                 "implemented (as megatron train refuses it)\n");
    return 2;
  }
  gpu::init_device();
  Stream& st = gpu::default_stream();
  nlohmann::json torch = nlohmann::json::object();
  if (!torch_file.empty()) {
    std::ifstream f(torch_file);
    if (f) torch = nlohmann::json::parse(f, nullptr, false);
    if (torch.is_discarded() || !torch.is_object()) torch = nlohmann::json::object();
  }
  struct Row {
    std::string name;
    int64_t mb;
    double ms, tps, mfu, peak_mb, torch_tps, torch_peak;
    bool measured;
  };
  std::vector<Row> rows;
  std::string failed, profiles, gemms = gemm_cmp ? gemm_compare(st) : std::string();
  std::fprintf(stderr, "%s", gemms.c_str());
  for (auto c : cases()) {
    if (!only.empty() && c.name.find(only) == std::string::npos) continue;
    for (auto& [k, v] : mb_override)
      if (c.name.find(k) != std::string::npos) c.mb = v;
    const bool same_mb = c.mb == cases_mb(c.name);
    const std::string base_name = c.name;  // the PyTorch reference's key
    if (keep >= 0 && c.cfg.moe.num_experts > 0) {
      c.cfg.keep_mlp_activations = keep;
      c.name += fmt::format(" (keep {})", keep);
    }
    if (!recompute.empty() && c.cfg.moe.num_experts > 0) {
      auto has = [&](const char* m) {
        return ("," + recompute + ",").find(std::string(",") + m + ",") != std::string::npos;
      };
      c.cfg.recompute = model::TransformerConfig::Recompute::Selective;
      c.cfg.recompute_core_attn = has("core_attn");
      c.cfg.recompute_norms = has("layernorm");
      c.cfg.recompute_shared_experts = has("shared_experts") && c.cfg.moe.shared_ffn_hidden_size > 0;
      c.name += " (recompute " + recompute + ")";
    }
    if (capacity > 0 && c.cfg.moe.num_experts > 0) {
      c.cfg.moe.capacity_factor = capacity, c.cfg.moe.pad_to_capacity = pad_to_capacity;
      c.cfg.moe.drop_by_position = drop_policy == "position";
      c.name += fmt::format(" (capacity {}{}{})", capacity, pad_to_capacity ? ", padded" : "",
                            drop_policy == "position" ? ", by position" : "");
      c.torch_ref = 0;  // the PyTorch reference is dropless
    }
    if (host_routing && c.cfg.moe.num_experts > 0) c.name += " (host routing)";
    if (shared_overlap && c.cfg.moe.shared_ffn_hidden_size > 0) {
      c.cfg.moe.shared_expert_overlap = true;
      c.name += " (shared overlap)";
    }
    if (!fp8.empty()) {
      using F = model::Fp8Config;
      c.cfg.fp8.format = F::Format::Hybrid;
      c.cfg.fp8.recipe = fp8 == "tensorwise"  ? F::Recipe::Tensorwise
                         : fp8 == "blockwise" ? F::Recipe::Blockwise
                                              : F::Recipe::Delayed;
      if (fp8 == "delayed") c.cfg.fp8.amax_history_len = 1024, c.cfg.fp8.amax_max = true;
      c.name += " (FP8 " + fp8 + ")";
      c.torch_ref = 0;  // the PyTorch reference is bf16
    }
    gpu::trim_memory_pool();
    gpu::reset_peak_memory();
    const int64_t B = c.mb, S = c.cfg.seq_length, V = c.cfg.padded_vocab_size;
    std::fprintf(stderr, "bench_gpu_moe: %s, batch %lld, seq %lld\n", c.name.c_str(),
                 (long long)B, (long long)S);
    double ms = 0, na = 0;
    try {  // a model that fails (out of memory, say) costs only its row
      model::GPTModel m(c.cfg);
      optim::AdamW opt(m.params(), {});
      Tensor tok = Tensor::empty({B, S}, DType::I64), lab = Tensor::empty({B, S}, DType::I64);
      Tensor mask = Tensor::empty({B, S}, DType::F32);
      for (int64_t i = 0; i < B * S; ++i)
        tok.data<int64_t>()[i] = int64_t(Philox::u32(1, 1, uint64_t(i)) % uint64_t(V - 64));
      for (int64_t i = 0; i < B * S; ++i) {
        lab.data<int64_t>()[i] = (i + 1) % S ? tok.data<int64_t>()[i + 1]
                                             : int64_t(Philox::u32(1, 2, uint64_t(i)) % 50);
        mask.data<float>()[i] = 1.f;
      }
      model::MicroBatch mb;
      mb.tokens = Tensor::empty({B, S}, DType::I64, Device::CUDA);
      mb.labels = Tensor::empty({B, S}, DType::I64, Device::CUDA);
      mb.loss_mask = Tensor::empty({B, S}, DType::F32, Device::CUDA);
      ops::copy(tok, mb.tokens, st), ops::copy(lab, mb.labels, st), ops::copy(mask, mb.loss_mask, st);
      std::string trace;
      auto step = [&](int64_t it) {
        model::StepKeys k;
        k.iteration = it, k.global_batch = B;
        m.params().zero_grads();
        const double loss = m.forward(mb, k) / double(B * S);
        m.backward(1.0 / double(B * S));
        model::fp8_update_scales(m.config(), m.params(), st);  // delayed only
        opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
        opt.step(1e-4, 0.1);
        trace += fmt::format(" {:.4f}", loss);
      };
      for (int i = 0; i < warmup; ++i) step(i);
      gpu::synchronize(st);
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < steps; ++i) step(warmup + i);
      gpu::synchronize(st);
      auto t1 = std::chrono::steady_clock::now();
      ms = std::chrono::duration<double, std::milli>(t1 - t0).count() / steps;
      if (profile) {
        gpu::op_profile_collect();
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
            c.name, B, pms, ms);
        double small = 0;
        for (auto& t : times) {
          if (t.ms >= 0.005 * pms)
            profiles += fmt::format("| {} | {} | {:.2f} | {:.1f}% |\n", t.name, t.calls, t.ms,
                                    100 * t.ms / pms);
          else
            small += t.ms;
        }
        profiles += fmt::format("| (the ops under 0.5% each) | | {:.2f} | {:.1f}% |\n", small,
                                100 * small / pms);
        profiles += bench::profile_remainder_row(pms, sum);
      }
      na = active_params(m.params(), c.cfg);
      auto mem = gpu::memory_stats();
      std::fprintf(stderr, "  losses:%s\n  %.1f ms/step, peak %.0f MB, active params %.3fB\n",
                   trace.c_str(), ms, mem.peak / 1048576.0, na / 1e9);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "bench_gpu_moe: %s failed: %s\n", c.name.c_str(), e.what());
      failed += fmt::format("\n{} (micro-batch {}) failed: {}\n", c.name, B, e.what());
      continue;
    }
    const double tps = double(B * S) / (ms / 1e3);
    const double per_tok = 6 * na + 12.0 * c.cfg.num_layers * c.cfg.hidden_size * S;
    Row r{c.name, B, ms, tps, tps * per_tok / 989e12, gpu::memory_stats().peak / 1048576.0,
          same_mb ? c.torch_ref : 0.0, 0, false};
    if (torch.contains(base_name) && torch[base_name].value("mb", int64_t(0)) == B &&
        torch[base_name].value("compiled", 0.0) > 0 && fp8.empty() && capacity <= 0) {
      r.torch_tps = torch[base_name].value("compiled", 0.0), r.measured = true;
      r.torch_peak = torch[base_name].value("compiled_peak_mb", 0.0);
    }
    rows.push_back(r);
  }
  double dense_tps = 0;
  for (auto& r : rows)
    if (r.name.find("dense") != std::string::npos) dense_tps = r.tps;
  std::printf("| model | micro-batch | step (ms) | tokens/s | MFU (active params) | peak (MB) | "
              "PyTorch compiled | PyTorch peak (MB) | ours / PyTorch | ours / dense 1B |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto& r : rows)
    std::printf("| %s | %lld | %.1f | %.1fK | %.1f%% | %.0f | %s | %s | %s | %s |\n",
                r.name.c_str(), (long long)r.mb, r.ms, r.tps / 1e3, 100 * r.mfu, r.peak_mb,
                r.torch_tps > 0
                    ? fmt::format("{:.1f}K{}", r.torch_tps / 1e3, r.measured ? "" : " (ref)").c_str()
                    : "-",
                r.torch_peak > 0 ? fmt::format("{:.0f}", r.torch_peak).c_str() : "-",
                r.torch_tps > 0 ? fmt::format("{:.2f}x", r.tps / r.torch_tps).c_str() : "-",
                dense_tps > 0 ? fmt::format("{:.2f}", r.tps / dense_tps).c_str() : "-");
  std::printf("%s%s%s", failed.c_str(), gemms.c_str(), profiles.c_str());
  if (!json_out.empty()) {  // for moe_bench.sh's table with a PyTorch run made afterwards
    nlohmann::json j = nlohmann::json::object();
    for (auto& r : rows)
      j[r.name] = {{"mb", r.mb}, {"ms", r.ms}, {"tps", r.tps}, {"mfu", r.mfu},
                   {"peak_mb", r.peak_mb}, {"torch_ref", r.measured ? 0.0 : r.torch_tps}};
    std::ofstream(json_out) << j.dump(1);
  }
  return 0;
}
