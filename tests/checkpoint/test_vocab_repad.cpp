// Issue 23 A.3: a checkpoint saved at TP2 with the vocabulary padded for TP2 (GPT-2: 50432)
// loads at TP1 (50304) and at any other TP, trimming or extending the padding rows as
// Megatron's converters do with true_vocab_size. Tiny version: Vp 256 at TP2 <-> 128 at TP1.
#include <gtest/gtest.h>

#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace ck = mcpp::checkpoint;

namespace vocab_repad_test {

constexpr uint64_t kW = 11, kM = 12, kV = 13;  // salts of weights, exp_avg, exp_avg_sq

struct RepadRank {
  std::unique_ptr<model::GPTModel> m;
  std::unique_ptr<optim::AdamW> opt;
};

model::TransformerConfig cfg(const std::string& fam, int64_t tp, int64_t r, int64_t vp) {
  auto c = tiny_config(fam, tp, r);
  c.padded_vocab_size = vp;
  return c;
}

RepadRank rank(const std::string& fam, int64_t tp, int64_t r, int64_t vp, bool fill) {
  RepadRank k;
  k.m = std::make_unique<model::GPTModel>(cfg(fam, tp, r, vp));
  k.opt = std::make_unique<optim::AdamW>(k.m->params(), optim::OptimizerConfig{});
  if (fill) {
    fill_global(k.m->params(), k.m->params().flat_params(), kW);
    fill_global(k.m->params(), k.opt->exp_avg(), kM);
    fill_global(k.m->params(), k.opt->exp_avg_sq(), kV);
  }
  return k;
}

std::string save(const std::string& fam, int64_t tp, int64_t vp) {
  const std::string dir = scratch_dir() + "_tp" + std::to_string(tp);
  std::filesystem::remove_all(dir);
  std::vector<RepadRank> ks;
  std::vector<ck::RankSnapshot> snaps;
  for (int64_t r = 0; r < tp; ++r) ks.push_back(rank(fam, tp, r, vp, true));
  for (auto& k : ks) snaps.push_back(ck::RankSnapshot::view(k.m->params(), k.opt.get()));
  ck::SaveOptions so;
  so.model = cfg(fam, tp, 0, vp);
  ck::save_checkpoint(dir, snaps, sample_state(10), so);
  return dir;
}

// Every element of the loaded rank equals the saved global value, except vocabulary rows at
// or beyond `saved_vp`: weights equal the saved last row, moments zero.
void expect_repadded(const RepadRank& k, int64_t saved_vp) {
  const auto& ps = k.m->params();
  for (const auto& p : ps.infos()) {
    const bool vocab =
        p.name == "embedding.word_embeddings.weight" || p.name == "output_layer.weight";
    const int64_t rows = p.local_shape[0], cols = p.numel() / rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const int64_t g = ps.global_index(p, r, c), grow = g / cols, gcol = g % cols;
        const int64_t i = p.offset + r * cols + c;
        const bool extra = vocab && grow >= saved_vp;
        const int64_t src = extra ? (saved_vp - 1) * cols + gcol : g;
        ASSERT_EQ(k.m->params().flat_params().data<float>()[i],
                  float(global_value(kW, p.name, src)))
            << p.name << " row " << grow;
        ASSERT_EQ(k.opt->exp_avg().data<float>()[i],
                  extra ? 0.f : float(global_value(kM, p.name, g)))
            << p.name << " row " << grow;
        ASSERT_EQ(k.opt->exp_avg_sq().data<float>()[i],
                  extra ? 0.f : float(global_value(kV, p.name, g)));
      }
  }
}


TEST(VocabRepad, Tp2PaddingLoadsAtTp1AndBack) {
  for (const std::string fam : {"gpt", "llama"}) {
    SCOPED_TRACE(fam);
    // TP2 (padded 256) -> TP1 (128): the padding rows beyond 128 are dropped.
    const std::string tp2 = save(fam, 2, 256);
    RepadRank one = rank(fam, 1, 0, 128, false);
    EXPECT_EQ(ck::load_checkpoint(tp2, std::nullopt, *one.m, one.opt.get()).iteration, 10);
    expect_repadded(one, 256);
    // TP1 (128) -> TP2 (256) and TP4 (256): new rows copy row 127, their moments start at 0.
    const std::string tp1 = save(fam, 1, 128);
    for (int64_t tp : fam == "gpt" ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{2})
      for (int64_t r = 0; r < tp; ++r) {
        RepadRank k = rank(fam, tp, r, 256, false);
        ck::load_checkpoint(tp1, std::nullopt, *k.m, k.opt.get());
        expect_repadded(k, 128);
      }
  }
}

TEST(VocabRepad, AnotherVocabularyIsStillAnError) {
  // Same TP: the padded sizes differ only with another vocabulary or divisor: an error.
  const std::string dir = save("gpt", 1, 128);
  RepadRank k = rank("gpt", 1, 0, 256, false);
  try {
    ck::load_checkpoint(dir, std::nullopt, *k.m, k.opt.get());
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("padded_vocab_size"), std::string::npos) << e.what();
  }
  // Far apart (another tokenizer), even across TP: an error.
  const std::string big = save("gpt", 2, 1024);
  RepadRank small = rank("gpt", 1, 0, 128, false);
  EXPECT_THROW(ck::load_checkpoint(big, std::nullopt, *small.m, small.opt.get()), Error);
  // With the loading tokenizer's size given, the same TP re-pads when both sizes hold it.
  ck::LoadOptions o;
  o.true_vocab_size = 100;
  RepadRank k2 = rank("gpt", 1, 0, 256, false);
  ck::load_checkpoint(dir, std::nullopt, *k2.m, k2.opt.get(), o);
  expect_repadded(k2, 128);
}

}  // namespace vocab_repad_test
