// The RoPE fields of a Hugging Face config.json (checkpoint/hf_rope.h): Llama 3.x scaling,
// linear position interpolation and YaRN imported from transformers 4.x's rope_scaling (and
// its older "type" spelling) and 5.x's rope_parameters, exported in both, round trips of config
// and logits; YaRN's numbers against transformers' formulas; other rope types, contradicting
// fields and a model with both Llama 3.x scaling and interpolation (no one rope type says it)
// refused, naming the field or the flags.
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
#include "ops/rope_math.h"

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

// partial_rotary_factor below 1 would rotate part of each head in transformers' rope
// initialisers; the import rotates whole heads, so any rope type with it is refused naming
// the field (at the top level, 4.x's place, or in a 5.x set); 1 is accepted.
TEST(HfRope, PartialRotaryFactorIsRefusedForEveryRopeType) {
  json plain = llama3_config();
  plain.erase("rope_scaling");
  plain["partial_rotary_factor"] = 0.5;
  std::string e = error_of([&] { ck::model_config_from_hf(plain, 1); });
  EXPECT_NE(e.find("'partial_rotary_factor' is 0.5 with rope_type 'default'"), std::string::npos)
      << e;
  json scaled = llama3_config();
  scaled["partial_rotary_factor"] = 0.25;
  e = error_of([&] { ck::model_config_from_hf(scaled, 1); });
  EXPECT_NE(e.find("'partial_rotary_factor' is 0.25 with rope_type 'llama3'"), std::string::npos)
      << e;
  json five = llama3_config();
  five.erase("rope_scaling");
  five["rope_parameters"] = {
      {"rope_type", "linear"}, {"rope_theta", 1e4}, {"factor", 2.0}, {"partial_rotary_factor", 0.5}};
  e = error_of([&] { ck::model_config_from_hf(five, 1); });
  EXPECT_NE(e.find("'rope_parameters.partial_rotary_factor' is 0.5 with rope_type 'linear'"),
            std::string::npos)
      << e;
  plain["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(ck::model_config_from_hf(plain, 1).rotary_percent, 1.0);
}

TEST(HfRope, RefusesOtherRopeTypesNamingTheField) {
  for (const char* rt : {"dynamic", "longrope"}) {
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

// ---- YaRN: rope_type "yarn", transformers' _compute_yarn_parameters

// The tiny Llama of llama3_config() with YaRN as transformers 4.x writes it: factor 16 over an
// original context of 64 (max_position_embeddings 1024 = 16 x 64, so transformers does not
// warn), betas other than the defaults to show they are kept, and DeepSeek-style mscales.
json yarn_config() {
  json j = llama3_config();
  j["rope_scaling"] = {
      {"rope_type", "yarn"},  {"factor", 16.0},   {"original_max_position_embeddings", 64},
      {"beta_fast", 8.0},     {"beta_slow", 0.5}, {"mscale", 0.707},
      {"mscale_all_dim", 1.0}};
  return j;
}

// config.json j with one field of its rope_scaling set (null: removed).
json with_scaling(json j, const char* key, const json& v) {
  if (v.is_null())
    j["rope_scaling"].erase(key);
  else
    j["rope_scaling"][key] = v;
  return j;
}

model::TransformerConfig::Yarn yarn_of(const json& j) {
  return ck::model_config_from_hf(j, 1).yarn;
}

double concentration(const model::TransformerConfig::Yarn& y) {
  return ops::yarn_concentration(y.factor, y.mscale, y.mscale_all_dim);
}

// The 5.x spelling of a 4.x config.json: rope_parameters with rope_theta, one object or
// (per_layer) one set for full_attention.
json transformers5(json j, bool per_layer) {
  json rp = j["rope_scaling"];
  rp["rope_theta"] = j["rope_theta"];
  j.erase("rope_scaling"), j.erase("rope_theta");
  j["rope_parameters"] = per_layer ? json{{"full_attention", rp}} : rp;
  return j;
}

TEST(HfRope, ImportsYarnFromTransformers4) {
  const auto c = ck::model_config_from_hf(yarn_config(), 1);
  EXPECT_TRUE(c.yarn.on);
  EXPECT_TRUE(c.rope);
  EXPECT_FALSE(c.rope_scaling);
  EXPECT_EQ(c.seq_len_interpolation_factor, 1.0);
  EXPECT_EQ(c.rotary_base, 10000.0);
  EXPECT_EQ(c.yarn.factor, 16.0);
  EXPECT_EQ(c.yarn.original_max_positions, 64);
  EXPECT_EQ(c.yarn.beta_fast, 8.0);
  EXPECT_EQ(c.yarn.beta_slow, 0.5);
  EXPECT_TRUE(c.yarn.round_to_int);
  EXPECT_EQ(c.yarn.mscale, 0.707);  // both non-zero: transformers uses the pair as it is
  EXPECT_EQ(c.yarn.mscale_all_dim, 1.0);
  // transformers before 4.43 (and DeepSeek-V3's config.json) name the rope type "type".
  json old = yarn_config();
  old["rope_scaling"].erase("rope_type");
  old["rope_scaling"]["type"] = "yarn";
  EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(old, 1)), ck::model_config_json(c));
  // truncate false turns the correction range's rounding off.
  EXPECT_FALSE(yarn_of(with_scaling(yarn_config(), "truncate", false)).round_to_int);
  EXPECT_TRUE(yarn_of(with_scaling(yarn_config(), "truncate", true)).round_to_int);
}

TEST(HfRope, ImportsYarnFromTransformers5) {
  const auto c4 = ck::model_config_from_hf(yarn_config(), 1);
  for (const bool per_layer : {false, true}) {
    SCOPED_TRACE(per_layer);
    const json j = transformers5(yarn_config(), per_layer);
    EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j, 1)), ck::model_config_json(c4));
  }
  // One object may turn truncation off (transformers reads truncate there).
  json j = transformers5(with_scaling(yarn_config(), "truncate", false), false);
  EXPECT_FALSE(ck::model_config_from_hf(j, 1).yarn.round_to_int);
  // Both spellings at once, saying the same (as export writes them).
  j = yarn_config();
  j["rope_parameters"] = transformers5(yarn_config(), false)["rope_parameters"];
  EXPECT_EQ(ck::model_config_json(ck::model_config_from_hf(j, 1)), ck::model_config_json(c4));
}

