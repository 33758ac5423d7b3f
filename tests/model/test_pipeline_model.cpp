// Pipeline stages of the model in one process: every stage is its own GPTModel holding
// its part (PipelinePart), the stages run their schedule's action lists interleaved by a
// small in-memory replay (transfers are FIFO queues per channel), and the result must be
// the whole model's: the loss and every gradient, for 1F1B, GPipe, interleaved and
// uneven layouts, with activation recomputation off, full (uniform, block) and
// selective. Recomputation must not change a single bit of the gradients, nor must
// keeping the MLP activation (--keep-mlp-activations), and the activation memory each
// stage holds at its peak must be exactly the schedule's in-flight count times the bytes
// one micro-batch keeps, counted here from the shapes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <optional>
#include <tuple>

#include "base/philox.h"
#include "model/gpt_model.h"
#include "tiny_model.h"
#include "parallel/pipeline/schedule.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;
namespace pl = mcpp::parallel::pipeline;

namespace pipeline_model_test {

using RC = TransformerConfig::Recompute;
using RM = TransformerConfig::RecomputeMethod;

TransformerConfig tiny(bool llama, int layers) { return model::test::tiny(llama, layers, 0.1); }

struct Recompute {
  RC granularity = RC::None;
  RM method = RM::Uniform;
  int layers = 1;
  std::string name() const {
    if (granularity == RC::None) return "none";
    if (granularity == RC::Selective) return "selective";
    return std::string(method == RM::Uniform ? "full-uniform-" : "full-block-") +
           std::to_string(layers);
  }
};

TransformerConfig with(TransformerConfig c, const Recompute& r) {
  c.recompute = r.granularity, c.recompute_method = r.method, c.recompute_num_layers = r.layers;
  return c;
}

std::vector<model::MicroBatch> batches(int M, int64_t B, int64_t S, int64_t V) {
  std::vector<model::MicroBatch> out;
  for (int m = 0; m < M; ++m) {
    model::MicroBatch mb;
    mb.tokens = Tensor::empty({B, S}, DType::I64);
    mb.labels = Tensor::empty({B, S}, DType::I64);
    mb.loss_mask = Tensor::empty({B, S}, DType::F32);
    for (int64_t i = 0; i < B * S; ++i) {
      mb.tokens.data<int64_t>()[i] = Philox::u32(17, 1 + 2 * m, i) % V;
      mb.labels.data<int64_t>()[i] = Philox::u32(17, 2 + 2 * m, i) % V;
      mb.loss_mask.data<float>()[i] = (i + m) % 5 == 2 ? 0.f : 1.f;
    }
    out.push_back(mb);
  }
  return out;
}

model::StepKeys keys_for(int m, int64_t B, int M) {
  model::StepKeys k;
  k.iteration = 4, k.sample_offset = m * B, k.global_batch = B * M;
  return k;
}

constexpr double kScale = 0.05;

// The whole model, micro-batch after micro-batch: (loss sum, gradients by name).
std::pair<double, std::map<std::string, Tensor>> whole(const TransformerConfig& c,
                                                       const std::vector<model::MicroBatch>& mbs) {
  GPTModel m(c);
  const int M = int(mbs.size());
  double loss = 0;
  for (int j = 0; j < M; ++j) {
    loss += m.forward(mbs[size_t(j)], keys_for(j, mbs[0].tokens.size(0), M));
    m.backward(kScale);
  }
  std::map<std::string, Tensor> g;
  for (size_t i = 0; i < m.params().infos().size(); ++i)
    g[m.params().infos()[i].name] = m.params().grad(i).clone();
  return {loss, g};
}

struct StageRun {
  std::vector<int64_t> predicted_slot, predicted_scratch;  // GPTModel's own prediction
  double loss = 0;
  std::map<std::string, Tensor> grads;   // the tied embedding's copies summed
  std::vector<model::ActivationMemory> memory;  // per stage, after the step
};

// Replays the per-stage action lists in one process: a stage advances until it needs a
// tensor nobody has sent yet; a round in which no stage advances is a deadlock.
StageRun run_stages(const TransformerConfig& c, const pl::Schedule& sched, int vpp,
                    const std::vector<model::MicroBatch>& mbs, std::optional<int> first = {},
                    std::optional<int> last = {}) {
  const int pp = int(sched.size()), M = int(mbs.size());
  const int64_t B = mbs[0].tokens.size(0);
  const auto layers = pl::assign_layers(int(c.num_layers), pp, vpp, first, last);
  std::vector<std::unique_ptr<GPTModel>> st;
  for (int s = 0; s < pp; ++s) {
    model::PipelinePart part;
    for (int v = 0; v < vpp; ++v) part.chunks.push_back(layers[size_t(s * vpp + v)]);
    part.first_stage = s == 0, part.last_stage = s == pp - 1;
    st.push_back(std::make_unique<GPTModel>(c, nullptr, part));
  }
  using Key = std::pair<int, int>;
  std::map<std::tuple<int, int, int>, std::deque<Tensor>> channel;  // (src, dst, grad?)
  const size_t P = size_t(pp);
  std::vector<std::map<Key, Tensor>> in_act(P), in_grad(P), out_act(P), out_grad(P);
  std::vector<size_t> pos(size_t(pp), 0);
  StageRun r;
  auto take = [](std::map<Key, Tensor>& m, Key k) {
    auto it = m.find(k);
    if (it == m.end()) return Tensor();
    Tensor t = it->second;
    m.erase(it);
    return t;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      const auto& list = sched[size_t(s)];
      while (pos[size_t(s)] < list.size()) {
        const pl::Action& a = list[pos[size_t(s)]];
        const Key k{a.microbatch, a.chunk};
        bool done = true;
        switch (a.op) {
          case pl::Op::Forward: {
            auto o = st[size_t(s)]->forward_chunk(a.chunk, a.microbatch,
                                                  mbs[size_t(a.microbatch)],
                                                  keys_for(a.microbatch, B, M),
                                                  take(in_act[size_t(s)], k));
            r.loss += o.loss.value();
            if (o.output.defined()) out_act[size_t(s)][k] = o.output.clone();
            break;
          }
          case pl::Op::Backward: {
            Tensor dx = st[size_t(s)]->backward_chunk(a.chunk, a.microbatch,
                                                      take(in_grad[size_t(s)], k), kScale,
                                                      a.microbatch == M - 1);
            if (dx.defined()) out_grad[size_t(s)][k] = dx.clone();
            break;
          }
          case pl::Op::SendActivation:
            channel[{s, a.peer_stage, 0}].push_back(take(out_act[size_t(s)], k));
            break;
          case pl::Op::SendGrad:
            channel[{s, a.peer_stage, 1}].push_back(take(out_grad[size_t(s)], k));
            break;
          case pl::Op::RecvActivation:
          case pl::Op::RecvGrad: {
            const int g = a.op == pl::Op::RecvGrad;
            auto& q = channel[{a.peer_stage, s, g}];
            if (q.empty()) {
              done = false;
              break;
            }
            (g ? in_grad : in_act)[size_t(s)][k] = q.front();
            q.pop_front();
            break;
          }
        }
        if (!done) break;
        ++pos[size_t(s)];
        progress = true;
      }
    }
  }
  for (int s = 0; s < pp; ++s)
    EXPECT_EQ(pos[size_t(s)], sched[size_t(s)].size()) << "stage " << s << " is stuck";
  for (auto& m : st) {
    r.memory.push_back(m->activation_memory());
    r.predicted_slot.push_back(m->saved_bytes_per_microbatch(0, B, c.seq_length));
    r.predicted_scratch.push_back(m->scratch_bytes(B, c.seq_length));
    for (size_t i = 0; i < m->params().infos().size(); ++i) {
      const auto& name = m->params().infos()[i].name;
      Tensor g = m->params().grad(i).clone();
      if (r.grads.count(name)) {  // the tied embedding: first stage + last stage
        EXPECT_TRUE(m->params().infos()[i].pipeline_duplicate) << name;
        Tensor& acc = r.grads[name];
        for (int64_t e = 0; e < g.numel(); ++e) acc.data<double>()[e] += g.data<double>()[e];
      } else {
        r.grads[name] = g;
      }
    }
  }
  return r;
}

