// Hugging Face exchange of mixture-of-experts models (checkpoint/hf_moe.h) against the
// fixtures of tests/golden/hf_moe (make_hf_moe.py: transformers' own MixtralForCausalLM and
// Qwen3MoeForCausalLM, saved with save_pretrained, with their float64 logits):
//  * import reproduces transformers' logits; export gives back the same tensors byte for
//    byte and the same config fields; a checkpoint round trip (convert) keeps them;
//  * transformers 5's fused expert layout imports to the same weights;
//  * an unmapped tensor, a missing expert, both layouts at once and MoE settings neither
//    architecture can express are errors naming the tensor, field or flag;
//  * --qk-layernorm (Qwen3's q/k norms): gradients against finite differences, names,
//    checkpoint metadata and start-up errors.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/weights.h"
#include "ckpt_test_util.h"
#include "model/gpt_model.h"
#include "training/arguments.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;
using json = nlohmann::json;

namespace hf_moe_test {

std::string fixture(const std::string& fam) {
  return std::string(MCPP_SOURCE_DIR) + "/tests/golden/hf_moe/" + fam;
}

// The fixture's config as we read it (padding 1: the vocabulary stays transformers').
model::TransformerConfig mixtral_config() {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture("mixtral")), 1);
  c.seq_length = 8;  // the reference batch's
  return c;
}

json read_fixture_config() { return ck::read_hf_config(fixture("mixtral")); }

std::map<std::string, Tensor> fixture_tensors(const std::string& fam) {
  return ck::load_safetensors(fixture(fam) + "/model.safetensors").tensors;
}

// Our logits for the reference tokens against transformers' (float64).
double logits_rel_err(model::GPTModel& m, const std::string& fam) {
  return hf_logits_rel_err(m, fixture(fam) + "/reference.safetensors");
}

// transformers 5's in-memory layout of the same weights: mlp.gate.weight,
// mlp.experts.gate_up_proj [E, 2I, H] (per expert [w1; w3]), mlp.experts.down_proj [E, H, I].
std::map<std::string, Tensor> fuse(const std::map<std::string, Tensor>& hub, int64_t L, int64_t E) {
  std::map<std::string, Tensor> out;
  for (const auto& [n, t] : hub)
    if (n.find("block_sparse_moe") == std::string::npos) out[n] = t;
  for (int64_t l = 0; l < L; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    const std::string b = p + "block_sparse_moe.";
    out[p + "mlp.gate.weight"] = hub.at(b + "gate.weight");
    const Tensor& w1 = hub.at(b + "experts.0.w1.weight");
    const Tensor& w2 = hub.at(b + "experts.0.w2.weight");
    const int64_t I = w1.size(0), H = w1.size(1);
    Tensor gu = Tensor::empty({E, 2 * I, H}, w1.dtype()), dn = Tensor::empty({E, H, I}, w2.dtype());
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = b + "experts." + std::to_string(e) + ".";
      char* g = static_cast<char*>(gu.raw()) + size_t(e) * 2 * w1.nbytes();
      std::memcpy(g, hub.at(x + "w1.weight").raw(), w1.nbytes());
      std::memcpy(g + w1.nbytes(), hub.at(x + "w3.weight").raw(), w1.nbytes());
      std::memcpy(static_cast<char*>(dn.raw()) + size_t(e) * w2.nbytes(),
                  hub.at(x + "w2.weight").raw(), w2.nbytes());
    }
    out[p + "mlp.experts.gate_up_proj"] = gu;
    out[p + "mlp.experts.down_proj"] = dn;
  }
  return out;
}

// A small MoE model of ours that Mixtral can express.
model::TransformerConfig tiny_moe() {
  auto c = tiny_config("llama");
  c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 12;
  c.moe.aux_loss_coeff = {0.02}, c.rotary_base = 500000;
  c.moe.layer_pattern = {1, 1};  // as training spells --moe-layer-freq 1
  return c;
}


