// GPTDataset / BlendedDataset / builder against the worked examples of
// shared/reference/megatron.md §3.4-3.6 and against fixtures from the independent
// Python re-implementation tests/golden/make_gpt_dataset_fixtures.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "base/error.h"
#include "data/blended_dataset.h"
#include "data/dataset_builder.h"
#include "data/gpt_dataset.h"
#include "test_util.h"
#include "synthetic_low_dataset.h"

using namespace mcpp;
using namespace mcpp::data;

namespace gpt_dataset_test {

using mcpp::data::synthetic::Low;

uint64_t checksum(const auto& v) {
  const uint64_t mod = (uint64_t(1) << 61) - 1;
  unsigned __int128 s = 0;
  for (size_t i = 0; i < v.size(); ++i)
    s = (s * 1000003 + (uint64_t(int64_t(v[i])) & 0xFFFFFFFFFFFFull) + i) % mod;
  return uint64_t(s);
}


TEST(GPTDataset, WorkedExampleSampleIndex) {
  Low low({5, 3, 4});
  auto one = build_sample_index(low, {0, 1, 2}, 4, 1, 12, true, 1);
  EXPECT_TRUE(one.is_narrow());  // int32 elements, as Megatron's helper
  EXPECT_EQ(one.to_vector(), (std::vector<int64_t>{0, 0, 0, 4, 2, 0}));
  auto two = build_sample_index(low, {0, 1, 2, 0, 1, 2}, 4, 2, 12, true, 1);
  EXPECT_EQ(two.to_vector(), (std::vector<int64_t>{0, 0, 0, 4, 2, 0, 3, 0, 3, 4, 5, 0}));
}

TEST(GPTDataset, WorkedExampleSampleText) {
  auto low = std::make_shared<Low>(std::vector<int32_t>{5, 3, 4});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 4;
  GPTDataset ds(low, {0, 1, 2}, std::nullopt, Split::Train, cfg);
  ASSERT_EQ(ds.size(), 2);
  // Un-shuffle: window j of the epoch's token stream (documents in document_index
  // order) is D[4j : 4j+5]; consecutive windows share one token.
  std::vector<int64_t> stream;
  for (int32_t d : ds.document_index())
    for (int64_t k = 0; k < low->sequence_length(d); ++k) stream.push_back(1000 * d + k);
  std::vector<int64_t> t;
  for (int i = 0; i < 2; ++i) {
    ds.get_text(i, t);
    int64_t j = ds.shuffle_index()[i];
    EXPECT_EQ(t, std::vector<int64_t>(stream.begin() + 4 * j, stream.begin() + 4 * j + 5));
  }
}

TEST(GPTDataset, SeparateFinalEpochThreshold) {
  // 275 samples per epoch: 220 from the final epoch are not separate, 219 are.
  // S=1, X=1, one sequence of 276 tokens: (276-1)//1 = 275 samples per epoch.
  auto low = std::make_shared<Low>(std::vector<int32_t>{276});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 1;
  // epochs=2: sans_final = (276-1)//1 = 275; from_final = n - 275.
  GPTDataset a(low, {0}, 275 + 220, Split::Train, cfg);
  EXPECT_EQ(a.num_epochs(), 2);
  EXPECT_FALSE(a.separate_final_epoch());
  GPTDataset b(low, {0}, 275 + 219, Split::Train, cfg);
  EXPECT_TRUE(b.separate_final_epoch());
}

TEST(GPTDataset, IndicesAreBuiltOnFirstUseOnceAcrossThreads) {
  // Mock data: ~68M tokens per split. A split nobody reads must not build its indices
  // (that took ~1.5 s of every process start); size() and the log line need none.
  GPTDatasetsArgs a;
  a.mock_data = true, a.seq_length = 16, a.seed = 1234, a.vocab_size = 100, a.eod = 99;
  a.num_samples = {std::optional<int64_t>(160), std::optional<int64_t>(800),
                   std::optional<int64_t>(800)};
  auto sets = build_train_valid_test_datasets(a);
  std::vector<const GPTDataset*> g;
  for (auto& s : sets) {
    g.push_back(dynamic_cast<const GPTDataset*>(s.get()));
    ASSERT_TRUE(g.back());
    EXPECT_FALSE(g.back()->indices_built());
    EXPECT_GT(g.back()->size(), 0);
  }
  // Four threads ask for samples of the fresh train split at once: one build, and every
  // thread reads what a dataset built before any read gives.
  auto ref_sets = build_train_valid_test_datasets(a);
  auto* ref = dynamic_cast<const GPTDataset*>(ref_sets[0].get());
  ASSERT_FALSE(ref->shuffle_index().empty());
  EXPECT_TRUE(ref->indices_built());
  std::vector<std::vector<int64_t>> got(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&, t] { g[0]->get_text(t, got[size_t(t)]); });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(g[0]->indices_built());
  EXPECT_FALSE(g[1]->indices_built());
  EXPECT_FALSE(g[2]->indices_built());
  for (int t = 0; t < 4; ++t) {
    std::vector<int64_t> want;
    ref->get_text(t, want);
    EXPECT_EQ(got[size_t(t)], want) << "sample " << t;
  }
  EXPECT_EQ(g[0]->shuffle_index(), ref->shuffle_index());
}