double rel(const Tensor& a, const Tensor& b) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double d = a.data<double>()[i] - b.data<double>()[i];
    num += d * d, den += b.data<double>()[i] * b.data<double>()[i];
  }
  return std::sqrt(num / std::max(den, 1e-300));
}

struct Layout {
  const char* name;
  pl::ScheduleKind kind;
  int pp, vpp, layers;
  std::optional<int> first, last;
};

const Layout kLayouts[] = {
    {"1F1B PP2", pl::ScheduleKind::OneFOneB, 2, 1, 4, {}, {}},
    {"1F1B PP4", pl::ScheduleKind::OneFOneB, 4, 1, 4, {}, {}},
    {"GPipe PP2", pl::ScheduleKind::AllForwardAllBackward, 2, 1, 4, {}, {}},
    {"interleaved PP2 V2", pl::ScheduleKind::Interleaved1F1B, 2, 2, 4, {}, {}},
    {"1F1B PP2 uneven 1+3", pl::ScheduleKind::OneFOneB, 2, 1, 4, 1, 3},
};

const Recompute kRecompute[] = {
    {RC::None}, {RC::Full, RM::Uniform, 1}, {RC::Full, RM::Uniform, 2},
    {RC::Full, RM::Block, 1}, {RC::Selective}};

void check_family(bool llama) {
  const int M = 4;
  for (const Layout& lay : kLayouts) {
    const auto base = tiny(llama, lay.layers);
    const auto mbs = batches(M, 2, base.seq_length, 13);
    const auto [ref_loss, ref_grads] = whole(base, mbs);
    const auto sched = pl::build_schedule(lay.kind, lay.pp, lay.vpp, M);
    for (const Recompute& rc : kRecompute) {
      SCOPED_TRACE(std::string(llama ? "llama " : "gpt ") + lay.name + ", recompute " +
                   rc.name());
      const StageRun r = run_stages(with(base, rc), sched, lay.vpp, mbs, lay.first, lay.last);
      EXPECT_NEAR(r.loss, ref_loss, 1e-12 * std::abs(ref_loss));
      ASSERT_EQ(r.grads.size(), ref_grads.size());
      for (const auto& [name, g] : ref_grads) {
        ASSERT_TRUE(r.grads.count(name)) << name;
        EXPECT_LT(rel(r.grads.at(name), g), 1e-12) << name;
      }
    }
  }
}