TEST(HfMoe, MixtralConfigFromTransformers5) {
  const auto c = mixtral_config();
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.topk, 2);
  EXPECT_EQ(c.moe.ffn_hidden_size, 48);
  EXPECT_EQ(c.moe.layer_pattern, (std::vector<int64_t>{1, 1}));  // every layer MoE
  EXPECT_FALSE(c.moe.sigmoid_like() || c.moe.pre_softmax);
  EXPECT_DOUBLE_EQ(c.moe.aux_loss_coeff.at(0), 0.01);
  EXPECT_DOUBLE_EQ(c.rotary_base, 10000.0);  // from rope_parameters (Mixtral's default: 1e6)
  EXPECT_EQ(c.num_query_groups, 2);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.padded_vocab_size, 96);
  EXPECT_FALSE(c.tie_embeddings || c.add_bias_linear);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Mixtral);
}

// The logits of transformers' MixtralForCausalLM (float64) from the imported folder.
TEST(HfMoe, MixtralImportReproducesTransformersLogits) {
  const auto c = mixtral_config();
  ck::check_hf_fits_files(fixture("mixtral"), c);
  model::GPTModel m(c);
  ck::import_hf(fixture("mixtral"), c, m.params());
  const double rel = logits_rel_err(m, "mixtral");
  std::printf("mixtral: max |ours - transformers| / max |logit| = %.3g\n", rel);
  EXPECT_LT(rel, 1e-5) << "relative max diff " << rel;  // the dense HF golden tests' bound
}

// Without the experts' weights the logits are far off: the comparison above can fail.
TEST(HfMoe, MixtralLogitsCheckDetectsWrongExperts) {
  const auto c = mixtral_config();
  auto t = fixture_tensors("mixtral");
  // Swap two experts of layer 1: the router still picks by index, so the outputs change.
  std::swap(t.at("model.layers.1.block_sparse_moe.experts.0.w2.weight"),
            t.at("model.layers.1.block_sparse_moe.experts.2.w2.weight"));
  model::GPTModel m(c);
  ck::from_hf_tensors(c, t, m.params());
  const double rel = logits_rel_err(m, "mixtral");
  std::printf("mixtral, two experts swapped: relative max diff %.3g\n", rel);
  EXPECT_GT(rel, 1e-3);
}

TEST(HfMoe, MixtralExportIsByteIdenticalAndKeepsConfig) {
  const auto c = mixtral_config();
  model::GPTModel m(c);
  ck::import_hf(fixture("mixtral"), c, m.params());
  const auto committed = fixture_tensors("mixtral");
  const auto now = ck::to_hf_tensors(c, m.params(), DType::F32);
  ASSERT_EQ(now.size(), committed.size());
  for (const auto& [name, t] : committed) {
    ASSERT_TRUE(now.count(name)) << name;
    EXPECT_TRUE(same_bytes(now.at(name), t)) << name;
  }
  const json ref = ck::read_hf_config(fixture("mixtral")), ours = ck::hf_config(c);
  for (const char* k : {"architectures",
                        "model_type",
                        "vocab_size",
                        "hidden_size",
                        "intermediate_size",
                        "num_hidden_layers",
                        "num_attention_heads",
                        "num_key_value_heads",
                        "head_dim",
                        "max_position_embeddings",
                        "rms_norm_eps",
                        "rope_parameters",
                        "hidden_act",
                        "num_local_experts",
                        "num_experts_per_tok",
                        "router_aux_loss_coef",
                        "tie_word_embeddings",
                        "sliding_window",
                        "output_router_logits",
                        "router_jitter_noise",
                        "attention_dropout"})
    EXPECT_EQ(ours.value(k, json("absent")), ref.at(k)) << k;
  EXPECT_EQ(ours.at("rope_theta"), 10000.0);  // transformers 4.x's spelling, written too
}

