// Pipeline schedules checked as data: orders against Megatron's documented facts,
// properties over a matrix of (PP, V, M), the simulator's bubble against theory,
// and the simulator's own ability to catch broken schedules.
#include <gtest/gtest.h>

#include <map>

#include "base/error.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"

namespace mcpp::parallel::pipeline {
namespace {

using K = ScheduleKind;

std::string stage_text(const Schedule& s, int stage, bool p2p = false) {
  return format_actions(s[stage], p2p);
}

template <class F>
void expect_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an mcpp::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

// ---- exact orders ------------------------------------------------------------------

TEST(PipelineSchedule, OneFOneBOrderPP4M8) {
  auto s = build_schedule(K::OneFOneB, 4, 1, 8);
  // Warm-up PP-r-1 forwards, then 1F1B, then the cool-down backwards.
  EXPECT_EQ(stage_text(s, 0), "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  EXPECT_EQ(stage_text(s, 1), "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  EXPECT_EQ(stage_text(s, 3), "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // A middle stage's transfers: recv_forward, send_forward in warm-up; the batched
  // send_forward_recv_backward / send_backward_recv_forward in the steady state.
  EXPECT_EQ(stage_text(s, 2, true).substr(0, 47),
            "<a0 F0 >a0 <a1 F1 [>a1 <g0] B0 [>g0 <a2] F2 [>a");
}

TEST(PipelineSchedule, OneFOneBWarmupClampedToM) {
  auto s = build_schedule(K::OneFOneB, 8, 1, 3);
  EXPECT_EQ(stage_text(s, 0), "F0 F1 F2 B0 B1 B2");
  EXPECT_EQ(stage_text(s, 6), "F0 F1 B0 F2 B1 B2");
  EXPECT_EQ(stage_text(s, 7), "F0 B0 F1 B1 F2 B2");
  EXPECT_EQ(warmup_microbatches(K::OneFOneB, 8, 0, 1, 3), 3);
}

TEST(PipelineSchedule, NoPipelining) {
  auto s = build_schedule(K::OneFOneB, 1, 1, 3);
  EXPECT_EQ(stage_text(s, 0, true), "F0 B0 F1 B1 F2 B2");
}

TEST(PipelineSchedule, GPipeOrder) {
  auto s = build_schedule(K::AllForwardAllBackward, 2, 1, 3);
  EXPECT_EQ(stage_text(s, 0, true), "F0 >a0 F1 >a1 F2 >a2 <g0 B0 <g1 B1 <g2 B2");
  EXPECT_EQ(stage_text(s, 1, true), "<a0 F0 <a1 F1 <a2 F2 B0 >g0 B1 >g1 B2 >g2");
}

TEST(PipelineSchedule, InterleavedTableMatchesMegatronExample) {
  // schedules.py's comment for PP2, group size 3, M 5, VP 2.
  auto t = interleaved_schedule_table(5, 2, 3);
  std::vector<std::pair<int, int>> want{{0, 0}, {1, 0}, {2, 0}, {0, 1}, {1, 1},
                                        {2, 1}, {3, 0}, {4, 0}, {3, 1}, {4, 1}};
  EXPECT_EQ(t, want);
}

TEST(PipelineSchedule, InterleavedOrderPP2V2M4) {
  auto s = build_schedule(K::Interleaved1F1B, 2, 2, 4);
  // Table (mb.chunk): 0.0 1.0 0.1 1.1 2.0 3.0 2.1 3.1; backward k runs chunk V-1-c.
  // Rank 0 warm-up = (2-0-1)*2 + (2-1)*2 = 4, rank 1 warm-up = 2.
  EXPECT_EQ(stage_text(s, 0),
            "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(stage_text(s, 1),
            "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  EXPECT_EQ(warmup_microbatches(K::Interleaved1F1B, 4, 0, 2, 8), 6 + 4);
  EXPECT_EQ(warmup_microbatches(K::Interleaved1F1B, 4, 3, 3, 8, 5), 0 + 10);
}

// ---- properties over the matrix -----------------------------------------------------

struct Config {
  K kind;
  int pp, vpp, m, g;
};

std::string name(const Config& c) {
  return fmt::format("{} PP={} V={} M={} G={}", to_string(c.kind), c.pp, c.vpp, c.m, c.g);
}

// Theory of the idle fraction (idle time / step time, equal on every stage) under
// the unit-cost model (every chunk costs the same, sends free).
double theory_bubble(const Config& c) {
  const double p = c.pp, m = c.m, v = c.vpp;
  return (p - 1) / (v * m + p - 1);
}

void check_properties(const Config& c) {
  SCOPED_TRACE(name(c));
  const Schedule s = build_schedule(c.kind, c.pp, c.vpp, c.m, c.g);
  ASSERT_EQ(int(s.size()), c.pp);
  const CostModel cost{1.0, 2.0, 0.0};
  const SimResult r = simulate(s, cost);
  ASSERT_TRUE(r.ok) << r.problems.front();
  // NCCL-like rendezvous transfers must not deadlock either.
  const SimResult rr = simulate(s, cost, P2PSemantics::Rendezvous);
  ASSERT_TRUE(rr.ok) << rr.problems.front();

  // Index of every forward/backward, per stage.
  std::vector<std::map<std::pair<int, int>, int>> fwd(c.pp), bwd(c.pp);
  for (int st = 0; st < c.pp; ++st) {
    for (int i = 0; i < int(s[st].size()); ++i) {
      const Action& a = s[st][i];
      ASSERT_GE(a.microbatch, 0);
      ASSERT_LT(a.microbatch, c.m);
      ASSERT_GE(a.chunk, 0);
      ASSERT_LT(a.chunk, c.vpp);
      auto key = std::pair(a.microbatch, a.chunk);
      if (a.op == Op::Forward) ASSERT_TRUE(fwd[st].emplace(key, i).second) << "duplicate F";
      if (a.op == Op::Backward) ASSERT_TRUE(bwd[st].emplace(key, i).second) << "duplicate B";
      // Transfers go to the ring neighbours only.
      if (a.op == Op::SendActivation || a.op == Op::RecvGrad)
        ASSERT_EQ(a.peer_stage, (st + 1) % c.pp);
      if (a.op == Op::RecvActivation || a.op == Op::SendGrad)
        ASSERT_EQ(a.peer_stage, (st + c.pp - 1) % c.pp);
    }
    // Every (micro-batch, chunk) forward and backward exactly once.
    ASSERT_EQ(int(fwd[st].size()), c.m * c.vpp);
    ASSERT_EQ(int(bwd[st].size()), c.m * c.vpp);
    for (auto& [key, i] : fwd[st]) ASSERT_LT(i, bwd[st].at(key)) << "forward after backward";
  }

  // Cross-stage order: virtual stage u = chunk * PP + stage; the forward of (mb, u)
  // starts after the forward of (mb, u-1) ended, the backward of (mb, u) after the
  // backward of (mb, u+1), and the stage received the tensor before using it.
  const int U = c.pp * c.vpp;
  auto at = [&](int u) { return std::pair(u % c.pp, u / c.pp); };  // (stage, chunk)
  for (int mb = 0; mb < c.m; ++mb)
    for (int u = 0; u < U; ++u) {
      auto [st, ch] = at(u);
      const int fi = fwd[st].at({mb, ch}), bi = bwd[st].at({mb, ch});
      const double f_start = r.end_time[st][fi] - cost.forward;
      const double b_start = r.end_time[st][bi] - cost.backward;
      if (u > 0) {
        auto [ps, pc] = at(u - 1);
        ASSERT_LE(r.end_time[ps][fwd[ps].at({mb, pc})], f_start) << "mb " << mb << " u " << u;
        bool received = false;
        for (int i = 0; i < fi; ++i)
          received |=
              s[st][i] == Action{Op::RecvActivation, mb, ch, s[st][i].peer_stage, s[st][i].batch};
        ASSERT_TRUE(received) << "forward of mb " << mb << " virtual stage " << u
                              << " without its activation";
      }
      if (u + 1 < U) {
        auto [ns, nc] = at(u + 1);
        ASSERT_LE(r.end_time[ns][bwd[ns].at({mb, nc})], b_start) << "mb " << mb << " u " << u;
      }
    }

  // Activations held: at most what the schedule promises; exactly for 1F1B / GPipe.
  for (int st = 0; st < c.pp; ++st) {
    const int promised = promised_in_flight(c.kind, c.pp, st, c.vpp, c.m, c.g);
    EXPECT_LE(r.stages[st].peak_in_flight, promised) << "stage " << st;
    if (c.kind == K::OneFOneB) EXPECT_EQ(r.stages[st].peak_in_flight, std::min(c.pp - st, c.m));
    if (c.kind == K::AllForwardAllBackward) EXPECT_EQ(r.stages[st].peak_in_flight, c.m);
  }
  EXPECT_LE(r.stages[0].peak_in_flight, c.kind == K::OneFOneB ? c.pp : c.m * c.vpp);

  // Bubble. 1F1B and GPipe: (p-1)/(m+p-1) exactly, on every stage. Interleaved with
  // the default group size (= PP) and M a multiple of PP: (p-1)/(v·m+p-1) exactly
  // (each chunk costs 1/v of a stage, so the fill/drain of p-1 chunk-slots is 1/v as
  // long); a larger group only adds micro-batches to the warm-up, no bubble.
  const double want = theory_bubble(c);
  EXPECT_NEAR(r.bubble_fraction, want, 1e-12);
  for (int st = 0; st < c.pp; ++st)
    EXPECT_NEAR(r.stages[st].idle / r.makespan, want, 1e-12) << "stage " << st;
  // Rendezvous transfers cost nothing extra under this model.
  EXPECT_NEAR(rr.makespan, r.makespan, 1e-12);
}

TEST(PipelineSchedule, PropertiesOverMatrix) {
  int checked = 0;
  for (int pp : {1, 2, 3, 4, 8, 16})
    for (int m = pp; m <= 8 * pp; ++m) {
      check_properties({K::OneFOneB, pp, 1, m, 0});
      check_properties({K::AllForwardAllBackward, pp, 1, m, 0});
      checked += 2;
      if (pp >= 2 && m % pp == 0)
        for (int v : {1, 2, 3, 4}) check_properties({K::Interleaved1F1B, pp, v, m, 0}), ++checked;
      if (HasFatalFailure()) return;
    }
  EXPECT_EQ(checked, 648);
}

TEST(PipelineSchedule, InterleavedOtherGroupSizes) {
  // Group sizes other than PP, and last groups of size in [PP, 2G): still valid.
  for (int pp : {2, 3, 4})
    for (int v : {2, 3})
      for (int g = pp; g <= 3 * pp; ++g)
        for (int m = g; m <= 4 * pp + g; ++m) {
          int rem = m % g;
          if (rem != 0 && rem < pp) continue;
          SCOPED_TRACE(fmt::format("PP={} V={} G={} M={}", pp, v, g, m));
          auto s = build_schedule(K::Interleaved1F1B, pp, v, m, g);
          auto r = simulate(s);
          ASSERT_TRUE(r.ok) << r.problems.front();
          ASSERT_TRUE(simulate(s, {}, P2PSemantics::Rendezvous).ok);
          for (int st = 0; st < pp; ++st)
            EXPECT_LE(r.stages[st].peak_in_flight,
                      promised_in_flight(K::Interleaved1F1B, pp, st, v, m, g));
          // Never worse than without virtual stages.
          EXPECT_LE(r.bubble_fraction, double(pp - 1) / (m + pp - 1) + 1e-12);
          EXPECT_NEAR(r.bubble_fraction, double(pp - 1) / (v * m + pp - 1), 1e-12);
        }
}

// ---- the checker can fail --------------------------------------------------------------

TEST(PipelineSimulator, DetectsSwappedForwards) {
  auto s = build_schedule(K::OneFOneB, 3, 1, 4);
  auto& L = s[1];
  // Swap the first two forwards of stage 1: it now sends micro-batch 1 first.
  std::vector<int> f;
  for (int i = 0; i < int(L.size()); ++i)
    if (L[i].op == Op::SendActivation) f.push_back(i);
  std::swap(L[f[0]].microbatch, L[f[1]].microbatch);
  auto r = simulate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems.front().find("receiver expects micro-batch 0"), std::string::npos)
      << r.problems.front();
}

TEST(PipelineSimulator, DetectsUnmatchedTransfer) {
  auto s = build_schedule(K::OneFOneB, 2, 1, 2);
  s[1].erase(s[1].begin());  // stage 1 drops its first receive
  auto r = simulate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems.front().find("2 sends but 1 receives"), std::string::npos)
      << r.problems.front();
}

TEST(PipelineSimulator, DetectsDeadlock) {
  // Each stage waits for the other's gradient before sending its own activation.
  Schedule s(2);
  s[0] = {{Op::RecvGrad, 0, 0, 1},
          {Op::Forward, 0, 0},
          {Op::SendActivation, 0, 0, 1},
          {Op::Backward, 0, 0}};
  s[1] = {{Op::RecvActivation, 0, 0, 0},
          {Op::Forward, 0, 0},
          {Op::Backward, 0, 0},
          {Op::SendGrad, 0, 0, 0}};
  auto r = simulate(s);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.problems.front().find("deadlock: stage 0 blocked at step 0 (RecvGrad"),
            std::string::npos)
      << r.problems.front();
}

TEST(PipelineSimulator, RendezvousCatchesWhatEagerHides) {
  // Both stages send before receiving, as separate (unbatched) calls: fine with
  // buffered sends, a deadlock when a send waits for its receive (NCCL).
  Schedule s(2);
  s[0] = {{Op::SendActivation, 0, 0, 1}, {Op::RecvGrad, 0, 0, 1}};
  s[1] = {{Op::SendGrad, 0, 0, 0}, {Op::RecvActivation, 0, 0, 0}};
  auto eager = simulate(s);
  EXPECT_TRUE(eager.ok) << (eager.problems.empty() ? "" : eager.problems.front());
  auto rv = simulate(s, {}, P2PSemantics::Rendezvous);
  ASSERT_FALSE(rv.ok);
  EXPECT_NE(rv.problems.front().find("deadlock: stage 0 blocked at step 0 (SendActivation"),
            std::string::npos)
      << rv.problems.front();
  // Posted as one batch on each side, the same transfers are fine.
  for (auto& L : s)
    for (auto& a : L) a.batch = 0;
  EXPECT_TRUE(simulate(s, {}, P2PSemantics::Rendezvous).ok);
}

TEST(PipelineSimulator, CostModelAndInFlight) {
  auto s = build_schedule(K::OneFOneB, 4, 1, 8);
  auto r = simulate(s, {1.0, 2.0, 0.0});
  ASSERT_TRUE(r.ok);
  EXPECT_DOUBLE_EQ(r.makespan, (8 + 4 - 1) * 3.0);
  EXPECT_EQ(r.stages[0].peak_in_flight, 4);
  EXPECT_EQ(r.stages[3].peak_in_flight, 1);
  // A p2p latency lengthens the step: 2(p-1) transfers on the critical path at least.
  auto slow = simulate(s, {1.0, 2.0, 0.5});
  EXPECT_GE(slow.makespan, r.makespan + 2 * 3 * 0.5);
  auto g = simulate(build_schedule(K::AllForwardAllBackward, 4, 1, 8));
  EXPECT_EQ(g.stages[0].peak_in_flight, 8);
}

// ---- errors ------------------------------------------------------------------------------

TEST(PipelineSchedule, Errors) {
  expect_error([] { build_schedule(K::Interleaved1F1B, 4, 2, 6); }, "dependency bubbles");
  expect_error([] { build_schedule(K::Interleaved1F1B, 4, 2, 8, 3); }, "must lie in [PP=4, M=8]");
  expect_error([] { build_schedule(K::Interleaved1F1B, 4, 2, 8, 9); }, "must lie in [PP=4, M=8]");
  expect_error([] { build_schedule(K::Interleaved1F1B, 4, 2, 2); }, "must lie in [PP=4, M=2]");
  expect_error([] { build_schedule(K::OneFOneB, 4, 2, 8); }, "only the interleaved");
  expect_error([] { build_schedule(K::Interleaved1F1B, 1, 2, 8); }, ">= 2");
  expect_error([] { build_schedule(K::OneFOneB, 4, 1, 0); }, "micro-batches must be >= 1");
  expect_error([] { build_schedule(K::OneFOneB, 0, 1, 4); }, "must be >= 1");
}

// ---- layer partition ---------------------------------------------------------------------

using Layers = std::vector<std::vector<int>>;

TEST(PipelineLayers, RoundRobinChunks) {
  // megatron.md §1.1: 16 layers, PP 4, V 2 -> GPU0 [1,2][9,10], GPU1 [3,4][11,12], ...
  // (1-based there, 0-based here).
  auto a = assign_layers(16, 4, 2, std::nullopt, std::nullopt);
  Layers want{{0, 1}, {8, 9}, {2, 3}, {10, 11}, {4, 5}, {12, 13}, {6, 7}, {14, 15}};
  EXPECT_EQ(a, want);
  EXPECT_EQ(assign_layers(8, 2, 1), (Layers{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(assign_layers(3, 1, 1), (Layers{{0, 1, 2}}));
  EXPECT_EQ(assign_layers(6, 1, 3), (Layers{{0, 1}, {2, 3}, {4, 5}}));
}

TEST(PipelineLayers, UnevenFirstLast) {
  EXPECT_EQ(assign_layers(14, 4, 1, 2, 2),
            (Layers{{0, 1}, {2, 3, 4, 5, 6}, {7, 8, 9, 10, 11}, {12, 13}}));
  EXPECT_EQ(assign_layers(10, 3, 1, 4, std::nullopt), (Layers{{0, 1, 2, 3}, {4, 5, 6}, {7, 8, 9}}));
  EXPECT_EQ(assign_layers(7, 2, 1, std::nullopt, 3), (Layers{{0, 1, 2, 3}, {4, 5, 6}}));
  EXPECT_EQ(assign_layers(5, 2, 1, 2, 3), (Layers{{0, 1}, {2, 3, 4}}));
  // With virtual stages every round holds first/V, middle/V, last/V layers.
  EXPECT_EQ(assign_layers(12, 3, 2, 2, 2),
            (Layers{{0}, {6}, {1, 2, 3, 4}, {7, 8, 9, 10}, {5}, {11}}));
  // Every layer exactly once, ascending inside a chunk.
  auto a = assign_layers(40, 4, 2, 6, 6);
  std::vector<int> all;
  for (auto& c : a) all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 40; ++i) EXPECT_EQ(all[i], i);
}

TEST(PipelineLayers, Errors) {
  expect_error([] { assign_layers(10, 4, 1); },
               "--num-layers 10 is not divisible by --pipeline-model-parallel-size 4");
  expect_error([] { assign_layers(16, 4, 3); }, "not divisible by 3 virtual stages");
  expect_error([] { assign_layers(15, 4, 1, 2, 2); }, "do not split evenly");
  expect_error([] { assign_layers(6, 2, 1, 2, 2); }, "differs from");
  expect_error([] { assign_layers(4, 2, 1, 3, 3); }, "fewer than the layers given");
  expect_error([] { assign_layers(13, 3, 2, 3, std::nullopt); }, "stage 0 has 3 layers");
  expect_error([] { assign_layers(8, 1, 1, 2, std::nullopt); }, "need --pipeline-model-parallel");
  expect_error([] { assign_layers(8, 2, 1, 0, std::nullopt); }, "must be >= 1");
}

TEST(PipelineLayers, VirtualStagesAndMicrobatches) {
  EXPECT_EQ(virtual_stages_from_layers_per_stage(16, 4, 2), 2);
  EXPECT_EQ(virtual_stages_from_layers_per_stage(24, 2, 3), 4);
  expect_error([] { virtual_stages_from_layers_per_stage(16, 4, 3); },
               "not divisible by --num-layers-per-virtual-pipeline-stage 3");
  EXPECT_EQ(num_microbatches(512, 4, 8), 16);
  EXPECT_EQ(num_microbatches(8, 8, 1), 1);
  expect_error([] { num_microbatches(100, 4, 8); },
               "--global-batch-size 100 is not divisible by --micro-batch-size 4 x "
               "data-parallel size 8 = 32");
}

}  // namespace
}  // namespace mcpp::parallel::pipeline

namespace mcpp::parallel::pipeline {
namespace {

// Evaluation runs the forward-only form of the training schedule: it must replay
// without deadlock (also with rendezvous transfers), every stage forwarding every
// (micro-batch, chunk) exactly once, in the training schedule's order.
TEST(PipelineSchedule, ForwardOnlyReplays) {
  for (int pp : {2, 3, 4, 8})
    for (int v : {1, 2, 4})
      for (int m = pp; m <= 8 * pp; m += pp) {
        const K kind = v > 1 ? K::Interleaved1F1B : K::OneFOneB;
        const Schedule full = build_schedule(kind, pp, v, m);
        const Schedule fo = forward_only(full);
        const SimResult r = simulate(fo, {}, P2PSemantics::Rendezvous);
        // The only complaint allowed: forwards without backwards (by construction).
        for (const auto& p : r.problems)
          ASSERT_NE(p.find("never had their backward"), std::string::npos)
              << "PP " << pp << " V " << v << " M " << m << ": " << p;
        ASSERT_EQ(int(r.problems.size()), pp);
        for (int s = 0; s < pp; ++s) {
          std::vector<Action> fwd_full, fwd_fo;
          for (const auto& a : full[size_t(s)])
            if (a.op == Op::Forward) fwd_full.push_back(a);
          for (const auto& a : fo[size_t(s)]) {
            ASSERT_TRUE(a.op == Op::Forward || a.op == Op::SendActivation ||
                        a.op == Op::RecvActivation);
            if (a.op == Op::Forward) fwd_fo.push_back(a);
          }
          ASSERT_EQ(fwd_fo, fwd_full);
          ASSERT_EQ(int(fwd_fo.size()), m * v);
        }
      }
}

}  // namespace
}  // namespace mcpp::parallel::pipeline