TEST(PipelineModel, StagesEqualWholeModelGpt) { check_family(false); }
TEST(PipelineModel, StagesEqualWholeModelLlama) { check_family(true); }

// Recomputation re-runs the same deterministic forward: the gradients are bitwise those
// of the stored activations.
TEST(PipelineModel, RecomputationIsBitwiseExact) {
  for (bool llama : {false, true}) {
    const auto base = tiny(llama, 4);
    const auto mbs = batches(3, 2, base.seq_length, 13);
    const auto [ref_loss, ref] = whole(base, mbs);
    for (const Recompute& rc : kRecompute) {
      const auto [loss, g] = whole(with(base, rc), mbs);
      EXPECT_EQ(loss, ref_loss) << rc.name();
      for (const auto& [name, t] : ref)
        EXPECT_EQ(std::memcmp(t.raw(), g.at(name).raw(), t.nbytes()), 0)
            << (llama ? "llama " : "gpt ") << rc.name() << ": " << name;
    }
  }
}

// ---- activation memory ----------------------------------------------------------------

// Bytes one micro-batch keeps on a stage holding `n` layers (one chunk), counted from
// the shapes (f64 model on the CPU: 8-byte elements; the loss mask also kept as f32).
int64_t expected_slot_bytes(const TransformerConfig& c, int n, bool first, bool last,
                            const Recompute& rc, int64_t B) {
  const int64_t S = c.seq_length, T = S * B, H = c.hidden_size;
  const int64_t qkv = c.num_query_groups * (c.num_attention_heads / c.num_query_groups + 2) *
                      c.kv_channels;
  const int64_t nhd = c.num_attention_heads * c.kv_channels, nh = c.num_attention_heads;
  const int64_t F = c.ffn_hidden_size, fc1 = (c.swiglu ? 2 : 1) * F;
  const int64_t norm_stats = c.rmsnorm ? 1 : 2;  // rstd (+ mean)
  const int64_t core = T * nhd + nh * T;         // attention output + log-sum-exp
  const int64_t layer = T * H + norm_stats * T + T * qkv + core + T * H + T * H +
                        norm_stats * T + T * fc1;  // the MLP activation is recomputed in backward
  int64_t elems = 0;
  int stored_layers = n, kept_hidden = n + 1;
  if (rc.granularity == RC::Full && rc.method == RM::Uniform) {
    stored_layers = 0;
    kept_hidden = (n + rc.layers - 1) / rc.layers + 1;  // each group's input + the output
  } else if (rc.granularity == RC::Full) {
    stored_layers = n - std::min(n, rc.layers);
  }
  elems += int64_t(stored_layers) * (rc.granularity == RC::Selective ? layer - core : layer);
  elems += int64_t(kept_hidden) * T * H;
  if (first) elems += T * H;  // the embedding before its dropout
  if (last)                   // final norm, logits, targets, mask, CE statistics, losses
    elems += T * H + norm_stats * T + T * c.padded_vocab_size + T + T + 4 * T;
  int64_t bytes = elems * 8;
  if (last) bytes += T * 4;  // the f32 loss mask
  return bytes;
}

