// Hugging Face exchange of gpt-oss models (checkpoint/hf_gpt_oss.h) against the fixture of
// tests/golden/hf_gpt_oss (make_hf_gpt_oss.py: transformers' own GptOssForCausalLM with
// sinks, q/k/v/o biases, head dim 16 x 4 heads over hidden 32, sliding and full layers, YaRN,
// a biased router and biased experts with the clamped GLU, saved with save_pretrained, with
// its float64 logits):
//  * import reproduces transformers' logits, and the comparison fails when the gate/up
//    interleave, the sinks or the experts' output bias are wrong;
//  * export gives back the same tensors byte for byte and the config fields; a megatron.cpp
//    checkpoint round trip keeps them;
//  * MXFP4-quantised experts import as the values they encode; settings GptOssForCausalLM
//    cannot express are errors naming the flag.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "base/philox.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "ckpt_test_util.h"
#include "model/gpt_model.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;
using json = nlohmann::json;

namespace hf_gpt_oss_test {

std::string fixture() { return std::string(MCPP_SOURCE_DIR) + "/tests/golden/hf_gpt_oss"; }

model::TransformerConfig fixture_config() {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture()), 1);
  c.seq_length = 10;  // the reference batch's
  return c;
}

std::map<std::string, Tensor> fixture_tensors() {
  return ck::load_safetensors(fixture() + "/model.safetensors").tensors;
}

// Our logits for the reference tokens against transformers' (float64).
double logits_rel_err(model::GPTModel& m) {
  return hf_logits_rel_err(m, fixture() + "/reference.safetensors");
}

double rel_err_of(const std::map<std::string, Tensor>& t) {
  const auto c = fixture_config();
  model::GPTModel m(c);
  ck::from_hf_tensors(c, t, m.params());
  return logits_rel_err(m);
}

TEST(HfGptOss, ConfigFromTransformers5) {
  const auto c = fixture_config();
  EXPECT_TRUE(c.quick_geglu);
  EXPECT_FALSE(c.swiglu);
  EXPECT_EQ(c.glu_linear_offset, 1.0);
  ASSERT_TRUE(c.activation_func_clamp_value.has_value());
  EXPECT_EQ(*c.activation_func_clamp_value, 7.0);
  EXPECT_EQ(c.softmax_type, model::TransformerConfig::SoftmaxType::Learnable);
  EXPECT_TRUE(c.add_bias_linear);
  EXPECT_EQ(c.kv_channels, 16);
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.topk, 2);
  EXPECT_EQ(c.moe.ffn_hidden_size, 24);
  EXPECT_FALSE(c.moe.pre_softmax);
  EXPECT_EQ(c.window_left, 3);  // sliding_window 4: keys i - 3 .. i
  EXPECT_TRUE(c.is_window_layer(0));
  EXPECT_FALSE(c.is_window_layer(1));
  EXPECT_TRUE(c.yarn.on);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::GptOss);
}

// The independent check: transformers' GptOssForCausalLM logits (float64).
TEST(HfGptOss, ImportReproducesTransformersLogits) {
  const auto c = fixture_config();
  ck::check_hf_fits_files(fixture(), c);
  model::GPTModel m(c);
  ck::import_hf(fixture(), c, m.params());
  const double rel = logits_rel_err(m);
  std::printf("gpt_oss: max |ours - transformers| / max |logit| = %.3g\n", rel);
  EXPECT_LT(rel, 1e-5) << "relative max diff " << rel;
}

