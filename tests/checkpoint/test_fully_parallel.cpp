// Fully parallel save (the DP replicas of a shard share its writing) and the pieces of the
// fully parallel load that need no second process: the assignment by bytes and the reader
// that reads only the tensors asked for. The exchange itself runs under mpirun
// (tests/cli/fully_parallel_ckpt.sh).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <numeric>

#include "checkpoint/fully_parallel.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace fs = std::filesystem;
namespace ck = mcpp::checkpoint;

namespace fully_parallel_test {

constexpr uint64_t kFpParamSalt = 21, kFpAvgSalt = 22, kFpSqSalt = 23;

using Rank = CkptRank;

Rank make_rank(int64_t tp, int64_t r, bool filled) {
  return make_ckpt_rank("llama", tp, r, filled, {kFpParamSalt, kFpAvgSalt, kFpSqSalt, 5});
}

// Every tensor's shards without the file that holds them: what a loader gets.
nlohmann::json shards_by_key(const nlohmann::json& md) {
  nlohmann::json out = nlohmann::json::object();
  for (auto& [key, t] : md["tensors"].items()) {
    std::vector<std::string> shards;
    for (nlohmann::json sh : t["shards"]) {
      sh.erase("file");
      shards.push_back(sh.dump());
    }
    std::sort(shards.begin(), shards.end());
    out[key] = shards;
  }
  return out;
}


TEST(FullyParallel, DistributeByBytesBalancesAndRespectsHolders) {
  // Greedy, largest first, to the least-loaded rank: 4 ranks end within one item's size.
  std::vector<int64_t> bytes;
  for (int i = 0; i < 40; ++i) bytes.push_back(100 + (i * 37) % 300);
  const std::vector<int> owner = ck::distribute_by_bytes(bytes, 4);
  std::vector<int64_t> load(4, 0);
  for (size_t i = 0; i < bytes.size(); ++i) {
    ASSERT_GE(owner[i], 0);
    ASSERT_LT(owner[i], 4);
    load[size_t(owner[i])] += bytes[i];
  }
  const auto [lo, hi] = std::minmax_element(load.begin(), load.end());
  EXPECT_LE(*hi - *lo, *std::max_element(bytes.begin(), bytes.end()));
  EXPECT_EQ(ck::distribute_by_bytes(bytes, 4), owner);  // deterministic
  // One rank: everything is its own.
  EXPECT_EQ(ck::distribute_by_bytes(bytes, 1), std::vector<int>(bytes.size(), 0));
  // A tensor goes to one of the ranks that hold it.
  const std::vector<int64_t> b2 = {50, 50, 50, 50};
  const std::vector<std::vector<int>> holders = {{1}, {0, 1}, {0, 2}, {2}};
  const std::vector<int> o2 = ck::distribute_by_bytes(b2, holders);
  for (size_t i = 0; i < b2.size(); ++i)
    EXPECT_NE(std::find(holders[i].begin(), holders[i].end(), o2[i]), holders[i].end()) << i;
  EXPECT_EQ(o2[0], 1);
  EXPECT_EQ(o2[3], 2);
  EXPECT_EQ(o2[1], 0);  // rank 1 already holds item 0's bytes
}

TEST(FullyParallel, SafetensorsReaderReadsOnlyWhatIsAsked) {
  const std::string dir = scratch_dir();
  const std::string path = dir + "/x.safetensors";
  Tensor a = Tensor::zeros({100}, DType::F32), b = Tensor::zeros({7, 3}, DType::F64);
  for (int i = 0; i < 21; ++i) b.data<double>()[i] = i * 0.5;
  ck::save_safetensors(path, {{"a", a}, {"b", b}}, {{"format", "test"}});
  ck::SafetensorsReader rd(path);
  EXPECT_EQ(rd.bytes_read(), 0u);  // the header only
  EXPECT_TRUE(rd.contains("a"));
  EXPECT_FALSE(rd.contains("c"));
  EXPECT_EQ(rd.metadata().at("format"), "test");
  const Tensor got = rd.read("b");
  EXPECT_TRUE(same_bytes(got, b));
  EXPECT_EQ(rd.bytes_read(), b.nbytes());
  EXPECT_NE(error_of([&] { rd.read("c"); }).find("has no tensor 'c'"), std::string::npos);
  // The whole-file reader is this one reading everything.
  const ck::SafetensorsFile f = ck::load_safetensors(path);
  EXPECT_TRUE(same_bytes(f.at("a"), a));
  EXPECT_TRUE(same_bytes(f.at("b"), b));
}

// TP2 x DP2 in one process: the fully parallel save spreads every (TP) shard over its two DP
// replicas, each writing model_tpXX_pp00_dpYY; the tensors are those of the save by DP rank 0
// alone, byte for byte, and the checkpoint loads at TP 1 and TP 2.
TEST(FullyParallel, SaveSharesEachShardAcrossItsReplicas) {
  const std::string dir = scratch_dir();
  std::vector<Rank> ranks;
  for (int64_t tp = 0; tp < 2; ++tp) ranks.push_back(make_rank(2, tp, true));
  ck::SaveOptions so;
  so.model = tiny_config("llama", 2, 0);
  std::vector<ck::RankSnapshot> plain, shared;
  for (int64_t dp = 0; dp < 2; ++dp)
    for (auto& k : ranks) {
      ck::RankSnapshot s = ck::RankSnapshot::view(k.m->params(), k.opt.get(), {0, 0, dp, 0});
      s.write_model = dp == 0;  // today's save: DP rank 0 writes model and moments
      plain.push_back(s);
      s.write_model = true;
      s.dense_share = s.expert_share = {int(dp), 2};
      shared.push_back(s);
    }
  ck::save_checkpoint(dir + "/plain", plain, sample_state(10), so);
  ck::save_checkpoint(dir + "/shared", shared, sample_state(10), so);
  const nlohmann::json mp = ck::read_metadata(dir + "/plain");
  const nlohmann::json ms = ck::read_metadata(dir + "/shared");
  const nlohmann::json sp = shards_by_key(mp), ss = shards_by_key(ms);
  std::vector<std::string> differ;
  for (auto& [key, v] : sp.items())
    if (!ss.contains(key) || ss[key] != v) differ.push_back(key);
  for (auto& [key, v] : ss.items())
    if (!sp.contains(key)) differ.push_back(key);
  EXPECT_TRUE(differ.empty()) << differ.size() << " tensors differ, e.g. " << differ[0];
  std::vector<std::string> files;
  for (auto& [f, v] : ms["files"].items()) files.push_back(f);
  EXPECT_EQ(files, (std::vector<std::string>{
                       "model_tp00_pp00_dp00.safetensors", "model_tp00_pp00_dp01.safetensors",
                       "model_tp01_pp00_dp00.safetensors", "model_tp01_pp00_dp01.safetensors",
                       "optim_tp00_pp00_dp00.safetensors", "optim_tp00_pp00_dp01.safetensors",
                       "optim_tp01_pp00_dp00.safetensors", "optim_tp01_pp00_dp01.safetensors"}));
  // Shares balanced by bytes (parameters and moments together): each replica of a TP shard
  // writes between 45% and 55%.
  for (const char* tp : {"00", "01"}) {
    double b[2] = {0, 0};
    for (int dp = 0; dp < 2; ++dp)
      for (const char* kind : {"model", "optim"})
        b[dp] += ms["files"][fmt::format("{}_tp{}_pp00_dp0{}.safetensors", kind, tp, dp)]["bytes"]
                     .get<double>();
    EXPECT_GT(b[0] / (b[0] + b[1]), 0.45) << tp;
    EXPECT_LT(b[0] / (b[0] + b[1]), 0.55) << tp;
  }
  for (int64_t tp_load : {1, 2})
    for (int64_t r = 0; r < tp_load; ++r) {
      SCOPED_TRACE("load at TP " + std::to_string(tp_load) + " rank " + std::to_string(r));
      Rank k = make_rank(tp_load, r, false);
      ck::load_checkpoint(dir + "/shared", std::nullopt, *k.m, k.opt.get());
      auto& ps = k.m->params();
      EXPECT_EQ(count_mismatches(ps, ps.flat_params(), kFpParamSalt), 0);
      EXPECT_EQ(count_mismatches(ps, k.opt->exp_avg(), kFpAvgSalt), 0);
      EXPECT_EQ(count_mismatches(ps, k.opt->exp_avg_sq(), kFpSqSalt), 0);
      EXPECT_EQ(k.opt->steps(), 5);
    }
}

}  // namespace fully_parallel_test
