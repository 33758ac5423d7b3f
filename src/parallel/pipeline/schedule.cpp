// Builders of the per-stage action lists; see schedule.h for the model. Each
// builder mirrors one Megatron function loop by loop (warm-up, steady 1F1B,
// cool-down), so a reader can hold the two side by side.
#include "parallel/pipeline/schedule.h"

#include <fmt/format.h>

#include "base/error.h"

namespace mcpp::parallel::pipeline {
namespace {

// Appends actions of one stage; knows the stage's neighbours and numbers batches.
struct StageWriter {
  int rank, pp;
  std::vector<Action>& out;
  int next_batch = 0;

  int next() const { return (rank + 1) % pp; }
  int prev() const { return (rank + pp - 1) % pp; }
  void compute(Op op, int mb, int chunk) { out.push_back({op, mb, chunk, -1, -1}); }
  // One batch_isend_irecv: the transfers given (nullopt = not posted). Sends first.
  void p2p(std::initializer_list<std::optional<Action>> ops) {
    int n = 0;
    for (auto& a : ops) n += a.has_value();
    if (n == 0) return;
    int id = n > 1 ? next_batch++ : -1;
    for (auto& a : ops)
      if (a) {
        Action b = *a;
        b.batch = id;
        out.push_back(b);
      }
  }
  std::optional<Action> send_act(int mb, int c) const {
    return Action{Op::SendActivation, mb, c, next()};
  }
  std::optional<Action> recv_act(int mb, int c) const {
    return Action{Op::RecvActivation, mb, c, prev()};
  }
  std::optional<Action> send_grad(int mb, int c) const {
    return Action{Op::SendGrad, mb, c, prev()};
  }
  std::optional<Action> recv_grad(int mb, int c) const {
    return Action{Op::RecvGrad, mb, c, next()};
  }
};

void check_common(ScheduleKind kind, int pp, int vpp, int m) {
  MCPP_CHECK_HINT(pp >= 1, "set --pipeline-model-parallel-size to 1 or more",
                  "pipeline schedule: pipeline-parallel size must be >= 1, got {}", pp);
  MCPP_CHECK_HINT(vpp >= 1, "set --num-virtual-stages-per-pipeline-rank to 1 or more",
                  "pipeline schedule: virtual stages per rank must be >= 1, got {}", vpp);
  MCPP_CHECK_HINT(m >= 1, "raise --global-batch-size or lower --micro-batch-size",
                  "pipeline schedule: number of micro-batches must be >= 1, got {}", m);
  MCPP_CHECK_HINT(kind == ScheduleKind::Interleaved1F1B || vpp == 1,
                  "virtual stages need the interleaved schedule",
                  "pipeline schedule {}: {} virtual stages per rank given, only the interleaved "
                  "schedule runs more than one model chunk per rank",
                  to_string(kind), vpp);
}

int group_size_or_pp(int pp, int g) { return g == 0 ? pp : g; }

void check_interleaved(int pp, int vpp, int m, int g) {
  MCPP_CHECK_HINT(pp >= 2, "use the 1F1B schedule (no virtual stages) with one pipeline stage",
                  "interleaved pipeline schedule: needs --pipeline-model-parallel-size >= 2, "
                  "got {}",
                  pp);
  MCPP_CHECK_HINT(g >= pp && g <= m,
                  "set --microbatch-group-size-per-virtual-pipeline-stage between the pipeline "
                  "size and the number of micro-batches (default: the pipeline size)",
                  "interleaved pipeline schedule: the micro-batch group size per virtual stage "
                  "must lie in [PP={}, M={}], got {}",
                  pp, m, g);
  int rem = m % g;
  MCPP_CHECK_HINT(rem == 0 || rem >= pp,
                  fmt::format("use a number of micro-batches that is a multiple of {} (global "
                              "batch = micro batch x DP x micro-batches)",
                              g),
                  "interleaved pipeline schedule: {} micro-batches leave a last group of {} "
                  "(M mod group size {}), fewer than the {} pipeline stages; Megatron rejects "
                  "this because it creates dependency bubbles",
                  m, rem, g, pp);
}

void build_gpipe(StageWriter& w, int m) {
  bool first = w.rank == 0, last = w.rank == w.pp - 1;
  for (int i = 0; i < m; ++i) {
    if (!first) w.p2p({w.recv_act(i, 0)});
    w.compute(Op::Forward, i, 0);
    if (!last) w.p2p({w.send_act(i, 0)});
  }
  for (int i = 0; i < m; ++i) {
    if (!last) w.p2p({w.recv_grad(i, 0)});
    w.compute(Op::Backward, i, 0);
    if (!first) w.p2p({w.send_grad(i, 0)});
  }
}

// forward_backward_pipelining_without_interleaving.
void build_1f1b(StageWriter& w, int m) {
  const bool first = w.rank == 0, last = w.rank == w.pp - 1;
  const std::optional<Action> none;
  const int warmup = std::min(w.pp - w.rank - 1, m), remaining = m - warmup;
  for (int i = 0; i < warmup; ++i) {
    w.p2p({first ? none : w.recv_act(i, 0)});  // recv_forward
    w.compute(Op::Forward, i, 0);
    w.p2p({last ? none : w.send_act(i, 0)});  // send_forward
  }
  if (remaining > 0) w.p2p({first ? none : w.recv_act(warmup, 0)});
  for (int i = 0; i < remaining; ++i) {
    const int f = warmup + i, b = i;
    w.compute(Op::Forward, f, 0);
    // send_forward_recv_backward
    w.p2p({last ? none : w.send_act(f, 0), last ? none : w.recv_grad(b, 0)});
    w.compute(Op::Backward, b, 0);
    if (i == remaining - 1)
      w.p2p({first ? none : w.send_grad(b, 0)});  // send_backward
    else                                          // send_backward_recv_forward
      w.p2p({first ? none : w.send_grad(b, 0), first ? none : w.recv_act(f + 1, 0)});
  }
  for (int i = 0; i < warmup; ++i) {
    const int b = remaining + i;
    w.p2p({last ? none : w.recv_grad(b, 0)});  // recv_backward
    w.compute(Op::Backward, b, 0);
    w.p2p({first ? none : w.send_grad(b, 0)});  // send_backward
  }
}

// forward_backward_pipelining_with_interleaving, P2P overlap off (batched p2p).
void build_interleaved(StageWriter& w, int vpp, int m, int g) {
  const int pp = w.pp, r = w.rank, total = m * vpp;
  const auto table = interleaved_schedule_table(m, vpp, g);
  const int warmup = warmup_microbatches(ScheduleKind::Interleaved1F1B, pp, r, vpp, m, g);
  const bool all_warmup = warmup == total;
  const int remaining = total - warmup;
  auto chunk_of = [&](int k, bool forward) {
    int c = table[k % total].second;
    return forward ? c : vpp - 1 - c;
  };
  auto mb_of = [&](int k) { return table[k].first; };
  auto first_vstage = [&](int c) { return r == 0 && c == 0; };
  auto last_vstage = [&](int c) { return r == pp - 1 && c == vpp - 1; };
  // Megatron's recv_tensor_from_previous_stage: whether the exchange after
  // iteration k receives a tensor, and for which local chunk. The leading stage
  // (rank 0 in forward, the last rank in backward) receives what the ending stage
  // produced PP-1 iterations earlier, wrapped to the next chunk.
  auto recv_from_prev = [&](int k, bool forward) -> std::pair<bool, int> {
    const bool leading = forward ? r == 0 : r == pp - 1;
    if (!leading) return {true, chunk_of(k + 1, forward)};
    if (k < pp - 1) return {false, 0};
    int c = chunk_of(k - (pp - 1), forward);
    if (c == (forward ? vpp - 1 : 0)) return {false, 0};
    return {true, forward ? c + 1 : c - 1};
  };
  // Received tensors of a chunk arrive in micro-batch order.
  std::vector<int> acts_received(vpp, 0), grads_received(vpp, 0);
  const std::optional<Action> none;
  auto recv_act = [&](bool cond, int c) { return cond ? w.recv_act(acts_received[c]++, c) : none; };
  auto recv_grad = [&](bool cond, int c) {
    return cond ? w.recv_grad(grads_received[c]++, c) : none;
  };

  w.p2p({recv_act(!first_vstage(0), 0)});
  for (int k = 0; k < warmup; ++k) {
    const int c = chunk_of(k, true);
    w.compute(Op::Forward, mb_of(k), c);
    auto [recv_prev, next_c] = recv_from_prev(k, true);
    if (k == total - 1) recv_prev = false;
    auto send = last_vstage(c) ? none : w.send_act(mb_of(k), c);
    if (k == warmup - 1 && !all_warmup)  // send_forward_backward_recv_forward_backward
      w.p2p({send, recv_act(recv_prev, next_c), recv_grad(r != pp - 1, vpp - 1)});
    else  // send_forward_recv_forward
      w.p2p({send, recv_act(recv_prev, next_c)});
  }
  for (int k = 0; k < remaining; ++k) {
    const int fk = warmup + k, bk = k;
    const int fc = chunk_of(fk, true), bc = chunk_of(bk, false);
    w.compute(Op::Forward, mb_of(fk), fc);
    w.compute(Op::Backward, mb_of(bk), bc);
    auto [recv_prev, next_fc] = recv_from_prev(fk, true);
    auto [recv_next, next_bc] = recv_from_prev(bk, false);
    if (k == remaining - 1) recv_prev = false;
    w.p2p({last_vstage(fc) ? none : w.send_act(mb_of(fk), fc),
           first_vstage(bc) ? none : w.send_grad(mb_of(bk), bc), recv_act(recv_prev, next_fc),
           recv_grad(recv_next, next_bc)});
  }
  if (all_warmup) w.p2p({recv_grad(r != pp - 1, vpp - 1)});
  for (int k = remaining; k < total; ++k) {
    const int c = chunk_of(k, false);
    w.compute(Op::Backward, mb_of(k), c);
    auto [recv_next, next_c] = recv_from_prev(k, false);
    if (k == total - 1) recv_next = false;
    w.p2p({first_vstage(c) ? none : w.send_grad(mb_of(k), c), recv_grad(recv_next, next_c)});
  }
}

}  // namespace

Schedule forward_only(const Schedule& schedule) {
  Schedule out(schedule.size());
  for (size_t s = 0; s < schedule.size(); ++s)
    for (const Action& a : schedule[s])
      if (a.op == Op::Forward || a.op == Op::SendActivation || a.op == Op::RecvActivation)
        out[s].push_back(a);
  return out;
}

std::vector<std::pair<int, int>> interleaved_schedule_table(int m, int vpp, int g) {
  MCPP_CHECK(g >= 1 && m >= 1 && vpp >= 1, "schedule table: bad sizes M={} V={} G={}", m, vpp, g);
  std::vector<std::pair<int, int>> table;
  table.reserve(size_t(m) * size_t(vpp));
  for (int lo = 0; lo < m; lo += g) {
    // The last group takes every remaining micro-batch (so its size is in [g, 2g)).
    const int hi = lo + g >= m ? m : lo + g;
    for (int c = 0; c < vpp; ++c)
      for (int mb = lo; mb < hi; ++mb) table.emplace_back(mb, c);
    if (hi == m) break;
  }
  return table;
}

int warmup_microbatches(ScheduleKind kind, int pp, int rank, int vpp, int m, int g) {
  switch (kind) {
    case ScheduleKind::AllForwardAllBackward:
      return m;
    case ScheduleKind::OneFOneB:
      return std::min(pp - rank - 1, m);
    case ScheduleKind::Interleaved1F1B: {
      int w = (pp - rank - 1) * 2 + (vpp - 1) * group_size_or_pp(pp, g);
      return std::min(w, m * vpp);
    }
  }
  return 0;
}

int promised_in_flight(ScheduleKind kind, int pp, int rank, int vpp, int m, int g) {
  int total = kind == ScheduleKind::Interleaved1F1B ? m * vpp : m;
  return std::min(warmup_microbatches(kind, pp, rank, vpp, m, g) + 1, total);
}

Schedule build_schedule(ScheduleKind kind, int pp, int vpp, int m, int microbatch_group_size) {
  check_common(kind, pp, vpp, m);
  const int g = group_size_or_pp(pp, microbatch_group_size);
  if (kind == ScheduleKind::Interleaved1F1B) check_interleaved(pp, vpp, m, g);
  Schedule s(pp);
  for (int r = 0; r < pp; ++r) {
    StageWriter w{r, pp, s[r]};
    switch (kind) {
      case ScheduleKind::AllForwardAllBackward:
        build_gpipe(w, m);
        break;
      case ScheduleKind::OneFOneB:
        build_1f1b(w, m);
        break;
      case ScheduleKind::Interleaved1F1B:
        build_interleaved(w, vpp, m, g);
        break;
    }
  }
  return s;
}

std::string to_string(Op op) {
  switch (op) {
    case Op::Forward:
      return "Forward";
    case Op::Backward:
      return "Backward";
    case Op::SendActivation:
      return "SendActivation";
    case Op::RecvActivation:
      return "RecvActivation";
    case Op::SendGrad:
      return "SendGrad";
    case Op::RecvGrad:
      return "RecvGrad";
  }
  return "?";
}

std::string to_string(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::AllForwardAllBackward:
      return "all-forward-all-backward (GPipe)";
    case ScheduleKind::OneFOneB:
      return "1F1B";
    case ScheduleKind::Interleaved1F1B:
      return "interleaved 1F1B";
  }
  return "?";
}

