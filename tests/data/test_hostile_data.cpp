// Hostile data inputs (issue 23, part B): each case below was a crash, a hang or a silent
// wrong result before it became an error naming the file (or a rebuilt cache).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>

#include "base/error.h"
#include "data/dataset_builder.h"
#include "data/gpt_dataset.h"
#include "data/index_cache.h"
#include "data/indexed_dataset.h"
#include "data/preprocess.h"
#include "test_util.h"
#include "synthetic_low_dataset.h"

#ifdef MCPP_HAVE_ZLIB
#include <zlib.h>
#endif

using namespace mcpp;
using namespace mcpp::data;
using mcpp::data::synthetic::Low;
using mcpp::testing::read_bytes;
using mcpp::testing::scratch_dir;
using mcpp::testing::write_bytes;
namespace fs = std::filesystem;

namespace hostile_data_test {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void expect_has(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "missing '" << part << "' in:\n" << s;
}

// A dataset of `seqs` sequences (one document each) of dtype dt.
std::string make_dataset(const std::string& prefix, IndexDType dt,
                         const std::vector<std::vector<int64_t>>& seqs) {
  IndexedDatasetBuilder b(prefix, dt);
  for (const auto& s : seqs) {
    b.add_item(std::span<const int64_t>(s));
    b.end_document();
  }
  b.finalize();
  return prefix;
}


// A sequence pointer near INT64_MAX made `ptr + len * itemsize` wrap around and pass; the
// read at training time then left the mapping (SIGSEGV).
TEST(HostileData, IdxPointerNearInt64MaxIsError) {
  const std::string dir = scratch_dir();
  const std::string p =
      make_dataset(dir + "/d", IndexDType::U16, {{1, 2, 3}, {4, 5}, {6, 7, 8, 9}, {10}});
  std::string idx = read_bytes(p + ".idx");
  const int64_t n = 4, huge = std::numeric_limits<int64_t>::max() - 1;
  std::memcpy(idx.data() + 34 + 4 * n + 8 * 2, &huge, 8);  // pointer of sequence 2
  write_bytes(p + ".idx", idx);
  const std::string err = error_of([&] { IndexedDataset d(p); });
  expect_has(err, "d.bin");
  expect_has(err, "sequence 2");
}

// Ids at or above the padded vocabulary trained silently on a zero embedding row.
TEST(HostileData, TokenIdsOutsideTheVocabularyAreErrors) {
  const std::string dir = scratch_dir();
  const std::string u16 =
      make_dataset(dir + "/u16", IndexDType::U16, {{1, 2, 3}, {0xFFFF, 4}, {5}});
  IndexedDataset d(u16);
  EXPECT_EQ(d.max_token_id(), 0xFFFF);
  EXPECT_NO_THROW(d.check_vocabulary(65536));
  std::string err = error_of([&] { d.check_vocabulary(50304); });
  expect_has(err, "u16.bin");
  expect_has(err, "token id 65535");
  expect_has(err, "50304");

  const std::string neg = make_dataset(dir + "/i32", IndexDType::I32, {{1, -5, 3}, {2}});
  err = error_of([&] { IndexedDataset(neg).max_token_id(); });
  expect_has(err, "i32.bin");
  expect_has(err, "negative value -5");

  // A float dataset holding NaN (written over the bytes of id 2).
  const std::string f32 = make_dataset(dir + "/f32", IndexDType::F32, {{1, 2}, {3}});
  std::string bin = read_bytes(f32 + ".bin");
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(bin.data() + 4, &nan, 4);
  write_bytes(f32 + ".bin", bin);
  err = error_of([&] { IndexedDataset(f32).max_token_id(); });
  expect_has(err, "f32.bin");
  expect_has(err, "not a token id");

  // The builder checks every dataset it opens when given the padded vocabulary.
  std::vector<std::vector<int64_t>> many;
  for (int i = 0; i < 200; ++i) many.push_back({i % 7 + 1, 700, 3, 4, 5, 6, 7, 8});
  const std::string big = make_dataset(dir + "/big", IndexDType::U16, many);
  GPTDatasetsArgs a;
  a.data_path = {big};
  a.split = "1,0,0";
  a.seq_length = 8;
  a.num_samples[0] = 10;
  a.padded_vocab_size = 640;
  err = error_of([&] { build_train_valid_test_datasets(a); });
  expect_has(err, "big.bin");
  expect_has(err, "token id 700");
  a.padded_vocab_size = 768;
  EXPECT_NO_THROW(build_train_valid_test_datasets(a));
  // With --data-cache-path the scan runs once; the cached value decides the next opening.
  a.data_cache_path = dir + "/cache";
  EXPECT_NO_THROW(build_train_valid_test_datasets(a));
  std::string cached;
  for (auto& e : fs::directory_iterator(a.data_cache_path))
    if (e.path().filename().string().find("-IndexedDataset-vocabulary-max_token_id.npy") !=
        std::string::npos)
      cached = e.path().string();
  ASSERT_FALSE(cached.empty());
  EXPECT_EQ((*read_npy(cached)->as_int64())[0], 700);
  a.padded_vocab_size = 640;
  expect_has(error_of([&] { build_train_valid_test_datasets(a); }), "token id 700");
}

// A cached sample_index.npy with a backwards or out-of-range boundary corrupted the heap in
// get_text(); an all-zero one trained on one-token samples. Each is rebuilt instead.
TEST(HostileData, CorruptCachedSampleIndexIsRebuilt) {
  const std::string dir = scratch_dir();
  auto low = std::make_shared<Low>(std::vector<int32_t>{50, 31, 7, 64, 12, 90, 3, 41});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 16, cfg.seed = 7, cfg.split_spec = "1,0,0";
  const std::vector<int32_t> idx{0, 1, 2, 3, 4, 5, 6, 7};
  GPTDataset fresh(low, idx, int64_t(40), Split::Train, cfg);
  cfg.path_to_cache = dir + "/cache";
  GPTDataset first(low, idx, int64_t(40), Split::Train, cfg);
  std::string path;
  for (auto& e : fs::directory_iterator(cfg.path_to_cache))
    if (e.path().filename().string().find("sample_index") != std::string::npos)
      path = e.path().string();
  ASSERT_FALSE(path.empty());
  const std::string good = read_bytes(path);
  const size_t rows = fresh.sample_index().size();  // (n + 1) * 2 int32 values
  ASSERT_EQ(read_npy(path)->descr, "<i4");
  const size_t data = good.size() - rows * 4;
  auto corrupt = [&](auto edit) {
    std::string b = good;
    std::vector<int32_t> v(rows);
    std::memcpy(v.data(), b.data() + data, rows * 4);
    edit(v);
    std::memcpy(b.data() + data, v.data(), rows * 4);
    write_bytes(path, b);
    GPTDataset ds(low, idx, int64_t(40), Split::Train, cfg);
    EXPECT_FALSE(ds.loaded_from_cache());
    EXPECT_EQ(ds.sample_index(), fresh.sample_index());
    std::vector<int64_t> text;
    for (int64_t i = 0; i < ds.size(); ++i) ds.get_text(i, text);
  };
  corrupt([](std::vector<int32_t>& v) { std::fill(v.begin(), v.end(), 0); });
  corrupt([](std::vector<int32_t>& v) {  // offsets far past their sequences
    for (size_t i = 3; i < v.size(); i += 2) v[i] = 1 << 20;
  });
  corrupt([](std::vector<int32_t>& v) {  // a boundary moved backwards within its document
    for (size_t i = 2; i + 2 < v.size(); i += 2)
      if (v[i] == v[i + 2] && v[i + 3] > v[i + 1]) {
        std::swap(v[i + 1], v[i + 3]);
        return;
      }
    FAIL() << "no sample within one document";
  });
  write_bytes(path, good);
  GPTDataset again(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_TRUE(again.loaded_from_cache());
  // A FIFO under the cache name: rebuilt (and replaced), never read (a read would block).
  fs::remove(path);
  ASSERT_EQ(::mkfifo(path.c_str(), 0644), 0);
  GPTDataset fifo(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_FALSE(fifo.loaded_from_cache());
  EXPECT_TRUE(fs::is_regular_file(path));
}

// --split words that are not plain numbers are named ("abc" was "sums to zero", "1e400"
// was "has 4 numbers", "nan" passed as nothing).
TEST(HostileData, SplitErrorsNameTheWord) {
  for (const char* bad : {"abc", "1e400,1,1", "nan,1,1", "-1,2,3", "1,inf,1"}) {
    const std::string err = error_of([&] { parse_split(bad); });
    expect_has(err, "is not a non-negative decimal number");
  }
  expect_has(error_of([&] { parse_split("1e400,1,1"); }), "'1e400'");
  EXPECT_EQ(parse_split("969, 30, 1"), parse_split("969,30,1"));
  EXPECT_EQ(parse_split("98/2/0")[2], 0.0);
  expect_has(error_of([&] { parse_split("0,0,0"); }), "sums to zero");
}

#ifdef MCPP_HAVE_ZLIB
// A cut-off .gz was read as a clean end: with --skip-bad-lines half the documents and exit 0.
TEST(HostileData, TruncatedGzipIsReportedAsTruncation) {
  const std::string dir = scratch_dir();
  std::string text;
  for (int i = 0; i < 2000; ++i) text += "{\"text\": \"" + std::to_string(i) + " 1 2 3\"}\n";
  gzFile g = gzopen((dir + "/in.jsonl.gz").c_str(), "wb");
  gzwrite(g, text.data(), unsigned(text.size()));
  gzclose(g);
  const std::string gz = read_bytes(dir + "/in.jsonl.gz");
  write_bytes(dir + "/cut.jsonl.gz", gz.substr(0, gz.size() / 2));
  NullTokenizer tok(100000);
  PreprocessOptions o;
  o.inputs = {dir + "/cut.jsonl.gz"};
  o.output_prefix = dir + "/out";
  o.skip_bad_lines = true;
  o.progress = false;
  const std::string err = error_of([&] { preprocess(o, tok); });
  expect_has(err, "cut.jsonl.gz");
  expect_has(err, "truncated");
  for (auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find("out"), std::string::npos) << e.path();
  o.inputs = {dir + "/in.jsonl.gz"};
  EXPECT_EQ(preprocess(o, tok).documents, 2000);
}
#endif

// --workers 100000 aborted in std::thread and left out_text_document.bin.tmp<pid> behind.
TEST(HostileData, TooManyWorkersIsAnErrorAndLeavesNothing) {
  const std::string dir = scratch_dir();
  write_bytes(dir + "/in.jsonl", "{\"text\": \"1 2\"}\n");
  NullTokenizer tok(1000);
  PreprocessOptions o;
  o.inputs = {dir + "/in.jsonl"};
  o.output_prefix = dir + "/out";
  o.workers = 100000;
  o.progress = false;
  expect_has(error_of([&] { preprocess(o, tok); }), "--workers 100000");
  int files = 0;
  for (auto& e : fs::directory_iterator(dir)) ++files, (void)e;
  EXPECT_EQ(files, 1);
}

}  // namespace hostile_data_test