TEST(HfRope, ImportsYarnDefaults) {
  json j = llama3_config();
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  const auto y = yarn_of(j);
  EXPECT_TRUE(y.on);
  EXPECT_EQ(y.factor, 4.0);
  EXPECT_EQ(y.original_max_positions, 1024);  // max_position_embeddings
  EXPECT_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_TRUE(y.round_to_int);
  EXPECT_EQ(y.mscale, 1.0);  // attention factor get_mscale(4) = 0.1 ln 4 + 1
  EXPECT_EQ(y.mscale_all_dim, 0.0);
  EXPECT_DOUBLE_EQ(concentration(y), 0.1 * std::log(4.0) + 1);
  // transformers' `beta or default`: null and 0 are the defaults too.
  for (const json& v : {json(nullptr), json(0), json(0.0)}) {
    json k = j;
    k["rope_scaling"]["beta_fast"] = v, k["rope_scaling"]["beta_slow"] = v;
    EXPECT_EQ(yarn_of(k), y) << v.dump();
  }
  // A top-level original_max_position_embeddings (Phi-3's place) that agrees is accepted.
  json k = j;
  k["original_max_position_embeddings"] = 1024;
  EXPECT_EQ(yarn_of(k), y);
  k = yarn_config();
  k["original_max_position_embeddings"] = 64;
  EXPECT_EQ(yarn_of(k), yarn_of(yarn_config()));
  // partial_rotary_factor 1 is the whole head, as ours.
  k = yarn_config();
  k["partial_rotary_factor"] = 1.0;
  EXPECT_EQ(yarn_of(k), yarn_of(yarn_config()));
  // A factor that is not max_position_embeddings / original (1024 / 128 = 8): transformers
  // uses the factor as given (and warns), so do we.
  k = with_scaling(yarn_config(), "original_max_position_embeddings", 128);
  EXPECT_EQ(yarn_of(k).factor, 16.0);
  EXPECT_EQ(yarn_of(k).original_max_positions, 128);
}

