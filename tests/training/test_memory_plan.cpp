// The start-up memory plan counts --grad-reduce-in-bf16's bf16 staging copy: 2 bytes per
// parameter of the rank's buffer (plus 2 per parameter of the 1/DP shard with the
// distributed optimizer), as DataParallelGrads allocates it (staging_bytes(), checked
// against the same sizes by parallel_equiv.grad_buffer_np2); nothing at DP 1. It counts
// the MLP activations --keep-mlp-activations keeps too (measured against the model's own
// allocations by test_model's KeepMlpActivations/PipelineModel tests and
// parallel_equiv.memory_plan_*_keep*).
#include <algorithm>
#include <cstdlib>

#include "model/core_attention.h"
#include "ops/types.h"
#include "test_util.h"
#include "training/memory_plan.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace memory_plan_test {
StageMemory plan(std::vector<std::string> argv, int world) {
  Args a = parse_and_validate(argv, world);
  a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by,
                                          a.tensor_model_parallel_size);
  return plan_stage_memory(a, model_config(a, Device::CUDA, DType::BF16), 0);
}
// base_argv's heads are 16 wide: no CUDA kernel takes them with attention dropout (a
// start-up error), cuDNN does without.
std::vector<std::string> gpu_argv() {
  return with(base_argv(), {"--bf16", "--attention-dropout", "0"});
}

TEST(MemoryPlan, GradReduceInBf16Staging) {
  for (bool distopt : {false, true}) {
    auto argv = gpu_argv();
    if (distopt) argv.push_back("--use-distributed-optimizer");
    const StageMemory fp32 = plan(argv, 2);
    const StageMemory bf16 = plan(with(argv, {"--grad-reduce-in-bf16"}), 2);
    const int64_t n = fp32.parameters;
    ASSERT_GT(n, 0);
    EXPECT_EQ(bf16.parameters, n);
    EXPECT_EQ(bf16.grads - fp32.grads, 2 * n + (distopt ? 2 * (n / 2) : 0)) << distopt;
    EXPECT_EQ(bf16.weights, fp32.weights);
    EXPECT_EQ(bf16.optimizer, fp32.optimizer);
    // DP 1: the flag has no effect, nothing is allocated.
    EXPECT_EQ(plan(with(argv, {"--grad-reduce-in-bf16"}), 1).grads, plan(argv, 1).grads);
  }
}

// bf16 main parameters split into the model's values and lower halves (ops/split_main.h):
// 2 bytes an element besides the moments, with and without the distributed optimizer; 4 with
// MCPP_FP32_MAIN_PARAMS=1 (the optimizer's setting, read when the plan is made).
TEST(MemoryPlan, SplitMainParamsCountTwoBytes) {
  ASSERT_EQ(std::getenv("MCPP_FP32_MAIN_PARAMS"), nullptr);
  for (bool distopt : {false, true}) {
    auto argv = gpu_argv();
    if (distopt) argv.push_back("--use-distributed-optimizer");
    const StageMemory split = plan(argv, 2);
    setenv("MCPP_FP32_MAIN_PARAMS", "1", 1);
    const StageMemory whole = plan(argv, 2);
    unsetenv("MCPP_FP32_MAIN_PARAMS");
    const int64_t held = distopt ? split.parameters / 2 : split.parameters;
    ASSERT_GT(held, 0);
    EXPECT_EQ(split.optimizer, held * 10) << distopt;
    EXPECT_EQ(whole.optimizer, held * 12) << distopt;
  }
}

// --optimizer muon: the momentum where Adam's first moment is, beside the scalar rule's
// state (AdamW allocates both moments for the whole buffer with Adam, one with Lion).
TEST(MemoryPlan, MuonCountsItsScalarRulesState) {
  const StageMemory adam = plan(gpu_argv(), 1);
  const StageMemory muon = plan(with(gpu_argv(), {"--optimizer", "muon"}), 1);
  const StageMemory muon_lion = plan(with(gpu_argv(), {"--optimizer", "muon",
                                                       "--muon-scalar-optimizer", "lion"}), 1);
  ASSERT_GT(adam.parameters, 0);
  EXPECT_EQ(muon.optimizer, adam.optimizer);
  EXPECT_EQ(muon.optimizer, adam.parameters * 10);       // lower halves + two moments
  EXPECT_EQ(muon_lion.optimizer, adam.parameters * 6);   // lower halves + one
}

