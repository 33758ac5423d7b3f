// Hugging Face exchange: round trips, config mapping, and the golden fixtures of
// tests/golden/hf (check_hf_export.py: an independent PyTorch GPT-2 / Llama forward on our
// export agreed with our logits; its reference logits are committed).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "../golden/golden_models.h"
#include "checkpoint/fs.h"
#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;

namespace {

std::string hf_golden(const std::string& fam) {
  return std::string(MCPP_SOURCE_DIR) + "/tests/golden/hf/" + fam;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void round_trip(model::TransformerConfig c) {
  model::GPTModel a(c);
  fill_global(a.params(), a.params().flat_params(), 3);
  const std::string dir = scratch_dir() + "/hf";
  ck::export_hf(dir, c, a.params());
  auto back_cfg = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
  for (auto k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                 "num_query_groups", "kv_channels", "padded_vocab_size", "rope", "rmsnorm",
                 "swiglu", "tie_embeddings", "add_bias_linear", "norm_epsilon", "rotary_base"})
    EXPECT_EQ(ck::model_config_json(back_cfg)[k], ck::model_config_json(c)[k]) << k;
  back_cfg.dtype = c.dtype, back_cfg.seq_length = c.seq_length;
  model::GPTModel b(back_cfg);
  ck::import_hf(dir, back_cfg, b.params());
  EXPECT_TRUE(same_bytes(a.params().flat_params(), b.params().flat_params()));
}

}  // namespace

TEST(HfExport, RoundTripGpt2) { round_trip(tiny_config("gpt")); }
TEST(HfExport, RoundTripLlamaGqa) { round_trip(tiny_config("llama")); }
TEST(HfExport, RoundTripLlamaTiedWithBiases) {
  auto c = tiny_config("llama");
  c.tie_embeddings = true, c.add_bias_linear = true, c.rotary_base = 500000;
  round_trip(c);
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
  EXPECT_THROW(ck::model_config_from_hf({{"model_type", "bert"}}), Error);
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
  for (std::string fam : {"gpt", "llama"}) {
    SCOPED_TRACE(fam);
    const std::string dir = hf_golden(fam == "gpt" ? "gpt2" : "llama");
    auto cfg = golden::golden_config(fam, DType::F32);
    model::GPTModel m(cfg);
    golden::perturb(m.params());

    // 1. Layout: tensors and config.json as committed.
    auto committed = ck::load_safetensors(dir + "/model.safetensors");
    auto now = ck::to_hf_tensors(cfg, m.params());
    ASSERT_EQ(committed.tensors.size(), now.size());
    for (const auto& [name, t] : now) EXPECT_TRUE(same_bytes(t, committed.at(name))) << name;
    EXPECT_EQ(ck::read_hf_config(dir), ck::hf_config(cfg));

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

    // 3. Import of the committed folder gives back the exact weights.
    model::GPTModel b(cfg);
    ck::import_hf(dir, cfg, b.params());
    EXPECT_TRUE(same_bytes(b.params().flat_params(), m.params().flat_params()));
  }
}