// The comparison can fail: a gate_up_proj read as [gate | up] halves instead of interleaved
// columns, sinks of zero, or the experts' output bias dropped all move the logits.
TEST(HfGptOss, LogitsCheckDetectsWrongLayouts) {
  {
    auto t = fixture_tensors();
    Tensor& gu = t.at("model.layers.1.mlp.experts.gate_up_proj");  // [E, H, 2F]
    const int64_t E = gu.size(0), H = gu.size(1), F2 = gu.size(2), F = F2 / 2;
    Tensor halves = gu.clone();
    const float* s = gu.data<float>();
    float* d = halves.data<float>();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < F; ++i) {
          d[(e * H + h) * F2 + i] = s[(e * H + h) * F2 + 2 * i];
          d[(e * H + h) * F2 + F + i] = s[(e * H + h) * F2 + 2 * i + 1];
        }
    gu = halves;
    const double rel = rel_err_of(t);
    std::printf("gate/up as halves: relative max diff %.3g\n", rel);
    EXPECT_GT(rel, 1e-3);
  }
  {
    auto t = fixture_tensors();
    std::memset(t.at("model.layers.0.self_attn.sinks").raw(), 0,
                t.at("model.layers.0.self_attn.sinks").nbytes());
    EXPECT_GT(rel_err_of(t), 1e-3);
  }
  {
    auto t = fixture_tensors();
    Tensor& b = t.at("model.layers.1.mlp.experts.down_proj_bias");
    std::memset(b.raw(), 0, b.nbytes());
    EXPECT_GT(rel_err_of(t), 1e-3);
  }
}

TEST(HfGptOss, ExportIsByteIdenticalAndKeepsConfig) {
  const auto c = fixture_config();
  model::GPTModel m(c);
  ck::import_hf(fixture(), c, m.params());
  const auto committed = fixture_tensors();
  const auto now = ck::to_hf_tensors(c, m.params(), DType::F32);
  ASSERT_EQ(now.size(), committed.size());
  for (const auto& [name, t] : committed) {
    ASSERT_TRUE(now.count(name)) << name;
    EXPECT_TRUE(same_bytes(now.at(name), t)) << name;
  }
  const json ref = ck::read_hf_config(fixture()), ours = ck::hf_config(c);
  for (const char* k :
       {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
        "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
        "max_position_embeddings", "rms_norm_eps", "num_local_experts",
        "num_experts_per_tok", "router_aux_loss_coef", "tie_word_embeddings", "sliding_window",
        "layer_types", "swiglu_limit", "attention_bias", "output_router_logits"})
    EXPECT_EQ(ours.value(k, json("absent")), ref.at(k)) << k;
  // YaRN: every field transformers wrote, and ours spells out the attention factor it implies
  // (0.1 ln(factor) + 1) and the mscale pair that gives it.
  for (const auto& [k, v] : ref.at("rope_parameters").items())
    EXPECT_EQ(ours.at("rope_parameters").value(k, json("absent")), v) << k;
  EXPECT_NEAR(ours.at("rope_parameters").at("attention_factor").get<double>(),
              0.1 * std::log(4.0) + 1.0, 1e-12);
}

// convert --from-hf, then --to-hf, through a megatron.cpp checkpoint: byte for byte.
TEST(HfGptOss, ThroughCheckpointRoundTrip) {
  const auto c = fixture_config();
  model::GPTModel m(c);
  ck::import_hf(fixture(), c, m.params());
  const std::string dir = scratch_dir();
  ck::TrainingState st;
  st.rng_seed = c.seed;
  ck::save_checkpoint(dir + "/ckpt", m, nullptr, st);
  auto w = ck::load_model_weights(dir + "/ckpt", std::nullopt);
  ck::export_hf(dir + "/hf", w.config, w.params);
  const auto back = ck::load_safetensors(dir + "/hf/model.safetensors").tensors;
  const auto committed = fixture_tensors();
  ASSERT_EQ(back.size(), committed.size());
  for (const auto& [name, t] : committed) EXPECT_TRUE(same_bytes(back.at(name), t)) << name;
  auto again = ck::model_config_from_hf(ck::read_hf_config(dir + "/hf"), 1);
  again.seq_length = c.seq_length;
  EXPECT_EQ(ck::model_config_json(again), ck::model_config_json(c));
}

