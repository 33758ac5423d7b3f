#include "model/linear.h"

#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

// ---- column-parallel ---------------------------------------------------------------------

void ColumnParallelLinear::add_params(const TransformerConfig& c, const std::string& prefix,
                                      int layer, int64_t out, int64_t in, TpSplit split,
                                      double init_std, bool bias, std::vector<ParamInfo>& params) {
  params.push_back(make_param(prefix + ".weight", {out, in}, split, Init::Normal, init_std, true,
                              layer, c.tp_size));
  if (bias)
    params.push_back(
        make_param(prefix + ".bias", {out}, split, Init::Zeros, 0, false, layer, c.tp_size));
}

ColumnParallelLinear::ColumnParallelLinear(const ParamStore* store, const std::string& weight,
                                           const std::string& bias)
    : w_(ParamStore::view(store, weight)), b_(ParamStore::view(store, bias)), fp8_(store, weight) {}

// Under SP the gathered input is not saved (as Megatron-Core's
// LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel): only the caller's
// sequence shard x [Tl,in] is kept, and backward all-gathers it again for the weight
// gradient. The gather lands in the shared workspace buffer ws.dln_full, in forward (read at
// once by the GEMM) and in backward (read by the weight GEMM, then overwritten by dx_full).
void ColumnParallelLinear::saved_specs(const Dims& d, int64_t in, Saved& s,
                                       const TensorVisitor& v) {
  v(s.x_full, {d.T, in}, d.dt, false);
}

void ColumnParallelLinear::scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) {
  v(ws.dln_full, {d.T, d.H}, d.dt, d.sp);
}

// Column-parallel input: x [Tl,H] -> x_full [T,H] (SP all-gather into the workspace); else
// the identity copy_to_tp (x_full is x).
const Tensor& ColumnParallelLinear::gathered(const Tensor& x, Workspace& ws,
                                             const StepContext& cx) const {
  if (cx.tp_comm) {
    if (cx.sp)
      parallel::gather_from_sp(x, ws.dln_full, *cx.tp_comm, cx.stream());
    else
      parallel::copy_to_tp(x, *cx.tp_comm, cx.stream());
  }
  return cx.sp ? ws.dln_full : x;
}

// FP8: the gathered input is whole on every rank; the weight is this rank's rows.
void ColumnParallelLinear::forward(const Tensor& x, Saved& s, Tensor& y, Workspace& ws,
                                   const StepContext& cx) const {
  (void)s;
  const Tensor& xf = gathered(x, ws, cx);
  if (fp8_.on(cx))
    fp8_.forward(xf, false, w_.w, b_.w, Tensor(), y, cx);
  else if (cx.pos)  // generation (inference/): a decode step's few rows stream the weights
    ops::linear_decode(xf, w_.w, b_.w, Tensor(), y, cx.stream());
  else
    ops::linear_forward(xf, w_.w, b_.w, y, cx.stream());
}

void ColumnParallelLinear::forward_gelu(const Tensor& x, Saved& s, Tensor& pre, Tensor& act,
                                        Workspace& ws, const StepContext& cx) const {
  (void)s;
  const Tensor& xf = gathered(x, ws, cx);
  if (fp8_.on(cx)) {  // the GELU after the FP8 GEMM
    fp8_.forward(xf, false, w_.w, b_.w, Tensor(), pre, cx);
    ops::gelu_forward(pre, act, cx.stream());
  } else {
    ops::linear_gelu_forward(xf, w_.w, b_.w, pre, act, cx.stream());
  }
}

void ColumnParallelLinear::forward_swiglu(const Tensor& x, Saved& s, Tensor& pre, Tensor& act,
                                          Workspace& ws, const StepContext& cx) const {
  if (!cx.pos || fp8_.on(cx)) {
    forward(x, s, pre, ws, cx);
    ops::swiglu_forward(pre, act, cx.stream());
    return;
  }
  ops::linear_swiglu_decode(gathered(x, ws, cx), w_.w, b_.w, pre, act, cx.stream());
}