TEST(GPTDataset, SizeBeforeTheIndicesEqualsTheBuiltIndex) {
  // size() is counted from the token total; the built sample index must agree, for whole
  // samples and for validation's partial last sample, over one and several epochs.
  auto low = std::make_shared<Low>(std::vector<int32_t>{5, 3, 4, 9, 2, 7});
  for (bool drop : {true, false})
    for (std::optional<int64_t> n :
         {std::optional<int64_t>(), std::optional<int64_t>(3), std::optional<int64_t>(17)}) {
      GPTDatasetConfig cfg;
      cfg.sequence_length = 4;
      cfg.drop_last_partial_validation_sequence = drop;
      GPTDataset ds(low, {0, 1, 2, 3, 4, 5}, n, Split::Valid, cfg);
      const int64_t before = ds.size();
      EXPECT_FALSE(ds.indices_built());
      EXPECT_EQ(before, int64_t(ds.sample_index().size() / 2) - 1) << drop;
      EXPECT_EQ(before, int64_t(ds.shuffle_index().size()));
    }
}

TEST(Split, ParseAndRoundHalfToEven) {
  auto v = parse_split("1,1");
  EXPECT_DOUBLE_EQ(v[0], 0.5);
  EXPECT_DOUBLE_EQ(v[2], 0.0);
  auto m = split_matrix(v);
  ASSERT_TRUE(m[0] && m[1]);
  EXPECT_FALSE(m[2]);
  EXPECT_EQ(python_round(m[0]->second * 301), 150);  // std::round would give 151
  EXPECT_EQ(python_round(2.5), 2);
  EXPECT_EQ(python_round(3.5), 4);
  auto d = parse_split("969, 30, 1");
  EXPECT_NEAR(d[0], 0.969, 1e-15);
  EXPECT_THROW(parse_split("0,0,0"), Error);
  EXPECT_THROW(parse_split("1,2,3,4"), Error);
}

TEST(Split, EmptySplitIsClearError) {
  auto dir = mcpp::testing::scratch_dir();
  IndexedDatasetBuilder b(dir + "/small", IndexDType::U16);
  std::vector<int32_t> t(20, 7);
  for (int i = 0; i < 100; ++i) b.add_item(std::span<const int32_t>(t)), b.end_document();
  b.finalize();
  GPTDatasetsArgs a;
  a.data_path = {dir + "/small"};
  a.split = "969,30,1";  // test split: round(0.999*100)..100 = 100..100, empty
  a.seq_length = 8;
  a.num_samples = {10, 10, 10};
  try {
    build_train_valid_test_datasets(a);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("test split"), std::string::npos) << w;
    EXPECT_NE(w.find(dir + "/small"), std::string::npos) << w;
    EXPECT_NE(w.find("100 sequences"), std::string::npos) << w;
  }
  // A run that does not read the test split (no evaluation) builds the others; the train
  // split is the one a full build gives (Megatron's split book-ends, its samples).
  a.reads = {true, true, false};
  auto sets = build_train_valid_test_datasets(a);
  ASSERT_TRUE(sets[0] && sets[1]);
  EXPECT_FALSE(sets[2]);
  a.split = "970,20,10";  // every split non-empty; the train range [0, 97) is the same
  auto full = build_train_valid_test_datasets(a);
  std::vector<int64_t> x, y;
  for (int64_t i = 0; i < sets[0]->size(); ++i) {
    sets[0]->get_text(i, x), full[0]->get_text(i, y);
    EXPECT_EQ(x, y) << i;
  }
  // Blended prefixes: the unread, empty split is left out of the blend too.
  a.split = "969,30,1";
  a.data_path = {"1", dir + "/small", "1", dir + "/small"};
  auto blended = build_train_valid_test_datasets(a);
  EXPECT_TRUE(blended[0] && !blended[2]);
}

