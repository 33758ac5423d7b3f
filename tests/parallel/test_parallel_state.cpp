// Megatron's rank layout, checked against megatron.md §4's worked examples (which
// were computed by running Megatron's own RankGenerator), and the validation errors.
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "comm/world.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
using namespace mcpp::parallel;

namespace {

RankGroups R(std::initializer_list<std::vector<int>> g) { return RankGroups(g); }
std::vector<int> iota(int a, int b) {
  std::vector<int> v;
  for (int i = a; i <= b; ++i) v.push_back(i);
  return v;
}

Layout make(int world, int tp, int pp, int cp = 1, int ep = 1, bool tp_pp_dp = false) {
  ParallelSizes s;
  s.world = world, s.tp = tp, s.pp = pp, s.cp = cp, s.ep = ep, s.tp_pp_dp_mapping = tp_pp_dp;
  return Layout(s);
}

std::string error_of(const ParallelSizes& s) {
  try {
    Layout l(s);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Layout, Worked16RanksTp2Pp2Dp4) {
  Layout l = make(16, 2, 2);
  EXPECT_EQ(l.dp(), 4);
  EXPECT_EQ(l.order(), "tp-cp-ep-dp-pp");
  for (int r = 0; r < 16; ++r) {
    Coords c = l.coords(r);
    EXPECT_EQ(c.tp, r % 2);
    EXPECT_EQ(c.dp, (r / 2) % 4);
    EXPECT_EQ(c.pp, r / 8);
    EXPECT_EQ(l.rank_of(c.tp, c.cp, c.dp, c.pp), r);
  }
  EXPECT_EQ(l.groups(Group::TP),
            R({{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.groups(Group::DP), R({{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(l.groups(Group::DP_CP), l.groups(Group::DP));
  EXPECT_EQ(l.groups(Group::PP),
            R({{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12}, {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(l.groups(Group::MP), R({{0, 1, 8, 9}, {2, 3, 10, 11}, {4, 5, 12, 13}, {6, 7, 14, 15}}));
  EXPECT_EQ(l.groups(Group::TP_DP), R({iota(0, 7), iota(8, 15)}));
  EXPECT_EQ(l.groups(Group::Embedding), l.groups(Group::PP));
  EXPECT_EQ(l.groups(Group::PositionEmbedding), R({{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // CP = 1: singleton CP groups; EP = 1: expert groups mirror the dense ones.
  EXPECT_EQ(l.groups(Group::CP).size(), 16u);
  EXPECT_EQ(l.groups(Group::ExpertTP), l.groups(Group::TP));
  EXPECT_EQ(l.groups(Group::ExpertDP), l.groups(Group::DP));
  EXPECT_EQ(l.group_of(Group::DP, 11), (std::vector<int>{9, 11, 13, 15}));
}

TEST(Layout, TpPpDpMapping) {
  Layout l = make(16, 2, 2, 1, 1, /*tp_pp_dp=*/true);
  EXPECT_EQ(l.order(), "tp-cp-ep-pp-dp");
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(l.coords(r).pp, (r / 2) % 2);
    EXPECT_EQ(l.coords(r).dp, r / 4);
  }
  EXPECT_EQ(l.groups(Group::TP),
            R({{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(l.groups(Group::PP),
            R({{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.groups(Group::DP), R({{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.groups(Group::MP), R({iota(0, 3), iota(4, 7), iota(8, 11), iota(12, 15)}));
}

TEST(Layout, ExpertParallel2) {
  Layout l = make(16, 2, 2, 1, /*ep=*/2);
  EXPECT_EQ(l.etp(), 2);
  EXPECT_EQ(l.edp(), 2);
  EXPECT_EQ(l.groups(Group::EP),
            R({{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.groups(Group::ExpertDP),
            R({{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(l.groups(Group::TP_EP), R({iota(0, 3), iota(4, 7), iota(8, 11), iota(12, 15)}));
  EXPECT_EQ(l.groups(Group::TP_EP_PP).size(), 2u);
  EXPECT_EQ(l.coords(6).ep, 1);
  EXPECT_EQ(l.coords(6).edp, 1);
  // Dense groups are unchanged by EP.
  EXPECT_EQ(l.groups(Group::DP), make(16, 2, 2).groups(Group::DP));
}

TEST(Layout, ContextParallel2) {
  Layout l = make(16, 2, 2, /*cp=*/2);
  EXPECT_EQ(l.dp(), 2);
  const auto& cp = l.groups(Group::CP);
  ASSERT_EQ(cp.size(), 8u);
  EXPECT_EQ(cp[0], (std::vector<int>{0, 2}));
  EXPECT_EQ(cp[1], (std::vector<int>{1, 3}));
  const auto& dp = l.groups(Group::DP);
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 5}));
  EXPECT_EQ(dp[2], (std::vector<int>{2, 6}));
  EXPECT_EQ(dp[3], (std::vector<int>{3, 7}));
  EXPECT_EQ(dp[4], (std::vector<int>{8, 12}));
  EXPECT_EQ(l.groups(Group::DP_CP),
            R({{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(l.groups(Group::TP_CP)[0], (std::vector<int>{0, 1, 2, 3}));
}

// Hierarchical CP (--hierarchical-context-parallel-sizes 2 4 at CP 8, TP 2): inside each CP
// group's list, Megatron's create_hierarchical_groups puts A = 2 consecutive members in a
// level-0 (all-to-all) group and the members 2 apart in a level-1 (ring) group.
TEST(Layout, HierarchicalContextParallel) {
  ParallelSizes s;
  s.world = 16, s.tp = 2, s.cp = 8, s.cp_a2a = 2;
  Layout l(s);
  ASSERT_EQ(l.groups(Group::CP), R({{0, 2, 4, 6, 8, 10, 12, 14}, {1, 3, 5, 7, 9, 11, 13, 15}}));
  EXPECT_EQ(l.groups(Group::CpA2A),
            R({{0, 2}, {4, 6}, {8, 10}, {12, 14}, {1, 3}, {5, 7}, {9, 11}, {13, 15}}));
  EXPECT_EQ(l.groups(Group::CpP2P),
            R({{0, 4, 8, 12}, {2, 6, 10, 14}, {1, 5, 9, 13}, {3, 7, 11, 15}}));
  // Without the flag both levels are groups of one.
  s.cp_a2a = 0;
  EXPECT_EQ(Layout(s).groups(Group::CpA2A).size(), 16u);
  s.cp_a2a = 3;
  EXPECT_NE(error_of(s).find("all-to-all level of 3 does not divide --context-parallel-size 8"),
            std::string::npos)
      << error_of(s);
}

// The docstring example of initialize_model_parallel: TP=2, PP=4, DP=2 on 16 ranks.
TEST(Layout, MegatronDocstringTp2Pp4) {
  Layout l = make(16, 2, 4);
  EXPECT_EQ(l.groups(Group::DP),
            R({{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(l.groups(Group::PP), R({{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(l.groups(Group::Embedding), R({{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  ParallelSizes s;
  s.world = 16, s.tp = 2, s.pp = 4, s.untie_embeddings = true;
  EXPECT_EQ(Layout(s).groups(Group::Embedding), R({{0}, {1}, {2}, {3}}));
}

TEST(Layout, EveryKindPartitionsTheWorld) {
  for (bool m : {false, true}) {
    Layout l = make(24, 2, 3, m ? 1 : 2, 1, m);  // the mapping needs ETP*EP == TP*CP
    for (int g = 0; g < kNumGroups; ++g) {
      if (Group(g) == Group::Embedding || Group(g) == Group::PositionEmbedding) continue;
      if (l.groups(Group(g)).empty()) continue;  // the instance kinds at N = 1
      std::map<int, int> seen;
      for (const auto& grp : l.groups(Group(g)))
        for (int r : grp) seen[r]++;
      EXPECT_EQ(seen.size(), 24u) << group_name(Group(g));
      for (auto [r, n] : seen) EXPECT_EQ(n, 1) << group_name(Group(g)) << " rank " << r;
    }
  }
}

TEST(Layout, SingleProcess) {
  Layout l = make(1, 1, 1);
  for (int g = 0; g < kNumGroups; ++g)
    if (Group(g) != Group::IntraDpCp && Group(g) != Group::InterDistOpt &&
        Group(g) != Group::IntraDistOpt)
      EXPECT_EQ(l.groups(Group(g)), R({{0}})) << group_name(Group(g));
}

// --num-distributed-optimizer-instances (Megatron's initialize_model_parallel): each DP x CP
// list cut into N runs of DP*CP/N; the inter group joins the same place of every run.
TEST(Layout, DistributedOptimizerInstances) {
  ParallelSizes s;
  s.world = 16, s.tp = 2, s.dist_opt_instances = 2;  // DP 8: dp groups [0,2,..14] [1,3,..15]
  Layout l(s);
  EXPECT_EQ(l.groups(Group::IntraDpCp),
            R({{0, 2, 4, 6}, {8, 10, 12, 14}, {1, 3, 5, 7}, {9, 11, 13, 15}}));
  EXPECT_EQ(l.groups(Group::InterDistOpt),
            R({{0, 8}, {2, 10}, {4, 12}, {6, 14}, {1, 9}, {3, 11}, {5, 13}, {7, 15}}));
  EXPECT_EQ(l.groups(Group::IntraDistOpt), R({iota(0, 7), iota(8, 15)}));
  // With CP the runs are cut from the dp-cp list (CP fastest): [0,1,2,3] [4,5,6,7].
  s = {};
  s.world = 8, s.cp = 2, s.dist_opt_instances = 2;
  Layout c(s);
  EXPECT_EQ(c.groups(Group::DP_CP), R({iota(0, 7)}));
  EXPECT_EQ(c.groups(Group::IntraDpCp), R({{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(c.groups(Group::InterDistOpt), R({{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  Layout one = make(8, 2, 2);
  // N = 1: no groups (ParallelState makes no communicators; intra_dp_cp() is dp_cp()).
  for (Group g : {Group::IntraDpCp, Group::InterDistOpt, Group::IntraDistOpt})
    EXPECT_TRUE(one.groups(g).empty()) << group_name(g);
  // Pipeline stages: an instance spans every stage of its DP ranks.
  s = {};
  s.world = 8, s.pp = 2, s.dist_opt_instances = 2;  // DP 4: [0,1,2,3] and [4,5,6,7]
  EXPECT_EQ(Layout(s).groups(Group::IntraDistOpt), R({{0, 1, 4, 5}, {2, 3, 6, 7}}));
  s = {};
  s.world = 6, s.dist_opt_instances = 4;
  const std::string e = error_of(s);
  EXPECT_NE(e.find("--num-distributed-optimizer-instances 4: data-parallel (6) x context-parallel "
                   "(1) size 6 is not divisible by it"),
            std::string::npos)
      << e;
}

TEST(Layout, ValidationErrors) {
  ParallelSizes s;
  s.world = 12, s.tp = 2, s.pp = 2, s.cp = 2;
  std::string e = error_of(s);
  EXPECT_NE(e.find("world size 12 is not divisible by tensor (2) x pipeline (2) x context (2)"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("HINT: launch a multiple of 8"), std::string::npos) << e;

  s = {};
  s.world = 8, s.tp = 1, s.ep = 3;
  e = error_of(s);
  EXPECT_NE(e.find("expert model (3)"), std::string::npos) << e;

  s = {};
  s.world = 8, s.tp = 0;
  EXPECT_NE(error_of(s).find("--tensor-model-parallel-size 0 must be at least 1"),
            std::string::npos);

  // tp-pp-dp mapping with ETP*EP != TP*CP moves the pipeline groups apart.
  s = {};
  s.world = 16, s.tp = 2, s.pp = 2, s.ep = 2, s.tp_pp_dp_mapping = true;
  EXPECT_NE(error_of(s).find("pipeline groups differ"), std::string::npos);

  EXPECT_THROW(RankGenerator(2, 1, 1, 1, 1, "cp-dp-pp"), Error);  // tp=2 not in the order
  EXPECT_THROW(RankGenerator(1, 1, 1, 1, 1, "tp-xx"), Error);
}

TEST(Layout, GeneratorMatchesFormula) {
  RankGenerator g(2, 1, 3, 2, 2, "tp-cp-ep-dp-pp");
  for (int r = 0; r < g.world_size(); ++r) {
    int tp = g.coord(r, "tp"), cp = g.coord(r, "cp"), dp = g.coord(r, "dp"), pp = g.coord(r, "pp");
    EXPECT_EQ(r, tp + 2 * (cp + 2 * (dp + 3 * pp)));
    EXPECT_EQ(g.rank_of(tp, cp, 0, dp, pp), r);
  }
  // A token's axes may be listed in any order.
  EXPECT_EQ(g.get_ranks("pp-tp"), g.get_ranks("tp-pp"));
}

// ---- launcher detection and the local backend (no MPI) ------------------------------

TEST(Launch, Detect) {
  auto env = [](std::map<std::string, std::string> m) {
    return [m](const char* n) -> const char* {
      auto it = m.find(n);
      return it == m.end() ? nullptr : it->second.c_str();
    };
  };
  EXPECT_FALSE(comm::detect_launch(env({})).launched());
  auto li =
      comm::detect_launch(env({{"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_RANK", "3"}}));
  EXPECT_EQ(li.launcher, "mpirun");
  EXPECT_EQ(li.size, 4);
  EXPECT_EQ(li.rank, 3);
  li = comm::detect_launch(env({{"SLURM_STEP_NUM_TASKS", "8"}, {"SLURM_PROCID", "5"}}));
  EXPECT_EQ(li.launcher, "srun");
  EXPECT_EQ(li.size, 8);
  // A batch script (no step) is not a launch.
  EXPECT_FALSE(comm::detect_launch(env({{"SLURM_NTASKS", "8"}, {"SLURM_PROCID", "0"}})).launched());
  EXPECT_EQ(comm::detect_launch(env({{"PMI_SIZE", "2"}, {"PMI_RANK", "1"}})).launcher, "pmi");
}