void ColumnParallelLinear::forward_folded(const Tensor& x, const Norm::Fold& f, bool swiglu,
                                          Tensor& pre, Tensor& y, const StepContext& cx) const {
  MCPP_CHECK(!cx.tp_comm && cx.pos, "ColumnParallelLinear: a folded norm is for generation at TP 1");
  if (fp8_.on(cx)) {
    ops::rmsnorm_forward(x, *f.w, f.eps, f.s->y, f.s->rstd, cx.stream());
    Saved unused;
    Workspace none;
    if (swiglu)
      forward_swiglu(f.s->y, unused, pre, y, none, cx);
    else
      forward(f.s->y, unused, y, none, cx);
    return;
  }
  ops::rmsnorm_linear_decode(x, *f.w, f.eps, f.s->y, f.s->rstd, w_.w, b_.w, swiglu, pre, y,
                             cx.stream());
}

// dx_full = dy @ w, dw += dy^T @ x_full, db += sum dy; then the dual of the input
// transition: the SP reduce-scatter into dx, or the all-reduce in place (dx_full is dx).
// Under SP x_full is gathered again first (the weight GEMM's input), and dx_full then
// overwrites it (the data GEMM reads only dy and w).
void ColumnParallelLinear::backward(const Tensor& dy, const Tensor& x, const Saved& s, Tensor& dx,
                                    Workspace& ws, const StepContext& cx) {
  (void)s;
  const bool fp8 = fp8_.on(cx);
  Tensor none;
  if (!cx.sp || !cx.tp_comm) {
    if (fp8)  // dy: this rank's output columns
      fp8_.backward(dy, cx.tp_comm != nullptr, x, false, w_, b_, dx, true, cx);
    else
      ops::linear_backward(dy, x, w_.w, dx, false, w_.g, b_.g, cx.stream());
    if (cx.tp_comm) parallel::copy_to_tp_backward(dx, *cx.tp_comm, cx.stream());
    return;
  }
  // x_full and dx_full share ws.dln_full: the weight gradient first, then the data GEMM.
  const Tensor& x_full = gathered(x, ws, cx);
  if (fp8) {
    fp8_.backward(dy, true, x_full, false, w_, b_, none, true, cx);
    fp8_.backward(dy, true, x_full, false, w_, b_, ws.dln_full, false, cx);
  } else {
    ops::linear_backward(dy, x_full, w_.w, none, false, w_.g, b_.g, cx.stream());
    ops::linear_backward(dy, x_full, w_.w, ws.dln_full, false, none, none, cx.stream());
  }
  parallel::gather_from_sp_backward(ws.dln_full, dx, *cx.tp_comm, cx.stream());
}

// ---- row-parallel ------------------------------------------------------------------------

void RowParallelLinear::add_params(const TransformerConfig& c, const std::string& prefix, int layer,
                                   int64_t out, int64_t in, double init_std, bool bias,
                                   std::vector<ParamInfo>& params) {
  params.push_back(make_param(prefix + ".weight", {out, in}, TpSplit::Cols, Init::Normal, init_std,
                              true, layer, c.tp_size));
  // Added after the reduction, on the whole gradient: complete on every rank, not a
  // sequence-parallel partial sum.
  if (bias)
    params.push_back(make_param(prefix + ".bias", {out}, TpSplit::None, Init::Zeros, 0, false,
                                layer, c.tp_size));
}

RowParallelLinear::RowParallelLinear(const ParamStore* store, const std::string& weight,
                                     const std::string& bias)
    : w_(ParamStore::view(store, weight)), b_(ParamStore::view(store, bias)), fp8_(store, weight) {}

void RowParallelLinear::scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) {
  v(ws.tmp_full, {d.T, d.H}, d.dt, d.sp);
  v(ws.ones, {d.Tl, 1}, d.dt, d.tp);
  v(ws.dtmp_full, {d.T, d.H}, d.dt, d.sp);
}