// --num-distributed-optimizer-instances N: every instance holds the whole state, sharded
// over DP x CP / N ranks: DP 4 with N 2 plans the optimizer state and gradient shard of DP 2
// with one instance, twice DP 4's.
TEST(MemoryPlan, DistributedOptimizerInstances) {
  const auto argv = with(gpu_argv(), {"--use-distributed-optimizer"});
  const StageMemory dp4 = plan(argv, 4), dp2 = plan(argv, 2);
  const StageMemory inst2 = plan(with(argv, {"--num-distributed-optimizer-instances", "2"}), 4);
  EXPECT_EQ(inst2.optimizer, dp2.optimizer);
  // Moments 4 + 4 bytes, the split main parameters' lower halves 2 (ops/split_main.h).
  EXPECT_EQ(inst2.optimizer, (dp4.parameters / 2) * (4 + 4 + 2));
  EXPECT_EQ(inst2.optimizer, 2 * dp4.optimizer);
  EXPECT_EQ(inst2.grads - dp4.grads, (dp4.parameters / 2 - dp4.parameters / 4) * 4);
  EXPECT_EQ(inst2.weights, dp4.weights);
}

// The plan rejects a model whose attention no CUDA kernel takes, as the GPU run would at
// start-up (16-wide heads with attention dropout), and takes multi-latent attention's 192-wide
// heads without dropout (cuDNN).
TEST(MemoryPlan, RejectsAttentionNoKernelTakes) {
  EXPECT_THROW(plan(with(base_argv(), {"--bf16"}), 1), Error);
  const auto mla = with(gpu_argv(), {"--multi-latent-attention", "--qk-head-dim", "128",
                                     "--qk-pos-emb-head-dim", "64", "--v-head-dim", "128"});
  EXPECT_GT(plan(mla, 1).per_microbatch, 0);
  EXPECT_THROW(plan(with(mla, {"--attention-dropout", "0.1"}), 1), Error);
}

// --keep-mlp-activations: one [S*B, F/TP] bf16 activation per kept layer and micro-batch
// (GPT-3 XL at micro-batch 16: 2048 * 16 * 8192 * 2 B = 512 MiB, 256 MiB at TP 2); when
// every layer keeps its own, the shared scratch activation is not allocated.
TEST(MemoryPlan, KeepMlpActivations) {
  const auto xl =
      with(base_argv(), {"--bf16", "--num-layers", "24", "--hidden-size", "2048",
                         "--num-attention-heads", "16", "--seq-length", "2048",
                         "--max-position-embeddings", "2048", "--micro-batch-size", "16"});
  const int64_t MiB = 1 << 20;
  for (int tp : {1, 2}) {
    auto argv = with(xl, {"--tensor-model-parallel-size", std::to_string(tp)});
    const int64_t per_layer = 512 * MiB / tp;
    const StageMemory none = plan(argv, tp);
    for (int keep : {1, 12, 24, 100}) {
      const StageMemory m = plan(with(argv, {"--keep-mlp-activations", std::to_string(keep)}), tp);
      const int kept = std::min(keep, 24);
      EXPECT_EQ(m.per_microbatch - none.per_microbatch, kept * per_layer) << keep;
      EXPECT_EQ(m.scratch - none.scratch, kept == 24 ? -per_layer : 0) << keep;
      EXPECT_EQ(m.weights_and_optimizer(), none.weights_and_optimizer());
    }
    // Selective recomputation drops the attention core only: the same bytes more.
    const auto sel = with(argv, {"--recompute-granularity", "selective"});
    EXPECT_EQ(plan(with(sel, {"--keep-mlp-activations", "3"}), tp).per_microbatch -
                  plan(sel, tp).per_microbatch,
              3 * per_layer);
    // Block recomputation of 4 layers: they save nothing; the next 3 keep.
    const auto block = with(argv, {"--recompute-granularity", "full", "--recompute-method", "block",
                                   "--recompute-num-layers", "4"});
    EXPECT_EQ(plan(with(block, {"--keep-mlp-activations", "3"}), tp).per_microbatch -
                  plan(block, tp).per_microbatch,
              3 * per_layer);
    EXPECT_EQ(plan(with(block, {"--keep-mlp-activations", "30"}), tp).per_microbatch -
                  plan(block, tp).per_microbatch,
              20 * per_layer);
  }
}

