// The RoPE fields of a Hugging Face config.json (checkpoint/hf_rope.h): Llama 3.x scaling and
// linear position interpolation imported from transformers 4.x's rope_scaling (and its older
// "type" spelling) and 5.x's rope_parameters, exported in both, round trips of config and
// logits; other rope types, contradicting fields and a model with both (no one rope type says
// it) refused, naming the field or the flags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>

#include "../golden/golden_models.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;
using json = nlohmann::json;

namespace hf_rope_test {

// A tiny Llama 3.x config.json as transformers 4.x writes it. Head dim 8 (4 rotary pairs of
// wavelengths 6.3, 63, 628 and 6283 at theta 10000) and an original context of 64, so the
// scaling keeps pair 0 and divides pairs 1-3; factor, low and high other than Megatron's
// constants, to show they are kept as given.
json llama3_config() {
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", 64},
          {"hidden_size", 32},
          {"intermediate_size", 48},
          {"num_hidden_layers", 2},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"head_dim", 8},
          {"max_position_embeddings", 1024},
          {"rms_norm_eps", 1e-5},
          {"rope_theta", 10000.0},
          {"rope_scaling",
           {{"rope_type", "llama3"},
            {"factor", 16.0},
            {"low_freq_factor", 2.0},
            {"high_freq_factor", 8.0},
            {"original_max_position_embeddings", 64}}},
          {"tie_word_embeddings", false}};
}

// Exports a perturbed model of config c to Hugging Face and imports it back: the same config
// and bit-identical logits (checked here). Returns the largest |logit| difference from the
// same weights read into `plain` (c without its RoPE change), which the change must make
// large.
double hf_round_trip_logit_change(const model::TransformerConfig& c,
                                  const model::TransformerConfig& plain) {
  model::GPTModel a(c);
  golden::perturb(a.params());
  const std::string dir = scratch_dir() + "/hf";
  ck::export_hf(dir, c, a.params());
  auto back = ck::model_config_from_hf(ck::read_hf_config(dir), 1);
  back.seq_length = c.seq_length;
  EXPECT_EQ(ck::model_config_json(back), ck::model_config_json(c));
  model::GPTModel b(back);
  ck::import_hf(dir, back, b.params());
  model::StepKeys keys;
  keys.training = false;
  const model::MicroBatch mb = golden::golden_batch();
  a.forward(mb, keys);
  b.forward(mb, keys);
  EXPECT_TRUE(same_bytes(a.logits(), b.logits()));
  model::GPTModel p(plain);
  ck::import_hf(dir, plain, p.params());
  p.forward(mb, keys);
  double d = 0;
  for (int64_t i = 0; i < a.logits().numel(); ++i)
    d = std::max(d, double(std::abs(a.logits().data<float>()[i] - p.logits().data<float>()[i])));
  return d;
}


TEST(HfRope, ImportsLlama3ScalingFromTransformers4) {
  const auto c = ck::model_config_from_hf(llama3_config(), 1);
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rotary_base, 10000.0);
  EXPECT_EQ(c.rope_scaling_factor, 16.0);
  EXPECT_EQ(c.rope_low_freq_factor, 2.0);
  EXPECT_EQ(c.rope_high_freq_factor, 8.0);
  EXPECT_EQ(c.rope_original_max_positions, 64);
  // transformers before 4.43 named the rope type "type": the same config.
  json old = llama3_config();
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "llama3";
  EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(old, 1)), ck::model_config_json(c));
  // A plain Llama (rope_scaling null, or of rope_type "default") has none.
  json plain = llama3_config();
  plain["rope_scaling"] = nullptr;
  EXPECT_FALSE(ck::model_config_from_hf(plain, 1).rope_scaling);
  plain["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(ck::model_config_from_hf(plain, 1).rope_scaling);
}

TEST(HfRope, ImportsLlama3ScalingFromTransformers5) {
  const auto c4 = ck::model_config_from_hf(llama3_config(), 1);
  json j = llama3_config();
  json rp = j["rope_scaling"];
  rp["rope_theta"] = 10000.0;
  j.erase("rope_scaling"), j.erase("rope_theta");
  j["rope_parameters"] = rp;
  EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j, 1)), ck::model_config_json(c4));
  j["rope_parameters"] = {{"full_attention", rp}};  // one set per layer type
  EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j, 1)), ck::model_config_json(c4));
}

TEST(HfRope, ExportWritesBothSpellingsAndRoundTrips) {
  auto c = ck::model_config_from_hf(llama3_config(), 1);
  c.seq_length = golden::kGoldenS;
  const json out = ck::hf_config(c);
  const json want = {{"rope_type", "llama3"},
                     {"factor", 16.0},
                     {"low_freq_factor", 2.0},
                     {"high_freq_factor", 8.0},
                     {"original_max_position_embeddings", 64}};
  EXPECT_EQ(out.at("rope_scaling"), want);
  json want5 = want;
  want5["rope_theta"] = 10000.0;
  EXPECT_EQ(out.at("rope_parameters"), want5);
  EXPECT_EQ(out.at("rope_theta"), 10000.0);
  // Without scaling the Llama config.json is as before: rope_scaling null, no rope_parameters.
  auto plain = c;
  plain.rope_scaling = false;
  EXPECT_TRUE(ck::hf_config(plain).at("rope_scaling").is_null());
  EXPECT_FALSE(ck::hf_config(plain).contains("rope_parameters"));

  // import -> export -> import: the same config and the same logits, which the scaling
  // changes (pairs 1-3 turn 16 times slower).
  EXPECT_GT(hf_round_trip_logit_change(c, plain), 1e-3) << "the scaling should change the logits";
}

