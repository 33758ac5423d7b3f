// Hugging Face exchange: round trips, config mapping, and the golden fixtures of
// tests/golden/hf (check_hf_export.py: an independent PyTorch GPT-2 / Llama / Qwen2 / Qwen3 /
// Mistral forward on our export agreed with our logits; its reference logits are committed).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "../golden/golden_models.h"
#include "checkpoint/fs.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;

namespace hf_test {

std::string hf_golden(const std::string& fam) {
  return std::string(MCPP_SOURCE_DIR) + "/tests/golden/hf/" + fam;
}

// Export (as model_type, "" for the default), import: the same config and the same bytes.
// Returns the exported config.json.
nlohmann::json round_trip(model::TransformerConfig c, const std::string& model_type = "") {
  model::GPTModel a(c);
  fill_global(a.params(), a.params().flat_params(), 3);
  const std::string dir = scratch_dir() + "/hf";
  ck::export_hf(dir, c, a.params(), DType::F32, model_type);
  const nlohmann::json hf = ck::read_hf_config(dir);
  auto back_cfg = ck::model_config_from_hf(hf, 1);
  const nlohmann::json want = ck::model_config_json(c), got = ck::model_config_json(back_cfg);
  for (auto k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                 "num_query_groups", "kv_channels", "padded_vocab_size", "rope", "rmsnorm",
                 "swiglu", "tie_embeddings", "add_bias_linear", "norm_epsilon", "rotary_base",
                 "qk_layernorm", "add_qkv_bias", "window"})  // the last three: absent when off
    EXPECT_EQ(got.value(k, nlohmann::json()), want.value(k, nlohmann::json())) << k;
  back_cfg.dtype = c.dtype, back_cfg.seq_length = c.seq_length;
  model::GPTModel b(back_cfg);
  ck::import_hf(dir, back_cfg, b.params());
  EXPECT_TRUE(same_bytes(a.params().flat_params(), b.params().flat_params()));
  return hf;
}

// The Llama-style config.json of `type` that real checkpoints carry (tiny sizes).
nlohmann::json llama_like(const std::string& type) {
  nlohmann::json j = {{"model_type", type},       {"vocab_size", 61},
                      {"hidden_size", 16},        {"intermediate_size", 24},
                      {"num_hidden_layers", 2},   {"num_attention_heads", 4},
                      {"num_key_value_heads", 2}, {"max_position_embeddings", 32},
                      {"rms_norm_eps", 1e-6},     {"rope_theta", 1000000.0},
                      {"hidden_act", "silu"},     {"tie_word_embeddings", false}};
  return j;
}


TEST(HfExport, RoundTripGpt2) { round_trip(tiny_config("gpt")); }
TEST(HfExport, RoundTripLlamaGqa) { round_trip(tiny_config("llama")); }
TEST(HfExport, RoundTripLlamaTiedWithBiases) {
  auto c = tiny_config("llama");
  c.tie_embeddings = true, c.add_bias_linear = true, c.rotary_base = 500000;
  round_trip(c);
}