std::string format_actions(const std::vector<Action>& actions, bool with_p2p) {
  bool chunks = false;
  for (auto& a : actions) chunks |= a.chunk != 0;
  auto id = [&](const Action& a) {
    return chunks ? fmt::format("{}.{}", a.microbatch, a.chunk) : fmt::format("{}", a.microbatch);
  };
  std::string s;
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const char* tag = "";
    switch (a.op) {
      case Op::Forward:
        tag = "F";
        break;
      case Op::Backward:
        tag = "B";
        break;
      case Op::SendActivation:
        tag = ">a";
        break;
      case Op::RecvActivation:
        tag = "<a";
        break;
      case Op::SendGrad:
        tag = ">g";
        break;
      case Op::RecvGrad:
        tag = "<g";
        break;
    }
    const bool compute = a.op == Op::Forward || a.op == Op::Backward;
    if (!compute && !with_p2p) continue;
    const bool opens = a.batch >= 0 && (i == 0 || actions[i - 1].batch != a.batch);
    const bool closes =
        a.batch >= 0 && (i + 1 == actions.size() || actions[i + 1].batch != a.batch);
    if (!s.empty()) s += ' ';
    s += fmt::format("{}{}{}{}", opens ? "[" : "", tag, id(a), closes ? "]" : "");
  }
  return s;
}