TEST(HfRope, YarnAttentionFactorFollowsTransformersRule) {
  const double dflt = 0.1 * std::log(16.0) + 1;  // get_mscale(16)
  // Without attention_factor transformers uses mscale / mscale_all_dim only when both are
  // non-zero, else get_mscale(factor): ours is then mscale 1, mscale_all_dim 0.
  struct Case {
    json mscale, mscale_all_dim;
    double want_mscale, want_all_dim, want_concentration;
  };
  const double pair = (0.1 * 0.707 * std::log(16.0) + 1) / (0.1 * std::log(16.0) + 1);
  for (const Case& k :
       {Case{0.707, nullptr, 1, 0, dflt}, Case{nullptr, 1.0, 1, 0, dflt},
        Case{0.707, 0.0, 1, 0, dflt}, Case{0, 1.0, 1, 0, dflt}, Case{nullptr, nullptr, 1, 0, dflt},
        Case{0.707, 1.0, 0.707, 1, pair}, Case{1.0, 1.0, 1, 1, 1.0}}) {
    SCOPED_TRACE(k.mscale.dump() + " " + k.mscale_all_dim.dump());
    const auto y = yarn_of(with_scaling(with_scaling(yarn_config(), "mscale", k.mscale),
                                        "mscale_all_dim", k.mscale_all_dim));
    EXPECT_EQ(y.mscale, k.want_mscale);
    EXPECT_EQ(y.mscale_all_dim, k.want_all_dim);
    EXPECT_NEAR(concentration(y), k.want_concentration, 1e-15);
  }
  // At factor <= 1 the concentration is 1 whatever the mscales: the file's pair is kept.
  json j = with_scaling(with_scaling(yarn_config(), "factor", 1.0), "mscale_all_dim", nullptr);
  const auto y = yarn_of(j);
  EXPECT_EQ(y.mscale, 0.707);
  EXPECT_EQ(concentration(y), 1.0);
}

TEST(HfRope, YarnExplicitAttentionFactor) {
  // attention_factor wins over the mscales; ours: mscale_all_dim 0 and the mscale that gives it.
  for (const json& ms : {json(nullptr), json(0.707)}) {
    SCOPED_TRACE(ms.dump());
    const auto y =
        yarn_of(with_scaling(with_scaling(yarn_config(), "mscale", ms), "attention_factor", 1.5));
    EXPECT_EQ(y.mscale_all_dim, 0.0);
    EXPECT_NEAR(y.mscale, 0.5 / (0.1 * std::log(16.0)), 1e-12);
    EXPECT_NEAR(concentration(y), 1.5, 1.5e-12);
  }
  // One the file's mscales (or the default rule) reproduce keeps them exactly.
  const double pair = (0.1 * 0.707 * std::log(16.0) + 1) / (0.1 * std::log(16.0) + 1);
  auto y = yarn_of(with_scaling(yarn_config(), "attention_factor", pair));
  EXPECT_EQ(y.mscale, 0.707);
  EXPECT_EQ(y.mscale_all_dim, 1.0);
  json j = with_scaling(with_scaling(yarn_config(), "mscale", nullptr), "mscale_all_dim", nullptr);
  y = yarn_of(with_scaling(j, "attention_factor", 0.1 * std::log(16.0) + 1));
  EXPECT_EQ(y.mscale, 1.0);
  EXPECT_EQ(y.mscale_all_dim, 0.0);
  // An integer attention factor of 1 at factor 1 is the concentration there.
  y = yarn_of(with_scaling(with_scaling(j, "factor", 1.0), "attention_factor", 1));
  EXPECT_EQ(concentration(y), 1.0);
  // Any other at factor <= 1 is not (the concentration is 1 there), nor a non-positive or
  // non-numeric one, nor one whose mscale overflows; each error names the field.
  auto err = [&](const json& factor, const json& a) {
    return error_of(
        [&] { yarn_of(with_scaling(with_scaling(j, "factor", factor), "attention_factor", a)); });
  };
  EXPECT_NE(err(1.0, 1.2).find("'rope_scaling.attention_factor' is 1.2 with factor 1"),
            std::string::npos)
      << err(1.0, 1.2);
  EXPECT_NE(err(0.5, 2.0).find("'rope_scaling.attention_factor' is 2 with factor 0.5"),
            std::string::npos)
      << err(0.5, 2.0);
  for (const json& a : {json(0.0), json(-1.0), json("1.5")})
    EXPECT_NE(err(16.0, a).find("'rope_scaling.attention_factor' is " + a.dump() +
                                ", expected a positive number"),
              std::string::npos)
        << err(16.0, a);
  EXPECT_NE(err(1.0001, 1e305)
                .find("'rope_scaling.attention_factor' 1e+305 cannot be "
                      "represented as --mscale"),
            std::string::npos)
      << err(1.0001, 1e305);
}