// Qwen2: Llama + q/k/v_proj biases (--add-qkv-bias alone), tied embeddings as the small ones.
TEST(HfExport, RoundTripQwen2) {
  auto c = tiny_config("qwen2");
  c.tie_embeddings = true, c.rotary_base = 1e6;
  const auto j = round_trip(c);
  EXPECT_EQ(j["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(j["model_type"], "qwen2");
  EXPECT_EQ(j["use_sliding_window"], false);
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_FALSE(j.contains("attention_bias") || j.contains("mlp_bias"));  // not Qwen2 fields
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 3);
  auto t = ck::to_hf_tensors(c, m.params());
  EXPECT_EQ(t.at("model.layers.1.self_attn.k_proj.bias").shape(), (Shape{8}));
  EXPECT_EQ(t.at("model.layers.1.self_attn.q_proj.bias").shape(), (Shape{16}));
  EXPECT_EQ(t.count("model.layers.1.self_attn.o_proj.bias"), 0u);
  EXPECT_EQ(t.count("model.layers.1.mlp.down_proj.bias"), 0u);
  EXPECT_EQ(t.count("lm_head.weight"), 0u);
  // k_proj.bias row d of kv head g = linear_qkv.bias row (g * (r + 2) + r) * HD + d, r = 2.
  Tensor b = m.params().param("decoder.layers.1.self_attention.linear_qkv.bias");
  EXPECT_EQ(t.at("model.layers.1.self_attn.k_proj.bias").data<float>()[1 * 4 + 3],
            b.data<float>()[(1 * 4 + 2) * 4 + 3]);
}

// Qwen3: Llama + per-head q/k RMSNorm, head_dim != hidden / heads.
TEST(HfExport, RoundTripQwen3) {
  auto c = tiny_config("llama");
  c.qk_layernorm = true, c.kv_channels = 8, c.norm_epsilon = 1e-6;
  const auto j = round_trip(c);
  EXPECT_EQ(j["architectures"][0], "Qwen3ForCausalLM");
  EXPECT_EQ(j["head_dim"], 8);
  EXPECT_EQ(j["attention_bias"], false);
  EXPECT_FALSE(j.contains("mlp_bias"));
  // --apply-layernorm-1p: the q/k norm weights are exported as 1 + stored.
  c.zero_centered_gamma = true;
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 3);
  const auto t = ck::to_hf_tensors(c, m.params());
  const Tensor k = m.params().param("decoder.layers.1.self_attention.k_layernorm.weight");
  EXPECT_EQ(t.at("model.layers.1.self_attn.k_norm.weight").data<float>()[5],
            k.data<float>()[5] + 1.0f);
}

// Mistral: the Llama layout, exported as MistralForCausalLM on request, sliding_window null.
// --rotary-interleaved exports as transformers' rotate-half Llama (Qwen3 with q/k norms) with
// each query and key head's rows (and norm weights) permuted: the re-imported model, plain
// RoPE now, gives the interleaved model's logits; the same weights without the permutation
// do not.
TEST(HfExport, InterleavedRopeExportsAsRotateHalf) {
  for (bool qk_norm : {false, true}) {
    SCOPED_TRACE(qk_norm ? "qwen3" : "llama");
    model::TransformerConfig c = tiny_config("llama", 1, 0, DType::F64);
    c.rotary_interleaved = true, c.qk_layernorm = qk_norm;
    model::GPTModel a(c);
    fill_global(a.params(), a.params().flat_params(), 3);
    const std::string dir = scratch_dir() + "/hf_interleaved";
    ck::export_hf(dir, c, a.params(), DType::F64);
    model::TransformerConfig back = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
    EXPECT_FALSE(back.rotary_interleaved);
    back.dtype = DType::F64, back.seq_length = c.seq_length;
    model::GPTModel b(back);
    ck::import_hf(dir, back, b.params());
    model::TransformerConfig plain = c;
    plain.rotary_interleaved = false;
    model::GPTModel p(plain);
    const Tensor from = a.params().flat_params(), to = p.params().flat_params();
    ASSERT_EQ(from.nbytes(), to.nbytes());
    std::memcpy(to.raw(), from.raw(), from.nbytes());
    const model::MicroBatch mb = golden::golden_batch();
    model::StepKeys k;
    k.training = false;
    a.forward(mb, k), b.forward(mb, k), p.forward(mb, k);
    double diff = 0, base = 0, plain_diff = 0;
    for (int64_t i = 0; i < a.logits().numel(); ++i) {
      const double x = a.logits().data<double>()[i];
      diff = std::max(diff, std::abs(b.logits().data<double>()[i] - x));
      plain_diff = std::max(plain_diff, std::abs(p.logits().data<double>()[i] - x));
      base = std::max(base, std::abs(x));
    }
    EXPECT_LT(diff, 1e-12 * base);
    EXPECT_GT(plain_diff, 1e-3 * base);
  }
}

