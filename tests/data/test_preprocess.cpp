#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "test_util.h"

#ifdef MCPP_HAVE_ZLIB
#include <zlib.h>
#endif
#ifdef MCPP_HAVE_ZSTD
#include <zstd.h>
#endif

using namespace mcpp;
using namespace mcpp::data;

namespace preprocess_test {

const char* kJsonl =
    "{\"text\": \"1 2 3\", \"other\": \"7\"}\n"
    "{\"other\": \"8 8\", \"text\": \"4 5\"}\n"
    "\n"                                                           // blank: skipped
    "{\"text\": \"\", \"other\": \"9\"}\n"                         // empty document
    "{\"text\": [\"10 11\", \"\", \"12\"], \"other\": \"1\"}\r\n"  // list: one sequence per
                                                                   // non-empty item
    "{\"text\": \"13\\u0020 14\", \"other\": \"2\"}";              // escapes, no final newline

PreprocessOptions options(const std::string& dir, const std::string& input, int workers) {
  PreprocessOptions o;
  o.inputs = {input};
  o.output_prefix = dir + "/out";
  o.json_keys = {"text", "other"};
  o.append_eod = true;
  o.workers = workers;
  o.batch_bytes = 64;  // many batches even for a tiny file
  o.progress = false;
  return o;
}

void check_output(const std::string& dir) {
  IndexedDataset t(dir + "/out_text_document");
  EXPECT_EQ(t.dtype(), IndexDType::U16);
  // Documents: [1 2 3 E] [4 5 E] [] [10 11][12 E] [13 14 E]; E = 1000 (NullTokenizer eod)
  EXPECT_EQ(t.num_documents(), 5);
  EXPECT_EQ(t.num_sequences(), 5);
  std::vector<int64_t> docs(t.document_indices().begin(), t.document_indices().end());
  EXPECT_EQ(docs, (std::vector<int64_t>{0, 1, 2, 2, 4, 5}));
  EXPECT_EQ(t.get(0), (std::vector<int64_t>{1, 2, 3, 1000}));
  EXPECT_EQ(t.get(2), (std::vector<int64_t>{10, 11}));
  EXPECT_EQ(t.get(3), (std::vector<int64_t>{12, 1000}));
  EXPECT_EQ(t.get(4), (std::vector<int64_t>{13, 14, 1000}));
  IndexedDataset o(dir + "/out_other_document");
  EXPECT_EQ(o.num_documents(), 5);
  EXPECT_EQ(o.get(1), (std::vector<int64_t>{8, 8, 1000}));
}


TEST(Preprocess, EndToEndPlainMultiWorker) {
  auto dir = mcpp::testing::scratch_dir();
  mcpp::testing::write_bytes(dir + "/in.jsonl", kJsonl);
  NullTokenizer tok(1000);
  for (int workers : {1, 3}) {
    auto st = preprocess(options(dir, dir + "/in.jsonl", workers), tok);
    EXPECT_EQ(st.documents, 5);
    EXPECT_EQ(st.tokens, 14 + 11);
    check_output(dir);
  }
}

#ifdef MCPP_HAVE_ZLIB
TEST(Preprocess, GzipInput) {
  auto dir = mcpp::testing::scratch_dir();
  gzFile g = gzopen((dir + "/in.jsonl.gz").c_str(), "wb");
  gzwrite(g, kJsonl, unsigned(std::strlen(kJsonl)));
  gzclose(g);
  NullTokenizer tok(1000);
  preprocess(options(dir, dir + "/in.jsonl.gz", 2), tok);
  check_output(dir);
}
#endif

#ifdef MCPP_HAVE_ZSTD
TEST(Preprocess, ZstdInput) {
  auto dir = mcpp::testing::scratch_dir();
  std::string z(ZSTD_compressBound(std::strlen(kJsonl)), '\0');
  z.resize(ZSTD_compress(z.data(), z.size(), kJsonl, std::strlen(kJsonl), 3));
  mcpp::testing::write_bytes(dir + "/in.jsonl.zst", z);
  NullTokenizer tok(1000);
  preprocess(options(dir, dir + "/in.jsonl.zst", 2), tok);
  check_output(dir);
  mcpp::testing::write_bytes(dir + "/bad.jsonl.zst", z.substr(0, z.size() / 2));
  EXPECT_THROW(preprocess(options(dir, dir + "/bad.jsonl.zst", 1), tok), Error);
}
#endif

TEST(Preprocess, BadLineNamesFileAndLineAndLeavesNothing) {
  auto dir = mcpp::testing::scratch_dir();
  std::string in =
      std::string(kJsonl) + "\n{\"text\": \"5\"}\n{\"text\": \"5\", \"other\": \"1\"}\n{broken\n";
  mcpp::testing::write_bytes(dir + "/in.jsonl", in);
  NullTokenizer tok(1000);
  auto o = options(dir, dir + "/in.jsonl", 2);
  try {
    preprocess(o, tok);
    FAIL() << "no error";
  } catch (const Error& e) {
    std::string w = e.what();
    EXPECT_NE(w.find("in.jsonl:7"), std::string::npos) << w;  // line 7 lacks "other"
    EXPECT_NE(w.find("other"), std::string::npos) << w;
    EXPECT_NE(w.find("--skip-bad-lines"), std::string::npos) << w;
  }
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_EQ(e.path().filename(), "in.jsonl") << "left behind: " << e.path();
  o.skip_bad_lines = true;
  auto st = preprocess(o, tok);
  EXPECT_EQ(st.skipped, 2);
  EXPECT_EQ(st.documents, 6);
  IndexedDataset t(dir + "/out_text_document");
  EXPECT_EQ(t.num_documents(), 6);
  EXPECT_EQ(t.get(t.num_sequences() - 1), (std::vector<int64_t>{5, 1000}));
}

// Real BPE through the whole pipeline: every worker count writes the same bytes, and
// every document holds the ids that the tokenizer gives for its text (+ EOD). Small
// batches and a line far longer than a batch exercise the reader's cutting.
TEST(Preprocess, Gpt2ManyWorkersMatchOneAndTheTokenizer) {
  const std::string gpt2 = std::string(MCPP_SOURCE_DIR) + "/.cache/assets/gpt2/package";
  ASSERT_TRUE(std::filesystem::exists(gpt2 + "/encoder.json")) << "run scripts/fetch_assets.sh";
  auto tok = make_tokenizer({.type = "GPT2BPETokenizer",
                             .vocab_file = gpt2 + "/encoder.json",
                             .merge_file = gpt2 + "/vocab.bpe"});
  auto dir = mcpp::testing::scratch_dir();
  std::vector<std::string> texts;
  std::string jsonl;
  for (int i = 0; i < 400; ++i) {
    std::string t = "Line " + std::to_string(i) + ": naïve café, 東京 😀 — it's";
    for (int j = 0; j < i % 13; ++j) t += " word" + std::to_string(i * j % 97);
    if (i == 123) t += std::string(5000, 'x') + " the end";  // longer than a batch
    texts.push_back(t);
    jsonl += "{\"text\": \"" + t + "\"}\n";
  }
  mcpp::testing::write_bytes(dir + "/in.jsonl", jsonl);
  std::string first_bin, first_idx;
  for (int workers : {1, 4, 7}) {
    PreprocessOptions o;
    o.inputs = {dir + "/in.jsonl"};
    o.output_prefix = dir + "/w" + std::to_string(workers);
    o.append_eod = true;
    o.workers = workers;
    o.batch_bytes = 1000;
    o.progress = false;
    auto st = preprocess(o, *tok);
    EXPECT_EQ(st.documents, 400);
    std::string bin = mcpp::testing::read_bytes(o.output_prefix + "_text_document.bin");
    std::string idx = mcpp::testing::read_bytes(o.output_prefix + "_text_document.idx");
    if (workers == 1) {
      first_bin = bin, first_idx = idx;
      IndexedDataset ds(o.output_prefix + "_text_document");
      ASSERT_EQ(ds.num_documents(), 400);
      for (int i = 0; i < 400; ++i) {
        auto want = tok->encode(texts[size_t(i)]);
        want.push_back(int32_t(tok->eod()));
        auto got = ds.get(i);
        ASSERT_EQ(std::vector<int32_t>(got.begin(), got.end()), want) << "document " << i;
      }
    } else {
      EXPECT_EQ(bin, first_bin) << workers << " workers";
      EXPECT_EQ(idx, first_idx) << workers << " workers";
    }
  }
}

TEST(Preprocess, MissingInputIsError) {
  auto dir = mcpp::testing::scratch_dir();
  NullTokenizer tok(1000);
  EXPECT_THROW(preprocess(options(dir, dir + "/nope.jsonl", 1), tok), Error);
}

}  // namespace preprocess_test
