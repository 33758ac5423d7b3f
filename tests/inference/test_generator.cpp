// The key oracle of generation: greedy decoding with the KV cache produces exactly the
// tokens of argmax decoding that recomputes the training model's full forward every step,
// and the cached logits equal the full-forward logits, for both model families and both
// CPU dtypes (and Llama with --add-qkv-bias); batched lock-step decoding and the prefill's
// all-position logits too.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include "inference/generator.h"
#include "inference_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace generator_test {

struct Case {
  bool llama;
  DType dt;
  bool qkv_bias = false;  // Llama + --add-qkv-bias (Qwen2): the bias in the folded QKV GEMV
  bool mla = false;       // Llama + multi-latent attention (to_mla)
  bool interleaved = false;  // Llama + --rotary-interleaved
  bool nope = false;         // Llama + --no-rope-freq 2: layer 2 without RoPE
};

class CachedVsFull : public ::testing::TestWithParam<Case> {};

std::vector<double> row(const Tensor& logits, int64_t r) {
  const int64_t V = logits.size(-1);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v)
    out[size_t(v)] = logits.dtype() == DType::F64 ? logits.data<double>()[r * V + v]
                                                  : double(logits.data<float>()[r * V + v]);
  return out;
}

int64_t argmax(const std::vector<double>& x) {
  return int64_t(std::max_element(x.begin(), x.end()) - x.begin());
}

double tol(DType dt) { return dt == DType::F64 ? 1e-12 : 1e-5; }

TEST_P(CachedVsFull, GreedyTokensAndLogitsMatchFullRecompute) {
  const auto [llama, dt, qkv_bias, mla, interleaved, nope] = GetParam();
  auto cfg = tiny_config(llama, dt);
  if (mla) to_mla(cfg);
  cfg.rotary_interleaved = interleaved;
  if (nope) cfg.no_rope_pattern = {0, 1};
  cfg.add_qkv_bias = qkv_bias;
  model::GPTModel m(cfg);
  perturb_norms(m.params());
  inference::Generator gen(m.params(), cfg);
  const int64_t B = 2, P = 5, steps = 20;  // 25 of the 32 positions
  inference::KVCache cache(cfg, cfg.max_position_embeddings, B);
  std::vector<std::vector<int64_t>> seqs(B);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < P; ++s)
      seqs[size_t(b)].push_back(Philox::u32(9, uint64_t(b), uint64_t(s)) % 60);

  Tensor tokens = Tensor::empty({B, P}, DType::I64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < P; ++s) tokens.data<int64_t>()[b * P + s] = seqs[size_t(b)][size_t(s)];
  const Tensor* logits = &gen.forward(tokens, cache);
  for (int64_t step = 0; step < steps; ++step) {
    auto want = full_forward_last_logits(m, seqs);
    Tensor next = Tensor::empty({B, 1}, DType::I64);
    for (int64_t b = 0; b < B; ++b) {
      auto got = row(*logits, b);
      ASSERT_LE(rel_diff(got, want[size_t(b)]), tol(dt)) << "step " << step << " seq " << b;
      const int64_t id = argmax(got);
      ASSERT_EQ(id, argmax(want[size_t(b)])) << "step " << step << " seq " << b;
      seqs[size_t(b)].push_back(id);
      next.data<int64_t>()[b] = id;
    }
    logits = &gen.forward(next, cache);
  }
  EXPECT_EQ(cache.length(), P + steps);
}