// The released checkpoints' MXFP4 experts: a blocks/scales pair imports as the tensor it
// encodes. The expected values are written here from the format's definition (blocks of 32
// FP4 E2M1 values along the input dim, two a byte low nibble first, an E8M0 scale 2^(s-127),
// then [E, R, C] -> [E, C, R] as transformers' convert_moe_packed_tensors).
TEST(HfGptOss, Mxfp4ExpertsImportAsTheirValues) {
  const auto c = fixture_config();
  const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  const int64_t E = 4, R = 48, H = 32;  // gate_up_proj: [E, H, 2F] from [E, 2F, H]
  Tensor blocks = Tensor::empty({E, R, 1, 16}, DType::U8), scales = Tensor::empty({E, R, 1},
                                                                                  DType::U8);
  for (int64_t i = 0; i < blocks.numel(); ++i)
    blocks.data<uint8_t>()[i] = uint8_t(Philox::uniform(5, 1, uint64_t(i)) * 256.0f);
  for (int64_t i = 0; i < scales.numel(); ++i)
    scales.data<uint8_t>()[i] = uint8_t(122 + int(Philox::uniform(5, 2, uint64_t(i)) * 8.0f));
  Tensor want = Tensor::empty({E, H, R}, DType::F32);
  for (int64_t e = 0; e < E; ++e)
    for (int64_t r = 0; r < R; ++r)
      for (int64_t h = 0; h < H; ++h) {
        const uint8_t byte = blocks.data<uint8_t>()[(e * R + r) * 16 + h / 2];
        const int nib = h % 2 == 0 ? byte & 0x0F : byte >> 4;
        const int x = int(scales.data<uint8_t>()[e * R + r]) - 127;
        want.data<float>()[(e * H + h) * R + r] = fp4[nib] * std::pow(2.0f, float(x));
      }
  const std::string n = "model.layers.0.mlp.experts.gate_up_proj";
  auto plain = fixture_tensors(), mx = fixture_tensors();
  plain[n] = want;
  mx.erase(n);
  mx[n + "_blocks"] = blocks, mx[n + "_scales"] = scales;
  model::GPTModel a(c), b(c);
  ck::from_hf_tensors(c, plain, a.params());
  ck::from_hf_tensors(c, mx, b.params());
  EXPECT_TRUE(same_bytes(a.params().flat_params(), b.params().flat_params()));
  // A half pair, or both forms at once, is an error naming the tensor.
  auto half = mx;
  half.erase(n + "_scales");
  EXPECT_NE(error_of([&] { ck::from_hf_tensors(c, half, b.params()); })
                .find("gate_up_proj_blocks (MXFP4) has no model.layers.0.mlp.experts."
                      "gate_up_proj_scales"),
            std::string::npos);
  auto both = mx;
  both[n] = want;
  EXPECT_NE(error_of([&] { ck::from_hf_tensors(c, both, b.params()); })
                .find("is given both dequantised and as MXFP4"),
            std::string::npos);
}

TEST(HfGptOss, WrongExpertCountNamesTheTensor) {
  const auto c = fixture_config();
  auto t = fixture_tensors();
  t["model.layers.1.mlp.experts.down_proj"] = Tensor::zeros({3, 24, 32}, DType::F32);
  model::GPTModel m(c);
  const std::string e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
  EXPECT_NE(e.find("model.layers.1.mlp.experts.down_proj has shape [3, 24, 32], expected 4 "
                   "experts first"),
            std::string::npos)
      << e;
}

// What GptOssForCausalLM cannot express is named, never exported as something else.
TEST(HfGptOss, SettingsItCannotExpressAreErrors) {
  struct Case {
    const char* want;
    std::function<void(model::TransformerConfig&)> change;
  };
  const std::vector<Case> cases = {
      {"--glu-linear-offset 1", [](auto& c) { c.glu_linear_offset = 0.5; }},
      {"--glu-linear-offset 1", [](auto& c) { c.activation_func_clamp_value.reset(); }},
      {"sink", [](auto& c) {
         c.softmax_type = model::TransformerConfig::SoftmaxType::Vanilla;
       }},
      {"shared experts", [](auto& c) { c.moe.shared_ffn_hidden_size = 8; }},
      {"the router", [](auto& c) { c.moe.pre_softmax = true; }},
      {"token dropping", [](auto& c) { c.moe.capacity_factor = 1.0; }},
  };
  for (const auto& k : cases) {
    auto c = fixture_config();
    k.change(c);
    const std::string e = error_of([&] { (void)ck::hf_config(c); });
    EXPECT_NE(e.find("GptOssForCausalLM"), std::string::npos) << k.want << ": " << e;
    EXPECT_NE(e.find(k.want), std::string::npos) << e;
  }
}

}  // namespace hf_gpt_oss_test