// ---- layer partition -----------------------------------------------------------------

std::vector<std::vector<int>> assign_layers(int num_layers, int pp, int vpp,
                                            std::optional<int> first, std::optional<int> last) {
  MCPP_CHECK_HINT(num_layers >= 1, "set --num-layers", "--num-layers must be >= 1, got {}",
                  num_layers);
  MCPP_CHECK_HINT(pp >= 1 && vpp >= 1, "set the pipeline sizes to 1 or more",
                  "layer partition: pipeline size {} and virtual stages {} must be >= 1", pp, vpp);
  MCPP_CHECK_HINT(!first || *first >= 1, "give at least one layer to the first stage",
                  "--decoder-first-pipeline-num-layers must be >= 1, got {}", first.value_or(0));
  MCPP_CHECK_HINT(!last || *last >= 1, "give at least one layer to the last stage",
                  "--decoder-last-pipeline-num-layers must be >= 1, got {}", last.value_or(0));
  MCPP_CHECK_HINT(pp > 1 || (!first && !last),
                  "drop --decoder-first/last-pipeline-num-layers with one pipeline stage",
                  "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size "
                  "> 1, got {}",
                  pp);
  // Layers of each stage.
  std::vector<int> per_stage(pp, 0);
  if (!first && !last) {
    MCPP_CHECK_HINT(num_layers % pp == 0,
                    "change --num-layers or --pipeline-model-parallel-size, or give the first/"
                    "last stage its own count with --decoder-first-pipeline-num-layers / "
                    "--decoder-last-pipeline-num-layers",
                    "--num-layers {} is not divisible by --pipeline-model-parallel-size {}",
                    num_layers, pp);
    std::fill(per_stage.begin(), per_stage.end(), num_layers / pp);
  } else {
    const int middle_stages = pp - (first ? 1 : 0) - (last ? 1 : 0);
    const int middle_layers = num_layers - first.value_or(0) - last.value_or(0);
    const std::string given =
        (first ? fmt::format(" --decoder-first-pipeline-num-layers {}", *first) : "") +
        (last ? fmt::format(" --decoder-last-pipeline-num-layers {}", *last) : "");
    MCPP_CHECK_HINT(middle_layers >= 0, "lower the first/last stage layer counts",
                    "--num-layers {} is fewer than the layers given to the first/last stages "
                    "({})",
                    num_layers, given);
    if (middle_stages == 0) {
      MCPP_CHECK_HINT(middle_layers == 0,
                      "with two stages the first and last counts must add up to --num-layers",
                      "--num-layers {} differs from{} (no other stages to take the remaining "
                      "{})",
                      num_layers, given, middle_layers);
    } else {
      MCPP_CHECK_HINT(
          middle_layers % middle_stages == 0 && middle_layers / middle_stages >= 1,
          "choose first/last counts so that the other stages split the rest evenly",
          "--num-layers {} minus{} leaves {} layers, which do not split evenly (at least one "
          "each) over the {} other pipeline stages",
          num_layers, given, middle_layers, middle_stages);
    }
    for (int s = 0; s < pp; ++s) per_stage[s] = middle_stages ? middle_layers / middle_stages : 0;
    if (first) per_stage[0] = *first;
    if (last) per_stage[pp - 1] = *last;
  }
  for (int s = 0; s < pp; ++s) {
    MCPP_CHECK_HINT(per_stage[s] % vpp == 0,
                    "change --num-layers, the first/last stage counts or the number of virtual "
                    "stages so that every stage's layers split evenly into its model chunks",
                    "pipeline stage {} has {} layers, which is not divisible by {} virtual "
                    "stages per pipeline rank",
                    s, per_stage[s], vpp);
  }
  // Round c of the model (c = model chunk) holds per_stage[s]/vpp layers of every stage,
  // stage 0 first: Megatron's get_transformer_layer_offset.
  std::vector<std::vector<int>> out(size_t(pp) * size_t(vpp));
  int layer = 0;
  for (int c = 0; c < vpp; ++c)
    for (int s = 0; s < pp; ++s)
      for (int i = 0; i < per_stage[s] / vpp; ++i) out[size_t(s) * vpp + c].push_back(layer++);
  return out;
}