TEST(HfExport, RoundTripMistral) {
  const auto c = tiny_config("llama");
  const auto j = round_trip(c, "mistral");
  EXPECT_EQ(j["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(j["model_type"], "mistral");
  ASSERT_TRUE(j.contains("sliding_window"));
  EXPECT_TRUE(j["sliding_window"].is_null());
  EXPECT_FALSE(j.contains("attention_bias") || j.contains("use_sliding_window"));
  EXPECT_EQ(ck::hf_config(c)["model_type"], "llama");  // the default stays Llama
}

TEST(HfExport, ExportTypeMustFitTheModel) {
  auto c = tiny_config("llama");
  c.add_bias_linear = true;
  EXPECT_NE(error_of([&] {
              ck::hf_config(c, DType::F32, "mistral");
            }).find("MistralForCausalLM has no linear biases"),
            std::string::npos);
  c = tiny_config("qwen2");
  const std::string e = error_of([&] { ck::hf_config(c, DType::F32, "mistral"); });
  EXPECT_NE(e.find("maps to Hugging Face model_type 'qwen2'"), std::string::npos) << e;
  EXPECT_NE(error_of([&] { ck::hf_config(c, DType::F32, "llama"); }).find("not 'llama'"),
            std::string::npos);
  EXPECT_EQ(ck::hf_config(c, DType::F32, "qwen2")["model_type"], "qwen2");
  // Nothing is written when the type does not fit.
  model::GPTModel m(c);
  const std::string dir = scratch_dir() + "/out";
  EXPECT_THROW(ck::export_hf(dir, c, m.params(), DType::F32, "mistral"), Error);
  EXPECT_FALSE(std::filesystem::exists(dir));
  // q/k norms with biases: Qwen3ForCausalLM has none.
  c = tiny_config("qwen2");
  c.qk_layernorm = true;
  EXPECT_NE(error_of([&] { ck::hf_arch_of(c); }).find("--add-qkv-bias"), std::string::npos);
  c.add_qkv_bias = false, c.add_bias_linear = true;
  EXPECT_NE(error_of([&] { ck::hf_arch_of(c); }).find("Qwen3ForCausalLM has none"),
            std::string::npos);
  // --qk-layernorm's LayerNorm form (per-head q/k LayerNorms with biases): no architecture
  // has it, whatever else the model is (GPT-2-like, or Llama-like but for the norm); nothing
  // is written.
  c = tiny_config("gpt");
  c.qk_layernorm = true;
  for (bool rope_swiglu : {false, true}) {
    c.rope = c.swiglu = rope_swiglu;
    const std::string e = error_of([&] { ck::hf_arch_of(c); });
    EXPECT_NE(e.find("--qk-layernorm with --normalization LayerNorm"), std::string::npos) << e;
    EXPECT_NE(e.find("HINT"), std::string::npos) << e;
  }
  model::GPTModel g(c);
  EXPECT_THROW(ck::export_hf(dir, c, g.params(), DType::F32), Error);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

TEST(HfImport, Qwen2Config) {
  auto j = llama_like("qwen2");
  j["use_sliding_window"] = false, j["sliding_window"] = 8, j["max_window_layers"] = 1;
  j["tie_word_embeddings"] = true;
  auto c = ck::model_config_from_hf(j, 1);
  EXPECT_TRUE(c.add_qkv_bias);
  EXPECT_FALSE(c.add_bias_linear);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_FALSE(c.qk_layernorm);
  EXPECT_EQ(c.rotary_base, 1e6);
  EXPECT_EQ(c.kv_channels, 4);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Qwen2);
  EXPECT_FALSE(c.has_window_layers());  // use_sliding_window false
  // use_sliding_window: the layers >= max_window_layers (1) slide; HF's i - j < 8 is L = 7.
  j["use_sliding_window"] = true;
  c = ck::model_config_from_hf(j, 1);
  EXPECT_EQ(c.window_left, 7);
  EXPECT_EQ(c.window_pattern, (std::vector<int64_t>{0, 1}));
  j["max_window_layers"] = 2;  // no layer at or beyond it: no window anywhere
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).has_window_layers());
  j.erase("max_window_layers");  // Qwen2Config's default 28: none of the 2 layers
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).has_window_layers());
  j["layer_types"] = {"sliding_attention", "full_attention"};  // overrides max_window_layers
  c = ck::model_config_from_hf(j, 1);
  EXPECT_EQ(c.window_left, 7);
  EXPECT_EQ(c.window_pattern, (std::vector<int64_t>{1, 0}));
  {  // written back: the window, its switch and the layer types (weights too: round_trip)
    const nlohmann::json out = round_trip(c);
    EXPECT_EQ(out["sliding_window"], 8);
    EXPECT_EQ(out["use_sliding_window"], true);
    EXPECT_EQ(out["layer_types"],
              nlohmann::json::array({"sliding_attention", "full_attention"}));
    const auto back = ck::model_config_from_hf(out, 1);
    EXPECT_EQ(back.window_left, 7);
    EXPECT_EQ(back.window_pattern, c.window_pattern);
  }
  j["sliding_window"] = 32;  // as long as the model's positions: never applies
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).has_window_layers());
  j["layer_types"] = {"full_attention", "chunked_attention"};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("layer_types holds"),
            std::string::npos);
  j["layer_types"] = {"full_attention"};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("layer_types"),
            std::string::npos);
  j.erase("layer_types");
  j.erase("sliding_window");  // Qwen2Config's default window 4096 >= 32
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).has_window_layers());
  j["use_sliding_window"] = "yes";
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("use_sliding_window"),
            std::string::npos);
}

