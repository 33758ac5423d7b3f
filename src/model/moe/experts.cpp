#include "model/moe/experts.h"

#include <algorithm>
#include <cstdlib>

#include "base/error.h"
#include "ops/graph.h"
#include "ops/ops.h"

namespace mcpp::model::moe {
namespace {

std::string fc1_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc1.weight" + std::to_string(e));
}
std::string fc2_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc2.weight" + std::to_string(e));
}
std::string fc1_bias_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc1.bias" + std::to_string(e));
}
std::string fc2_bias_name(int layer, int64_t e) {
  return layer_param_name(layer, "mlp.experts.linear_fc2.bias" + std::to_string(e));
}

}  // namespace

void GroupedExperts::add_fp8_buffers(const TransformerConfig& c, int layer,
                                     std::vector<BufferInfo>& out) {
  if (!c.fp8.delayed() || !c.fp8.layer_in_fp8(layer, c.num_layers)) return;
  const int64_t e0 = c.moe.first_expert();
  for (int64_t e = e0; e < e0 + c.moe.local_experts(); ++e)
    for (const std::string& w : {fc1_name(layer, e), fc2_name(layer, e)}) {
      // As a dense linear's (fp8_linear.cpp): scales start at 1, the history empty; the
      // state is the expert's, so it travels with the expert (EP writers, resharding).
      BufferInfo h;
      h.name = fp8_history_name(w), h.global_shape = {c.fp8.amax_history_len, 3};
      h.layer = layer, h.expert = int(e), h.init = Init::Zeros;
      BufferInfo sc = h;
      sc.name = fp8_scale_name(w), sc.global_shape = {3}, sc.init = Init::Ones;
      out.push_back(std::move(h)), out.push_back(std::move(sc));
    }
}

void GroupedExperts::add_params(const TransformerConfig& c, int layer,
                                std::vector<ParamInfo>& params) {
  const bool glu = c.gated_linear_unit();
  const int64_t H = c.hidden_size, I = c.moe.ffn_hidden_size, fc1 = (glu ? 2 : 1) * I;
  const TpSplit split1 = glu ? TpSplit::SwigluRows : TpSplit::Rows;
  const int64_t e0 = c.moe.first_expert();
  for (int64_t e = e0; e < e0 + c.moe.local_experts(); ++e) {  // global indices
    std::vector<ParamInfo> mine;
    mine.push_back(make_param(fc1_name(layer, e), {fc1, H}, split1, Init::Normal,
                              c.init_method_std, true, layer, c.moe_etp()));
    mine.push_back(make_param(fc2_name(layer, e), {H, I}, TpSplit::Cols, Init::Normal,
                              output_init_std(c), true, layer, c.moe_etp()));
    if (c.add_bias_linear) {  // zeros, not decayed (TE's GroupedLinear, Megatron's linears)
      mine.push_back(make_param(fc1_bias_name(layer, e), {fc1}, split1, Init::Zeros, 0, false,
                                layer, c.moe_etp()));
      mine.push_back(make_param(fc2_bias_name(layer, e), {H}, TpSplit::None, Init::Zeros, 0,
                                false, layer, c.moe_etp()));
    }
    for (ParamInfo& p : mine) {
      p.grad_group = GradGroup::Expert;
      p.expert = int(e);
      // Sharded over the ETP group: its box of the global tensor follows the ETP rank.
      if (c.moe.etp_size > 0) p.split_rank = int(c.moe.etp_rank);
      params.push_back(std::move(p));
    }
  }
}

GroupedExperts::GroupedExperts(const TransformerConfig& c, int layer, const ParamStore* store)
    : cfg_(&c) {
  const int64_t e0 = c.moe.first_expert();
  for (int64_t e = e0; e < e0 + c.moe.local_experts(); ++e) {
    w1_.push_back(ParamStore::view(store, fc1_name(layer, e)));
    w2_.push_back(ParamStore::view(store, fc2_name(layer, e)));
    b1_.push_back(ParamStore::view(store, fc1_bias_name(layer, e)));  // (undefined: none)
    b2_.push_back(ParamStore::view(store, fc2_bias_name(layer, e)));
    f1_.emplace_back(store, fc1_name(layer, e));
    f2_.emplace_back(store, fc2_name(layer, e));
  }
}