TEST(HfRope, YarnRefusesBadFieldsNamingThem) {
  auto bad = [](const json& j) { return error_of([&] { ck::model_config_from_hf(j, 1); }); };
  auto has = [&](const json& j, const std::string& text) {
    const std::string e = bad(j);
    EXPECT_NE(e.find(text), std::string::npos) << "want: " << text << "\ngot: " << e;
  };
  const json y = yarn_config();
  has(with_scaling(y, "factor", nullptr), "rope_scaling (rope_type 'yarn') lacks 'factor'");
  has(transformers5(with_scaling(y, "factor", nullptr), true),
      "rope_parameters.full_attention (rope_type 'yarn') lacks 'factor'");
  has(with_scaling(y, "factor", 0.0), "'rope_scaling.factor' is 0.0, expected a positive");
  has(with_scaling(y, "factor", "16"), "'rope_scaling.factor' is \"16\", expected a positive");
  has(with_scaling(y, "beta_fast", "fast"), "'rope_scaling.beta_fast' is \"fast\", expected");
  has(with_scaling(y, "beta_fast", -32.0), "'rope_scaling.beta_fast' is -32.0, expected");
  has(with_scaling(y, "beta_slow", -1), "'rope_scaling.beta_slow' is -1, expected");
  has(with_scaling(y, "original_max_position_embeddings", 64.5),
      "'rope_scaling.original_max_position_embeddings' is 64.5, expected a positive integer");
  has(with_scaling(y, "original_max_position_embeddings", 0),
      "'rope_scaling.original_max_position_embeddings' is 0, expected a positive integer");
  has(with_scaling(y, "truncate", "yes"), "'rope_scaling.truncate' is \"yes\", expected true");
  json k = y;
  k["rope_scaling"]["truncate"] = nullptr;  // transformers would read it as false
  has(k, "'rope_scaling.truncate' is null, expected true or false");
  has(with_scaling(y, "mscale", "big"), "'rope_scaling.mscale' is \"big\", expected a number");
  has(with_scaling(y, "mscale_all_dim", true),
      "'rope_scaling.mscale_all_dim' is true, expected a number");
  // mscale -100 with mscale_all_dim 1: transformers' attention factor would be negative.
  has(with_scaling(y, "mscale", -100.0),
      "rope_scaling.mscale -100 and mscale_all_dim 1 give the attention factor");
  // transformers' yarn rotates head_dim x partial_rotary_factor dims; ours the whole head.
  k = y;
  k["partial_rotary_factor"] = 0.5;
  has(k, "'partial_rotary_factor' is 0.5 with rope_type 'yarn'");
  k = transformers5(y, false);
  k["rope_parameters"]["partial_rotary_factor"] = 0.25;
  has(k, "'rope_parameters.partial_rotary_factor' is 0.25 with rope_type 'yarn'");
  // A top-level original context that is not the one the set (or max_position_embeddings)
  // gives: transformers releases differ in which they take.
  k = y;
  k["original_max_position_embeddings"] = 128;
  has(k,
      "'original_max_position_embeddings' 128 and "
      "'rope_scaling.original_max_position_embeddings' 64 disagree");
  k = with_scaling(y, "original_max_position_embeddings", nullptr);
  k["original_max_position_embeddings"] = 64;
  has(k, "'original_max_position_embeddings' 64 and 'max_position_embeddings' 1024 disagree");
  // transformers 5 ignores truncate in a per-layer-type set.
  has(transformers5(with_scaling(y, "truncate", false), true),
      "rope_parameters.full_attention.truncate is false, which transformers ignores");
  // rope_scaling and rope_parameters must say the same.
  k = y;
  k["rope_parameters"] =
      transformers5(with_scaling(y, "beta_fast", 16.0), false)["rope_parameters"];
  has(k, "rope_scaling and rope_parameters disagree on the RoPE scaling");
}