TEST(PipelineModel, PeakActivationMemoryPerStage) {
  const int M = 8, pp = 4;
  const int64_t B = 2;
  const auto base = tiny(false, 8);
  const auto mbs = batches(M, B, base.seq_length, 13);
  std::printf("%-6s %-18s %5s %10s %10s %10s\n", "sched", "recompute", "stage", "in-flight",
              "peak B", "expected");
  for (auto kind : {pl::ScheduleKind::OneFOneB, pl::ScheduleKind::AllForwardAllBackward}) {
    const auto sched = pl::build_schedule(kind, pp, 1, M);
    std::vector<int64_t> peak_none(pp);
    for (const Recompute& rc : kRecompute) {
      const StageRun r = run_stages(with(base, rc), sched, 1, mbs);
      for (int s = 0; s < pp; ++s) {
        const int in_flight = pl::promised_in_flight(kind, pp, s, 1, M);
        const int64_t slot = expected_slot_bytes(base, 2, s == 0, s == pp - 1, rc, B);
        const auto& m = r.memory[size_t(s)];
        std::printf("%-6s %-18s %5d %10d %10lld %10lld\n",
                    kind == pl::ScheduleKind::OneFOneB ? "1F1B" : "GPipe", rc.name().c_str(), s,
                    m.max_in_flight, (long long)m.peak, (long long)(in_flight * slot));
        EXPECT_EQ(m.max_in_flight, in_flight) << rc.name() << " stage " << s;
        EXPECT_EQ(m.per_slot_max, slot) << rc.name() << " stage " << s;
        EXPECT_EQ(m.peak, int64_t(in_flight) * slot) << rc.name() << " stage " << s;
        EXPECT_EQ(m.live, 0) << "every micro-batch released";
        // The model's own prediction (printed by the trainer at start-up) is exact too.
        EXPECT_EQ(r.predicted_slot[size_t(s)], m.per_slot_max) << rc.name() << " stage " << s;
        EXPECT_EQ(r.predicted_scratch[size_t(s)], m.scratch) << rc.name() << " stage " << s;
        if (rc.granularity == RC::None) peak_none[size_t(s)] = m.peak;
        else EXPECT_LT(m.peak, peak_none[size_t(s)]) << rc.name() << " saves memory";
      }
    }
  }
}

// ---- --keep-mlp-activations ---------------------------------------------------------------

TransformerConfig keeping(TransformerConfig c, int64_t n) {
  c.keep_mlp_activations = n;
  return c;
}