int64_t GroupedExperts::row_multiple(const StepContext& cx, Device dev) const {
  if (pad_rows_ > 0) return pad_rows_;
  if (dev == Device::CPU) return 1;           // the emulation takes any shape
  return cx.cfg->fp8.blockwise() ? 128 : 16;  // 128: whole 128-row blocks for the block GEMMs
}

namespace {

// Scratch for the padded operands, shared by every MoE layer (slot 0: the input, 1: the
// output or output gradient, 2: the input gradient), grown to the largest use: each is read
// by the GEMM right after it on the same stream, so the next expert may overwrite it.
Tensor pad_scratch(int slot, const Shape& shape, DType dt, Device dev) {
  static Tensor pool[3];
  Tensor& buf = pool[slot];
  const int64_t n = shape_numel(shape);
  if (!buf.defined() || buf.numel() < n || buf.dtype() != dt || buf.device() != dev)
    buf = Tensor::empty({std::max<int64_t>(n, buf.defined() ? buf.numel() : 0)}, dt, dev);
  return buf.narrow(0, n).view(shape);
}

// Rows [0, n) of v into slot's first np rows, rows [n, np) zero.
Tensor pad_rows(const Tensor& v, int64_t np, int slot, Stream& st) {
  Tensor buf = pad_scratch(slot, {np, v.size(1)}, v.dtype(), v.device());
  Tensor head = buf.narrow(0, v.size(0)), tail = buf.narrow(v.size(0), np - v.size(0));
  ops::copy(v, head, st);
  ops::fill(tail, 0.0, st);  // only the padding rows: the head is overwritten
  return buf;
}

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

}  // namespace

void GroupedExperts::fp8_forward(const Fp8Linear& f, const Tensor& x, bool x_split,
                                 const ParamView& w, const ParamView& b, Tensor& y,
                                 const StepContext& cx) const {
  const int64_t n = x.size(0), np = round_up(n, row_multiple(cx, x.device()));
  if (np == n) return f.forward(x, x_split, w.w, b.w, Tensor(), y, cx);
  const Tensor xp = pad_rows(x, np, 0, cx.stream());
  Tensor yp = pad_scratch(1, {np, y.size(1)}, y.dtype(), y.device());
  f.forward(xp, x_split, w.w, b.w, Tensor(), yp, cx);  // (padding rows: the bias, dropped)
  ops::copy(yp.narrow(0, n), y, cx.stream());
}

void GroupedExperts::fp8_backward(const Fp8Linear& f, const Tensor& dy, bool dy_split,
                                  const Tensor& x, bool x_split, const ParamView& w,
                                  const ParamView& b, Tensor& dx, const StepContext& cx) const {
  const int64_t n = x.size(0), np = round_up(n, row_multiple(cx, x.device()));
  if (np == n) return f.backward(dy, dy_split, x, x_split, w, b, dx, true, cx);
  const Tensor xp = pad_rows(x, np, 0, cx.stream());
  const Tensor gp = pad_rows(dy, np, 1, cx.stream());  // zero rows: no bias gradient
  Tensor dxp = pad_scratch(2, {np, dx.size(1)}, dx.dtype(), dx.device());
  f.backward(gp, dy_split, xp, x_split, w, b, dxp, true, cx);
  ops::copy(dxp.narrow(0, n), dx, cx.stream());
}

void GroupedExperts::saved_specs(const TransformerConfig& c, int64_t Nmax, DType dt, bool keep_ap,
                                 Saved& s, const TensorVisitor& v) {
  v(s.fc1, {Nmax, c.moe_fc1_width_local()}, dt, true);
  v(s.ap, {Nmax, c.moe_ffn_local()}, dt, keep_ap);
}

void GroupedExperts::scratch_specs(const TransformerConfig& c, int64_t Nmax, DType dt,
                                   DType sdt, Scratch& w, const TensorVisitor& v) {
  v(w.dap, {Nmax, c.moe_ffn_local()}, dt, true);
  v(w.dfc1, {Nmax, c.moe_fc1_width_local()}, dt, true);
  v(w.xs, {Nmax, c.hidden_size}, dt, c.moe.apply_probs_on_input);
  v(w.ones, {Nmax}, sdt, c.moe.apply_probs_on_input);
}