TEST(HfRope, ExportsYarnAndRoundTrips) {
  auto c = ck::model_config_from_hf(with_scaling(yarn_config(), "truncate", false), 1);
  c.seq_length = golden::kGoldenS;
  const json out = ck::hf_config(c);
  const double a = ops::yarn_concentration(16, 0.707, 1.0);
  const json want = {
      {"rope_type", "yarn"},   {"factor", 16.0},   {"original_max_position_embeddings", 64},
      {"beta_fast", 8.0},      {"beta_slow", 0.5}, {"truncate", false},
      {"attention_factor", a}, {"mscale", 0.707},  {"mscale_all_dim", 1.0}};
  EXPECT_EQ(out.at("rope_scaling"), want);
  json want5 = want;
  want5["rope_theta"] = 10000.0;
  EXPECT_EQ(out.at("rope_parameters"), want5);
  EXPECT_EQ(out.at("rope_theta"), 10000.0);
  // The attention factor written is transformers' number for these mscales (Python:
  // (0.1*0.707*math.log(16)+1)/(0.1*1.0*math.log(16)+1)).
  EXPECT_NEAR(out["rope_scaling"]["attention_factor"].get<double>(), 0.9363975061530204, 1e-15);

  // import(export(c)) == c for the config, for every kind of mscale pair: transformers' rule
  // expresses (m, 1), (1, 0) and any pair at factor <= 1 exactly, and mscale_all_dim 0 with
  // mscale m gives the same concentration.
  struct Pair {
    double factor, mscale, all_dim;
    bool written;  // mscale and mscale_all_dim in the file
  };
  for (const Pair& p : {Pair{16, 0.707, 1.0, true}, Pair{16, 1, 0, true}, Pair{16, 1, 1, true},
                        Pair{16, 0, 0, false}, Pair{16, 0.707, 0, false}, Pair{16, 0, 1.0, false},
                        Pair{0.5, 0.707, 0, true}}) {
    SCOPED_TRACE(fmt::format("factor {} mscale {} all_dim {}", p.factor, p.mscale, p.all_dim));
    auto d = c;
    d.yarn.factor = p.factor, d.yarn.mscale = p.mscale, d.yarn.mscale_all_dim = p.all_dim;
    const json o = ck::hf_config(d);
    EXPECT_EQ(o["rope_scaling"].contains("mscale"), p.written);
    EXPECT_EQ(o["rope_scaling"].contains("mscale_all_dim"), p.written);
    const auto back = ck::model_config_from_hf(o, 1);
    const double want_a = concentration(d.yarn);
    EXPECT_NEAR(concentration(back.yarn), want_a, 1e-12 * want_a);
    auto b = back.yarn, e = d.yarn;
    if (!p.written && p.all_dim != 0) {
      // (0, m') is refused by transformers' rule: it comes back as (a - 1) / (0.1 ln f), 0.
      EXPECT_EQ(b.mscale_all_dim, 0.0);
      b.mscale = e.mscale, b.mscale_all_dim = e.mscale_all_dim;
    } else if (!p.written) {
      EXPECT_NEAR(b.mscale, e.mscale, 1e-12);  // derived from attention_factor: to rounding
      b.mscale = e.mscale;
    }
    EXPECT_EQ(b, e);
  }

  // import -> export -> import: the same config and the same logits, which YaRN changes
  // (pairs 1-3 of the tiny head interpolated, cos and sin scaled).
  auto plain = c;
  plain.yarn = {};
  EXPECT_GT(hf_round_trip_logit_change(c, plain), 1e-3) << "YaRN should change the logits";
}

