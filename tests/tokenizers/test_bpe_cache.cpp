// The BPE building blocks that preprocessing threads share: the piece cache (lock-free
// reads, concurrent inserts), the vocabulary index, and GPT-2 encoding from many threads
// at once against one thread.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer.h"

using namespace mcpp::data;
using bpe::SharedPieceCache;

namespace bpe_cache_test {

uint64_t test_hash(const std::string& s) { return std::hash<std::string>{}(s) | 1; }

std::vector<int32_t> ids_of(int i) { return std::vector<int32_t>(size_t(1 + i % 5), i); }


TEST(SharedPieceCache, ConcurrentInsertsAreAllFound) {
  SharedPieceCache cache(size_t(1) << 14);
  constexpr int kKeys = 4000, kThreads = 8;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      // Every thread inserts every key (in a different order): racing inserts of one key.
      for (int j = 0; j < kKeys; ++j) {
        int i = (j * 7 + t * 613) % kKeys;
        std::string k = "piece" + std::to_string(i);
        auto v = ids_of(i);
        if (!cache.find(k, test_hash(k)))
          EXPECT_TRUE(cache.insert(k, test_hash(k), v.data(), v.size()));
      }
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < kKeys; ++i) {
    std::string k = "piece" + std::to_string(i);
    const auto* e = cache.find(k, test_hash(k));
    ASSERT_NE(e, nullptr) << k;
    EXPECT_EQ(std::vector<int32_t>(e->ids(), e->ids() + e->n_ids), ids_of(i)) << k;
    EXPECT_EQ(std::string_view(e->key(), e->key_len), k);
  }
  EXPECT_EQ(cache.find("absent", test_hash("absent")), nullptr);
  EXPECT_FALSE(cache.full());
}

TEST(SharedPieceCache, StopsGrowingWhenFull) {
  SharedPieceCache cache(64);  // at most 32 entries
  int inserted = 0;
  for (int i = 0; i < 100; ++i) {
    std::string k = "k" + std::to_string(i);
    auto v = ids_of(i);
    inserted += cache.insert(k, test_hash(k), v.data(), v.size());
  }
  EXPECT_EQ(inserted, 32);
  EXPECT_TRUE(cache.full());
  for (int i = 0; i < 32; ++i) {
    std::string k = "k" + std::to_string(i);
    ASSERT_NE(cache.find(k, test_hash(k)), nullptr) << k;
  }
  // The byte bound: one 1 MB arena block allowed, entries of ~4 KB fill it.
  SharedPieceCache small(1024, size_t(1) << 20);
  std::vector<int32_t> big(1000, 7);
  int n = 0;
  for (int i = 0;
       i < 512 && small.insert("b" + std::to_string(i), test_hash("b" + std::to_string(i)),
                               big.data(), big.size());
       ++i)
    ++n;
  EXPECT_GT(n, 200);
  EXPECT_LT(n, 262);
  EXPECT_TRUE(small.full());
}

TEST(TokenIndex, FindsWhatWasAddedAndGrows) {
  bpe::TokenIndex idx(4);  // grows many times
  for (int i = 0; i < 20000; ++i) idx.add("t" + std::to_string(i), i);
  idx.add("", 99999);
  idx.add("t5", 123);  // already present: keeps 5
  for (int i = 0; i < 20000; ++i) ASSERT_EQ(idx.find("t" + std::to_string(i)), i);
  EXPECT_EQ(idx.find("t5"), 5);
  EXPECT_EQ(idx.find(""), 99999);
  EXPECT_EQ(idx.find("t20000"), -1);
  EXPECT_EQ(idx.find(std::string("t1\0", 3)), -1);
}

// Eight threads encoding at once through one tokenizer (one shared cache, filling while
// they run) give the ids that a fresh tokenizer gives on one thread.
TEST(GPT2BPE, ManyThreadsEncodeAsOne) {
  const std::string dir = std::string(MCPP_SOURCE_DIR) + "/.cache/assets/gpt2/package";
  ASSERT_TRUE(std::filesystem::exists(dir + "/encoder.json")) << "run scripts/fetch_assets.sh";
  const TokenizerArgs args{.type = "GPT2BPETokenizer",
                           .vocab_file = dir + "/encoder.json",
                           .merge_file = dir + "/vocab.bpe"};
  std::vector<std::string> texts;
  const char* words[] = {"the",      " quick", " naïve", " café",  " 東京", " 😀",
                         "  ",       " 123",   ",",      " DON'T", "\n\n",  " supercalifragilistic",
                         " Ünïcödé", "\t"};
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    for (int j = 0; j < 1 + i % 17; ++j) s += words[(i * 31 + j * 7) % std::size(words)];
    s += " w" + std::to_string(i * 7919 % 1000);  // many distinct pieces
    texts.push_back(s);
  }
  std::vector<std::vector<int32_t>> want(texts.size());
  {
    auto serial = make_tokenizer(args);
    for (size_t i = 0; i < texts.size(); ++i) want[i] = serial->encode(texts[i]);
  }
  auto shared = make_tokenizer(args);
  std::vector<std::vector<int32_t>> got(texts.size());
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      for (size_t i = size_t(t); i < texts.size(); i += 8) got[i] = shared->encode(texts[i]);
      for (size_t i = 0; i < texts.size(); i += 3) EXPECT_EQ(shared->encode(texts[i]), want[i]);
    });
  for (auto& th : threads) th.join();
  for (size_t i = 0; i < texts.size(); ++i) ASSERT_EQ(got[i], want[i]) << texts[i];
}

}  // namespace bpe_cache_test