TEST(HfImport, Qwen3Config) {
  auto j = llama_like("qwen3");
  j["head_dim"] = 8, j["attention_bias"] = false, j["use_sliding_window"] = false;
  j["sliding_window"] = nullptr;
  auto c = ck::model_config_from_hf(j, 1);
  EXPECT_TRUE(c.qk_layernorm);
  EXPECT_FALSE(c.add_bias_linear || c.add_qkv_bias);
  EXPECT_EQ(c.kv_channels, 8);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Qwen3);
  j.erase("head_dim");  // Qwen3Config's default head_dim is 128, not hidden / heads
  EXPECT_EQ(ck::model_config_from_hf(j, 1).kv_channels, 128);
  j["attention_bias"] = true;
  std::string e = error_of([&] { ck::model_config_from_hf(j, 1); });
  EXPECT_NE(e.find("(qwen3) has attention_bias true"), std::string::npos) << e;
  j["attention_bias"] = false, j["hidden_act"] = "gelu";
  e = error_of([&] { ck::model_config_from_hf(j, 1); });
  EXPECT_NE(e.find("(qwen3): hidden_act 'gelu'"), std::string::npos) << e;
}

TEST(HfImport, MistralConfig) {
  auto j = llama_like("mistral");
  j["sliding_window"] = nullptr;  // Mistral 7B v0.2 / v0.3
  auto c = ck::model_config_from_hf(j, 1);
  EXPECT_FALSE(c.add_bias_linear || c.add_qkv_bias || c.qk_layernorm);
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Llama);
  j["sliding_window"] = 16;  // v0.1 style: every layer slides, L = 16 - 1
  c = ck::model_config_from_hf(j, 1);
  EXPECT_EQ(c.window_left, 15);
  EXPECT_EQ(c.window_pattern, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(ck::hf_arch_of(c), ck::HfArch::Mistral);  // Llama has no window
  {
    const nlohmann::json out = round_trip(c);
    EXPECT_EQ(out["model_type"], "mistral");
    EXPECT_EQ(out["sliding_window"], 16);
    EXPECT_EQ(ck::model_config_from_hf(out, 1).window_left, 15);
  }
  {  // some layers only: Mistral cannot say it
    auto p = c;
    p.window_pattern = {1, 0};
    std::string e = error_of([&] { ck::hf_config(p); });
    EXPECT_NE(e.find("'mistral' slides in every layer"), std::string::npos) << e;
    p = c, p.add_bias_linear = true;
    e = error_of([&] { ck::hf_config(p); });
    EXPECT_NE(e.find("sliding-window model with linear biases"), std::string::npos) << e;
  }
  j["max_position_embeddings"] = 16;  // a window as long as the positions never applies
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).has_window_layers());
  j["max_position_embeddings"] = 8192;
  j.erase("sliding_window");  // MistralConfig's default window 4096 applies
  EXPECT_EQ(ck::model_config_from_hf(j, 1).window_left, 4095);
  std::string e;
  j["sliding_window"] = -1;
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("not a positive integer"),
            std::string::npos);
  // A Mistral folder's tensors with biases (which MistralForCausalLM never has) are unknown.
  j = llama_like("mistral");
  j["sliding_window"] = nullptr;
  c = ck::model_config_from_hf(j, 1);
  auto q = c;
  q.add_qkv_bias = true;
  model::GPTModel with_bias(q), m(c);
  auto t = ck::to_hf_tensors(q, with_bias.params());
  e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
  EXPECT_NE(e.find("have no megatron.cpp parameter"), std::string::npos) << e;
}