// SP: the partial y_full [T,H] is reduce-scattered into y [Tl,H]; else y_full is y and is
// all-reduced. Then the bias, once: y[Tl,H] += ones[Tl,1] @ b[1,H].
// FP8: the input is this rank's columns (split over TP), the weight too.
void RowParallelLinear::forward(const Tensor& x, Tensor& y, Workspace& ws,
                                const StepContext& cx) const {
  Stream& st = cx.stream();
  const bool fp8 = fp8_.on(cx);
  if (!cx.tp_comm) {
    if (fp8)
      fp8_.forward(x, false, w_.w, b_.w, Tensor(), y, cx);
    else if (cx.pos)  // generation (inference/): see ColumnParallelLinear::forward
      ops::linear_decode(x, w_.w, b_.w, Tensor(), y, st);
    else
      ops::linear_forward(x, w_.w, b_.w, y, st);
    return;
  }
  Tensor& y_full = cx.sp ? ws.tmp_full : y;
  if (fp8)
    fp8_.forward(x, true, w_.w, Tensor(), Tensor(), y_full, cx);
  else if (cx.pos)
    ops::linear_decode(x, w_.w, Tensor(), Tensor(), y_full, st);
  else
    ops::linear_forward(x, w_.w, Tensor(), y_full, st);
  if (cx.sp)
    parallel::reduce_scatter_to_sp(y_full, y, *cx.tp_comm, st);
  else
    parallel::reduce_from_tp(y, *cx.tp_comm, st);
  if (b_.w.defined()) {
    Tensor b2 = b_.w.view({1, b_.w.numel()});
    ops::gemm(false, false, 1.0, ws.ones, b2, 1.0, y, st);
  }
}

void RowParallelLinear::forward_residual(const Tensor& x, const Tensor& residual, Tensor& y,
                                         const StepContext& cx) const {
  MCPP_CHECK(!cx.tp_comm, "RowParallelLinear: the residual epilogue needs TP 1");
  if (fp8_.on(cx))
    fp8_.forward(x, false, w_.w, b_.w, residual, y, cx);
  else if (cx.pos)  // generation: linear then add, fused on the GPU for a few rows
    ops::linear_decode(x, w_.w, b_.w, residual, y, cx.stream());
  else
    ops::linear_residual_forward(x, w_.w, b_.w, residual, y, cx.stream());
}

// Its dual: dy [Tl,H] -> dy_full [T,H] (SP all-gather; else the identity).
const Tensor& RowParallelLinear::grad_output(const Tensor& dy, Workspace& ws,
                                             const StepContext& cx) const {
  if (cx.tp_comm) {
    if (cx.sp)
      parallel::reduce_scatter_to_sp_backward(dy, ws.dtmp_full, *cx.tp_comm, cx.stream());
    else
      parallel::reduce_from_tp_backward(dy, *cx.tp_comm, cx.stream());
  }
  return cx.sp ? ws.dtmp_full : dy;
}

void RowParallelLinear::backward(const Tensor& dy, const Tensor& x, Tensor& dx, Workspace& ws,
                                 const StepContext& cx) {
  const Tensor& g = grad_output(dy, ws, cx);
  if (fp8_.on(cx))  // g: whole on every rank (gathered); x: this rank's columns
    fp8_.backward(g, false, x, cx.tp_comm != nullptr, w_, b_, dx, true, cx);
  else
    ops::linear_backward(g, x, w_.w, dx, false, w_.g, b_.g, cx.stream());
}

void RowParallelLinear::backward_gelu(const Tensor& dy, const Tensor& x, const Tensor& pre,
                                      Tensor& dx, Workspace& ws, const StepContext& cx) {
  const Tensor& g = grad_output(dy, ws, cx);
  if (fp8_.on(cx)) {  // the GELU gradient after the FP8 GEMM
    fp8_.backward(g, false, x, cx.tp_comm != nullptr, w_, b_, dx, true, cx);
    ops::gelu_backward(dx, pre, dx, cx.stream());
  } else {
    ops::linear_gelu_backward(g, x, w_.w, pre, dx, w_.g, b_.g, cx.stream());
  }
}

void RowParallelLinear::backward_data(const Tensor& g, const Tensor& x, Tensor& dx,
                                      const StepContext& cx) const {
  Tensor none;
  if (fp8_.on(cx))
    fp8_.backward(g, false, x, cx.tp_comm != nullptr, w_, b_, dx, false, cx);
  else
    ops::linear_backward(g, x, w_.w, dx, false, none, none, cx.stream());
}

void RowParallelLinear::backward_weights(const Tensor& g, const Tensor& x, const StepContext& cx) {
  Tensor none;
  if (fp8_.on(cx))
    fp8_.backward(g, false, x, cx.tp_comm != nullptr, w_, b_, none, true, cx);
  else
    ops::linear_backward(g, x, w_.w, none, false, w_.g, b_.g, cx.stream());
}

}  // namespace mcpp::model