TEST_P(CachedVsFull, PrefillAllPositionsAndChunkedPrefill) {
  const auto [llama, dt, qkv_bias, mla, interleaved, nope] = GetParam();
  auto cfg = tiny_config(llama, dt);
  if (mla) to_mla(cfg);
  cfg.rotary_interleaved = interleaved;
  if (nope) cfg.no_rope_pattern = {0, 1};
  cfg.add_qkv_bias = qkv_bias;
  model::GPTModel m(cfg);
  perturb_norms(m.params());
  inference::Generator gen(m.params(), cfg);
  const int64_t S = 12;
  std::vector<int64_t> seq;
  for (int64_t s = 0; s < S; ++s) seq.push_back(Philox::u32(4, 0, uint64_t(s)) % 60);
  // All positions of a one-shot prefill vs the full forward's logits at each position.
  inference::KVCache cache(cfg, 16, 1);
  Tensor t = Tensor::from(seq, {1, S});
  const Tensor all = gen.forward(t, cache, /*all_positions=*/true).clone();
  ASSERT_EQ(all.shape(), (Shape{S, 1, cfg.padded_vocab_size}));
  for (int64_t s = 1; s <= S; ++s) {
    std::vector<int64_t> prefix(seq.begin(), seq.begin() + s);
    auto want = full_forward_last_logits(m, {prefix});
    EXPECT_LE(rel_diff(row(all, s - 1), want[0]), tol(dt)) << "position " << s - 1;
  }
  // The same sequence prefilled in chunks of 5, 1 and 6 ends at the same logits.
  inference::KVCache c2(cfg, 16, 1);
  const Tensor* last = nullptr;
  for (auto [a, n] : {std::pair<int64_t, int64_t>{0, 5}, {5, 1}, {6, 6}}) {
    std::vector<int64_t> part(seq.begin() + a, seq.begin() + a + n);
    last = &gen.forward(Tensor::from(part, {1, n}), c2);
  }
  EXPECT_LE(rel_diff(row(*last, 0), row(all, S - 1)), tol(dt));
}

TEST_P(CachedVsFull, GenerateGreedyEqualsRecompute) {
  const auto [llama, dt, qkv_bias, mla, interleaved, nope] = GetParam();
  auto cfg = tiny_config(llama, dt);
  if (mla) to_mla(cfg);
  cfg.rotary_interleaved = interleaved;
  if (nope) cfg.no_rope_pattern = {0, 1};
  cfg.add_qkv_bias = qkv_bias;
  model::GPTModel m(cfg);
  perturb_norms(m.params());
  inference::Generator gen(m.params(), cfg);
  inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
  std::vector<int32_t> prompt = {3, 14, 15, 9, 26, 5, 35};
  inference::GenerateOptions o;
  o.tokens_to_generate = 16;
  o.sampling.greedy = true;
  o.vocab_size = 50;  // columns 50..63 are padding: never chosen
  std::vector<int32_t> streamed;
  auto r =
      inference::generate(gen, cache, prompt, o, 0, [&](int32_t id) { streamed.push_back(id); });
  EXPECT_EQ(r.tokens, streamed);
  EXPECT_EQ(r.stop_reason, "max_tokens");
  ASSERT_EQ(r.tokens.size(), 16u);
  EXPECT_EQ(r.decode_steps, 15);
  std::vector<int64_t> seq(prompt.begin(), prompt.end());
  for (int32_t id : r.tokens) {
    auto want = full_forward_last_logits(m, {seq})[0];
    want.resize(50);
    EXPECT_EQ(id, argmax(want));
    seq.push_back(id);
  }
  // Running again reuses the cache and gives the same tokens.
  auto r2 = inference::generate(gen, cache, prompt, o);
  EXPECT_EQ(r2.tokens, r.tokens);
}

INSTANTIATE_TEST_SUITE_P(Families, CachedVsFull,
                         ::testing::Values(Case{false, DType::F64}, Case{false, DType::F32},
                                           Case{true, DType::F64}, Case{true, DType::F32},
                                           Case{true, DType::F32, true},
                                           Case{true, DType::F64, false, true},
                                           Case{true, DType::F32, false, true},
                                           Case{true, DType::F64, false, false, true},
                                           Case{true, DType::F64, false, false, false, true},
                                           Case{true, DType::F32, false, false, false, true}),
                         [](const auto& i) {
                           return std::string(i.param.llama ? "Llama" : "GPT2") +
                                  (i.param.qkv_bias ? "QkvBias" : "") +
                                  (i.param.mla ? "Mla" : "") +
                                  (i.param.interleaved ? "Interleaved" : "") +
                                  (i.param.nope ? "NoPE" : "") + "_" +
                                  std::string(dtype_name(i.param.dt));
                         });