// A Qwen2 folder without a q/k/v bias is incomplete, not a Llama.
TEST(HfImport, Qwen2MissingBiasIsAnError) {
  auto c = tiny_config("qwen2");
  model::GPTModel m(c);
  auto t = ck::to_hf_tensors(c, m.params());
  t.erase("model.layers.0.self_attn.v_proj.bias");
  const std::string e = error_of([&] { ck::from_hf_tensors(c, t, m.params()); });
  EXPECT_NE(e.find("v_proj.bias is missing"), std::string::npos) << e;
}

TEST(HfExport, Gpt2Layout) {
  auto c = tiny_config("gpt");
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 3);
  auto t = ck::to_hf_tensors(c, m.params());
  EXPECT_EQ(t.count("lm_head.weight"), 0u);  // tied, as HF stores GPT-2
  EXPECT_EQ(t.at("transformer.h.0.attn.c_attn.weight").shape(), (Shape{16, 48}));  // [in, out]
  EXPECT_EQ(t.at("transformer.h.1.mlp.c_fc.weight").shape(), (Shape{16, 32}));
  EXPECT_EQ(t.at("transformer.h.1.mlp.c_proj.weight").shape(), (Shape{32, 16}));
  // c_attn column n: q of head n/4 for n < 16, k for 16..31, v for 32..47. Megatron's row of
  // head h's key dim d: (h * 3 + 1) * 4 + d.
  Tensor qkv = m.params().param("decoder.layers.0.self_attention.linear_qkv.weight");
  const Tensor& ca = t.at("transformer.h.0.attn.c_attn.weight");
  const int64_t h = 2, d = 3, in = 5;
  EXPECT_EQ(ca.data<float>()[in * 48 + 16 + h * 4 + d],
            qkv.data<float>()[((h * 3 + 1) * 4 + d) * 16 + in]);
  EXPECT_EQ(ca.data<float>()[in * 48 + 0 + h * 4 + d],
            qkv.data<float>()[((h * 3 + 0) * 4 + d) * 16 + in]);
  EXPECT_EQ(ck::hf_config(c)["vocab_size"], 64);  // the padded vocabulary
}

TEST(HfExport, UnsupportedModelsAreClearErrors) {
  auto c = tiny_config("gpt");
  c.tie_embeddings = false;
  EXPECT_THROW(ck::hf_arch_of(c), Error);
  c = tiny_config("llama");
  c.rmsnorm = false;
  EXPECT_THROW(ck::hf_arch_of(c), Error);
  c = tiny_config("llama");
  c.rotary_percent = 0.5;
  EXPECT_THROW(ck::hf_arch_of(c), Error);
  EXPECT_NE(error_of([] {
              ck::model_config_from_hf({{"model_type", "bert"}});
            }).find("mistral, qwen2, qwen3"),
            std::string::npos);
  nlohmann::json j = ck::hf_config(tiny_config("gpt"));
  j["activation_function"] = "relu";
  EXPECT_THROW(ck::model_config_from_hf(j), Error);
  j = ck::hf_config(tiny_config("llama"));
  j["rope_scaling"] = {{"type", "llama3"}};
  EXPECT_THROW(ck::model_config_from_hf(j), Error);
}

TEST(HfExport, ImportErrors) {
  auto c = tiny_config("llama");
  model::GPTModel m(c);
  auto t = ck::to_hf_tensors(c, m.params());
  auto missing = t;
  missing.erase("model.layers.1.self_attn.k_proj.weight");
  try {
    ck::from_hf_tensors(c, missing, m.params());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("k_proj.weight is missing"), std::string::npos);
  }
  auto wrong = t;
  wrong["model.layers.0.mlp.up_proj.weight"] = Tensor::zeros({16, 24}, DType::F32);
  EXPECT_THROW(ck::from_hf_tensors(c, wrong, m.params()), Error);
  auto extra = t;
  extra["model.layers.9.mlp.up_proj.weight"] = Tensor::zeros({24, 16}, DType::F32);
  EXPECT_THROW(ck::from_hf_tensors(c, extra, m.params()), Error);
  auto buffers = t;  // HF's non-parameter buffers are skipped
  buffers["model.layers.0.self_attn.rotary_emb.inv_freq"] = Tensor::zeros({2}, DType::F32);
  EXPECT_NO_THROW(ck::from_hf_tensors(c, buffers, m.params()));
  EXPECT_THROW(ck::import_hf(scratch_dir(), c, m.params()), Error);
}

