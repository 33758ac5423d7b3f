// Attention sinks (--softmax-type) in generation: the cached decode (a prefill, then one token
// a step through rope_attention_decode, whose dims carry the layer's sinks) equals the training
// forward of the same model at every step, for the learnable sinks (perturbed away from their
// initialisation) and off-by-one, with GQA and with multi-latent attention; and it differs
// from the vanilla model with the same weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <tuple>

#include "inference/generator.h"
#include "inference_test_util.h"

using namespace mcpp;
using namespace mcpp::test;

namespace generator_sink_test {

using ST = model::TransformerConfig::SoftmaxType;

std::vector<double> last_row(const Tensor& logits) {
  const int64_t V = logits.size(-1);
  std::vector<double> out(static_cast<size_t>(V));
  for (int64_t v = 0; v < V; ++v) out[size_t(v)] = logits.data<double>()[v];
  return out;
}

TEST(GenerateSink, CachedMatchesFullForward) {
  for (const auto& [type, mla] :
       {std::tuple{ST::Learnable, false}, {ST::OffByOne, false}, {ST::Learnable, true}}) {
    SCOPED_TRACE(::testing::Message() << "type " << model::softmax_type_name(type) << " mla "
                                      << mla);
    auto cfg = tiny_config(true, DType::F64);
    if (mla) to_mla(cfg);
    cfg.softmax_type = type;
    auto vanilla_cfg = cfg;
    vanilla_cfg.softmax_type = ST::Vanilla;
    model::GPTModel m(cfg), vanilla(vanilla_cfg);
    perturb_norms(m.params());
    perturb_norms(vanilla.params());
    for (const auto& p : m.params().infos())  // sinks of either sign and size
      if (p.name.ends_with("softmax_offset")) {
        Tensor w = m.params().param(p.name);
        for (int64_t h = 0; h < w.numel(); ++h) w.data<double>()[h] = 1.5 * double(h) - 2.0;
      }
    inference::Generator gen(m.params(), cfg);
    inference::KVCache cache(cfg, cfg.max_position_embeddings, 1);
    std::vector<std::vector<int64_t>> seq = {{3, 14, 15, 9, 2}};
    const Tensor* logits = &gen.forward(Tensor::from(seq[0], {1, 5}), cache);
    double off_vanilla = 0;
    for (int64_t step = 0; step < 12; ++step) {
      const auto got = last_row(*logits);
      ASSERT_LE(rel_diff(got, full_forward_last_logits(m, seq)[0]), 1e-12) << "step " << step;
      off_vanilla = std::max(off_vanilla, rel_diff(got, full_forward_last_logits(vanilla, seq)[0]));
      seq[0].push_back(int64_t(std::max_element(got.begin(), got.end()) - got.begin()));
      logits = &gen.forward(Tensor::from(std::vector<int64_t>{seq[0].back()}, {1, 1}), cache);
    }
    EXPECT_GT(off_vanilla, 1e-4);
  }
}

}  // namespace generator_sink_test
