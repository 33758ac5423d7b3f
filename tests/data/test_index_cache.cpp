// --data-cache-path: GPTDataset / BlendedDataset indices are written as .npy files with a
// description, reloaded when valid (same indices as a fresh build), and rebuilt with a
// warning when the description, a header or a value is wrong.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "data/blended_dataset.h"
#include "data/gpt_dataset.h"
#include "data/index_cache.h"
#include "test_util.h"
#include "synthetic_low_dataset.h"

using namespace mcpp;
using namespace mcpp::data;
using mcpp::data::synthetic::Low;

namespace index_cache_test {

std::vector<std::string> files(const std::string& dir) {
  std::vector<std::string> v;
  for (auto& e : std::filesystem::directory_iterator(dir)) v.push_back(e.path().filename());
  std::sort(v.begin(), v.end());
  return v;
}


TEST(IndexCache, NpyRoundTrip) {
  auto dir = mcpp::testing::scratch_dir();
  std::vector<int32_t> a{1, -2, 3, 4, 5, 6};
  write_npy(dir + "/a.npy", "<i4", {3, 2}, a.data(), 24);
  std::string raw = mcpp::testing::read_bytes(dir + "/a.npy");
  EXPECT_EQ(raw.substr(0, 6), "\x93NUMPY");
  EXPECT_EQ((raw.size() - 24) % 64, 0u);
  EXPECT_NE(raw.find("'shape': (3, 2)"), std::string::npos);
  auto r = read_npy(dir + "/a.npy");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->shape, (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(*r->as_int64(), (std::vector<int64_t>{1, -2, 3, 4, 5, 6}));
  mcpp::testing::write_bytes(dir + "/b.npy", raw.substr(0, raw.size() - 3));
  EXPECT_FALSE(read_npy(dir + "/b.npy"));
}

TEST(IndexCache, GPTDatasetSavesLoadsAndRebuildsCorrupt) {
  auto dir = mcpp::testing::scratch_dir();
  auto low = std::make_shared<Low>(std::vector<int32_t>{50, 31, 7, 64, 12, 90, 3, 41});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 16;
  cfg.seed = 7;
  cfg.split_spec = "1,0,0";
  std::vector<int32_t> idx{0, 1, 2, 3, 4, 5, 6, 7};
  GPTDataset fresh(low, idx, int64_t(40), Split::Train, cfg);  // several epochs
  cfg.path_to_cache = dir + "/cache";
  GPTDataset first(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_FALSE(first.loaded_from_cache());
  auto names = files(cfg.path_to_cache);
  ASSERT_EQ(names.size(), 4u);
  for (auto& n : names) EXPECT_NE(n.find("-GPTDataset-train-"), std::string::npos) << n;
  GPTDataset second(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.document_index(), fresh.document_index());
  EXPECT_EQ(second.sample_index(), fresh.sample_index());
  EXPECT_EQ(second.shuffle_index(), fresh.shuffle_index());

  // Another seed is another description: a new set of files, not a reuse.
  cfg.seed = 8;
  GPTDataset other(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_FALSE(other.loaded_from_cache());
  EXPECT_EQ(files(cfg.path_to_cache).size(), 8u);
  cfg.seed = 7;

  // A corrupt shuffle index (values out of range) is rebuilt, then reloads.
  std::string shuffle;
  for (auto& n : files(cfg.path_to_cache))
    if (n.find("shuffle_index") != std::string::npos &&
        n.find(description_hash(second.description())) == 0)
      shuffle = cfg.path_to_cache + "/" + n;
  ASSERT_FALSE(shuffle.empty());
  std::string raw = mcpp::testing::read_bytes(shuffle);
  std::fill(raw.end() - 8, raw.end(), '\xFF');
  mcpp::testing::write_bytes(shuffle, raw);
  GPTDataset third(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_FALSE(third.loaded_from_cache());
  EXPECT_EQ(third.shuffle_index(), fresh.shuffle_index());
  mcpp::testing::write_bytes(shuffle, raw.substr(0, 20));  // truncated
  GPTDataset fourth(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_FALSE(fourth.loaded_from_cache());
  GPTDataset fifth(low, idx, int64_t(40), Split::Train, cfg);
  EXPECT_TRUE(fifth.loaded_from_cache());
  EXPECT_EQ(fifth.shuffle_index(), fresh.shuffle_index());
}

TEST(IndexCache, BlendedDatasetSavesAndLoads) {
  auto dir = mcpp::testing::scratch_dir();
  auto low = std::make_shared<Low>(std::vector<int32_t>{50, 31, 7, 64, 12, 90, 3, 41});
  GPTDatasetConfig cfg;
  cfg.sequence_length = 8;
  auto a = std::make_shared<GPTDataset>(low, std::vector<int32_t>{0, 1, 2, 3}, int64_t(30),
                                        Split::Train, cfg);
  auto b = std::make_shared<GPTDataset>(low, std::vector<int32_t>{4, 5, 6, 7}, int64_t(30),
                                        Split::Train, cfg);
  BlendedDataset fresh({a, b}, {0.3, 0.7}, int64_t(40), Split::Train);
  BlendedDataset first({a, b}, {0.3, 0.7}, int64_t(40), Split::Train, dir);
  EXPECT_FALSE(first.loaded_from_cache());
  BlendedDataset second({a, b}, {0.3, 0.7}, int64_t(40), Split::Train, dir);
  EXPECT_TRUE(second.loaded_from_cache());
  EXPECT_EQ(second.dataset_index(), fresh.dataset_index());
  EXPECT_EQ(second.dataset_sample_index(), fresh.dataset_sample_index());
  BlendedDataset other({a, b}, {0.5, 0.5}, int64_t(40), Split::Train, dir);
  EXPECT_FALSE(other.loaded_from_cache());
}

}  // namespace index_cache_test
