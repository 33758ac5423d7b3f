// Batched generation on CUDA against the CPU: the same tiny f32 model (GPT-2 and Llama
// shapes) with a batch of prompts of different lengths (each prefilled into its cache
// slot, then decoded together at different positions, sequences leaving as they stop).
// Every step's logits agree with the CPU Generator's within f32 tolerance, and greedy
// tokens are equal, also against the CPU training model's full-recompute forward; and
// weights loaded from a checkpoint straight to the GPU (checkpoint::load_model_weights,
// the `generate --device cuda` path) generate the CPU's tokens. The logits also with a
// sliding window in one layer, past the window.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include "../inference/inference_test_util.h"
#include "checkpoint/weights.h"
#include "gpu_test_util.h"
#include "inference/generator.h"
#include "model/stage.h"

using namespace mcpp;
using namespace mcpp::test;

namespace generate_gpu_test {

// The CPU model's weights in a weights-only store on the GPU (the layout of the CPU one).
model::ParamStore to_gpu_store(const model::TransformerConfig& c, const model::ParamStore& host) {
  model::ParamStore ps;
  for (auto& p : model::Stage::parameters(c, model::normalized_part(c, {}))) ps.add(p);
  ps.allocate_weights(DType::F32, Device::CUDA, 0, 1, c.param_align);
  EXPECT_EQ(ps.total_numel(), host.total_numel());
  ops::copy(const_cast<model::ParamStore&>(host).flat_params(), ps.flat_params(), GS());
  gpu::synchronize(GS());
  return ps;
}

std::vector<double> row(const Tensor& logits, int64_t r) {
  const int64_t V = logits.size(-1);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) out[size_t(v)] = double(logits.data<float>()[r * V + v]);
  return out;
}

Tensor as_tokens(const std::vector<int32_t>& ids) {
  Tensor t = Tensor::empty({1, int64_t(ids.size())}, DType::I64);
  for (size_t i = 0; i < ids.size(); ++i) t.data<int64_t>()[i] = ids[i];
  return t;
}

int64_t argmax(const std::vector<double>& x) {
  return int64_t(std::max_element(x.begin(), x.end()) - x.begin());
}

const std::vector<std::vector<int32_t>> kPrompts = {
    {3, 14, 15}, {9, 26, 5, 35, 8, 9, 7, 9, 3}, {2}, {38, 4, 6, 26, 43}};

// The tiny model (tiny_config, f32, norms perturbed) on the CPU, and its weights on the GPU.
struct TinyOnGpu {
  explicit TinyOnGpu(bool llama, int64_t window = -1)
      : cfg(windowed(tiny_config(llama, DType::F32), window)), m(cfg), gcfg(cfg) {
    perturb_norms(m.params());
    gcfg.device = Device::CUDA;
    gparams = to_gpu_store(gcfg, m.params());
  }
  // A sliding window of `window` keys back in the first layer (-1: none).
  static model::TransformerConfig windowed(model::TransformerConfig c, int64_t window) {
    if (window >= 0) c.window_left = window, c.window_pattern = {1, 0};
    return c;
  }
  model::TransformerConfig cfg;
  model::GPTModel m;
  model::TransformerConfig gcfg;
  model::ParamStore gparams;
};

class GenerateGpu : public ::testing::TestWithParam<bool> {};

// The batch's logits, step by step; with a sliding window (TinyOnGpu::windowed: 3 keys back
// in the first layer) past it, in the prefills of the longer prompts and in the decode.
void expect_batch_logits_match_cpu(bool llama, int64_t window) {
  TinyOnGpu t(llama, window);
  const auto &cfg = t.cfg, &gcfg = t.gcfg;
  model::GPTModel& m = t.m;
  model::ParamStore& gparams = t.gparams;
  inference::Generator cpu_gen(m.params(), cfg), gpu_gen(gparams, gcfg);
  const int64_t B = int64_t(kPrompts.size()), steps = 10;
  inference::KVCache cc(cfg, 24, B), gc(gcfg, 24, B, Device::CUDA);
  std::vector<int64_t> next(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    auto want = row(cpu_gen.prefill(as_tokens(kPrompts[size_t(b)]), cc, b), 0);
    auto got = row(gpu_gen.prefill(as_tokens(kPrompts[size_t(b)]), gc, b), 0);
    EXPECT_LE(rel_diff(got, want), 1e-5) << "prefill of prompt " << b;
    next[size_t(b)] = argmax(want);
  }
  for (int64_t step = 0; step < steps; ++step) {
    Tensor t = Tensor::empty({B, 1}, DType::I64);
    for (int64_t b = 0; b < B; ++b) t.data<int64_t>()[b] = next[size_t(b)];
    const Tensor want = cpu_gen.forward(t, cc).clone();
    const Tensor& got = gpu_gen.forward(t, gc);
    for (int64_t b = 0; b < B; ++b) {
      auto w = row(want, b), g = row(got, b);
      ASSERT_LE(rel_diff(g, w), 1e-5) << "step " << step << " prompt " << b;
      next[size_t(b)] = argmax(w);
    }
  }
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(gc.length(b), cc.length(b));
}

TEST_P(GenerateGpu, BatchLogitsMatchCpu) {
  MCPP_REQUIRE_GPU();
  expect_batch_logits_match_cpu(GetParam(), -1);
}