namespace {
// --moe-apply-probs-on-input: xs = xp * p (rounded to the dtype, as Megatron casts it) and
// ones in place of p; the experts then run on (xs, ones).
void probs_on_input(const Tensor& xp, const Tensor& p, GroupedExperts::Scratch& w, Tensor& xs,
                    Tensor& ones, Stream& st) {
  const int64_t N = xp.size(0);
  xs = w.xs.narrow(0, N), ones = w.ones.narrow(0, N);
  ops::moe_scale_rows(xp, p, xs, st);
  ops::fill(ones, 1.0, st);
}

// The streams one loop of expert GEMMs spreads over (ops::StreamFork): expert e's GEMM on
// side e mod n, so one expert's last wave runs beside the next one's first (32 experts of
// ~3K rows are 1.5 waves each on an H200). MCPP_MOE_GEMM_STREAMS (docs/environment.md),
// default 4; 1 runs them one after another on the step's stream. The same bits either way.
int gemm_streams() {
  static const int n = [] {
    const char* e = std::getenv("MCPP_MOE_GEMM_STREAMS");
    const long v = e ? std::strtol(e, nullptr, 10) : 4;
    return int(std::clamp<long>(v, 1, ops::StreamFork::kMaxSides));
  }();
  return n;
}
}  // namespace

void GroupedExperts::forward(const Tensor& xp_in, const Tensor& p_in,
                             const std::vector<int64_t>& counts, Saved& s, Tensor& yp, Scratch& w,
                             const StepContext& cx0, comm::Communicator* etp) const {
  Stream& st = cx0.stream();
  Tensor xp = xp_in, p = p_in;  // or the scaled rows and ones (--moe-apply-probs-on-input)
  if (cfg_->moe.apply_probs_on_input) probs_on_input(xp_in, p_in, w, xp, p, st);
  // The expert GEMMs' TP group is the ETP group (fp8_linear.h: a split tensor's amax)
  StepContext cx = cx0;
  cx.tp_comm = etp;
  const bool fp8 = !f1_.empty() && f1_[0].on(cx);
  MCPP_CHECK(counts.size() == w1_.size(), "GroupedExperts: {} row counts for {} local experts",
             counts.size(), w1_.size());
  const int64_t N = xp.size(0);
  // ap: kept, or in the scratch dap (the backward's alone) until fc2 has read it
  Tensor fc1 = s.fc1.narrow(0, N), ap = (s.ap.defined() ? s.ap : w.dap).narrow(0, N);
  const int ns = fp8 ? 1 : gemm_streams();  // FP8: its scales' state runs in step order
  int64_t off = 0;
  {
    ops::StreamFork f(st, ns);
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;  // an expert without tokens: nothing to compute
      Tensor h = fc1.narrow(off, n);
      if (fp8)
        fp8_forward(f1_[e], xp.narrow(off, n), false, w1_[e], b1_[e], h, cx);
      else
        ops::linear_forward(xp.narrow(off, n), w1_[e].w, b1_[e].w, h, f.side(int(e)));
      off += n;
    }
  }
  // probabilities after the activation
  ops::moe_act_scale_forward(fc1, p, cfg_->activation(), ap, st);
  off = 0;
  ops::StreamFork f(st, ns);
  for (size_t e = 0; e < counts.size(); ++e) {
    const int64_t n = counts[e];
    if (n == 0) continue;
    Tensor y = yp.narrow(off, n);
    if (fp8)
      fp8_forward(f2_[e], ap.narrow(off, n), etp != nullptr, w2_[e], ParamView{}, y, cx);
    else
      ops::linear_forward(ap.narrow(off, n), w2_[e].w, Tensor(), y, f.side(int(e)));
    // fc2's bias times the probability (Megatron's _apply_bias; whole experts: ETP 1)
    if (b2_[e].w.defined())
      ops::moe_bias_scale_forward(b2_[e].w, p.narrow(off, n), y, f.side(int(e)));
    off += n;
  }
}

void GroupedExperts::backward(const Tensor& dyp, const Tensor& xp_in, const Tensor& p_in,
                              const std::vector<int64_t>& counts, const Saved& s, Tensor& dxp,
                              Tensor& dp, Scratch& w, const StepContext& cx0,
                              comm::Communicator* etp) {
  Stream& st = cx0.stream();
  const bool on_input = cfg_->moe.apply_probs_on_input;
  Tensor xp = xp_in, p = p_in;  // or the scaled rows and ones, recomputed (as the forward's)
  if (on_input) probs_on_input(xp_in, p_in, w, xp, p, st);
  backward_rows(dyp, xp, p, counts, s, dxp, dp, w, cx0, etp);
  if (on_input) {  // xs = p x: dp = rowsum(dxs * x), dx = dxs * p (in place)
    ops::moe_row_dot(dxp, xp_in, dp, st);
    ops::moe_scale_rows(dxp, p_in, dxp, st);
  }
}

