// Sliding-window attention (--window-size L,0, --window-attn-skip-freq) in generation: the
// cached decode of a windowed model equals the training forward of the same model (whose
// window layers mask by key_start) at every step, far past the window -- the prefill longer
// than the window, then one token a step -- for a window in every layer and in every
// other layer only, with GQA, with learnable sinks beside the window (gpt-oss's layers),
// with multi-latent attention, and for two sequences decoded together; and it differs from
// the same weights without the window (so the window is applied, not merely allowed).
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "inference/generator.h"
#include "inference_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace generator_window_test {

using ST = model::TransformerConfig::SoftmaxType;

std::vector<double> row(const Tensor& logits) {
  const int64_t V = logits.size(-1);
  return std::vector<double>(logits.data<double>(), logits.data<double>() + V);
}

model::TransformerConfig windowed(bool every_layer, bool sinks, bool mla) {
  auto cfg = tiny_config(true, DType::F64);
  if (mla) to_mla(cfg);
  cfg.window_left = 3;  // the query at q sees q - 3 .. q
  if (!every_layer) cfg.window_pattern = {1, 0};
  if (sinks) cfg.softmax_type = ST::Learnable;
  return cfg;
}

TEST(GenerateWindow, CachedMatchesFullForwardPastTheWindow) {
  for (const auto& [every, sinks, mla] :
       {std::tuple{true, false, false}, {false, false, false}, {false, true, false},
        {true, false, true}}) {
    SCOPED_TRACE(::testing::Message() << "every layer " << every << " sinks " << sinks
                                      << " mla " << mla);
    const auto cfg = windowed(every, sinks, mla);
    auto plain_cfg = cfg;
    plain_cfg.window_left = -1, plain_cfg.window_pattern.clear();
    model::GPTModel m(cfg), plain(plain_cfg);
    perturb_norms(m.params());
    perturb_norms(plain.params());
    for (const auto& p : m.params().infos())  // sinks of either sign and size
      if (p.name.ends_with("softmax_offset")) {
        Tensor w = m.params().param(p.name), v = plain.params().param(p.name);
        for (int64_t h = 0; h < w.numel(); ++h)
          w.data<double>()[h] = v.data<double>()[h] = 1.5 * double(h) - 2.0;
      }
    inference::Generator gen(m.params(), cfg);
    inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
    std::vector<std::vector<int64_t>> seq = {{3, 14, 15, 9, 2, 6, 5}};  // 7 > L + 1 tokens
    const Tensor* logits = &gen.forward(Tensor::from(seq[0], {1, 7}), cache);
    double off_plain = 0;
    for (int64_t step = 0; step < 14; ++step) {
      const auto got = row(*logits);
      ASSERT_LE(rel_diff(got, full_forward_last_logits(m, seq)[0]), 1e-12) << "step " << step;
      off_plain = std::max(off_plain, rel_diff(got, full_forward_last_logits(plain, seq)[0]));
      seq[0].push_back(int64_t(std::max_element(got.begin(), got.end()) - got.begin()));
      logits = &gen.forward(Tensor::from(std::vector<int64_t>{seq[0].back()}, {1, 1}), cache);
    }
    EXPECT_GT(off_plain, 1e-4);
  }
}

// Two sequences decoded in one batch, a window in every other layer.
TEST(GenerateWindow, BatchedGreedyDecodeMatchesFullForward) {
  const auto cfg = windowed(false, false, false);
  model::GPTModel m(cfg);
  perturb_norms(m.params());
  expect_greedy_decode_matches_full_forward(m, cfg);
}

}  // namespace generator_window_test