// convert --from-hf, then --to-hf: through a megatron.cpp checkpoint (MoE metadata, experts
// by global index) and back, byte for byte.
TEST(HfMoe, MixtralThroughCheckpointRoundTrip) {
  const auto c = mixtral_config();
  model::GPTModel m(c);
  ck::import_hf(fixture("mixtral"), c, m.params());
  const std::string dir = scratch_dir();
  ck::TrainingState st;
  st.rng_seed = c.seed;
  ck::save_checkpoint(dir + "/ckpt", m, nullptr, st);
  auto w = ck::load_model_weights(dir + "/ckpt", std::nullopt);
  EXPECT_EQ(w.config.moe.num_experts, 4);
  ck::export_hf(dir + "/hf", w.config, w.params);
  const auto back = ck::load_safetensors(dir + "/hf/model.safetensors").tensors;
  const auto committed = fixture_tensors("mixtral");
  ASSERT_EQ(back.size(), committed.size());
  for (const auto& [name, t] : committed) EXPECT_TRUE(same_bytes(back.at(name), t)) << name;
  auto again = ck::model_config_from_hf(ck::read_hf_config(dir + "/hf"), 1);
  again.seq_length = c.seq_length;  // not a config.json field (max_position_embeddings is)
  EXPECT_EQ(ck::model_config_json(again), ck::model_config_json(c));
}

TEST(HfMoe, FusedTransformers5LayoutImportsTheSameWeights) {
  const auto c = mixtral_config();
  const auto hub = fixture_tensors("mixtral");
  model::GPTModel a(c), b(c);
  ck::from_hf_tensors(c, hub, a.params());
  ck::from_hf_tensors(c, fuse(hub, c.num_layers, c.moe.num_experts), b.params());
  EXPECT_TRUE(same_bytes(a.params().flat_params(), b.params().flat_params()));

  // Both layouts at once: which one counts? An error, not a guess.
  auto both = hub;
  both["model.layers.0.mlp.experts.down_proj"] =
      fuse(hub, c.num_layers, c.moe.num_experts).at("model.layers.0.mlp.experts.down_proj");
  EXPECT_NE(error_of([&] {
              ck::from_hf_tensors(c, both, a.params());
            }).find("model.layers.0.block_sparse_moe.experts.0.w2.weight is given twice"),
            std::string::npos);
  // A fused tensor of the wrong expert count names itself and both shapes.
  auto f = fuse(hub, c.num_layers, c.moe.num_experts);
  f["model.layers.1.mlp.experts.down_proj"] = Tensor::zeros({3, 32, 48}, DType::F32);
  const std::string e = error_of([&] { ck::from_hf_tensors(c, f, a.params()); });
  EXPECT_NE(e.find("model.layers.1.mlp.experts.down_proj has shape [3, 32, 48], expected [4, 32, "
                   "48]"),
            std::string::npos)
      << e;
}

TEST(HfMoe, UnmappedTensorIsAnErrorNamingIt) {
  const auto c = mixtral_config();
  auto t = fixture_tensors("mixtral");
  t["model.layers.0.block_sparse_moe.experts.4.w1.weight"] = Tensor::zeros({48, 32}, DType::F32);
  model::GPTModel m(c);
  const std::string e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
  EXPECT_NE(e.find("model.layers.0.block_sparse_moe.experts.4.w1.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("no megatron.cpp parameter"), std::string::npos) << e;
}

TEST(HfMoe, MissingExpertIsAnErrorNamingIt) {
  const auto c = mixtral_config();
  model::GPTModel m(c);
  for (const char* gone : {"model.layers.1.block_sparse_moe.experts.3.w2.weight",
                           "model.layers.0.block_sparse_moe.experts.1.w3.weight",
                           "model.layers.1.block_sparse_moe.gate.weight"}) {
    auto t = fixture_tensors("mixtral");
    t.erase(gone);
    const std::string e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
    EXPECT_NE(e.find(std::string("Hugging Face tensor ") + gone + " is missing"), std::string::npos)
        << e;
  }
}

// Qwen3-MoE: q/k norms (--qk-layernorm), a dense first layer (mlp_only_layers), experts of
// moe_intermediate_size, norm_topk_prob true.
TEST(HfMoe, Qwen3MoeConfigFromTransformers5) {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture("qwen3_moe")), 1);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_EQ(c.moe.layer_pattern, (std::vector<int64_t>{0, 1, 1}));
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.ffn_hidden_size, 24);
  EXPECT_EQ(c.ffn_hidden_size, 40);
  EXPECT_FALSE(c.moe.pre_softmax);  // norm_topk_prob true: the default router
  EXPECT_DOUBLE_EQ(c.rotary_base, 20000.0);
  EXPECT_DOUBLE_EQ(c.norm_epsilon, 1e-6);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Qwen3Moe);
}