TEST(Blend, WorkedExamples) {
  std::vector<int16_t> di;
  std::vector<int64_t> dsi;
  build_blending_indices({0.3, 0.7}, 10, di, dsi);
  std::vector<std::pair<int, int64_t>> got,
      want{{1, 0}, {0, 0}, {1, 1}, {1, 2}, {0, 1}, {1, 3}, {1, 4}, {0, 2}, {1, 5}, {1, 6}};
  for (int s = 0; s < 10; ++s) got.push_back({di[s], dsi[s]});
  EXPECT_EQ(got, want);
  build_blending_indices({0.5, 0.5}, 6, di, dsi);
  EXPECT_EQ(di, (std::vector<int16_t>{0, 1, 0, 1, 0, 1}));
  build_exhaustive_blending_indices({3, 1}, di, dsi);
  EXPECT_EQ(di.size(), 4u);
  EXPECT_EQ(std::count(di.begin(), di.end(), 1), 1);
}

TEST(Blend, DataPathParsing) {
  auto b = parse_data_path({"7", "A", "93", "B"});
  ASSERT_EQ(b.prefixes, (std::vector<std::string>{"A", "B"}));
  EXPECT_DOUBLE_EQ(b.weights[0], 0.07);
  // ceil(100 * 0.07) = 8 in float64 (7.000000000000001), as Megatron computes it.
  EXPECT_EQ(int64_t(std::ceil(100 * b.weights[0])), 8);
  auto c = parse_data_path({"A B"});
  EXPECT_EQ(c.prefixes.size(), 2u);
  EXPECT_TRUE(c.weights.empty());
  auto d = parse_data_path({"A"});
  EXPECT_TRUE(d.weights.empty());
}

TEST(GPTDataset, MockLengthsMatchNumpy) {
  auto fx =
      nlohmann::json::parse(std::ifstream(mcpp::testing::golden("gpt_dataset_fixtures.json")));
  MockGPTLowLevelDataset mock(50257, 50256);
  auto head = fx["mock_lengths_head"].get<std::vector<int32_t>>();
  for (size_t i = 0; i < head.size(); ++i) EXPECT_EQ(mock.sequence_length(int64_t(i)), head[i]);
  int64_t sum = 0;
  for (int64_t i = 0; i < mock.num_sequences(); ++i) sum += mock.sequence_length(i);
  EXPECT_EQ(sum, fx["mock_lengths_sum"].get<int64_t>());
}

