// training::check_param_hashes_across_dp_replicas (--check-weight-hash-across-dp-replicas-
// interval) on a small parameter store, in every layout the world size allows: alone (a world
// of one) and under `mpirun -np 2` / `-np 4` (every rank runs every test; the verdicts are
// summed over the world at the end). Replicas that agree pass, also where the ranks of other
// groups (TP, EP) hold different values; one element changed by one ulp on one rank fails
// every rank -- those of the other groups too, which is what keeps them out of a hang -- with
// the parameter and the world ranks of each hash named; ranks holding different numbers of
// parameters are reported, not hung on.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "comm/world.h"
#include "parallel/host_collectives.h"
#include "training/weight_hash.h"

namespace {

using namespace mcpp;

comm::World* g_world = nullptr;

const char* kEmbedding = "embedding.word_embeddings.weight";  // split over TP (rows)
const char* kNorm = "decoder.final_layernorm.weight";         // the same on every TP rank

// One rank's part of a small model: two dense parameters and, with `experts`, one expert
// per EP rank (its own name, so EP ranks hold different values), parallel-invariant
// initialisation (every replica the same values). `extra`: one more dense parameter.
model::ParamStore make_store(const parallel::ParallelState& ps, bool experts, bool extra = false) {
  const int64_t tp = ps.layout().tp(), tp_rank = ps.tp_rank();
  model::ParamStore s;
  s.add(model::make_param(kEmbedding, {16, 4}, model::TpSplit::Rows, model::Init::Normal, 0.02,
                          true, -1, tp));
  s.add(model::make_param(kNorm, {4}, model::TpSplit::None, model::Init::Normal, 0.02, false, -1,
                          tp));
  if (extra)
    s.add(model::make_param("decoder.extra.bias", {4}, model::TpSplit::None, model::Init::Normal,
                            0.02, false, -1, tp));
  if (experts) {
    const int e = ps.ep_rank();
    model::ParamInfo p = model::make_param(
        "decoder.layers.0.mlp.experts.local_experts." + std::to_string(e) + ".linear_fc1.weight",
        {8, 4}, model::TpSplit::None, model::Init::Normal, 0.02, true, 0, tp);
    p.grad_group = model::GradGroup::Expert, p.expert = e;
    s.add(p);
  }
  s.allocate(DType::F32, tp_rank, tp);
  s.initialize(1234);
  return s;
}

// The next float above element 0 of parameter `name`: the smallest change there is.
void nudge(model::ParamStore& s, const std::string& name) {
  float* w = s.param(name).data<float>();
  w[0] = std::nextafter(w[0], INFINITY);
}

struct Layout {
  const char* what;
  parallel::ParallelSizes sizes;
};

// Every layout of the world size: TP x DP, DP with EP (expert-DP smaller than DP), CP x DP.
std::vector<Layout> layouts(int n) {
  std::vector<Layout> out = {{"dp", {.world = n}}};
  if (n >= 2) {
    out.push_back({"tp2", {.world = n, .tp = 2}});
    out.push_back({"cp2", {.world = n, .cp = 2}});
    out.push_back({"ep2", {.world = n, .ep = 2, .etp = 1}});
  }
  return out;
}

// Runs the check on every rank; "" when it passed, else the error's text.
std::string check(const model::ParamStore& s, const parallel::ParallelState& ps, int64_t it) {
  try {
    training::check_param_hashes_across_dp_replicas(s, ps, g_world->world(), it);
    return "";
  } catch (const Error& e) {
    return e.what();
  }
}

TEST(WeightHash, ReplicasThatAgreePassInEveryLayout) {
  for (const Layout& l : layouts(g_world->size())) {
    parallel::ParallelState ps(*g_world, l.sizes);
    const model::ParamStore s = make_store(ps, /*experts=*/true);
    EXPECT_EQ(check(s, ps, 3), "") << l.what << ", world rank " << g_world->rank();
  }
}

// With one replica (every rank a TP rank) there is nothing to compare: TP ranks hold
// different parts of the model, and a change on one of them is no disagreement.
TEST(WeightHash, OneReplicaHasNothingToCompare) {
  const int n = g_world->size();
  parallel::ParallelState ps(*g_world, {.world = n, .tp = n});
  model::ParamStore s = make_store(ps, /*experts=*/false);
  if (g_world->rank() == n - 1) nudge(s, kNorm);
  EXPECT_EQ(check(s, ps, 1), "") << "world rank " << g_world->rank();
}

TEST(WeightHash, ADenseParameterChangedOnOneRankFailsEveryRank) {
  const int n = g_world->size();
  if (n < 2) GTEST_SKIP() << "needs two replicas (mpirun -np 2 or 4)";
  // The last rank's replica group: DP over the ranks of its TP rank (TP 2), or DP x CP.
  struct Case {
    Layout l;
    std::string group;
  };
  std::vector<Case> cases = {
      {{"dp", {.world = n}},
       n == 2 ? "group 'dp' (world ranks [0, 1])" : "group 'dp' (world ranks [0, 1, 2, 3])"}};
  if (n == 4) {
    cases.push_back({{"tp2", {.world = n, .tp = 2}}, "group 'dp' (world ranks [1, 3])"});
    cases.push_back({{"cp2", {.world = n, .cp = 2}}, "group 'dp-cp' (world ranks [0, 1, 2, 3])"});
  }
  const int changed = n - 1;
  for (const Case& c : cases) {
    parallel::ParallelState ps(*g_world, c.l.sizes);
    model::ParamStore s = make_store(ps, /*experts=*/false);
    if (g_world->rank() == changed) nudge(s, kNorm);
    const std::string err = check(s, ps, 7);
    if (g_world->rank() == 0) std::printf("%s: the error reads\n%s\n", c.l.what, err.c_str());
    const std::string where =
        std::string(c.l.what) + ", world rank " + std::to_string(g_world->rank()) + ": " + err;
    EXPECT_NE(err.find("Parameter hashes not matching across DP replicas after 7 iterations"),
              std::string::npos)
        << where;
    EXPECT_NE(err.find(c.group + ": 1 of 2 parameters differ"), std::string::npos) << where;
    EXPECT_NE(err.find(std::string(kNorm) + ": hash"), std::string::npos) << where;
    EXPECT_NE(err.find("on world ranks [" + std::to_string(changed) + "]"), std::string::npos)
        << where;
    EXPECT_EQ(err.find(kEmbedding), std::string::npos) << where;  // only what differs
    EXPECT_NE(err.find("HINT"), std::string::npos) << where;
  }
}

// The experts are compared over the expert-data-parallel group: at DP 4 with EP 2, ranks
// 0 and 2 hold expert 0 and ranks 1 and 3 expert 1.
TEST(WeightHash, AnExpertChangedOnOneRankIsFoundOverTheExpertDataParallelGroup) {
  if (g_world->size() != 4) GTEST_SKIP() << "needs mpirun -np 4";
  parallel::ParallelState ps(*g_world, {.world = 4, .ep = 2, .etp = 1});
  model::ParamStore s = make_store(ps, /*experts=*/true);
  const std::string expert = "decoder.layers.0.mlp.experts.local_experts.0.linear_fc1.weight";
  if (g_world->rank() == 2) nudge(s, expert);
  const std::string err = check(s, ps, 2);
  const std::string where = "world rank " + std::to_string(g_world->rank()) + ": " + err;
  EXPECT_NE(err.find("group 'expert-dp' (world ranks [0, 2]): 1 of 1 parameters differ"),
            std::string::npos)
      << where;
  EXPECT_NE(err.find(expert + ": hash"), std::string::npos) << where;
  EXPECT_NE(err.find("on world ranks [0]"), std::string::npos) << where;
  EXPECT_NE(err.find("on world ranks [2]"), std::string::npos) << where;
  EXPECT_EQ(err.find("group 'dp'"), std::string::npos) << where;  // the dense ones agree
}

// Replicas that are not the same model part (a bug elsewhere): reported on every rank.
TEST(WeightHash, ReplicasHoldingDifferentParameterCountsAreReported) {
  const int n = g_world->size();
  if (n < 2) GTEST_SKIP() << "needs two replicas (mpirun -np 2 or 4)";
  parallel::ParallelState ps(*g_world, {.world = n});
  const model::ParamStore s = make_store(ps, false, /*extra=*/g_world->rank() == 1);
  const std::string err = check(s, ps, 5);
  EXPECT_NE(err.find("world rank 1 holds 3 parameters, world rank 0 holds 2"), std::string::npos)
      << "world rank " << g_world->rank() << ": " << err;
}

TEST(WeightHash, AllGatherU64KeepsEveryMembersValuesAndLengths) {
  comm::Communicator& w = g_world->world();
  std::vector<uint64_t> mine;
  for (int i = 0; i <= w.rank(); ++i) mine.push_back(~uint64_t(0) - uint64_t(10 * w.rank() + i));
  const auto all = parallel::all_gather_u64(w, mine);
  ASSERT_EQ(int(all.size()), w.size());
  for (int r = 0; r < w.size(); ++r) {
    ASSERT_EQ(all[size_t(r)].size(), size_t(r + 1));
    for (int i = 0; i <= r; ++i)
      EXPECT_EQ(all[size_t(r)][size_t(i)], ~uint64_t(0) - uint64_t(10 * r + i));
  }
}

}  // namespace

// Alone: a world of one (the local backend); under mpirun: MPI. Every rank runs every test
// (each test's collectives in the same order on every rank), and the job fails when any
// rank failed one.
int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  g_world = world.get();
  log::set_rank(world->rank(), world->size());
  const int failed = RUN_ALL_TESTS();
  const double ranks_failed = parallel::sum_over(world->world(), failed != 0 ? 1.0 : 0.0);
  if (world->rank() == 0)
    std::printf("weight_hash: %s on %d ranks\n", ranks_failed == 0 ? "passed" : "FAILED",
                world->size());
  return ranks_failed == 0 ? 0 : 1;
}
