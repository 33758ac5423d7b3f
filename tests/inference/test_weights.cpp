// checkpoint::load_model_weights, the loader of `generate` and `convert`: the weights of
// a checkpoint equal the training model's after load_checkpoint (serial and one TP
// shard of a TP 1 checkpoint), with no gradient buffer; bad TP sizes are clear errors.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/weights.h"
#include "inference_test_util.h"

using namespace mcpp;

namespace weights_test {

std::string fresh_dir(const char* name) {
  auto d = std::filesystem::temp_directory_path() /
           (std::string("mcpp_weights_") + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(LoadModelWeights, EqualsTheTrainingModelsLoadWithoutGradients) {
  for (bool llama : {false, true}) {
    auto cfg = test::tiny_config(llama, DType::F32);
    model::GPTModel saved(cfg);
    test::perturb_norms(saved.params());
    const std::string dir = fresh_dir(llama ? "llama" : "gpt");
    checkpoint::TrainingState st;
    st.iteration = 3;
    checkpoint::save_checkpoint(dir, saved, nullptr, st);
    for (int64_t tp : {1, 2}) {
      for (int64_t rank = 0; rank < tp; ++rank) {
        // Reference: the training model at this TP coordinate, loaded the usual way.
        auto c = cfg;
        c.tp_size = tp, c.tp_rank = rank;
        model::GPTModel ref(c);
        checkpoint::load_checkpoint(dir, std::nullopt, ref, nullptr);
        checkpoint::WeightsOptions o;
        o.tp_rank = rank, o.tp_size = tp;
        auto w = checkpoint::load_model_weights(dir, std::nullopt, o);
        EXPECT_EQ(w.state.iteration, 3);
        EXPECT_EQ(w.config.tp_size, tp);
        EXPECT_FALSE(w.params.has_grads());
        ASSERT_EQ(w.params.infos().size(), ref.params().infos().size());
        for (size_t i = 0; i < ref.params().infos().size(); ++i) {
          const auto& name = ref.params().infos()[i].name;
          EXPECT_FALSE(w.params.grad(i).defined()) << name;
          Tensor a = w.params.param(name), b = ref.params().param(name);
          ASSERT_EQ(a.shape(), b.shape()) << name;
          for (int64_t e = 0; e < a.numel(); ++e)
            ASSERT_EQ(a.data<float>()[e], b.data<float>()[e]) << name << " " << e;
        }
      }
    }
    // 4 heads / 2 query groups do not split over 3 ranks.
    checkpoint::WeightsOptions bad;
    bad.tp_size = 3;
    EXPECT_THROW(checkpoint::load_model_weights(dir, std::nullopt, bad), Error);
    std::filesystem::remove_all(dir);
  }
}

TEST(LoadModelWeights, RestoresTheExpertBias) {
  // The router's expert bias is a persistent buffer (never optimised): generation and
  // conversion must route with the trained bias, not the zeros a fresh model starts from.
  auto cfg = test::tiny_config(true, DType::F32);
  cfg.add_bias_linear = false;
  cfg.moe.num_experts = 4, cfg.moe.topk = 2, cfg.moe.ffn_hidden_size = 16;
  cfg.moe.score = model::TransformerConfig::Moe::Score::Sigmoid, cfg.moe.expert_bias = true;
  model::GPTModel saved(cfg);
  const std::string name = "decoder.layers.0.mlp.router.expert_bias";
  ASSERT_TRUE(saved.params().has_buffer(name));
  Tensor bias = saved.params().buffer(name);
  const float want[4] = {0.25f, -0.5f, 0.0f, 1.5f};
  for (int e = 0; e < 4; ++e) bias.data<float>()[e] = want[e];
  const std::string dir = fresh_dir("expert_bias");
  checkpoint::TrainingState st;
  st.iteration = 2;
  checkpoint::save_checkpoint(dir, saved, nullptr, st);
  auto w = checkpoint::load_model_weights(dir, std::nullopt);
  ASSERT_TRUE(w.params.has_buffer(name));
  Tensor got = w.params.buffer(name);
  for (int e = 0; e < 4; ++e) EXPECT_EQ(got.data<float>()[e], want[e]) << e;
  std::filesystem::remove_all(dir);
}

}  // namespace weights_test