TEST(GPTDataset, MatchesIndependentReimplementation) {
  auto fx =
      nlohmann::json::parse(std::ifstream(mcpp::testing::golden("gpt_dataset_fixtures.json")));
  for (auto& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    GPTDatasetsArgs a;
    for (auto& p : c["lows"])
      a.data_path.push_back(mcpp::testing::golden("gptdata/" + p.get<std::string>()));
    if (!c["weights"].is_null()) {
      std::vector<std::string> words;
      for (size_t k = 0; k < c["lows"].size(); ++k)
        words.push_back(fmt::format("{}", c["weights"][k].get<double>())),
            words.push_back(a.data_path[k]);
      a.data_path = words;
    }
    a.mock_data = c.value("mock", false);
    a.split = c["split"];
    a.seq_length = c["S"];
    a.seed = c["seed"];
    for (int i = 0; i < 3; ++i)
      if (!c["sizes"][i].is_null()) a.num_samples[i] = c["sizes"][i].get<int64_t>();
    a.eod = c["kw"].value("eod", int64_t(50256));
    a.vocab_size = 50257;
    a.eod_mask_loss = c["kw"].value("eod_mask_loss", false);
    a.reset_position_ids = c["kw"].value("reset_position_ids", false);
    auto sets = build_train_valid_test_datasets(a);
    for (int i = 0; i < 3; ++i) {
      SCOPED_TRACE(i);
      auto& want = c["splits"][i];
      if (want.is_null()) {
        EXPECT_FALSE(sets[i]);
        continue;
      }
      ASSERT_TRUE(sets[i]);
      EXPECT_EQ(sets[i]->size(), want["size"].get<int64_t>());
      std::vector<int64_t> text;
      for (auto& [k, v] : want["samples"].items()) {
        sets[i]->get_text(std::stoll(k), text);
        EXPECT_EQ(text, v.get<std::vector<int64_t>>()) << "sample " << k;
      }
      if (auto* g = dynamic_cast<GPTDataset*>(sets[i].get())) {
        EXPECT_EQ(g->num_epochs(), want["epochs"].get<int64_t>());
        EXPECT_EQ(g->separate_final_epoch(), want["separate_final_epoch"].get<bool>());
        EXPECT_EQ(int64_t(g->document_index().size()), want["document_index_len"].get<int64_t>());
        EXPECT_EQ(checksum(g->document_index()), want["document_index_sum"].get<uint64_t>());
        EXPECT_EQ(checksum(g->sample_index()), want["sample_index_sum"].get<uint64_t>());
        EXPECT_EQ(checksum(g->shuffle_index()), want["shuffle_index_sum"].get<uint64_t>());
        if (want.contains("sample0")) {
          GPTSample s;
          g->get(0, s);
          EXPECT_EQ(s.tokens, want["sample0"]["tokens"].get<std::vector<int64_t>>());
          EXPECT_EQ(s.labels, want["sample0"]["labels"].get<std::vector<int64_t>>());
          EXPECT_EQ(s.loss_mask, want["sample0"]["loss_mask"].get<std::vector<float>>());
          EXPECT_EQ(s.position_ids, want["sample0"]["position_ids"].get<std::vector<int64_t>>());
        }
      } else {
        auto* b = dynamic_cast<BlendedDataset*>(sets[i].get());
        ASSERT_TRUE(b);
        auto head = want["dataset_index_head"].get<std::vector<int16_t>>();
        for (size_t k = 0; k < head.size(); ++k) EXPECT_EQ(b->dataset_index()[k], head[k]);
        EXPECT_EQ(checksum(b->dataset_index()), want["dataset_index_sum"].get<uint64_t>());
      }
    }
  }
}

TEST(GPTDataset, CompactIndexReadsTheSameNarrowOrWide) {
  const std::vector<int64_t> values{0, 7, 3, 2147483647};
  CompactIndex<int32_t> narrow(std::vector<int32_t>(values.begin(), values.end()));
  CompactIndex<int32_t> wide{std::vector<int64_t>(values)};
  EXPECT_TRUE(narrow.is_narrow());
  EXPECT_FALSE(wide.is_narrow());
  ASSERT_EQ(narrow.size(), values.size());
  ASSERT_EQ(wide.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(narrow[i], values[i]);
    EXPECT_EQ(wide[i], values[i]);
  }
  EXPECT_EQ(narrow.to_vector(), values);
  EXPECT_EQ(wide.to_vector(), values);
  EXPECT_EQ(CompactIndex<uint32_t>().size(), 0u);
}

