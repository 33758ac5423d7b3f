// Fp8Linear under --fp8-recipe blockwise (fp8_linear.h; docs/fp8.md "Blockwise"), as
// Transformer Engine's Float8BlockScaling: each operand is quantised in blocks along the K of
// the GEMM that reads it, each block scaled by a power of two from its own amax:
//   fprop  y  = Q1(x) @ Q2(w)^T + b           Q1: 1x128 blocks along rows (K = in features)
//   dgrad  dx = Q1(dy) @ Q2(w)                Q1 along dy's rows (K = out features)
//   wgrad  dw += Qc(dy)^T @ Qc(x)             Qc: 128x1 blocks along columns (K = tokens)
// Q2: 128x128 blocks of w (one scale a tile, the same for w and its transpose). x and dy are
// each quantised twice (row blocks for one GEMM, column blocks for the other), from the
// unquantised tensor, as TE does ("both versions computed from the high precision input").
// No state, no amax reduction: a block's scale is a function of the block alone.
// On the CPU the emulation (fp8_block_quantize, then the f32 GEMMs of linear_*); on CUDA the
// casts (fp8_block_cast: both copies in one read, scales in cuBLASLt's layout) and cuBLASLt's
// block-scaled GEMMs (fp8_block_gemm), 1D x 2D in fprop and dgrad, 1D x 1D in wgrad.
#include <algorithm>
#include <cstdint>

#include "model/fp8/fp8_linear.h"
#include "ops/ops.h"

namespace mcpp::model {

namespace {

// Scratch shared by every layer, grown to the largest use (as fp8_linear.cpp's): slot
// 4 * k + {0 q, 1 qt, 2 s_q, 3 s_qt} for operand k. Each cast is read by the GEMM right after
// it on the same stream; the gradient's two copies are read by dgrad and wgrad after one cast.
Tensor block_scratch(int slot, const Shape& shape, DType dt, Device dev) {
  static Tensor pool[12];
  Tensor& buf = pool[slot];
  const int64_t n = shape_numel(shape);
  if (!buf.defined() || buf.numel() < n || buf.dtype() != dt || buf.device() != dev)
    buf = Tensor::empty({std::max<int64_t>(n, buf.defined() ? buf.numel() : 0)}, dt, dev);
  return buf.narrow(0, n).view(shape);
}

}  // namespace

const Tensor& Fp8Linear::block_quantize(const Tensor& v, Fp8Operand k, int64_t br, int64_t bc,
                                        int slot, const StepContext& cx) const {
  Tensor& q = slot == 0 ? q_[k] : qb_[k];
  ensure(q, v.shape(), v.dtype(), v.device());
  Tensor none;
  ops::fp8_block_quantize(v, fp8_format_of(cx.cfg->fp8, k), br, bc, q, none, cx.stream());
  return q;
}

const Fp8Linear::Cast& Fp8Linear::block_cast(const Tensor& v, Fp8Operand k, bool row, bool col,
                                             const StepContext& cx) const {
  const Fp8Config& f = cx.cfg->fp8;
  const ops::Fp8Format fmt = fp8_format_of(f, k);
  const DType dt = fmt == ops::Fp8Format::E5M2 ? DType::FP8E5M2 : DType::FP8E4M3;
  const bool tile = k == kFp8Weight;
  const Tensor v2 = as_2d(v);
  const int64_t R = v2.size(0), C = v2.size(1);
  Cast& c = shared_cast(k);
  int64_t a = 0, b = 0;
  c.q = c.s_q = c.qt = c.s_qt = Tensor();
  if (!row && !col) return c;
  if (row) {
    c.q = block_scratch(4 * k, {R, C}, dt, v.device());
    ops::fp8_block_scale_dims(R, C, tile, &a, &b);
    c.s_q = block_scratch(4 * k + 2, {a, b}, DType::F32, v.device());
  }
  if (col) {
    c.qt = block_scratch(4 * k + 1, {C, R}, dt, v.device());
    ops::fp8_block_scale_dims(C, R, tile, &a, &b);
    c.s_qt = block_scratch(4 * k + 3, {a, b}, DType::F32, v.device());
  }
  ops::fp8_block_cast(v2, fmt, tile, c.q, c.s_q, c.qt, c.s_qt, cx.stream());
  return c;
}

void Fp8Linear::block_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                              const Tensor& residual, Tensor& y, const StepContext& cx) const {
  Stream& st = cx.stream();
  if (x.device() == Device::CPU) {  // the emulation
    const Tensor& xq = block_quantize(as_2d(x), kFp8Input, 1, ops::kFp8Block, 0, cx);
    const Tensor& wq = block_quantize(w, kFp8Weight, ops::kFp8Block, ops::kFp8Block, 0, cx);
    const Tensor xv = xq.view(x.shape());
    if (residual.defined())
      ops::linear_residual_forward(xv, wq, b, residual, y, st);
    else
      ops::linear_forward(xv, wq, b, y, st);
    return;
  }
  const Cast& X = block_cast(x, kFp8Input, true, false, cx);
  const Cast& W = block_cast(w, kFp8Weight, true, false, cx);
  Tensor y2 = as_2d(y);
  ops::fp8_block_gemm(X.q, X.s_q, false, W.q, W.s_q, true, b, residual, false, y2, st);
}

void Fp8Linear::block_backward(const Tensor& dy, const Tensor& x, const ParamView& w, Tensor& dx,
                               bool fp8_wgrad, const StepContext& cx) const {
  Stream& st = cx.stream();
  Tensor none;
  if (dy.device() == Device::CPU) {  // the emulation
    const Tensor d2 = as_2d(dy), x2 = as_2d(x);
    if (dx.defined()) {
      const Tensor& gq = block_quantize(d2, kFp8Grad, 1, ops::kFp8Block, 0, cx);
      const Tensor& wq = block_quantize(w.w, kFp8Weight, ops::kFp8Block, ops::kFp8Block, 0, cx);
      ops::linear_backward(gq.view(dy.shape()), x, wq, dx, false, none, none, st);
    }
    if (fp8_wgrad) {
      const Tensor& gq = block_quantize(d2, kFp8Grad, ops::kFp8Block, 1, 1, cx);
      const Tensor& xq = block_quantize(x2, kFp8Input, ops::kFp8Block, 1, 1, cx);
      Tensor dw = w.g;
      ops::linear_backward(gq.view(dy.shape()), xq.view(x.shape()), w.w, none, false, dw, none, st);
    }
    return;
  }
  const Cast& G = block_cast(dy, kFp8Grad, dx.defined(), fp8_wgrad, cx);
  if (dx.defined()) {
    const Cast& W = block_cast(w.w, kFp8Weight, false, true, cx);
    Tensor dx2 = as_2d(dx);
    ops::fp8_block_gemm(G.q, G.s_q, false, W.qt, W.s_qt, true, none, none, false, dx2, st);
  }
  if (fp8_wgrad) {
    const Cast& X = block_cast(x, kFp8Input, false, true, cx);
    Tensor dw = w.g;
    ops::fp8_block_gemm(G.qt, G.s_qt, false, X.qt, X.s_qt, false, none, none, true, dw, st);
  }
}

}  // namespace mcpp::model