TEST(HfMoe, Qwen3MoeImportReproducesTransformersLogits) {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture("qwen3_moe")), 1);
  c.seq_length = 8;
  ck::check_hf_fits_files(fixture("qwen3_moe"), c);
  model::GPTModel m(c);
  ck::import_hf(fixture("qwen3_moe"), c, m.params());
  const double rel = logits_rel_err(m, "qwen3_moe");
  std::printf("qwen3_moe: max |ours - transformers| / max |logit| = %.3g\n", rel);
  EXPECT_LT(rel, 1e-5) << "relative max diff " << rel;
  // Without the q/k norms (weights of ones where the fixture has its own), the check fails.
  auto t = fixture_tensors("qwen3_moe");
  for (auto& [n, x] : t)
    if (n.find("_norm.weight") != std::string::npos && n.find("self_attn") != std::string::npos)
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 1.0f;
  model::GPTModel b(c);
  ck::from_hf_tensors(c, t, b.params());
  EXPECT_GT(logits_rel_err(b, "qwen3_moe"), 1e-3);
}

TEST(HfMoe, Qwen3MoeExportIsByteIdenticalAndKeepsConfig) {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture("qwen3_moe")), 1);
  model::GPTModel m(c);
  ck::import_hf(fixture("qwen3_moe"), c, m.params());
  const auto committed = fixture_tensors("qwen3_moe");
  const auto now = ck::to_hf_tensors(c, m.params(), DType::F32);
  ASSERT_EQ(now.size(), committed.size());
  for (const auto& [name, t] : committed) {
    ASSERT_TRUE(now.count(name)) << name;
    EXPECT_TRUE(same_bytes(now.at(name), t)) << name;
  }
  const json ref = ck::read_hf_config(fixture("qwen3_moe")), ours = ck::hf_config(c);
  for (const char* k : {"architectures",        "model_type",
                        "vocab_size",           "hidden_size",
                        "intermediate_size",    "moe_intermediate_size",
                        "num_hidden_layers",    "num_attention_heads",
                        "num_key_value_heads",  "max_position_embeddings",
                        "rms_norm_eps",         "rope_parameters",
                        "hidden_act",           "num_local_experts",
                        "num_experts_per_tok",  "norm_topk_prob",
                        "decoder_sparse_step",  "mlp_only_layers",
                        "router_aux_loss_coef", "tie_word_embeddings",
                        "attention_bias",       "use_sliding_window",
                        "sliding_window",       "output_router_logits"})
    EXPECT_EQ(ours.value(k, json("absent")), ref.at(k)) << k;
  EXPECT_EQ(ours.at("num_experts"), 4);  // 4.x's name (transformers 5 writes num_local_experts)
  // transformers 5's fused experts (mlp.experts.gate_up_proj / down_proj) import the same.
  std::map<std::string, Tensor> fused;
  for (const auto& [n, t] : committed)
    if (n.find(".mlp.experts.") == std::string::npos) fused[n] = t;
  for (int l : {1, 2}) {
    const std::string p = "model.layers." + std::to_string(l) + ".mlp.experts.";
    Tensor gu = Tensor::empty({4, 48, 32}, DType::F32), dn = Tensor::empty({4, 32, 24}, DType::F32);
    for (int e = 0; e < 4; ++e) {
      const std::string x = p + std::to_string(e) + ".";
      const Tensor &g = committed.at(x + "gate_proj.weight"),
                   &u = committed.at(x + "up_proj.weight");
      char* o = static_cast<char*>(gu.raw()) + size_t(e) * 2 * g.nbytes();
      std::memcpy(o, g.raw(), g.nbytes());
      std::memcpy(o + g.nbytes(), u.raw(), u.nbytes());
      const Tensor& d = committed.at(x + "down_proj.weight");
      std::memcpy(static_cast<char*>(dn.raw()) + size_t(e) * d.nbytes(), d.raw(), d.nbytes());
    }
    fused[p + "gate_up_proj"] = gu;
    fused[p + "down_proj"] = dn;
  }
  model::GPTModel b(c);
  ck::from_hf_tensors(c, fused, b.params());
  EXPECT_TRUE(same_bytes(b.params().flat_params(), m.params().flat_params()));
}