TEST(HfRope, RefusesOtherRopeTypesNamingTheField) {
  for (const char* rt : {"dynamic", "yarn", "longrope"}) {
    json j = llama3_config();
    j["rope_scaling"]["rope_type"] = rt;
    const std::string e = error_of([&] { ck::model_config_from_hf(j, 1); });
    EXPECT_NE(e.find(std::string("rope_scaling.rope_type '") + rt + "'"), std::string::npos) << e;
    json k = llama3_config();
    k.erase("rope_scaling");
    k["rope_parameters"] = {{"rope_type", rt}, {"rope_theta", 1e4}, {"factor", 4.0}};
    const std::string e5 = error_of([&] { ck::model_config_from_hf(k, 1); });
    EXPECT_NE(e5.find(std::string("rope_parameters.rope_type '") + rt + "'"), std::string::npos)
        << e5;
  }
  auto bad = [](const char* key, json v) {
    json j = llama3_config();
    if (v.is_null())
      j["rope_scaling"].erase(key);
    else
      j["rope_scaling"][key] = v;
    return error_of([&] { ck::model_config_from_hf(j, 1); });
  };
  EXPECT_NE(bad("factor", nullptr).find("lacks 'factor'"), std::string::npos);
  EXPECT_NE(bad("original_max_position_embeddings", nullptr)
                .find("lacks 'original_max_position_embeddings'"),
            std::string::npos);
  EXPECT_NE(bad("factor", 0.0).find("rope_scaling.factor"), std::string::npos);
  EXPECT_NE(bad("low_freq_factor", 8.0).find("is not below high_freq_factor"), std::string::npos);
  EXPECT_NE(bad("original_max_position_embeddings", 64.5).find("expected a positive integer"),
            std::string::npos);
  // rope_scaling and rope_parameters must say the same.
  json j = llama3_config();
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e4}};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("disagree on the RoPE scaling"),
            std::string::npos);
}

// ---- linear position interpolation: rope_type "linear", transformers' inv_freq / factor


json linear_config(double factor) {
  json j = llama3_config();
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", factor}};
  return j;
}


TEST(HfRope, ImportsLinearInterpolationInEverySpelling) {
  for (const double f : {4.0, 2.5}) {  // a fractional factor imports as it is
    SCOPED_TRACE(f);
    const auto c = ck::model_config_from_hf(linear_config(f), 1);
    EXPECT_EQ(c.seq_len_interpolation_factor, f);
    EXPECT_FALSE(c.rope_scaling);
    EXPECT_EQ(c.rotary_base, 10000.0);
    json old = linear_config(f);  // transformers before 4.43: "type"
    old["rope_scaling"].erase("rope_type");
    old["rope_scaling"]["type"] = "linear";
    EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(old, 1)), ck::model_config_json(c));
    json j5 = linear_config(f);  // transformers 5: rope_parameters, one set or one per type
    json rp = j5["rope_scaling"];
    rp["rope_theta"] = 10000.0;
    j5.erase("rope_scaling"), j5.erase("rope_theta");
    j5["rope_parameters"] = rp;
    EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j5, 1)), ck::model_config_json(c));
    j5["rope_parameters"] = {{"full_attention", rp}};
    EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j5, 1)), ck::model_config_json(c));
  }
  // A missing or bad factor, and rope_parameters saying otherwise, are refused.
  json j = linear_config(4);
  j["rope_scaling"].erase("factor");
  EXPECT_NE(error_of([&] {
              ck::model_config_from_hf(j, 1);
            }).find("rope_scaling (rope_type 'linear') lacks 'factor'"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              ck::model_config_from_hf(linear_config(0), 1);
            }).find("'rope_scaling.factor' is 0.0, expected a positive number"),
            std::string::npos);
  j = linear_config(4);
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 2.0}, {"rope_theta", 1e4}};
  EXPECT_NE(error_of([&] { ck::model_config_from_hf(j, 1); }).find("disagree on the RoPE scaling"),
            std::string::npos);
}

TEST(HfRope, ExportsLinearInterpolationAndRoundTrips) {
  auto c = ck::model_config_from_hf(linear_config(2.5), 1);
  c.seq_length = golden::kGoldenS;
  const json out = ck::hf_config(c);
  EXPECT_EQ(out.at("rope_scaling"), json({{"rope_type", "linear"}, {"factor", 2.5}}));
  EXPECT_EQ(out.at("rope_parameters"),
            json({{"rope_type", "linear"}, {"factor", 2.5}, {"rope_theta", 10000.0}}));
  // import -> export -> import: the same config and logits; interpolation changes them.
  auto plain = c;
  plain.seq_len_interpolation_factor = 1;
  EXPECT_GT(hf_round_trip_logit_change(c, plain), 1e-3)
      << "the interpolation should change the logits";
}

TEST(HfRope, ExportRefusesScalingWithInterpolation) {
  auto c = ck::model_config_from_hf(llama3_config(), 1);
  c.seq_len_interpolation_factor = 4;
  const std::string e = error_of([&] { ck::hf_config(c); });
  EXPECT_NE(e.find("both Llama 3.x RoPE scaling (--use-rope-scaling, factor 16)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("linear position interpolation (--rotary-seq-len-interpolation-factor 4)"),
            std::string::npos)
      << e;
  // Refused before any file is written.
  const std::string dir = scratch_dir() + "/hf";
  model::GPTModel m(c);
  EXPECT_THROW(ck::export_hf(dir, c, m.params()), Error);
  EXPECT_FALSE(std::filesystem::exists(dir));
}

}  // namespace hf_rope_test