TEST_P(GenerateGpu, BatchLogitsMatchCpuPastASlidingWindow) {
  MCPP_REQUIRE_GPU();
  expect_batch_logits_match_cpu(GetParam(), 3);
}

TEST_P(GenerateGpu, GreedyBatchEqualsCpuAndFullRecompute) {
  MCPP_REQUIRE_GPU();
  TinyOnGpu t(GetParam());
  const auto &cfg = t.cfg, &gcfg = t.gcfg;
  model::GPTModel& m = t.m;
  model::ParamStore& gparams = t.gparams;
  inference::Generator cpu_gen(m.params(), cfg), gpu_gen(gparams, gcfg);
  inference::GenerateOptions o;
  o.tokens_to_generate = 12;
  o.sampling.greedy = true;
  o.vocab_size = 50;
  inference::KVCache one(cfg, cfg.max_position_embeddings, 1);
  // The second prompt's fourth token also stops: a sequence leaves the batch mid-way.
  o.stop_tokens = {inference::generate(cpu_gen, one, kPrompts[1], o).tokens[3]};
  std::vector<std::span<const int32_t>> spans(kPrompts.begin(), kPrompts.end());
  inference::KVCache cc(cfg, cfg.max_position_embeddings, 4);
  inference::KVCache gc(gcfg, cfg.max_position_embeddings, 3, Device::CUDA);
  auto want = inference::generate_batch(cpu_gen, cc, spans, o);
  // On the GPU in two batches (3 + 1): sampling streams follow the prompt's index.
  auto got = inference::generate_batch(gpu_gen, gc, {spans[0], spans[1], spans[2]}, o, 0);
  got.push_back(inference::generate_batch(gpu_gen, gc, {spans[3]}, o, 3)[0]);
  EXPECT_EQ(want[1].stop_reason, "stop_token");
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << "prompt " << i;
    EXPECT_EQ(got[i].stop_reason, want[i].stop_reason) << "prompt " << i;
    std::vector<int64_t> seq(kPrompts[i].begin(), kPrompts[i].end());
    for (int32_t id : got[i].tokens) {
      auto full = full_forward_last_logits(m, {seq})[0];
      full.resize(50);
      ASSERT_EQ(id, argmax(full)) << "prompt " << i << " after " << seq.size() << " tokens";
      seq.push_back(id);
    }
  }
}

// The path of `megatron generate --device cuda`: a checkpoint's weights loaded straight
// to the GPU by checkpoint::load_model_weights (no gradients) generate the CPU's tokens.
TEST_P(GenerateGpu, WeightsLoadedToTheGpuGenerateTheCpuTokens) {
  MCPP_REQUIRE_GPU();
  const bool llama = GetParam();
  auto cfg = tiny_config(llama, DType::F32);
  model::GPTModel m(cfg);
  perturb_norms(m.params());
  const auto dir = std::filesystem::temp_directory_path() /
                   ("mcpp_gen_gpu_" + std::to_string(::getpid()) + (llama ? "_l" : "_g"));
  std::filesystem::remove_all(dir);
  checkpoint::save_checkpoint(dir.string(), m, nullptr, checkpoint::TrainingState{});
  checkpoint::WeightsOptions o;
  o.device = Device::CUDA;
  auto w = checkpoint::load_model_weights(dir.string(), std::nullopt, o);
  std::filesystem::remove_all(dir);
  EXPECT_FALSE(w.params.has_grads());
  EXPECT_EQ(w.params.device(), Device::CUDA);
  inference::Generator cpu_gen(m.params(), cfg), gpu_gen(w.params, w.config);
  inference::GenerateOptions go;
  go.tokens_to_generate = 10;
  go.sampling.greedy = true;
  std::vector<std::span<const int32_t>> spans(kPrompts.begin(), kPrompts.end());
  inference::KVCache cc(cfg, 24, 4), gc(w.config, 24, 4, Device::CUDA);
  auto want = inference::generate_batch(cpu_gen, cc, spans, go);
  auto got = inference::generate_batch(gpu_gen, gc, spans, go);
  for (size_t i = 0; i < spans.size(); ++i) EXPECT_EQ(got[i].tokens, want[i].tokens) << i;
}

// The server's pipelined decode on the GPU: Llama's steps replay a CUDA graph, queued, each
// row's token copied on the device from the step before; GPT-2's run eagerly (learned
// positions: no graphs), kFromLastStep read on the host. The ids of steps run one at a time.
TEST_P(GenerateGpu, PipelinedStepsEqualStepsOneAtATime) {
  MCPP_REQUIRE_GPU();
  TinyOnGpu t(GetParam());
  const auto &cfg = t.cfg, &gcfg = t.gcfg;
  model::GPTModel& m = t.m;
  model::ParamStore& gparams = t.gparams;
  inference::Generator ref(gparams, gcfg), pip(gparams, gcfg);
  inference::KVCache rc(gcfg, cfg.max_position_embeddings, 4, Device::CUDA);
  inference::KVCache pc(gcfg, cfg.max_position_embeddings, 4, Device::CUDA);
  check_pipelined_greedy(ref, rc, pip, pc, 50);
}

INSTANTIATE_TEST_SUITE_P(Families, GenerateGpu, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? "Llama" : "GPT2"; });

}  // namespace generate_gpu_test