TEST(HfMoe, Qwen3MoeMissingQkNormIsAnErrorNamingIt) {
  auto c = ck::model_config_from_hf(ck::read_hf_config(fixture("qwen3_moe")), 1);
  auto t = fixture_tensors("qwen3_moe");
  t.erase("model.layers.2.self_attn.k_norm.weight");
  model::GPTModel m(c);
  const std::string e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
  EXPECT_NE(e.find("Hugging Face tensor model.layers.2.self_attn.k_norm.weight is missing"),
            std::string::npos)
      << e;
}

// norm_topk_prob false (Qwen2/3-MoE's default) is Megatron's --moe-router-pre-softmax, and
// decoder_sparse_step picks every N-th layer.
TEST(HfMoe, Qwen3MoeRouterAndLayerFields) {
  json j = ck::read_hf_config(fixture("qwen3_moe"));
  j["norm_topk_prob"] = false;
  j["decoder_sparse_step"] = 2;
  j["mlp_only_layers"] = json::array();
  auto c = ck::model_config_from_hf(j, 1);
  EXPECT_TRUE(c.moe.pre_softmax);
  EXPECT_EQ(c.moe.layer_pattern, (std::vector<int64_t>{0, 1, 0}));
  const json back = ck::hf_config(c);
  EXPECT_EQ(back.at("norm_topk_prob"), false);
  EXPECT_EQ(back.at("mlp_only_layers"), json({0, 2}));
  // use_sliding_window: every layer slides (no layer_types), L = sliding_window - 1; the
  // export writes it back.
  j["use_sliding_window"] = true;
  j["sliding_window"] = 4;
  c = ck::model_config_from_hf(j, 1);
  EXPECT_EQ(c.window_left, 3);
  EXPECT_EQ(c.window_pattern, (std::vector<int64_t>{1, 1, 1}));
  const json win = ck::hf_config(c);
  EXPECT_EQ(win.at("sliding_window"), 4);
  EXPECT_EQ(win.at("use_sliding_window"), true);
  EXPECT_EQ(ck::model_config_from_hf(win, 1).window_left, 3);
  j["sliding_window"] = 0;
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("not a positive integer"),
            std::string::npos);
  j["sliding_window"] = 4;
  j["use_sliding_window"] = false;
  j["mlp_only_layers"] = {7};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("mlp_only_layers entry 7"),
            std::string::npos);
}