// Layers that keep their MLP activation run the same element functions and GEMMs as
// layers that recompute it: every pipeline layout gives the same bits, and each stage's
// prediction of its saved and scratch bytes stays exact.
TEST(PipelineModel, KeptMlpActivationsAreBitwiseExact) {
  const Recompute rcs[] = {{RC::None}, {RC::Selective}, {RC::Full, RM::Block, 1}};
  const int M = 4;
  for (bool llama : {false, true})
    for (const Layout& lay : kLayouts) {
      const auto base = tiny(llama, lay.layers);
      const auto mbs = batches(M, 2, base.seq_length, 13);
      const auto sched = pl::build_schedule(lay.kind, lay.pp, lay.vpp, M);
      for (const Recompute& rc : rcs) {
        const StageRun ref = run_stages(with(base, rc), sched, lay.vpp, mbs, lay.first, lay.last);
        for (int64_t keep : {1, 100}) {
          SCOPED_TRACE(std::string(llama ? "llama " : "gpt ") + lay.name + ", recompute " +
                       rc.name() + ", keep " + std::to_string(keep));
          const StageRun r =
              run_stages(keeping(with(base, rc), keep), sched, lay.vpp, mbs, lay.first, lay.last);
          EXPECT_EQ(r.loss, ref.loss);
          for (const auto& [name, g] : ref.grads)
            EXPECT_EQ(std::memcmp(g.raw(), r.grads.at(name).raw(), g.nbytes()), 0) << name;
          for (size_t s = 0; s < r.memory.size(); ++s) {
            EXPECT_EQ(r.predicted_scratch[s], r.memory[s].scratch) << "stage " << s;
            if (lay.vpp == 1)  // the prediction is chunk 0's: the stage's only chunk
              EXPECT_EQ(r.predicted_slot[s], r.memory[s].per_slot_max) << "stage " << s;
            if (rc.granularity != RC::Full)  // block 1 re-runs one-layer chunks whole
              EXPECT_GT(r.memory[s].per_slot_max, ref.memory[s].per_slot_max) << "stage " << s;
          }
        }
      }
    }
}

// What keeping costs: one [T, F] per kept layer (the first N a chunk stores) in every
// micro-batch's saved set, and the shared scratch activation goes once no layer uses it.
TEST(PipelineModel, KeptMlpActivationMemoryPerStage) {
  const int M = 8, pp = 4, n = 2;  // 8 layers: 2 per stage
  const int64_t B = 2;
  const auto base = tiny(false, 8);
  const int64_t act_bytes = base.seq_length * B * base.ffn_hidden_size * 8;  // f64 [T, F]
  const auto mbs = batches(M, B, base.seq_length, 13);
  const auto sched = pl::build_schedule(pl::ScheduleKind::OneFOneB, pp, 1, M);
  const Recompute rcs[] = {
      {RC::None}, {RC::Selective}, {RC::Full, RM::Block, 1}, {RC::Full, RM::Uniform, 1}};
  for (const Recompute& rc : rcs) {
    const StageRun none = run_stages(with(base, rc), sched, 1, mbs);
    const int stored = rc.granularity != RC::Full ? n : rc.method == RM::Block ? n - 1 : 0;
    for (int64_t keep : {1, 2, 5}) {
      SCOPED_TRACE("recompute " + rc.name() + ", keep " + std::to_string(keep));
      const StageRun r = run_stages(keeping(with(base, rc), keep), sched, 1, mbs);
      const int kept = int(std::min<int64_t>(keep, stored));
      for (int s = 0; s < pp; ++s) {
        const int in_flight = pl::promised_in_flight(pl::ScheduleKind::OneFOneB, pp, s, 1, M);
        const int64_t slot =
            expected_slot_bytes(base, n, s == 0, s == pp - 1, rc, B) + kept * act_bytes;
        const auto& m = r.memory[size_t(s)];
        EXPECT_EQ(m.per_slot_max, slot) << "stage " << s;
        EXPECT_EQ(m.peak, int64_t(in_flight) * slot) << "stage " << s;
        EXPECT_EQ(r.predicted_slot[size_t(s)], slot) << "stage " << s;
        EXPECT_EQ(m.scratch, none.memory[size_t(s)].scratch - (kept == n ? act_bytes : 0))
            << "stage " << s;
        EXPECT_EQ(r.predicted_scratch[size_t(s)], m.scratch) << "stage " << s;
      }
    }
  }
}

}  // namespace pipeline_model_test
