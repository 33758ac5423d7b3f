// Llama 3.x RoPE scaling (and position interpolation, and YaRN) in megatron.cpp checkpoints:
// metadata.json records it (absent: off, so checkpoints from before it load as plain RoPE); a
// run whose scaling differs loads with a warning naming both, as a different rotary base does.
#include <gtest/gtest.h>

#include <string>
#include <utility>

#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;
using json = nlohmann::json;

namespace rope_scaling_ckpt_test {

model::TransformerConfig scaled_llama() {
  auto c = tiny_config("llama");
  c.rotary_base = 500000;
  c.rope_scaling = true, c.rope_scaling_factor = 32;
  c.rope_low_freq_factor = 2, c.rope_high_freq_factor = 8, c.rope_original_max_positions = 4096;
  return c;
}

// What check_model_compat writes to stderr.
std::string compat_warnings(const json& saved, const model::TransformerConfig& cur) {
  ::testing::internal::CaptureStderr();
  ck::check_model_compat(saved, cur, "ckpt", false);
  return ::testing::internal::GetCapturedStderr();
}


TEST(RopeScalingCheckpoint, MetadataRecordsTheScaling) {
  const auto c = scaled_llama();
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 4);
  const std::string dir = scratch_dir();
  ck::save_checkpoint(dir, m, nullptr, sample_state(3));
  const json md = ck::read_metadata(dir);
  EXPECT_EQ(md.at("model").at("rope_scaling"), json({{"factor", 32.0},
                                                     {"low_freq_factor", 2.0},
                                                     {"high_freq_factor", 8.0},
                                                     {"original_max_position_embeddings", 4096}}));
  const auto back = ck::model_config_from_metadata(md);
  EXPECT_TRUE(back.rope_scaling);
  EXPECT_EQ(back.rope_scaling_factor, 32.0);
  EXPECT_EQ(back.rope_low_freq_factor, 2.0);
  EXPECT_EQ(back.rope_high_freq_factor, 8.0);
  EXPECT_EQ(back.rope_original_max_positions, 4096);
  EXPECT_EQ(ck::model_config_json(back), ck::model_config_json(c));
  // A checkpoint written before the scaling existed has no field: plain RoPE.
  json old = md;
  old["model"].erase("rope_scaling");
  EXPECT_FALSE(ck::model_config_from_metadata(old).rope_scaling);
  // Unscaled models write no field (their metadata is as before).
  EXPECT_FALSE(ck::model_config_json(tiny_config("llama")).contains("rope_scaling"));
}

TEST(RopeScalingCheckpoint, ADifferentScalingLoadsWithAWarning) {
  const auto c = scaled_llama();
  const json saved = ck::model_config_json(c);
  EXPECT_EQ(compat_warnings(saved, c), "");
  auto other = c;
  other.rope_scaling_factor = 8;
  std::string w = compat_warnings(saved, other);
  EXPECT_NE(w.find("ckpt: rope_scaling differs (checkpoint {\"factor\":32.0,"), std::string::npos)
      << w;
  EXPECT_NE(w.find("this run {\"factor\":8.0,"), std::string::npos) << w;
  auto none = c;
  none.rope_scaling = false;
  w = compat_warnings(saved, none);
  EXPECT_NE(w.find("rope_scaling differs"), std::string::npos) << w;
  EXPECT_NE(w.find("this run off)"), std::string::npos) << w;
  // The other way: a plain checkpoint and a scaled run (extending a model's context).
  EXPECT_NE(compat_warnings(ck::model_config_json(none), c).find("(checkpoint off, this run"),
            std::string::npos);
}

// ---- linear position interpolation (--rotary-seq-len-interpolation-factor)

// metadata.json's model.rotary_seq_len_interpolation_factor: written when set (with or
// without Llama 3.x scaling), read back, absent = 1 (checkpoints from before it); a
// different factor loads with a warning, as a different scaling does.
TEST(RopeInterpolationCheckpoint, MetadataRecordsTheFactor) {
  for (const double f : {4.0, 2.5}) {
    SCOPED_TRACE(f);
    auto c = scaled_llama();
    c.rope_scaling = f == 4.0;  // both together, and interpolation alone
    c.seq_len_interpolation_factor = f;
    model::GPTModel m(c);
    fill_global(m.params(), m.params().flat_params(), 5);
    const std::string dir = scratch_dir();
    ck::save_checkpoint(dir, m, nullptr, sample_state(3));
    const json md = ck::read_metadata(dir);
    EXPECT_EQ(md.at("model").at("rotary_seq_len_interpolation_factor"), json(f));
    const auto back = ck::model_config_from_metadata(md);
    EXPECT_EQ(back.seq_len_interpolation_factor, f);
    EXPECT_EQ(back.rope_scaling, c.rope_scaling);
    EXPECT_EQ(ck::model_config_json(back), ck::model_config_json(c));
    json old = md;
    old["model"].erase("rotary_seq_len_interpolation_factor");
    EXPECT_EQ(ck::model_config_from_metadata(old).seq_len_interpolation_factor, 1.0);
    // Nonsense is refused, naming the field.
    for (const json bad : {json(0.0), json(-4.0), json("4")}) {
      json h = md;
      h["model"]["rotary_seq_len_interpolation_factor"] = bad;
      EXPECT_THROW(ck::model_config_from_metadata(h), Error) << bad.dump();
    }
  }
  EXPECT_FALSE(
      ck::model_config_json(tiny_config("llama")).contains("rotary_seq_len_interpolation_factor"));
}