// A plan over the device's memory says by how much and what to change; the kept-layer
// count it proposes is the largest that fits, computed from the plan itself.
// --eval-micro-batch-size: an evaluation micro-batch larger than the training step's
// activations adds what it needs beyond them (forward only: one micro-batch's activations,
// its scratch); a smaller one adds nothing; the fit advice names the flag when it matters.
TEST(MemoryPlan, EvalMicroBatch) {
  auto eval = [](const char* emb) {
    return plan(with(gpu_argv(), {"--global-batch-size", "32", "--eval-micro-batch-size", emb}),
                1);
  };
  const StageMemory same = eval("2"), small = eval("1"), big = eval("16"), bigger = eval("32");
  EXPECT_EQ(same.eval_extra, 0);
  EXPECT_EQ(small.eval_extra, 0);
  EXPECT_EQ(small.total(), same.total());
  EXPECT_GT(big.eval_extra, 0);
  EXPECT_GT(bigger.eval_extra, big.eval_extra);
  EXPECT_EQ(big.total(), same.total() + big.eval_extra);
  // forward only: less than the training step's plan at that micro-batch would need
  const StageMemory train16 = plan(with(gpu_argv(), {"--micro-batch-size", "16",
                                                     "--global-batch-size", "32"}),
                                   1);
  EXPECT_LE(big.total(), train16.total());
  Args a = parse_and_validate(
      with(gpu_argv(), {"--global-batch-size", "32", "--eval-micro-batch-size", "16"}), 1);
  a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by, 1);
  const auto cfg = model_config(a, Device::CUDA, DType::BF16);
  const std::string advice = memory_fit_advice(a, cfg, 0, big.total() - 1);
  EXPECT_NE(advice.find("a smaller --eval-micro-batch-size (now 16"), std::string::npos)
      << advice;
}

