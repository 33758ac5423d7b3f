// Fill-in-the-middle (data/fim.h): the layouts on hand-made sequences with scripted draws,
// the transform against tests/golden/make_fim_fixtures.py (an independent Python version
// with NumPy's RandomState), the per-sample draws, and the wiring into GPTDataset.
#include <gtest/gtest.h>

#include <deque>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "base/numpy_rng.h"
#include "data/dataset_builder.h"
#include "data/fim.h"
#include "data/indexed_dataset.h"
#include "data/tokenizers/tokenizer.h"
#include "test_util.h"

using namespace mcpp;
using namespace mcpp::data;

namespace fim_test {

// The fixture tokenizer: byte b is token b, then these added special tokens.
constexpr int64_t P = 256, M = 257, S = 258, PAD = 259, SEP = 260, EOD = 261;

const Tokenizer& tokenizer() {
  static const auto tok = [] {
    TokenizerArgs a;
    a.type = "HuggingFaceTokenizer";
    a.tokenizer_model = mcpp::testing::golden("fim/tokenizer.json");
    return make_tokenizer(a);
  }();
  return *tok;
}

FimConfig config(double rate = 1.0, double spm_rate = 0.0) {
  FimConfig c;
  FimTokenNames names;
  resolve_fim_tokens(names, tokenizer(), c);
  c.rate = rate, c.spm_rate = spm_rate;
  return c;
}

std::vector<int64_t> ids(std::string_view text) {  // bytes are the fixture's ids
  std::vector<int64_t> v;
  for (unsigned char c : text) v.push_back(c);
  return v;
}
std::vector<int64_t> cat(std::initializer_list<std::vector<int64_t>> parts) {
  std::vector<int64_t> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// Draws given in advance; records the probabilities asked for and fails on a draw too many.
class ScriptedDraws final : public FimDraws {
 public:
  ScriptedDraws(std::deque<bool> coins, std::deque<std::array<int64_t, 2>> cuts)
      : coins_(std::move(coins)), cuts_(std::move(cuts)) {}
  bool bernoulli(double p) override {
    asked.push_back(p);
    if (coins_.empty()) ADD_FAILURE() << "a coin too many";
    if (coins_.empty()) return false;
    bool c = coins_.front();
    coins_.pop_front();
    return c;
  }
  std::array<int64_t, 2> boundaries(int64_t n) override {
    lengths.push_back(n);
    if (cuts_.empty()) ADD_FAILURE() << "a cut too many";
    if (cuts_.empty()) return {0, 0};
    auto c = cuts_.front();
    cuts_.pop_front();
    return c;
  }
  bool used_up() const { return coins_.empty() && cuts_.empty(); }
  std::vector<double> asked;
  std::vector<int64_t> lengths;

 private:
  std::deque<bool> coins_;
  std::deque<std::array<int64_t, 2>> cuts_;
};

std::vector<int64_t> transform(std::vector<int64_t> v, const FimConfig& c, FimDraws& d) {
  fim_transform(std::span<int64_t>(v), c, d);
  return v;
}

TEST(Fim, TokensResolveAgainstTheTokenizer) {
  FimConfig c = config();
  EXPECT_EQ(c.prefix, P);
  EXPECT_EQ(c.middle, M);
  EXPECT_EQ(c.suffix, S);
  EXPECT_EQ(c.pad, PAD);
  EXPECT_EQ(c.eod, EOD);
  EXPECT_EQ(tokenizer().eod(), EOD);
  EXPECT_TRUE(tokenizer().is_special(P) && tokenizer().is_special(EOD));
  EXPECT_FALSE(tokenizer().is_special('a'));
  EXPECT_EQ(tokenizer().token_to_id("a"), int64_t('a'));
}

TEST(Fim, PsmLayoutTokenByToken) {
  // "abcdef" cut at 2 and 4 -> <P> ab <S> ef <M> cd; the second document is left alone and
  // loses its last three tokens to the sentinels.
  const auto in = cat({ids("abcdef"), {EOD}, ids("ghijk")});
  ScriptedDraws d({true, false, false}, {{2, 4}});
  const auto out = transform(in, config(0.5, 0.25), d);
  EXPECT_EQ(out, cat({{P}, ids("ab"), {S}, ids("ef"), {M}, ids("cd"), {EOD}, ids("gh")}));
  EXPECT_EQ(d.asked, (std::vector<double>{0.5, 0.25, 0.5}));  // fim, spm, then the next doc
  EXPECT_EQ(d.lengths, std::vector<int64_t>{6});
  EXPECT_TRUE(d.used_up());
}

TEST(Fim, SpmLayoutIsMegatronsSentinelsFirst) {
  // Megatron's SPM: <P> <S> suffix <M> prefix middle.
  const auto in = cat({ids("abcdef"), {EOD}, ids("ghijk")});
  ScriptedDraws d({true, true, false}, {{2, 4}});
  const auto out = transform(in, config(), d);
  EXPECT_EQ(out, cat({{P, S}, ids("ef"), {M}, ids("ab"), ids("cd"), {EOD}, ids("gh")}));
  EXPECT_TRUE(d.used_up());
}

TEST(Fim, CutsAreCharactersNotBytes) {
  // "é" is two bytes and one character: the document has 3 characters.
  const auto in = cat({ids("a\xC3\xA9z"), {EOD}, ids("0123456789")});
  ScriptedDraws d({true, false, false}, {{1, 2}});
  const auto out = transform(in, config(), d);
  EXPECT_EQ(d.lengths, std::vector<int64_t>{3});
  EXPECT_EQ(out, cat({{P}, ids("a"), {S}, ids("z"), {M}, ids("\xC3\xA9"), {EOD},
                      ids("0123456")}));
}

TEST(Fim, ShortAndEmptyDocuments) {
  // "ab" EOD EOD "c" EOD: the empty document between the EODs loses its EOD (Megatron's
  // loop skips it), and the empty rest after the last EOD is transformed too: three
  // sentinels. Everything lengthens, so the sample is cut back to its 7 tokens.
  const std::vector<int64_t> in = {'a', 'b', EOD, EOD, 'c', EOD, 'x'};
  ScriptedDraws d({true, false, true, true, false}, {{0, 0}, {1, 1}});
  const auto out = transform(in, config(), d);
  EXPECT_EQ(d.lengths, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(out, (std::vector<int64_t>{P, S, 'a', 'b', M, EOD, P}));
  // A tail of nothing: [<P> <S> <M>] after the EOD; a sample shortened by the dropped EOD
  // is padded with <fim_pad>.
  ScriptedDraws d2({false, false, true, false}, {{0, 0}});
  EXPECT_EQ(transform({'a', EOD, EOD, 'b', EOD}, config(), d2),
            (std::vector<int64_t>{'a', EOD, 'b', EOD, P}));
  ScriptedDraws d3({false, false}, {});
  EXPECT_EQ(transform({'a', EOD, EOD, 'b'}, config(), d3),
            (std::vector<int64_t>{'a', EOD, 'b', PAD}));
  EXPECT_TRUE(d3.lengths.empty() && d3.used_up());  // a failed coin cuts nothing
}

TEST(Fim, FragmentsAtSplitTokenAndNoPrefix) {
  FimConfig c = config(0.75, 0.0);
  c.split_sample = SEP, c.fragment_rate = 0.5, c.no_prefix = "def";
  // "def a" SEP "x=1" SEP SEP "def b": the document passes its coin (rate 0.75); each
  // fragment then has its own (fragment rate 0.5). "def a" and "def b" start with the
  // no-FIM prefix: kept as they are, without a cut; the empty fragment loses its SEP.
  const auto in = cat({ids("def a"), {SEP}, ids("x=1"), {SEP, SEP}, ids("def b")});
  ScriptedDraws d({true, true, true, false, true}, {{1, 2}});
  const auto out = transform(in, c, d);
  EXPECT_EQ(d.asked, (std::vector<double>{0.75, 0.5, 0.5, 0.0, 0.5}));
  // 18 tokens out of 16: the end of "def b" is cut off.
  EXPECT_EQ(out, cat({ids("def a"), {SEP}, {P}, ids("x"), {S}, ids("1"), {M}, ids("="), {SEP},
                      ids("def")}));
  EXPECT_TRUE(d.used_up());
  // The document's coin fails: nothing is cut and no fragment draws.
  ScriptedDraws none({false}, {});
  EXPECT_EQ(transform(in, c, none), in);
  // A document without the split token is one piece at --fim-rate.
  ScriptedDraws whole({false}, {});
  EXPECT_EQ(transform(ids("x=1"), c, whole), ids("x=1"));
  EXPECT_EQ(whole.asked, std::vector<double>{0.75});
}

// Random samples over the fixture's bytes, EODs and split tokens; with whole_documents no
// EOD opens the sample or follows another (no empty document, whose EOD Megatron drops).
std::vector<int64_t> random_sample(NumpyRandomState& r, int64_t n, bool whole_documents = false) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) {
    const auto k = r.random_interval(15);
    v[i] = k == 0 ? EOD : k == 1 ? SEP : int64_t('a' + r.random_interval(25));
    if (whole_documents && v[i] == EOD && (i == 0 || v[i - 1] == EOD)) v[i] = 'q';
  }
  return v;
}

TEST(Fim, RateZeroLeavesSamplesAndRateOneTransformsEveryDocument) {
  NumpyRandomState r(3);
  for (int64_t i = 0; i < 200; ++i) {
    const auto in = random_sample(r, 1 + int64_t(r.random_interval(60)), true);
    NumpyFimDraws d0(1234, 0, i);
    EXPECT_EQ(transform(in, config(0.0, 0.5), d0), in);
    NumpyFimDraws d1(1234, 0, i);
    const auto out = transform(in, config(1.0, 0.5), d1);
    ASSERT_EQ(out.size(), in.size());
    // Every document (cut short or not) now starts with <fim_prefix>.
    for (size_t k = 0; k < out.size(); ++k)
      if (k == 0 || out[k - 1] == EOD) EXPECT_EQ(out[k], P) << "sample " << i << " at " << k;
  }  // Megatron's EOD loop drops an empty document's EOD whatever the rate: at rate 0 too.
  NumpyFimDraws d(1, 0, 0);
  EXPECT_EQ(transform({EOD, 'a', EOD, EOD, 'b'}, config(0.0, 0.5), d),
            (std::vector<int64_t>{'a', EOD, 'b', PAD, PAD}));
}

TEST(Fim, LengthIsKeptAndDrawsArePerSample) {
  NumpyRandomState r(11);
  std::vector<std::vector<int64_t>> in, first;
  FimConfig c = config(0.5, 0.5);
  c.split_sample = SEP, c.fragment_rate = 0.5;
  for (int64_t i = 0; i < 100; ++i) {
    in.push_back(random_sample(r, 1 + int64_t(r.random_interval(200))));
    NumpyFimDraws d(99, 1, i);
    first.push_back(transform(in.back(), c, d));
    EXPECT_EQ(first.back().size(), in.back().size());
  }
  for (int64_t i = 99; i >= 0; --i) {  // the other order: the same forms
    NumpyFimDraws d(99, 1, i);
    EXPECT_EQ(transform(in[size_t(i)], c, d), first[size_t(i)]) << i;
  }
  // Other keys draw otherwise: some sample changes with the seed, the split or the index.
  int differ_seed = 0, differ_split = 0, differ_index = 0;
  for (int64_t i = 0; i < 100; ++i) {
    NumpyFimDraws a(98, 1, i), b(99, 2, i), e(99, 1, i + (int64_t(1) << 32));
    differ_seed += transform(in[size_t(i)], c, a) != first[size_t(i)];
    differ_split += transform(in[size_t(i)], c, b) != first[size_t(i)];
    differ_index += transform(in[size_t(i)], c, e) != first[size_t(i)];
  }
  EXPECT_GT(differ_seed, 10);
  EXPECT_GT(differ_split, 10);
  EXPECT_GT(differ_index, 10);
}

nlohmann::json fixtures() {
  std::ifstream f(mcpp::testing::golden("fim/fixtures.json"));
  EXPECT_TRUE(f.good());
  return nlohmann::json::parse(f);
}

TEST(Fim, MatchesThePythonReimplementation) {
  const auto j = fixtures();
  ASSERT_GE(j["cases"].size(), 60u);
  for (const auto& k : j["cases"]) {
    const auto& cj = j["configs"][k["config"].get<size_t>()];
    FimConfig c = config(cj["rate"].get<double>(), cj["spm_rate"].get<double>());
    if (!cj["split_sample"].is_null()) {
      c.split_sample = cj["split_sample"].get<int64_t>();
      c.fragment_rate = cj["fragment_rate"].get<double>();
    }
    if (!cj["no_prefix"].is_null()) c.no_prefix = cj["no_prefix"].get<std::string>();
    NumpyFimDraws d(k["seed"].get<uint32_t>(), k["split"].get<int>(), k["index"].get<int64_t>());
    EXPECT_EQ(transform(k["sample"].get<std::vector<int64_t>>(), c, d),
              k["expected"].get<std::vector<int64_t>>())
        << k.dump();
  }
}

TEST(Fim, NumpyDrawsMatchRandomState) {
  const auto j = fixtures();
  for (const auto& e : j["rng"]) {
    const auto key = e["key"].get<std::vector<uint32_t>>();
    NumpyRandomState rs{std::span<const uint32_t>(key)};
    for (const auto& u : e["u32"]) EXPECT_EQ(rs.next_u32(), u.get<uint32_t>());
    for (const auto& x : e["sample"]) EXPECT_EQ(rs.random_sample(), x.get<double>());
    for (const auto& b : e["binomial"]) {
      const double p = b[0].get<double>();
      for (const auto& v : b[1]) EXPECT_EQ(rs.binomial(1, p), v.get<int64_t>()) << p;
    }
    for (const auto& b : e["binomial_n"])
      for (const auto& v : b[2])
        EXPECT_EQ(rs.binomial(b[0].get<int64_t>(), b[1].get<double>()), v.get<int64_t>());
    for (const auto& b : e["randint"]) {
      const uint64_t hi = b[0].get<uint64_t>();
      for (const auto& v : b[1]) EXPECT_EQ(rs.random_interval(hi), v.get<uint64_t>()) << hi;
    }
  }
}

TEST(Fim, TokenThatIsNotOneTokenIsAnErrorNamingFlagTokenAndTokenizer) {
  FimConfig c;
  FimTokenNames names;
  names.middle = "<fim_center>";
  try {
    resolve_fim_tokens(names, tokenizer(), c);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string w = e.what();
    for (const char* n : {"--fim-middle-token", "<fim_center>", "HuggingFaceTokenizer",
                          "encodes as 12 tokens"})
      EXPECT_NE(w.find(n), std::string::npos) << n << " missing in " << w;
    EXPECT_NE(e.hint().find("--fim-middle-token"), std::string::npos) << e.hint();
  }
  names = FimTokenNames();
  names.split_sample = "<no_such>";
  EXPECT_THROW(resolve_fim_tokens(names, tokenizer(), c), Error);
  // NullTokenizer spells no token at all.
  NullTokenizer null(100);
  EXPECT_THROW(resolve_fim_tokens(FimTokenNames(), null, c), Error);
}

TEST(Fim, GPTDatasetAppliesItPerSampleIndex) {
  auto dir = mcpp::testing::scratch_dir();
  IndexedDatasetBuilder b(dir + "/code", IndexDType::I32);
  NumpyRandomState r(5);
  for (int i = 0; i < 40; ++i) {
    auto doc = random_sample(r, 5 + int64_t(r.random_interval(30)));
    std::erase(doc, EOD);
    doc.push_back(EOD);
    b.add_item(std::span<const int64_t>(doc)), b.end_document();
  }
  b.finalize();
  GPTDatasetsArgs a;
  a.data_path = {dir + "/code"};
  a.split = "80,20,0";
  a.seq_length = 16;
  a.num_samples = {30, 10, std::nullopt};
  a.eod = EOD;
  auto plain = build_train_valid_test_datasets(a);
  auto fc = std::make_shared<FimConfig>(config(0.9, 0.5));
  a.fim = fc;
  auto sets = build_train_valid_test_datasets(a);
  auto again = build_train_valid_test_datasets(a);
  for (int split = 0; split < 2; ++split) {
    ASSERT_TRUE(sets[split] && plain[split]);
    const int64_t n = sets[split]->size();
    std::vector<std::vector<int64_t>> forward(static_cast<size_t>(n));
    std::vector<int64_t> t, u;
    int changed = 0;
    for (int64_t i = 0; i < n; ++i) {
      sets[split]->get_text(i, forward[size_t(i)]);
      plain[split]->get_text(i, u);
      ASSERT_EQ(forward[size_t(i)].size(), 17u);
      // The same sample index, transformed here with its own draws.
      NumpyFimDraws d(a.seed, split, i);
      EXPECT_EQ(transform(u, *fc, d), forward[size_t(i)]);
      changed += u != forward[size_t(i)];
    }
    EXPECT_GT(changed, 0);
    for (int64_t i = n - 1; i >= 0; --i) {  // another dataset, read backwards
      again[split]->get_text(i, t);
      EXPECT_EQ(t, forward[size_t(i)]) << i;
    }
    GPTSample s;  // the masks follow the transformed tokens; <fim_pad> is no tokenizer pad
    sets[split]->get(0, s);
    EXPECT_EQ(std::vector<int64_t>(forward[0].begin(), forward[0].end() - 1), s.tokens);
    for (float m : s.loss_mask) EXPECT_EQ(m, 1.f);
  }
}

}  // namespace fim_test
