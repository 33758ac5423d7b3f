// --dist-ckpt-strictness (checkpoint/strictness.h): a Llama-style checkpoint (no biases)
// loaded by a model with --add-qkv-bias (two unexpected keys, linear_qkv.bias of each layer)
// and the reverse (two missing keys), in every mode, under TP 1 and 2, through load_checkpoint
// and the trainer's load_training_checkpoint; buffers on one side; a shape that differs is an
// error in every mode.
#include <gtest/gtest.h>

#include <memory>

#include "checkpoint/training_checkpoint.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;
using ck::Strictness;

namespace strictness_test {

constexpr uint64_t kSaved = 51, kBefore = 61;  // moments: salt + 1, salt + 2

struct StrictRank {
  std::unique_ptr<model::GPTModel> m;
  std::unique_ptr<optim::AdamW> opt;
};

// A model of `fam` at (tp, r): parameters and moments filled with `salt`, salt+1, salt+2.
StrictRank make_rank(const std::string& fam, uint64_t salt, int64_t tp = 1, int64_t r = 0) {
  StrictRank k;
  k.m = std::make_unique<model::GPTModel>(tiny_config(fam, tp, r));
  k.opt = std::make_unique<optim::AdamW>(k.m->params(), optim::OptimizerConfig{});
  fill_global(k.m->params(), k.m->params().flat_params(), salt);
  fill_global(k.m->params(), k.opt->exp_avg(), salt + 1);
  fill_global(k.m->params(), k.opt->exp_avg_sq(), salt + 2);
  return k;
}

bool is_bias(const std::string& name) { return name.find("linear_qkv.bias") != std::string::npos; }

// Elements of `flat` differing from fill_global(salt), for the parameters `pick` selects.
template <class Pick>
int64_t mismatches(const model::ParamStore& ps, const Tensor& flat, uint64_t salt, Pick pick) {
  int64_t bad = 0;
  for (const auto& p : ps.infos()) {
    if (!pick(p.name)) continue;
    const int64_t rows = p.local_shape[0], cols = p.numel() / rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        bad += flat.data<float>()[p.offset + r * cols + c] !=
               float(global_value(salt, p.name, ps.global_index(p, r, c)));
  }
  return bad;
}
int64_t nonzero(const model::ParamStore& ps, const Tensor& flat) {
  int64_t n = 0;
  for (const auto& p : ps.infos())
    if (is_bias(p.name))
      for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) n += flat.data<float>()[i] != 0;
  return n;
}

// A checkpoint of `fam` (weights kSaved, moments kSaved+1/+2) at TP `tp`, iteration 5.
std::string save(const std::string& fam, int64_t tp = 1) {
  const std::string dir = scratch_dir() + "/" + fam;
  std::vector<StrictRank> ranks;
  std::vector<ck::RankSnapshot> snaps;
  for (int64_t r = 0; r < tp; ++r) ranks.push_back(make_rank(fam, kSaved, tp, r));
  for (int64_t r = 0; r < tp; ++r) {
    snaps.push_back(ck::RankSnapshot::view(ranks[r].m->params(), ranks[r].opt.get(),
                                           ck::RankCoord{r, 0, 0}));
  }
  ck::SaveOptions so;
  so.model = tiny_config(fam, tp);
  ck::save_checkpoint(dir, snaps, sample_state(5), so);
  return dir;
}

ck::LoadOptions opts(Strictness s) {
  ck::LoadOptions o;
  o.strictness = s;
  return o;
}

// Loads dir into k in mode s; returns the error ("" when none) and the warnings in *err.
std::string load(const std::string& dir, StrictRank& k, Strictness s, std::string* err = nullptr) {
  ::testing::internal::CaptureStderr();
  const std::string e =
      error_of([&] { ck::load_checkpoint(dir, std::nullopt, *k.m, k.opt.get(), opts(s)); });
  const std::string out = ::testing::internal::GetCapturedStderr();
  if (err) *err = out;
  return e;
}

// After a load of the Llama checkpoint into the qwen2 model: everything but the biases is the
// checkpoint's; the biases keep their values from before the load, with zero moments.
void expect_loaded_around_biases(const StrictRank& k) {
  auto& ps = k.m->params();
  auto all_but = [](const std::string& n) { return !is_bias(n); };
  EXPECT_EQ(mismatches(ps, ps.flat_params(), kSaved, all_but), 0);
  EXPECT_EQ(mismatches(ps, k.opt->exp_avg(), kSaved + 1, all_but), 0);
  EXPECT_EQ(mismatches(ps, k.opt->exp_avg_sq(), kSaved + 2, all_but), 0);
  EXPECT_EQ(mismatches(ps, ps.flat_params(), kBefore, is_bias), 0);
  EXPECT_EQ(nonzero(ps, k.opt->exp_avg()), 0);
  EXPECT_EQ(nonzero(ps, k.opt->exp_avg_sq()), 0);
}