// config.json as transformers 4.x wrote Mixtral's (rope_theta at the top, torch_dtype, no
// head_dim), with the errors for what we cannot map.
TEST(HfMoe, Transformers4ConfigAndUnsupportedFields) {
  json j = {{"architectures", {"MixtralForCausalLM"}},
            {"model_type", "mixtral"},
            {"vocab_size", 100},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 2},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 2},
            {"max_position_embeddings", 128},
            {"rms_norm_eps", 1e-5},
            {"rope_theta", 1e6},
            {"sliding_window", nullptr},
            {"num_local_experts", 8},
            {"num_experts_per_tok", 2},
            {"router_aux_loss_coef", 0.02},
            {"output_router_logits", false},
            {"tie_word_embeddings", false},
            {"torch_dtype", "bfloat16"}};
  auto c = ck::model_config_from_hf(j, 128);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(c.padded_vocab_size, 128);
  EXPECT_EQ(c.moe.num_experts, 8);
  EXPECT_DOUBLE_EQ(c.moe.aux_loss_coeff.at(0), 0.02);
  EXPECT_DOUBLE_EQ(c.rotary_base, 1e6);
  j.erase("rope_theta");
  EXPECT_DOUBLE_EQ(ck::model_config_from_hf(j, 1).rotary_base, 1e6);  // Mixtral's default
  auto bad = [&](const char* k, json v) {
    json b = j;
    b[k] = v;
    return error_of([&] { ck::model_config_from_hf(b, 1); });
  };
  EXPECT_NE(bad("rope_parameters", {{"rope_type", "longrope"}, {"rope_theta", 1e6}, {"factor", 4}})
                .find("rope_type 'longrope'"),
            std::string::npos);
  {  // Mixtral slides every layer by sliding_window (HF: i - j < 16, so L = 15)
    json w = j;
    w["sliding_window"] = 16;
    const auto cw = ck::model_config_from_hf(w, 1);
    EXPECT_EQ(cw.window_left, 15);
    EXPECT_EQ(cw.window_pattern, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(ck::hf_config(cw).at("sliding_window"), 16);
  }
  EXPECT_NE(bad("sliding_window", "16").find("sliding_window"), std::string::npos);
  EXPECT_NE(bad("num_experts_per_tok", 9).find("num_experts_per_tok 9"), std::string::npos);
  EXPECT_NE(bad("num_local_experts", 0).find("'num_local_experts' is 0"), std::string::npos);
  // Far more experts than the weight files can hold: refused before any allocation.
  {
    json big = read_fixture_config();
    big["num_local_experts"] = 1 << 19;
    big["num_experts_per_tok"] = 2;
    const auto cb = ck::model_config_from_hf(big, 1);
    const std::string e = error_of([&] { ck::check_hf_fits_files(fixture("mixtral"), cb); });
    EXPECT_NE(e.find("weight files hold only"), std::string::npos) << e;
  }
  json rp = j;
  rp["rope_theta"] = 1e4;
  rp["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(rp, 1); }).find("disagree"), std::string::npos);
  // A Llama config.json from transformers 5: the base comes from rope_parameters too.
  json llama = {{"model_type", "llama"},
                {"vocab_size", 64},
                {"hidden_size", 16},
                {"intermediate_size", 24},
                {"num_hidden_layers", 1},
                {"num_attention_heads", 4},
                {"max_position_embeddings", 32},
                {"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 500000.0}}}};
  EXPECT_DOUBLE_EQ(ck::model_config_from_hf(llama, 1).rotary_base, 500000.0);
  // Llama 3.x scaling needs its four values (test_hf_rope.cpp has the rest).
  llama["rope_parameters"]["rope_type"] = "llama3";
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(llama, 1); }).find("lacks 'factor'"),
            std::string::npos);
}