TEST(MemoryPlan, FitAdvice) {
  const auto xl =
      with(base_argv(), {"--bf16", "--num-layers", "24", "--hidden-size", "2048",
                         "--num-attention-heads", "16", "--seq-length", "2048",
                         "--max-position-embeddings", "2048", "--micro-batch-size", "16",
                         "--keep-mlp-activations", "24"});
  Args a = parse_and_validate(xl, 1);
  a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by, 1);
  const auto cfg = model_config(a, Device::CUDA, DType::BF16);
  const StageMemory all = plan_stage_memory(a, cfg, 0);
  EXPECT_EQ(memory_fit_advice(a, cfg, 0, all.total()), "");  // exactly enough fits
  // 10 layers' worth less than needed (plus the scratch the all-keep plan drops): 13 fit.
  const int64_t per_layer = int64_t(512) << 20;
  const std::string advice = memory_fit_advice(a, cfg, 0, all.total() - 10 * per_layer);
  EXPECT_NE(advice.find("does not"), std::string::npos) << advice;
  EXPECT_NE(advice.find("--keep-mlp-activations 13 (the most that fit)"), std::string::npos)
      << advice;
  {
    Args b = a;
    auto c = cfg;
    b.keep_mlp_activations = c.keep_mlp_activations = 13;
    EXPECT_LE(plan_stage_memory(b, c, 0).total(), all.total() - 10 * per_layer);
    b.keep_mlp_activations = c.keep_mlp_activations = 14;
    EXPECT_GT(plan_stage_memory(b, c, 0).total(), all.total() - 10 * per_layer);
  }
  EXPECT_NE(advice.find("--micro-batch-size"), std::string::npos) << advice;
  EXPECT_NE(advice.find("--recompute-activations"), std::string::npos) << advice;
  EXPECT_EQ(advice.find("--use-distributed-optimizer"), std::string::npos) << advice;  // DP 1
  // Without kept activations, selective recomputation with the dense MLPs' fc1 (24 layers
  // x 16 x 2048 tokens x 8192 x 2 bytes = 12 GiB less, and the attention core's output).
  {
    Args b = parse_and_validate(without(xl, "--keep-mlp-activations"), 1);
    b.padded_vocab_size = a.padded_vocab_size;
    const auto c = model_config(b, Device::CUDA, DType::BF16);
    const int64_t need = plan_stage_memory(b, c, 0).total();
    const std::string adv = memory_fit_advice(b, c, 0, need - (int64_t(8) << 30));
    EXPECT_NE(adv.find("--recompute-granularity selective --recompute-modules core_attn mlp ("),
              std::string::npos)
        << adv;
    EXPECT_EQ(adv.find("alone not enough: "), std::string::npos) << adv;  // 8 GiB short: fits
  }
  // A MoE model: the MoE layers re-run whole in backward (--recompute-modules ... moe) is
  // proposed with what it saves by the plan, which is what the plan of that setting says.
  {
    Args b = parse_and_validate(
        with(without(xl, "--keep-mlp-activations"),
             {"--num-experts", "8", "--moe-ffn-hidden-size", "2048", "--disable-bias-linear",
              "--swiglu", "--moe-grouped-gemm"}),
        1);
    b.padded_vocab_size = a.padded_vocab_size;
    const auto c = model_config(b, Device::CUDA, DType::BF16);
    const int64_t need = plan_stage_memory(b, c, 0).total();
    Args r = b;
    r.recompute_granularity = "selective", r.recompute_modules = {"core_attn", "moe"};
    auto rc = c;
    rc.recompute = model::TransformerConfig::Recompute::Selective, rc.recompute_moe = true;
    const int64_t saved = need - plan_stage_memory(r, rc, 0).total();
    EXPECT_GT(saved, int64_t(4) << 30);  // 24 layers of MoE activations, one set kept
    const std::string adv = memory_fit_advice(b, c, 0, need - (int64_t(2) << 30));
    EXPECT_NE(adv.find(fmt::format("--recompute-granularity selective --recompute-modules "
                                   "core_attn moe ({:.0f} MiB less; fits)",
                                   double(saved) / 1048576.0)),
              std::string::npos)
        << adv;
    EXPECT_EQ(adv.find("core_attn mlp"), std::string::npos) << adv;  // no dense layer
  }
  // Far too little: even no kept layer fits.
  const std::string tiny = memory_fit_advice(a, cfg, 0, int64_t(1) << 30);
  EXPECT_NE(tiny.find("alone not enough"), std::string::npos) << tiny;
  // DP 2 without the distributed optimizer: it is proposed.
  Args d = parse_and_validate(with(xl, {"--global-batch-size", "32"}), 2);
  d.padded_vocab_size = a.padded_vocab_size;
  EXPECT_NE(memory_fit_advice(d, cfg, 0, int64_t(1) << 30).find("--use-distributed-optimizer"),
            std::string::npos);
}