TEST(RopeInterpolationCheckpoint, ADifferentFactorLoadsWithAWarning) {
  auto c = tiny_config("llama");
  c.seq_len_interpolation_factor = 4;
  const json saved = ck::model_config_json(c);
  EXPECT_EQ(compat_warnings(saved, c), "");
  auto more = c;
  more.seq_len_interpolation_factor = 8;  // stretching a checkpoint's context further
  EXPECT_NE(compat_warnings(saved, more)
                .find("ckpt: rotary_seq_len_interpolation_factor differs (checkpoint 4.0, this "
                      "run 8.0)"),
            std::string::npos);
  EXPECT_NE(compat_warnings(ck::model_config_json(tiny_config("llama")), c)
                .find("(checkpoint 1.0, this run 4.0)"),
            std::string::npos);
}

// ---- YaRN (--position-embedding-type yarn)

model::TransformerConfig yarn_llama() {
  auto c = tiny_config("llama");
  c.rotary_base = 1e6;
  c.yarn.on = true, c.yarn.factor = 4, c.yarn.original_max_positions = 16;
  c.yarn.beta_fast = 8, c.yarn.beta_slow = 2, c.yarn.round_to_int = false;
  c.yarn.mscale = 0.9, c.yarn.mscale_all_dim = 0.5;
  return c;
}

// metadata.json's model.yarn: every field written, read back, absent = off; nonsense
// refused naming the field; a different YaRN loads with a warning, as for rope_scaling.
TEST(YarnCheckpoint, MetadataRecordsIt) {
  const auto c = yarn_llama();
  model::GPTModel m(c);
  fill_global(m.params(), m.params().flat_params(), 6);
  const std::string dir = scratch_dir();
  ck::save_checkpoint(dir, m, nullptr, sample_state(3));
  const json md = ck::read_metadata(dir);
  EXPECT_EQ(md.at("model").at("yarn"), json({{"factor", 4.0},
                                             {"original_max_position_embeddings", 16},
                                             {"beta_fast", 8.0},
                                             {"beta_slow", 2.0},
                                             {"correction_range_round_to_int", false},
                                             {"mscale", 0.9},
                                             {"mscale_all_dim", 0.5}}));
  const auto back = ck::model_config_from_metadata(md);
  EXPECT_EQ(back.yarn, c.yarn);
  EXPECT_TRUE(back.rope);
  EXPECT_EQ(ck::model_config_json(back), ck::model_config_json(c));
  json old = md;
  old["model"].erase("yarn");
  EXPECT_FALSE(ck::model_config_from_metadata(old).yarn.on);
  EXPECT_FALSE(ck::model_config_json(tiny_config("llama")).contains("yarn"));
  for (const auto& [field, bad] :
       {std::pair<std::string, json>{"factor", 0.0}, {"beta_fast", -1.0}, {"beta_slow", "1"},
        {"original_max_position_embeddings", 0}, {"correction_range_round_to_int", 1.5}}) {
    json h = md;
    h["model"]["yarn"][field] = bad;
    EXPECT_THROW(ck::model_config_from_metadata(h), Error) << field << " " << bad.dump();
  }
  json noisy = md;
  noisy["model"]["yarn"].erase("beta_fast");
  EXPECT_THROW(ck::model_config_from_metadata(noisy), Error);
  json flat = md;
  flat["model"]["rope"] = false;  // YaRN on a learned-position model
  EXPECT_THROW(ck::model_config_from_metadata(flat), Error);
}

TEST(YarnCheckpoint, ADifferentYarnLoadsWithAWarning) {
  const auto c = yarn_llama();
  const json saved = ck::model_config_json(c);
  EXPECT_EQ(compat_warnings(saved, c), "");
  auto longer = c;
  longer.yarn.factor = 8;
  const std::string w = compat_warnings(saved, longer);
  EXPECT_NE(w.find("ckpt: yarn differs (checkpoint {"), std::string::npos) << w;
  EXPECT_NE(w.find("\"factor\":8.0"), std::string::npos) << w;
  auto plain = c;
  plain.yarn.on = false;
  EXPECT_NE(compat_warnings(saved, plain).find("this run off)"), std::string::npos);
}

}  // namespace rope_scaling_ckpt_test