// Our own MoE model: export -> import is the identity, config included.
TEST(HfMoe, RoundTripOfOurMoeModel) {
  const auto c = tiny_moe();
  model::GPTModel a(c);
  fill_global(a.params(), a.params().flat_params(), 5);
  const std::string dir = scratch_dir() + "/hf";
  ck::export_hf(dir, c, a.params());
  auto back = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
  back.seq_length = c.seq_length, back.hidden_dropout = c.hidden_dropout;
  back.attention_dropout = c.attention_dropout, back.seed = c.seed;
  back.init_method_std = c.init_method_std;
  // Every layer is MoE: the dense width is unused, and Mixtral's config has only the
  // experts' (intermediate_size), which import uses for both.
  EXPECT_EQ(back.ffn_hidden_size, c.moe.ffn_hidden_size);
  back.ffn_hidden_size = c.ffn_hidden_size;
  EXPECT_EQ(ck::model_config_json(back), ck::model_config_json(c));
  model::GPTModel b(back);
  ck::import_hf(dir, back, b.params());
  EXPECT_TRUE(same_bytes(a.params().flat_params(), b.params().flat_params()));
  EXPECT_EQ(ck::load_safetensors(dir + "/model.safetensors")
                .tensors.at("model.layers.1.block_sparse_moe.experts.3.w3.weight")
                .shape(),
            (Shape{12, 16}));
}

TEST(HfMoe, MoeSettingsMixtralCannotExpressAreErrors) {
  auto expect_error = [](model::TransformerConfig c, const char* what) {
    const std::string e = error_of([&] { ck::hf_config(c); });
    EXPECT_NE(e.find(what), std::string::npos) << e;
    EXPECT_NE(e.find("MixtralForCausalLM"), std::string::npos) << e;
  };
  auto c = tiny_moe();
  c.moe.shared_ffn_hidden_size = 8;
  expect_error(c, "shared experts");
  c = tiny_moe();
  c.moe.layer_pattern = {0, 1};
  expect_error(c, "a dense layer");
  c = tiny_moe();
  c.moe.score = model::TransformerConfig::Moe::Score::Sigmoid;
  expect_error(c, "the router");
  c = tiny_moe();
  c.moe.pre_softmax = true;
  expect_error(c, "the router");
  c = tiny_moe();
  c.moe.capacity_factor = 1.0;
  expect_error(c, "token dropping");
  c = tiny_moe();
  c.add_qkv_bias = true;  // Qwen2's q/k/v biases: neither MoE class has them
  expect_error(c, "linear biases");
}

// ---- --qk-layernorm (ops::qk_norm_forward), the model option Qwen3 needs ------------------


model::TransformerConfig tiny_qk(bool moe, bool one_p) {
  model::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 4;
  c.num_query_groups = 2, c.seq_length = 6, c.max_position_embeddings = 8;
  c.padded_vocab_size = 16, c.ffn_hidden_size = 10, c.init_method_std = 0.3;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1, c.dtype = DType::F64;
  c.rope = c.rmsnorm = c.swiglu = true, c.add_bias_linear = false, c.tie_embeddings = false;
  c.zero_centered_gamma = one_p, c.qk_layernorm = true;
  if (moe) c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
  if (moe) c.moe.layer_pattern = {0, 1};
  return c;
}

model::MicroBatch qk_batch(int64_t B, int64_t S, int64_t V) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = Philox::u32(21, 1, uint64_t(i)) % V;
    mb.labels.data<int64_t>()[i] = Philox::u32(21, 2, uint64_t(i)) % V;
    mb.loss_mask.data<float>()[i] = 1.f;
  }
  return mb;
}