TEST(Strictness, ParseRefusesReturnModes) {
  EXPECT_EQ(ck::parse_strictness("log_all"), Strictness::LogAll);
  EXPECT_EQ(ck::parse_strictness("assume_ok_unexpected"), Strictness::AssumeOkUnexpected);
  const std::string e = error_of([] { ck::parse_strictness("return_unexpected"); });
  expect_has(e, "return_unexpected");
  expect_has(e, "HINT");
  expect_has(e, "log_unexpected");
  EXPECT_NE(error_of([] { ck::parse_strictness("return_all"); }), "");
  expect_has(error_of([] { ck::parse_strictness("strict"); }), "is not a strictness");
}

// The default and raise_* refuse a checkpoint lacking the model's parameters, naming the keys,
// the flag and what to pass instead; nothing is loaded.
TEST(Strictness, UnexpectedKeysAreErrorsByDefault) {
  const std::string dir = save("llama");
  for (Strictness s : {Strictness::AssumeOkUnexpected, Strictness::RaiseUnexpected,
                       Strictness::RaiseAll}) {
    SCOPED_TRACE(ck::to_string(s));
    StrictRank k = make_rank("qwen2", kBefore);
    const std::string e = load(dir, k, s);
    // The model config check speaks first (add_qkv_bias) by default and with raise_all; with
    // raise_unexpected it warns and the key check names linear_qkv.bias.
    expect_has(e, s == Strictness::RaiseUnexpected ? "linear_qkv.bias" : "add_qkv_bias");
    // Key by key (no model config to compare: a bare ParamStore).
    const std::string e2 = error_of([&] {
      ck::load_checkpoint(dir, std::nullopt, k.m->params(), k.opt.get(), opts(s));
    });
    expect_has(e2, "decoder.layers.0.self_attention.linear_qkv.bias");
    expect_has(e2, "decoder.layers.1.self_attention.linear_qkv.bias");
    expect_has(e2, "2 parameter(s)");
    expect_has(e2, dir);  // the checkpoint folder, named
    expect_has(e2, std::string("--dist-ckpt-strictness ") + ck::to_string(s));
    expect_has(e2, "log_unexpected");
    EXPECT_EQ(mismatches(k.m->params(), k.m->params().flat_params(), kBefore,
                         [](const std::string&) { return true; }),
              0);
  }
}

// log_unexpected, log_all: loaded around the biases with one warning naming them;
// ignore_all: the same, silently.
TEST(Strictness, UnexpectedKeysLoggedOrIgnored) {
  const std::string dir = save("llama");
  for (Strictness s : {Strictness::LogUnexpected, Strictness::LogAll, Strictness::IgnoreAll}) {
    SCOPED_TRACE(ck::to_string(s));
    StrictRank k = make_rank("qwen2", kBefore);
    std::string err;
    EXPECT_EQ(load(dir, k, s, &err), "");
    expect_loaded_around_biases(k);
    if (s == Strictness::IgnoreAll) {
      EXPECT_EQ(err.find("parameter(s)"), std::string::npos) << err;
    } else {
      expect_has(err, "2 parameter(s)");
      expect_has(err, "decoder.layers.0.self_attention.linear_qkv.bias");
      expect_has(err, "initial values");
      expect_has(err, ck::to_string(s));
    }
  }
}

// The checkpoint's biases that the model lacks: an error by default and with raise_all;
// warned with log_all; ignored silently otherwise.
TEST(Strictness, MissingKeys) {
  const std::string dir = save("qwen2");
  for (Strictness s : {Strictness::AssumeOkUnexpected, Strictness::RaiseAll,
                       Strictness::LogAll, Strictness::LogUnexpected,
                       Strictness::RaiseUnexpected, Strictness::IgnoreAll}) {
    SCOPED_TRACE(ck::to_string(s));
    StrictRank k = make_rank("llama", kBefore);
    std::string err;
    const std::string e = error_of([&] {
      ::testing::internal::CaptureStderr();
      try {
        ck::load_checkpoint(dir, std::nullopt, k.m->params(), k.opt.get(), opts(s));
      } catch (...) {
        err = ::testing::internal::GetCapturedStderr();
        throw;
      }
      err = ::testing::internal::GetCapturedStderr();
    });
    if (s == Strictness::AssumeOkUnexpected || s == Strictness::RaiseAll) {
      expect_has(e, "holds 2 parameter(s) this model does not have");
      expect_has(e, "decoder.layers.1.self_attention.linear_qkv.bias");
      expect_has(e, "log_all");
      continue;
    }
    EXPECT_EQ(e, "");
    auto all = [](const std::string&) { return true; };
    EXPECT_EQ(mismatches(k.m->params(), k.m->params().flat_params(), kSaved, all), 0);
    EXPECT_EQ(mismatches(k.m->params(), k.opt->exp_avg(), kSaved + 1, all), 0);
    if (s == Strictness::LogAll) {
      expect_has(err, "ignoring 2 parameter(s)");
      expect_has(err, "decoder.layers.0.self_attention.linear_qkv.bias");
    } else {
      EXPECT_EQ(err.find("parameter(s)"), std::string::npos) << err;
    }
  }
}

