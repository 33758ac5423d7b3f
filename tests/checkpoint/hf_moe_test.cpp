// Hugging Face exchange of mixture-of-experts models (checkpoint/hf_moe.h) against the
// fixtures of tests/golden/hf_moe (make_hf_moe.py: transformers' own MixtralForCausalLM and
// Qwen3MoeForCausalLM, saved with save_pretrained, with their float64 logits):
//  * import reproduces transformers' logits; export gives back the same tensors byte for
//    byte and the same config fields; a checkpoint round trip (convert) keeps them;
//  * transformers 5's fused expert layout imports to the same weights;
//  * an unmapped tensor, a missing expert, both layouts at once, a Qwen3-MoE folder and MoE
//    settings Mixtral cannot express are errors naming the tensor, field or flag.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

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

namespace {

std::string fixture(const std::string& fam) {
  return std::string(MCPP_SOURCE_DIR) + "/tests/golden/hf_moe/" + fam;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// The message of the mcpp::Error that f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
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

// Our logits [S, B, V] for the reference tokens [B, S], against transformers' [B, S, V]
// (float64): the largest difference relative to the largest logit.
double logits_rel_err(model::GPTModel& m, const std::string& fam) {
  auto ref = ck::load_safetensors(fixture(fam) + "/reference.safetensors").tensors;
  const Tensor& tok = ref.at("tokens");
  const Tensor& lref = ref.at("logits");
  const int64_t B = tok.size(0), S = tok.size(1), V = lref.size(2);
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::zeros({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = tok.data<int64_t>()[i];
    mb.loss_mask.data<float>()[i] = 1.0f;
  }
  model::StepKeys keys;
  keys.training = false;
  m.forward(mb, keys);
  const Tensor& lg = m.logits();  // [S, B, V] as [S*B, V]
  EXPECT_EQ(lg.numel(), S * B * V);
  if (lg.numel() != S * B * V) return 1e30;
  double err = 0, scale = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v) {
        const double r = lref.data<double>()[(b * S + s) * V + v];
        err = std::max(err, std::abs(double(lg.data<float>()[(s * B + b) * V + v]) - r));
        scale = std::max(scale, std::abs(r));
      }
  return err / scale;
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
  c.moe.aux_loss_coeff = 0.02, c.rotary_base = 500000;
  c.moe.layer_pattern = {1, 1};  // as training spells --moe-layer-freq 1
  return c;
}

}  // namespace

TEST(HfMoe, MixtralConfigFromTransformers5) {
  const auto c = mixtral_config();
  EXPECT_EQ(c.moe.num_experts, 4);
  EXPECT_EQ(c.moe.topk, 2);
  EXPECT_EQ(c.moe.ffn_hidden_size, 48);
  EXPECT_EQ(c.moe.layer_pattern, (std::vector<int64_t>{1, 1}));  // every layer MoE
  EXPECT_FALSE(c.moe.sigmoid || c.moe.pre_softmax);
  EXPECT_DOUBLE_EQ(c.moe.aux_loss_coeff, 0.01);
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

TEST(HfMoe, Qwen3MoeIsAClearError) {
  const std::string e =
      error_of([] { ck::model_config_from_hf(ck::read_hf_config(fixture("qwen3_moe")), 1); });
  EXPECT_NE(e.find("qwen3_moe"), std::string::npos) << e;
  EXPECT_NE(e.find("q_norm"), std::string::npos) << e;
  EXPECT_NE(e.find("--qk-layernorm"), std::string::npos) << e;
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
  EXPECT_DOUBLE_EQ(c.moe.aux_loss_coeff, 0.02);
  EXPECT_DOUBLE_EQ(c.rotary_base, 1e6);
  j.erase("rope_theta");
  EXPECT_DOUBLE_EQ(ck::model_config_from_hf(j, 1).rotary_base, 1e6);  // Mixtral's default
  auto bad = [&](const char* k, json v) {
    json b = j;
    b[k] = v;
    return error_of([&] { ck::model_config_from_hf(b, 1); });
  };
  EXPECT_NE(bad("rope_parameters", {{"rope_type", "yarn"}, {"rope_theta", 1e6}, {"factor", 4}})
                .find("rope_type 'yarn'"),
            std::string::npos);
  EXPECT_NE(bad("sliding_window", 16).find("sliding_window 16"), std::string::npos);
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
  llama["rope_parameters"]["rope_type"] = "llama3";
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(llama, 1); }).find("rope_type 'llama3'"),
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
  c.moe.sigmoid = true;
  expect_error(c, "the router");
  c = tiny_moe();
  c.moe.pre_softmax = true;
  expect_error(c, "the router");
  c = tiny_moe();
  c.moe.capacity_factor = 1.0;
  expect_error(c, "token dropping");
}