// cuDNN's deterministic attention backward workspace on a GPU: B*NH/TP*S*S*2 bytes (+
// B*NH/TP*S*HD*4 with GQA), in chunks under MCPP_ATTENTION_BWD_WORKSPACE_MB; nothing where
// cuDNN's attention does not run. With it the plan of the four benchmark models came
// within 5 MiB of the peak bench_gpu_train measured on the H200 (bench/RESULTS.md).
TEST(MemoryPlan, AttentionWorkspace) {
  const int64_t MiB = 1 << 20;
  const auto xl = with(base_argv(), {"--bf16", "--num-layers", "24", "--hidden-size", "2048",
                                     "--num-attention-heads", "16", "--seq-length", "2048",
                                     "--max-position-embeddings", "2048", "--micro-batch-size",
                                     "16", "--attention-dropout", "0"});
  auto ws = [](std::vector<std::string> argv, int world, Device dev = Device::CUDA,
               DType dt = DType::BF16) {
    Args a = parse_and_validate(argv, world);
    a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by,
                                            a.tensor_model_parallel_size);
    const auto cfg = model_config(a, dev, dt);
    EXPECT_EQ(plan_stage_memory(a, cfg, 0).attention_workspace,
              attention_workspace_bytes(a, cfg));
    return attention_workspace_bytes(a, cfg);
  };
  EXPECT_EQ(ws(xl, 1), 16 * 16 * 2048LL * 2048 * 2);  // 2048 MiB
  EXPECT_EQ(ws(with(xl, {"--tensor-model-parallel-size", "2"}), 2), 1024 * MiB);
  const auto llama = with(xl, {"--num-attention-heads", "32", "--group-query-attention",
                               "--num-query-groups", "8", "--ffn-hidden-size", "8192"});
  EXPECT_EQ(ws(llama, 1), 4096 * MiB + 256 * MiB);  // what cuDNN 9.19 asked for on the H200
  EXPECT_EQ(ws(xl, 1, Device::CPU), 0);
  EXPECT_EQ(ws(xl, 1, Device::CUDA, DType::F32), 0);
  // With dropout the own flash kernel runs. Its backward hands dS from the dK/dV kernel to
  // the dQ kernel: 2 bytes a score of the causal 64 x 64 tiles (4096 x 32 x 33 x 2 / 2 bytes
  // a head at S 2048), under the same cap as cuDNN's workspace.
  const int64_t ds = 16 * 16 * 4096LL * 32 * 33;
  const auto xl_drop = with(xl, {"--attention-dropout", "0.1"});
  EXPECT_EQ(ws(xl_drop, 1), ds);
  EXPECT_EQ(ws(with(xl_drop, {"--recompute-activations"}), 1), ds);
  setenv("MCPP_ATTENTION_BWD_WORKSPACE_MB", "300", 1);  // 4 of the 16 sequences a call
  EXPECT_EQ(ws(xl_drop, 1), ds / 4);
  unsetenv("MCPP_ATTENTION_BWD_WORKSPACE_MB");
  // Without the hand-over (MCPP_FLASH_DQ_FROM_DS=0, or one sequence's dS over the cap) the
  // dQ kernel recomputes dS from a bit per causal score (each row's key tiles up to its
  // own: 256 x 32 x 33 bytes a head). The layers keep the forward's bits for their backward
  // (saved activations, not workspace); under selective recomputation of the core the
  // backward holds them between its two kernels.
  const int64_t bits = 16 * 16 * 270336LL;
  setenv("MCPP_FLASH_DQ_FROM_DS", "0", 1);
  EXPECT_EQ(ws(xl_drop, 1), 0);
  EXPECT_EQ(ws(with(xl_drop, {"--recompute-activations"}), 1), bits);
  unsetenv("MCPP_FLASH_DQ_FROM_DS");
  setenv("MCPP_ATTENTION_BWD_WORKSPACE_MB", "60", 1);  // one sequence: 66 MiB
  EXPECT_EQ(ws(with(xl_drop, {"--recompute-activations"}), 1), bits);
  unsetenv("MCPP_ATTENTION_BWD_WORKSPACE_MB");
  {
    Args a = parse_and_validate(xl_drop, 1);
    a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by, 1);
    Args a0 = parse_and_validate(xl, 1);
    a0.padded_vocab_size = a.padded_vocab_size;
    const auto cfg = model_config(a, Device::CUDA, DType::BF16);
    const auto cfg0 = model_config(a0, Device::CUDA, DType::BF16);
    EXPECT_TRUE(mcpp::model::CoreAttention::saves_dropout_mask(cfg, 2048));
    EXPECT_FALSE(mcpp::model::CoreAttention::saves_dropout_mask(cfg0, 2048));
    EXPECT_FALSE(mcpp::model::CoreAttention::saves_dropout_mask(cfg, 2044));  // unaligned
    EXPECT_FALSE(mcpp::model::CoreAttention::saves_dropout_mask(
        model_config(a, Device::CPU, DType::BF16), 2048));
    EXPECT_EQ(plan_stage_memory(a, cfg, 0).activations() -
                  plan_stage_memory(a0, cfg0, 0).activations(),
              24 * bits);
  }
  // Under a 600 MiB cap: 2 of the 16 sequences a call (the largest divisor of 16 whose
  // 2 x 256 MiB fit).
  setenv("MCPP_ATTENTION_BWD_WORKSPACE_MB", "600", 1);
  EXPECT_EQ(ws(xl, 1), 512 * MiB);
  unsetenv("MCPP_ATTENTION_BWD_WORKSPACE_MB");
  // The atomic backward: no dP, the f32 dQ accumulators (ours and cuDNN's) and row sums:
  // 16 sequences x 16 heads x 2048 rows x (2 x 128 x 4 + 4) bytes.
  setenv("MCPP_ATTENTION_DETERMINISTIC", "0", 1);
  EXPECT_EQ(ws(xl, 1), 16LL * 16 * 2048 * (2 * 128 * 4 + 4));
  unsetenv("MCPP_ATTENTION_DETERMINISTIC");
  // Context parallelism: the ring's diagonal step over the rank's 2 chunks (S / CP rows),
  // or one chunk where the steps run chunk by chunk; a2a: the whole sequence, heads / CP.
  const auto cp2 = with(xl, {"--context-parallel-size", "2"});
  EXPECT_EQ(ws(cp2, 2), 16 * 16 * 1024LL * 1024 * 2);
  setenv("MCPP_CP_FUSED_STEPS", "0", 1);
  EXPECT_EQ(ws(cp2, 2), 16 * 16 * 512LL * 512 * 2);
  unsetenv("MCPP_CP_FUSED_STEPS");
  EXPECT_EQ(ws(with(cp2, {"--cp-comm-type", "a2a"}), 2), 16 * 8 * 2048LL * 2048 * 2);
  // a2a+p2p at CP 4 as 2 x 2: the ring of two on heads / 2 (its diagonal over S / 2 rows);
  // as 4 x 1 it is a2a, as 1 x 4 the ring of four.
  const auto hier = [&](const char* g, const char* p) {
    return ws(with(xl, {"--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                        "--hierarchical-context-parallel-sizes", g, p}),
              4);
  };
  EXPECT_EQ(hier("2", "2"), 16 * 8 * 1024LL * 1024 * 2);
  EXPECT_EQ(hier("4", "1"), 16 * 4 * 2048LL * 2048 * 2);
  EXPECT_EQ(hier("1", "4"), 16 * 16 * 512LL * 512 * 2);
  // With dropout the own kernels run: the ring's block kernels keep no buffer, a2a's
  // whole-sequence flash attention the dS of its 8 heads (or, without the hand-over, one
  // bit per score).
  const auto cp2_drop = with(cp2, {"--attention-dropout", "0.1"});
  EXPECT_EQ(ws(cp2_drop, 2), 0);
  EXPECT_EQ(ws(with(cp2_drop, {"--cp-comm-type", "a2a"}), 2), ds / 2);
  setenv("MCPP_FLASH_DQ_FROM_DS", "0", 1);
  EXPECT_EQ(ws(with(cp2_drop, {"--cp-comm-type", "a2a"}), 2), 16 * 8 * 270336LL);
  unsetenv("MCPP_FLASH_DQ_FROM_DS");
  // --attention-backend: cuDNN's dP, the own flash kernel's dS, nothing for the CUDA-core
  // kernel.
  EXPECT_EQ(ws(with(xl, {"--attention-backend", "fused"}), 1), 2048 * MiB);
  EXPECT_EQ(ws(with(xl, {"--attention-backend", "flash"}), 1), ds);
  EXPECT_EQ(ws(with(xl, {"--attention-backend", "unfused"}), 1), 0);
  EXPECT_EQ(ws(with(llama, {"--attention-backend", "local"}), 1), 0);
  // The formula the op checks each cuDNN plan against (ops/types.h) is the plan's.
  EXPECT_EQ(ops::cudnn_attention_bwd_workspace_bytes(16, 32, 8, 2048, 64, int64_t(8192) << 20),
            4096 * MiB + 256 * MiB);
  EXPECT_EQ(ops::cudnn_attention_bwd_workspace_bytes(16, 16, 16, 2048, 128, int64_t(600) << 20),
            512 * MiB);
}

// Context parallelism's exchange buffers (cp_exchange_bytes): in units of the rank's qkv,
// [S/CP * B, QKVW/TP]; p2p 5 (+1.5 of cuDNN scratch with fused steps, +0.5 with chunk
// blocks), all_gather 2 CP + 1 (+ the scratch), a2a 6; part of the plan's total.
TEST(MemoryPlan, ContextParallelExchangeBuffers) {
  const auto base = with(base_argv(), {"--bf16", "--num-layers", "2", "--hidden-size", "256",
                                       "--num-attention-heads", "8", "--seq-length", "1024",
                                       "--max-position-embeddings", "1024",
                                       "--micro-batch-size", "2", "--attention-dropout", "0",
                                       "--context-parallel-size", "2"});
  auto plan = [](std::vector<std::string> argv, Device dev) {
    Args a = parse_and_validate(argv, 2);
    a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by,
                                            a.tensor_model_parallel_size);
    const auto cfg = model_config(a, dev, dev == Device::CUDA ? DType::BF16 : DType::F32);
    const StageMemory m = plan_stage_memory(a, cfg, 0);
    EXPECT_EQ(m.cp_exchange, cp_exchange_bytes(a, cfg));
    EXPECT_EQ(m.total(), m.weights_and_optimizer() + m.activations() + m.attention_workspace +
                             m.cp_exchange);
    return m.cp_exchange;
  };
  const int64_t unit_gpu = 512 * 2 * 768 * 2, unit_cpu = 512 * 2 * 768 * 4;  // QKVW 3 x 256
  EXPECT_EQ(plan(base, Device::CUDA), 13 * unit_gpu / 2);
  EXPECT_EQ(plan(base, Device::CPU), 5 * unit_cpu);
  setenv("MCPP_CP_FUSED_STEPS", "0", 1);
  EXPECT_EQ(plan(base, Device::CUDA), 11 * unit_gpu / 2);
  unsetenv("MCPP_CP_FUSED_STEPS");
  EXPECT_EQ(plan(with(base, {"--cp-comm-type", "all_gather"}), Device::CUDA),
            (2 * (2 * 2 + 1) + 3) * unit_gpu / 2);
  EXPECT_EQ(plan(with(base, {"--cp-comm-type", "a2a"}), Device::CPU), 6 * unit_cpu);
  // a2a+p2p: a2a's four gathered tensors beside the ring's five; a level of one is the
  // other exchange.
  const auto hier = with(base, {"--cp-comm-type", "a2a+p2p", "--context-parallel-size", "4",
                                "--hierarchical-context-parallel-sizes", "2", "2"});
  const int64_t unit4_cpu = unit_cpu / 2;  // S / 4 rows
  auto plan4 = [&](std::vector<std::string> argv) {
    Args a = parse_and_validate(argv, 4);
    a.padded_vocab_size = padded_vocab_size(*a.vocab_size, a.make_vocab_size_divisible_by,
                                            a.tensor_model_parallel_size);
    return cp_exchange_bytes(a, model_config(a, Device::CPU, DType::F32));
  };
  EXPECT_EQ(plan4(hier), 9 * unit4_cpu);
  EXPECT_EQ(plan4(with(hier, {"--hierarchical-context-parallel-sizes", "4", "1"})),
            6 * unit4_cpu);
  EXPECT_EQ(plan4(with(hier, {"--hierarchical-context-parallel-sizes", "1", "4"})),
            5 * unit4_cpu);
  EXPECT_EQ(plan(with(base, {"--context-parallel-size", "1"}), Device::CUDA), 0);
}

// The host side of the start-up check: what Linux says is available, and how many of this
// job's ranks share it, from each launcher's variables (the fewest Slurm names: lenient).
TEST(MemoryPlan, HostMemoryAndLocalRanks) {
  EXPECT_GT(host_memory_available(), int64_t(64) << 20);  // Linux CI and dev machines
  const char* vars[] = {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_TASKS_PER_NODE"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* e = std::getenv(v)) saved.push_back({v, e});
    unsetenv(v);
  }
  EXPECT_EQ(host_local_ranks(), 1);
  setenv("SLURM_TASKS_PER_NODE", "4(x2),3", 1);
  EXPECT_EQ(host_local_ranks(), 3);
  setenv("MPI_LOCALNRANKS", "6", 1);
  EXPECT_EQ(host_local_ranks(), 6);
  setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "8", 1);
  EXPECT_EQ(host_local_ranks(), 8);
  for (const char* v : vars) unsetenv(v);
  for (const auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}

}  // namespace memory_plan_test