void GroupedExperts::backward_rows(const Tensor& dyp, const Tensor& xp, const Tensor& p,
                                   const std::vector<int64_t>& counts, const Saved& s,
                                   Tensor& dxp, Tensor& dp, Scratch& w, const StepContext& cx0,
                                   comm::Communicator* etp) {
  Stream& st = cx0.stream();
  StepContext cx = cx0;
  cx.tp_comm = etp;
  const bool fp8 = !f1_.empty() && f1_[0].on(cx);
  MCPP_CHECK(counts.size() == w1_.size(), "GroupedExperts: {} row counts for {} local experts",
             counts.size(), w1_.size());
  const int64_t N = xp.size(0);
  const int64_t I = cfg_->moe_ffn_local();
  const bool kept = s.ap.defined();
  const Tensor fc1 = s.fc1.narrow(0, N);
  Tensor dap = w.dap.narrow(0, N), dfc1 = w.dfc1.narrow(0, N), none;
  // fc2's input: kept; or recomputed by moe_act_scale_backward over dap once fc2's data
  // gradients are read (bf16/f16); or (FP8) recomputed first into dfc1's leading N x I
  // elements, which moe_act_scale_backward overwrites only after fc2's backward.
  Tensor ap = kept ? s.ap.narrow(0, N) : fp8 ? w.dfc1.view({-1}).narrow(0, N * I).view({N, I}) : dap;
  if (!kept && fp8) ops::moe_act_scale_forward(fc1, p, cfg_->activation(), ap, st);
  const bool split = !kept && !fp8;  // fc2's two GEMMs apart, ap recomputed between them
  const int ns = fp8 ? 1 : gemm_streams();
  int64_t off = 0;
  {
    ops::StreamFork f(st, ns);
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;
      Tensor dx = dap.narrow(off, n);
      if (fp8)
        fp8_backward(f2_[e], dyp.narrow(off, n), false, ap.narrow(off, n), etp != nullptr, w2_[e],
                     ParamView{}, dx, cx);
      else
        ops::linear_backward(dyp.narrow(off, n), ap.narrow(off, n), w2_[e].w, dx, false,
                             split ? none : w2_[e].g, none, f.side(int(e)));
      off += n;
    }
  }
  Tensor ap_out = split ? dap : none;  // in place over dap
  ops::moe_act_scale_backward(dap, fc1, p, cfg_->activation(), dfc1, dp, ap_out, st);
  {
    ops::StreamFork f(st, ns);
    if (split) {  // fc2's weight gradients beside fc1's backward: both read only what is done
      off = 0;
      for (size_t e = 0; e < counts.size(); ++e) {
        const int64_t n = counts[e];
        if (n == 0) continue;
        ops::linear_backward(dyp.narrow(off, n), ap.narrow(off, n), w2_[e].w, none, false,
                             w2_[e].g, none, f.side(int(e)));
        off += n;
      }
    }
    off = 0;
    for (size_t e = 0; e < counts.size(); ++e) {
      const int64_t n = counts[e];
      if (n == 0) continue;
      Tensor dx = dxp.narrow(off, n), db1 = b1_[e].g;
      if (fp8)
        fp8_backward(f1_[e], dfc1.narrow(off, n), etp != nullptr, xp.narrow(off, n), false,
                     w1_[e], b1_[e], dx, cx);
      else
        ops::linear_backward(dfc1.narrow(off, n), xp.narrow(off, n), w1_[e].w, dx, false,
                             w1_[e].g, db1, f.side(int(e) + 1));
      // fc2's bias: db2 += p^T dy, dp += dy b2 (after moe_act_scale_backward wrote dp)
      if (b2_[e].w.defined()) {
        Tensor dpe = dp.narrow(off, n);
        ops::moe_bias_scale_backward(dyp.narrow(off, n), b2_[e].w, p.narrow(off, n), b2_[e].g,
                                     dpe, f.side(int(e) + 1));
      }
      off += n;
    }
  }
}

}  // namespace mcpp::model::moe