// A smaller HF vocabulary (the real tokenizer size) loads into our padded one; padding is zero.
TEST(HfExport, ImportsUnpaddedVocabulary) {
  auto c = tiny_config("gpt");
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 3);
  auto t = ck::to_hf_tensors(c, m.params());
  Tensor wte = t.at("transformer.wte.weight");
  t["transformer.wte.weight"] = wte.narrow(0, 50).clone();
  model::GPTModel b(c);
  ck::from_hf_tensors(c, t, b.params());
  Tensor e = b.params().param("embedding.word_embeddings.weight");
  EXPECT_EQ(e.data<float>()[49 * 16 + 3], wte.data<float>()[49 * 16 + 3]);
  EXPECT_EQ(e.data<float>()[50 * 16 + 3], 0.0f);
  auto j = ck::hf_config(c);
  j["vocab_size"] = 50257;
  EXPECT_EQ(ck::model_config_from_hf(j, 128).padded_vocab_size, 50304);
}

// The committed export equals today's export, and an independent PyTorch implementation of
// the HF architectures (check_hf_export.py) computed the committed logits from it.
TEST(HfGolden, MatchesPyTorchReference) {
  for (std::string fam : {"gpt", "llama", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(fam);
    const std::string dir = hf_golden(fam == "gpt" ? "gpt2" : fam);
    const std::string type = fam == "mistral" ? "mistral" : "";  // as golden_hf_export
    auto cfg = golden::golden_config(fam, DType::F32);
    model::GPTModel m(cfg);
    golden::perturb(m.params());

    // 1. Layout: tensors and config.json as committed.
    auto committed = ck::load_safetensors(dir + "/model.safetensors");
    auto now = ck::to_hf_tensors(cfg, m.params());
    ASSERT_EQ(committed.tensors.size(), now.size());
    for (const auto& [name, t] : now) EXPECT_TRUE(same_bytes(t, committed.at(name))) << name;
    EXPECT_EQ(ck::read_hf_config(dir), ck::hf_config(cfg, DType::F32, type));

    // 2. Logits: ours against the PyTorch reference ([S, B, V], f64).
    auto ours = ck::load_safetensors(dir + "/ours.safetensors");
    auto ref = ck::load_safetensors(dir + "/reference_logits.safetensors").at("logits");
    model::MicroBatch mb = golden::golden_batch();
    ASSERT_TRUE(same_bytes(mb.tokens, ours.at("tokens")));
    model::StepKeys keys;
    keys.training = false;
    m.forward(mb, keys);
    const Tensor& lg = m.logits();
    ASSERT_EQ(lg.numel(), ref.numel());
    double err = 0, scale = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) {
      err = std::max(err, std::abs(double(lg.data<float>()[i]) - ref.data<double>()[i]));
      scale = std::max(scale, std::abs(ref.data<double>()[i]));
    }
    EXPECT_LT(err / scale, 1e-5) << "max abs diff " << err;

    // 3. Import of the committed folder gives back the model and the exact weights.
    auto back = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
    EXPECT_EQ(back.qkv_bias(), cfg.qkv_bias());
    EXPECT_EQ(back.add_bias_linear, cfg.add_bias_linear);
    EXPECT_EQ(back.qk_layernorm, cfg.qk_layernorm);
    EXPECT_EQ(back.kv_channels, cfg.kv_channels);
    EXPECT_EQ(back.tie_embeddings, cfg.tie_embeddings);
    model::GPTModel b(cfg);
    ck::import_hf(dir, cfg, b.params());
    EXPECT_TRUE(same_bytes(b.params().flat_params(), m.params().flat_params()));
  }
}

}  // namespace hf_test