// Any TP layout: a TP 2 checkpoint into TP 1 and a TP 1 checkpoint into TP 2 ranks.
TEST(Strictness, ReshardsAroundUnexpectedKeys) {
  for (auto [save_tp, load_tp] : {std::pair<int64_t, int64_t>{2, 1}, {1, 2}}) {
    const std::string dir = save("llama", save_tp);
    for (int64_t r = 0; r < load_tp; ++r) {
      SCOPED_TRACE(fmt::format("TP {} -> TP {} rank {}", save_tp, load_tp, r));
      StrictRank k = make_rank("qwen2", kBefore, load_tp, r);
      EXPECT_EQ(load(dir, k, Strictness::LogUnexpected), "");
      expect_loaded_around_biases(k);
    }
  }
}

// The trainer's path: host buffers that start from the live parameters (the biases keep
// their values) and zero moments.
TEST(Strictness, TrainingLoadKeepsInitialValues) {
  const std::string dir = save("llama");
  StrictRank k = make_rank("qwen2", kBefore);
  ::testing::internal::CaptureStderr();
  auto st = ck::load_training_checkpoint(dir, std::nullopt, k.m->params(), *k.opt, true,
                                         opts(Strictness::LogUnexpected));
  ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(st.has_value());
  expect_loaded_around_biases(k);
}

// A key present on both sides with another shape is an error in every mode.
TEST(Strictness, ShapeMismatchIsAlwaysAnError) {
  const std::string dir = save("llama");
  for (Strictness s : {Strictness::LogAll, Strictness::IgnoreAll, Strictness::LogUnexpected}) {
    SCOPED_TRACE(ck::to_string(s));
    model::TransformerConfig c = tiny_config("llama");
    c.ffn_hidden_size = 32;
    model::GPTModel m(c);
    const std::string e = error_of(
        [&] { ck::load_checkpoint(dir, std::nullopt, m.params(), nullptr, opts(s)); });
    expect_has(e, "linear_fc1.weight");
    expect_has(e, "global shape");
    expect_has(error_of([&] { ck::load_checkpoint(dir, std::nullopt, m, nullptr, opts(s)); }),
               "ffn_hidden_size");
  }
}

// Buffers the checkpoint lacks: a warning by default (as before the flag), an error with
// raise_unexpected; a buffer only the checkpoint has: an error with raise_all.
TEST(Strictness, Buffers) {
  const std::string base = scratch_dir();
  auto store = [](bool buffer) {
    model::GPTModel m(tiny_config("llama"));
    model::ParamStore ps;
    for (const auto& p : m.params().infos()) ps.add(p);
    if (buffer)
      ps.add_buffer(model::BufferInfo{"decoder.layers.0.mlp.router.expert_bias", {8}, {},
                                      DType::F32, model::TpSplit::None, 0});
    ps.allocate(DType::F32, 0, 1);
    fill_global(ps, ps.flat_params(), kSaved);
    return ps;
  };
  model::ParamStore plain = store(false), with = store(true);
  ck::save_checkpoint(base + "/plain", plain, nullptr, sample_state(5), {});
  ck::save_checkpoint(base + "/with", with, nullptr, sample_state(5), {});
  auto err = [&](const std::string& d, model::ParamStore& ps, Strictness s) {
    ::testing::internal::CaptureStderr();
    std::string e =
        error_of([&] { ck::load_checkpoint(base + d, std::nullopt, ps, nullptr, opts(s)); });
    return e + "\n" + ::testing::internal::GetCapturedStderr();
  };
  expect_has(err("/plain", with, Strictness::AssumeOkUnexpected), "keep their initial values");
  expect_has(err("/plain", with, Strictness::RaiseUnexpected), "1 buffer(s) of this model");
  expect_has(err("/plain", with, Strictness::LogUnexpected), "1 buffer(s) of this model");
  expect_has(err("/with", plain, Strictness::AssumeOkUnexpected), "ignoring 1 buffer(s)");
  expect_has(err("/with", plain, Strictness::RaiseAll), "holds 1 buffer(s) this model");
  EXPECT_EQ(err("/with", plain, Strictness::IgnoreAll).find("buffer"), std::string::npos);
}

}  // namespace strictness_test