// Llama 3.x RoPE scaling and position interpolation reach generation: the cached decode
// (prefill, then one token a step through rope_attention_decode) equals the training forward
// of the scaled (or interpolated) model at every step, and differs from the plain model's. An
// original context of 16 puts the 4 rotary pairs (wavelengths 6.3 to 6283) in the smoothed
// and the divided regions.
TEST(Generate, RopeScalingCachedMatchesFullForward) {
  // Llama 3.x scaling, linear position interpolation (a fractional factor, as a Hugging Face
  // "linear" config may give), both together, and YaRN (its concentration factor too).
  for (const auto& [scaled, interpolation, yarn] :
       {std::tuple{true, 1.0, false}, {false, 2.5, false}, {true, 2.5, false},
        {false, 1.0, true}}) {
    SCOPED_TRACE(::testing::Message() << "scaled " << scaled << " interpolation " << interpolation
                                      << " yarn " << yarn);
    auto cfg = tiny_config(true, DType::F64);
    cfg.rope_scaling = scaled, cfg.rope_scaling_factor = 4, cfg.rope_original_max_positions = 16;
    cfg.seq_len_interpolation_factor = interpolation;
    cfg.yarn.on = yarn, cfg.yarn.factor = 4, cfg.yarn.original_max_positions = 16;
    auto plain_cfg = cfg;
    plain_cfg.rope_scaling = false, plain_cfg.seq_len_interpolation_factor = 1;
    plain_cfg.yarn.on = false;
    model::GPTModel m(cfg), plain(plain_cfg);
    perturb_norms(m.params());
    perturb_norms(plain.params());  // the same weights (the same seed, the same perturbation)
    ASSERT_EQ(std::memcmp(m.params().flat_params().raw(), plain.params().flat_params().raw(),
                          m.params().flat_params().nbytes()),
              0);
    inference::Generator gen(m.params(), cfg);
    inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
    std::vector<std::vector<int64_t>> seq = {{3, 14, 15, 9, 2}};
    Tensor tokens = Tensor::from(seq[0], {1, 5});
    const Tensor* logits = &gen.forward(tokens, cache);
    double off_plain = 0;
    for (int64_t step = 0; step < 20; ++step) {
      const auto got = row(*logits, 0);
      ASSERT_LE(rel_diff(got, full_forward_last_logits(m, seq)[0]), 1e-12) << "step " << step;
      off_plain = std::max(off_plain, rel_diff(got, full_forward_last_logits(plain, seq)[0]));
      seq[0].push_back(argmax(got));
      Tensor next = Tensor::from(std::vector<int64_t>{seq[0].back()}, {1, 1});
      logits = &gen.forward(next, cache);
    }
    EXPECT_GT(off_plain, 1e-3) << "the scaling should change the logits";
  }
}

TEST(Generate, StopsAtEodStopTokenAndMaxPositions) {
  auto cfg = tiny_config(true, DType::F64);
  model::GPTModel m(cfg);
  inference::Generator gen(m.params(), cfg);
  inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
  std::vector<int32_t> prompt = {1, 2, 3};
  inference::GenerateOptions o;
  o.sampling.greedy = true;
  o.tokens_to_generate = 4;
  auto base = inference::generate(gen, cache, prompt, o);
  ASSERT_EQ(base.tokens.size(), 4u);
  // The second greedy token as EOD, then as a stop token: generation ends there.
  o.eod = base.tokens[1];
  auto r = inference::generate(gen, cache, prompt, o);
  EXPECT_EQ(r.stop_reason, "eod");
  EXPECT_EQ(r.tokens.size(), 2u);
  o.eod = -1;
  o.stop_tokens = {base.tokens[1]};
  r = inference::generate(gen, cache, prompt, o);
  EXPECT_EQ(r.stop_reason, "stop_token");
  EXPECT_EQ(r.tokens.size(), 2u);
  // 32 positions: a 3-token prompt can get 30 new tokens (the last needs no forward).
  o.stop_tokens.clear();
  o.tokens_to_generate = 100;
  r = inference::generate(gen, cache, prompt, o);
  EXPECT_EQ(r.stop_reason, "max_positions");
  EXPECT_EQ(r.tokens.size(), 30u);
}

TEST(Generate, RejectsBadPrompts) {
  auto cfg = tiny_config(false, DType::F32);
  model::GPTModel m(cfg);
  inference::Generator gen(m.params(), cfg);
  inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
  inference::GenerateOptions o;
  std::vector<int32_t> too_long(33, 1), empty, bad_id = {1, 64};
  EXPECT_THROW(inference::generate(gen, cache, too_long, o), Error);
  EXPECT_THROW(inference::generate(gen, cache, empty, o), Error);
  EXPECT_THROW(inference::generate(gen, cache, bad_id, o), Error);
  o.sampling.top_k = 5, o.sampling.top_p = 0.9;
  std::vector<int32_t> ok = {1, 2};
  EXPECT_THROW(inference::generate(gen, cache, ok, o), Error);
}

}  // namespace generator_test