int virtual_stages_from_layers_per_stage(int num_layers, int pp, int k) {
  MCPP_CHECK_HINT(k >= 1, "set --num-layers-per-virtual-pipeline-stage to 1 or more",
                  "--num-layers-per-virtual-pipeline-stage must be >= 1, got {}", k);
  MCPP_CHECK_HINT(
      pp >= 1 && num_layers % pp == 0, "change --num-layers or --pipeline-model-parallel-size",
      "--num-layers {} is not divisible by --pipeline-model-parallel-size {}", num_layers, pp);
  const int per_stage = num_layers / pp;
  MCPP_CHECK_HINT(per_stage % k == 0,
                  "choose --num-layers-per-virtual-pipeline-stage dividing the layers per stage",
                  "{} layers per pipeline stage (--num-layers {} / --pipeline-model-parallel-size "
                  "{}) are not divisible by --num-layers-per-virtual-pipeline-stage {}",
                  per_stage, num_layers, pp, k);
  return per_stage / k;
}

int num_microbatches(int64_t gbs, int64_t mbs, int64_t dp) {
  MCPP_CHECK_HINT(mbs >= 1 && dp >= 1, "set --micro-batch-size and the data-parallel size >= 1",
                  "micro batch size {} and data-parallel size {} must be >= 1", mbs, dp);
  const int64_t per_step = mbs * dp;
  MCPP_CHECK_HINT(gbs >= per_step && gbs % per_step == 0,
                  fmt::format("use a --global-batch-size that is a multiple of {}", per_step),
                  "--global-batch-size {} is not divisible by --micro-batch-size {} x "
                  "data-parallel size {} = {}",
                  gbs, mbs, dp, per_step);
  return int(gbs / per_step);
}

}  // namespace mcpp::parallel::pipeline