// --train-data-path / --valid-data-path / --test-data-path (Megatron's blend_per_split):
// split i reads the whole of each of its prefixes, which is what Megatron's builder does by
// spoofing the split matrix to (0, 1) at i. So each split equals the same split built from a
// --split that gives it everything ("1,0,0" for train, "0,1,0" for valid), sample for
// sample; a weighted blend likewise; a split without paths is not built.
TEST(PerSplitData, EachSplitReadsWholeDatasetsOfItsOwn) {
  const auto dir = mcpp::testing::scratch_dir();
  auto make = [&](const std::string& name, int docs, int32_t base) {
    IndexedDatasetBuilder b(dir + "/" + name, IndexDType::U16);
    for (int d = 0; d < docs; ++d) {
      std::vector<int32_t> t(size_t(5 + d % 13));
      for (size_t k = 0; k < t.size(); ++k) t[k] = base + int32_t((d * 7 + k) % 500);
      b.add_item(std::span<const int32_t>(t)), b.end_document();
    }
    b.finalize();
    return dir + "/" + name;
  };
  const std::string A = make("a", 120, 0), B = make("b", 80, 1000), C = make("c", 60, 2000);
  GPTDatasetsArgs base;
  base.seq_length = 16;
  base.num_samples = {40, 24, 8};
  auto same = [](const std::shared_ptr<GPTSampleSource>& x,
                 const std::shared_ptr<GPTSampleSource>& y) {
    if (!x || !y || x->size() != y->size()) return false;
    std::vector<int64_t> p, q;
    for (int64_t i = 0; i < x->size(); ++i) {
      x->get_text(i, p), y->get_text(i, q);
      if (p != q) return false;
    }
    return true;
  };
  GPTDatasetsArgs per = base;
  per.per_split = {std::vector<std::string>{A}, std::vector<std::string>{"0.3", B, "0.7", C},
                   std::nullopt};
  per.reads = {true, true, false};
  const auto got = build_train_valid_test_datasets(per);
  EXPECT_FALSE(got[2]);  // no --test-data-path

  GPTDatasetsArgs train = base;
  train.data_path = {A};
  train.split = "1,0,0";
  EXPECT_TRUE(same(got[0], build_train_valid_test_datasets(train)[0]));
  GPTDatasetsArgs valid = base;
  valid.data_path = {"0.3", B, "0.7", C};
  valid.split = "0,1,0";
  const auto want_valid = build_train_valid_test_datasets(valid)[1];
  EXPECT_TRUE(same(got[1], want_valid));
  // Not the --split "969,30,1" range of the same files: the valid split is whole.
  valid.split = "969,30,1";
  valid.reads = {false, true, false};
  EXPECT_FALSE(same(got[1], build_train_valid_test_datasets(valid)[1]));

  // One prefix with a weight is built directly (Megatron ignores the weight there).
  GPTDatasetsArgs weighted_one = per;
  weighted_one.per_split[0] = std::vector<std::string>{"0.5", A};
  EXPECT_TRUE(same(build_train_valid_test_datasets(weighted_one)[0], got[0]));
  // Errors name the split's flag.
  GPTDatasetsArgs bad = per;
  bad.per_split[1] = std::vector<std::string>{"1", B, "-2", C};
  try {
    build_train_valid_test_datasets(bad);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--valid-data-path weight -2"), std::string::npos)
        << e.what();
  }
}

TEST(PerSplitData, ArgsFiles) {
  const auto dir = mcpp::testing::scratch_dir();
  mcpp::testing::write_bytes(dir + "/words.txt", "0.3 a\n 0.7   b\n");
  EXPECT_EQ(read_data_args_file(dir + "/words.txt"),
            (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  auto error = [](auto f) -> std::string {
    try {
      f();
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  mcpp::testing::write_bytes(dir + "/empty.txt", " \n");
  EXPECT_NE(error([&] { read_data_args_file(dir + "/empty.txt"); }).find("holds no words"),
            std::string::npos);
  EXPECT_NE(error([&] { read_data_args_file(dir + "/none.txt"); }).find(dir + "/none.txt"),
            std::string::npos);

  mcpp::testing::write_bytes(dir + "/split.json",
                             R"({"train": "0.3 a 0.7 b", "valid": ["c", "d e"], "test": null})");
  const auto s = read_per_split_data_args(dir + "/split.json");
  EXPECT_EQ(s[0], (std::vector<std::string>{"0.3", "a", "0.7", "b"}));
  EXPECT_EQ(s[1], (std::vector<std::string>{"c", "d", "e"}));
  EXPECT_FALSE(s[2]);
  mcpp::testing::write_bytes(dir + "/nokey.json", R"({"train": "a", "valid": "b"})");
  const std::string e1 = error([&] { read_per_split_data_args(dir + "/nokey.json"); });
  EXPECT_NE(e1.find("no \"test\" entry"), std::string::npos) << e1;
  EXPECT_NE(e1.find("nokey.json"), std::string::npos) << e1;
  mcpp::testing::write_bytes(dir + "/num.json", R"({"train": 3, "valid": "b", "test": "c"})");
  EXPECT_NE(error([&] { read_per_split_data_args(dir + "/num.json"); })
                .find("\"train\" holds 3"),
            std::string::npos);
  mcpp::testing::write_bytes(dir + "/bad.json", "{train: a");
  EXPECT_NE(error([&] { read_per_split_data_args(dir + "/bad.json"); }).find("is not JSON"),
            std::string::npos);
}

}  // namespace gpt_dataset_test