// Every element of the q/k norm weights and three of every other parameter: the backward's
// gradient of the summed LM loss (f64, dropout on) against central finite differences.
void qk_fd(const model::TransformerConfig& cfg) {
  model::GPTModel m(cfg);
  auto& ps = m.params();
  fill_global(ps, ps.flat_params(), 13);  // q/k norm weights away from 1: a real test
  const auto mb = qk_batch(2, cfg.seq_length, 16);
  model::StepKeys keys;
  keys.iteration = 2;
  ps.zero_grads();
  m.forward(mb, keys);
  m.backward(1.0);
  const double h = 1e-6;
  int norms = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const std::string& name = ps.infos()[i].name;
    Tensor w = ps.param(i), g = ps.grad(i);
    const bool qk = name.find("_layernorm.weight") != std::string::npos &&
                    name.find("self_attention") != std::string::npos;
    norms += qk;
    const int64_t n = qk ? w.numel() : 3;
    for (int64_t kk = 0; kk < n; ++kk) {
      const int64_t e = qk ? kk : int64_t(Philox::u32(9, i, uint64_t(kk)) % uint64_t(w.numel()));
      double* x = w.data<double>() + e;
      const double x0 = *x;
      *x = x0 + h;
      const double lp = m.forward(mb, keys);
      *x = x0 - h;
      const double lm = m.forward(mb, keys);
      *x = x0;
      const double fd = (lp - lm) / (2 * h), an = g.data<double>()[e];
      EXPECT_NEAR(an, fd, 1e-6 * std::max(1.0, std::abs(fd))) << name << "[" << e << "]";
    }
  }
  EXPECT_EQ(norms, 2 * cfg.num_layers);  // q and k of every layer
}

std::string qk_start_up_error(std::vector<std::string> extra) {
  std::vector<std::string> argv = {"--num-layers",
                                   "2",
                                   "--hidden-size",
                                   "32",
                                   "--num-attention-heads",
                                   "4",
                                   "--seq-length",
                                   "16",
                                   "--max-position-embeddings",
                                   "16",
                                   "--micro-batch-size",
                                   "2",
                                   "--lr",
                                   "1e-3",
                                   "--train-iters",
                                   "5",
                                   "--mock-data",
                                   "--tokenizer-type",
                                   "NullTokenizer",
                                   "--vocab-size",
                                   "100",
                                   "--qk-layernorm"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  try {
    auto a = training::parse_args(argv);
    training::validate_args(a, 2);
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return "";
}


TEST(QkLayernorm, GradientsMatchFiniteDifferencesDense) { qk_fd(tiny_qk(false, false)); }
TEST(QkLayernorm, GradientsMatchFiniteDifferencesMoeAnd1p) { qk_fd(tiny_qk(true, true)); }

TEST(QkLayernorm, ParameterNamesAndCheckpointMetadata) {
  const auto c = tiny_qk(false, false);
  model::GPTModel m(c);
  EXPECT_EQ(m.params().param("decoder.layers.1.self_attention.q_layernorm.weight").shape(),
            (Shape{4}));
  EXPECT_EQ(m.params().param("decoder.layers.0.self_attention.k_layernorm.weight").shape(),
            (Shape{4}));
  EXPECT_EQ(ck::model_config_json(c).at("qk_layernorm"), true);
  auto off = c;
  off.qk_layernorm = false;
  EXPECT_FALSE(ck::model_config_json(off).contains("qk_layernorm"));  // dense metadata unchanged
  // A dense model with q/k norms is Qwen3ForCausalLM (test_hf.cpp: RoundTripQwen3).
  EXPECT_EQ(ck::hf_config(c)["architectures"][0], "Qwen3ForCausalLM");
}

TEST(QkLayernorm, StartUpErrorsNameTheFlag) {
  EXPECT_EQ(qk_start_up_error({"--normalization", "RMSNorm", "--device", "cpu"}), "");
  EXPECT_EQ(qk_start_up_error({"--device", "cpu"}), "");  // the LayerNorm form (a bias) too
  // TP (with and without SP) and CUDA (bf16) are implemented: accepted.
  EXPECT_EQ(qk_start_up_error({"--normalization", "RMSNorm", "--tensor-model-parallel-size", "2"}),
            "");
  EXPECT_EQ(qk_start_up_error({"--normalization", "RMSNorm", "--tensor-model-parallel-size", "2",
                               "--sequence-parallel"}),
            "");
  EXPECT_EQ(qk_start_up_error({"--normalization", "RMSNorm", "--device", "cuda", "--bf16"}), "");
}

}  // namespace hf_moe_test