TEST(HfRope, YarnMatchesTransformersNumbers) {
  // Reference values from transformers' _compute_yarn_parameters evaluated by hand in Python 3
  // doubles (math module only; not fp32 as transformers runs it): corr(r) = dim *
  // log(L / (r * 2 * pi)) / (2 * log(base)); low, high = corr(beta_fast), corr(beta_slow),
  // floor/ceil when truncate, clamped to [0, dim - 1] (+0.001 if equal); pos = base ** (2i /
  // dim); ramp = clamp((i - low) / (high - low), 0, 1); inv_freq = (1 / (factor * pos)) * ramp
  // + (1 / pos) * (1 - ramp); attention factor get_mscale(factor, mscale) /
  // get_mscale(factor, mscale_all_dim) with get_mscale(s, m) = 0.1 * m * log(s) + 1 for s > 1.
  auto check = [](const json& j, const std::vector<std::pair<int64_t, double>>& want,
                  double want_attention) {
    const auto c = ck::model_config_from_hf(j, 1);
    ASSERT_TRUE(c.yarn.on);
    const auto& y = c.yarn;
    for (const auto& [i, v] : want)
      EXPECT_NEAR(ops::yarn_inv_freq(c.rotary_base, y.factor, y.original_max_positions, y.beta_fast,
                                     y.beta_slow, y.round_to_int, i, c.kv_channels),
                  v, 1e-13 * v)
          << "pair " << i;
    EXPECT_NEAR(concentration(y), want_attention, 1e-14);
  };
  // The tiny head (dim 8, base 1e4), factor 16 over 64, defaults otherwise: low 0, high 2.
  json j = llama3_config();
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 16.0}, {"original_max_position_embeddings", 64}};
  check(j, {{0, 1.0}, {1, 0.053125000000000006}, {2, 0.000625}, {3, 6.25e-05}}, 1.2772588722239782);
  // The same with betas 8 and 0.5 and truncate false: low 0.1049, high 1.3090.
  j["rope_scaling"]["beta_fast"] = 8, j["rope_scaling"]["beta_slow"] = 0.5;
  j["rope_scaling"]["truncate"] = false;
  check(j, {{0, 1.0}, {1, 0.030310369741569965}, {2, 0.000625}, {3, 6.25e-05}}, 1.2772588722239782);
  // DeepSeek-V3's RoPE numbers (5.x spelling): dim 64, factor 40 over 4096, mscale 0.707 and
  // mscale_all_dim 1, max_position_embeddings 163840 = 40 x 4096; truncate false (low 10.47,
  // high 22.51).
  j = llama3_config();
  j.erase("rope_scaling"), j.erase("rope_theta");
  j["head_dim"] = 64, j["max_position_embeddings"] = 163840;
  j["rope_parameters"] = {
      {"rope_type", "yarn"}, {"rope_theta", 10000.0}, {"factor", 40},
      {"mscale", 0.707},     {"mscale_all_dim", 1.0}, {"beta_fast", 32},
      {"beta_slow", 1},      {"truncate", false},     {"original_max_position_embeddings", 4096}};
  check(j,
        {{0, 1.0},
         {5, 0.23713737056616555},
         {10, 0.056234132519034905},
         {11, 0.04036758449441141},
         {12, 0.02771085847508042},
         {15, 0.008446235311291834},
         {20, 0.0007226383418941806},
         {25, 1.8747355233311396e-05},
         {31, 3.33380358040831e-06}},
        0.9210423553163399);
}

}  // namespace hf_rope_test
