// The tensor ops of Multi-Latent Attention (DeepSeek-V2/V3; Megatron-Core's MLASelfAttention):
// the step from the up-projections' outputs to a qkv tensor the attention core takes, and the
// value-width narrowing of the attention output. Rows are sequence-first, R = S * B, row
// r = s * B + b; all dtypes of one call agree (CPU: f32, f64; CUDA: f32, bf16, f16).
//
//   q    [R, heads, Dq]       linear_q_up_proj's output, per head [nope Dn | pe Dr]
//   kv   [R, heads, Dn + Dv]  linear_kv_up_proj's output, per head [k nope Dn | value Dv]
//   kpe  [R, Dr]              the shared key position part (linear_kv_down_proj's tail)
//   qkv  [R, heads, 3, Dq]    per head [query | key | value] blocks of Dq = Dn + Dr   (=)
//
// Per row r at position p and head h, with deint the de-interleave Megatron's MLA applies
// before its rotary embedding (deint(x)[j] = x[2j] for j < Dr/2, x[2(j - Dr/2) + 1] after)
// and rope the rotate-half rotation by the angles p * inv_freq_i (mla_inv_freq below):
//   query = [ rope(deint(q[r, h, Dn:Dq])) | q[r, h, 0:Dn] ]
//   key   = [ rope(deint(kpe[r]))         | kv[r, h, 0:Dn] ]
//   value = [ kv[r, h, Dn:Dn+Dv]           | zeros(Dq - Dv) ]
// The position part comes first in query and key alike: scores are dot products, unchanged
// by one permutation applied to both, and this order lets the padded value share Dq with them.
// rope(y)[i] = y[i] c - y[i + Dr/2] sn, rope(y)[i + Dr/2] = y[i + Dr/2] c + y[i] sn with
// c = mscale cos(p inv_i), sn = mscale sin(p inv_i): YaRN's concentration factor scales cos
// and sin as Megatron's _apply_rotary_pos_emb_bshd does. Angles and mscale products are formed
// in double, rounded to f32 (f64 on the CPU's f64 path), the rotation computed in that type.
#pragma once
#include <cmath>
#include <cstdint>

#include "base/error.h"
#include "ops/rope_math.h"
#include "tensor/tensor.h"

namespace mcpp::ops {

// Head dimensions of one tensor-parallel rank.
struct MlaDims {
  int64_t heads = 0;  // local attention heads
  int64_t Dn = 0;     // qk_head_dim: the part without position
  int64_t Dr = 0;     // qk_pos_emb_head_dim: the rotated part, even
  int64_t Dv = 0;     // v_head_dim, at most Dq
  int64_t Dq() const { return Dn + Dr; }
};

// The rotary embedding of the position part: plain RoPE or YaRN (--rope-type yarn).
struct MlaRope {
  double base = 10000;  // --rotary-base
  bool yarn = false;
  double factor = 1;  // --rotary-scaling-factor (yarn)
  int64_t original_max_positions = 4096;
  double beta_fast = 32, beta_slow = 1;
  double mscale = 1;  // multiplies cos and sin (YaRN's concentration factor; 1 for plain rope)
};

// Inverse frequency of rotary pair i < Dr / 2, in double. Plain: base^(-2i / Dr). YaRN:
// ops/rope_math.h's yarn_inv_freq over Dr, its correction range rounded to integers as
// Megatron's MLA does.
MCPP_ROPE_HD inline double mla_inv_freq(const MlaRope& r, int64_t i, int64_t Dr) {
  if (!r.yarn) return ::pow(r.base, -2.0 * double(i) / double(Dr));
  return yarn_inv_freq(r.base, r.factor, r.original_max_positions, r.beta_fast, r.beta_slow, true,
                       i, Dr);
}

// ---- argument checks both backends share (each backend checks its dtypes) ----------------
inline void check_mla_dims(const MlaDims& d, const char* op) {
  MCPP_CHECK_HINT(
      d.heads > 0 && d.Dn > 0 && d.Dr > 0 && d.Dr % 2 == 0 && d.Dv > 0 && d.Dv <= d.Dq(),
      "check --qk-head-dim, --qk-pos-emb-head-dim (even) and --v-head-dim",
      "{}: invalid MLA dims heads={} Dn={} Dr={} Dv={} (all positive, Dr even, "
      "Dv <= Dn + Dr)",
      op, d.heads, d.Dn, d.Dr, d.Dv);
}
inline void check_mla_rope(const MlaRope& r, const char* op) {
  MCPP_CHECK(std::isfinite(r.base) && r.base > 0,
             "{}: rotary base {} must be positive "
             "(--rotary-base)",
             op, r.base);
  MCPP_CHECK(std::isfinite(r.mscale) && r.mscale > 0, "{}: rope mscale {} must be positive", op,
             r.mscale);
  if (!r.yarn) return;
  // corr() divides by ln(base) and takes ln(L / (2 pi beta)).
  MCPP_CHECK_HINT(r.base > 1 && std::isfinite(r.factor) && r.factor > 0 &&
                      r.original_max_positions > 0 && r.beta_fast > 0 && r.beta_slow > 0,
                  "check --rotary-base, --rotary-scaling-factor, "
                  "--original-max-position-embeddings, --beta-fast and --beta-slow",
                  "{}: YaRN needs base > 1 ({}) and a positive factor ({}), original context "
                  "({}), beta_fast ({}) and beta_slow ({})",
                  op, r.base, r.factor, r.original_max_positions, r.beta_fast, r.beta_slow);
}
// t: on dev, of dtype dt, rows * cols elements.
inline void check_mla_tensor(const Tensor& t, int64_t rows, int64_t cols, DType dt, Device dev,
                             const char* op, const char* name) {
  MCPP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  MCPP_CHECK(t.device() == dev && t.dtype() == dt, "{}: {} is {}, expected {} on the {}", op, name,
             t.str(), dtype_name(dt), dev == Device::CPU ? "CPU" : "GPU");
  MCPP_CHECK(t.numel() == rows * cols, "{}: {} is {}, expected [{}, {}] elements", op, name,
             t.str(), rows, cols);
}
// The rows R of t, [R, cols] with R a multiple of B (sequence-first [S, B] rows).
inline int64_t mla_rows(const Tensor& t, int64_t cols, int64_t B, const char* op,
                        const char* name) {
  MCPP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  MCPP_CHECK(B > 0 && t.numel() % (B * cols) == 0,
             "{}: {} is {}, expected [S * B, {}] elements with B = {}", op, name, t.str(), cols, B);
  return t.numel() / cols;
}
// An optional i64 [R] positions tensor on dev.
inline void check_mla_positions(const Tensor& positions, int64_t R, Device dev, const char* op) {
  if (!positions.defined()) return;
  MCPP_CHECK(positions.device() == dev && positions.dtype() == DType::I64 && positions.numel() == R,
             "{}: positions {} must be i64 [{}] on the {}", op, positions.str(), R,
             dev == Device::CPU ? "CPU" : "GPU");
}

// mla_qkv_forward's checks on dev (every tensor of q's dtype); returns R.
inline int64_t check_mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe,
                                     const MlaDims& d, const MlaRope& r, int64_t B,
                                     const Tensor& positions, const Tensor& qkv, Device dev,
                                     const char* op) {
  check_mla_dims(d, op);
  check_mla_rope(r, op);
  const int64_t R = mla_rows(q, d.heads * d.Dq(), B, op, "q");
  check_mla_tensor(q, R, d.heads * d.Dq(), q.dtype(), dev, op, "q");
  check_mla_tensor(kv, R, d.heads * (d.Dn + d.Dv), q.dtype(), dev, op, "kv");
  check_mla_tensor(kpe, R, d.Dr, q.dtype(), dev, op, "kpe");
  check_mla_tensor(qkv, R, d.heads * 3 * d.Dq(), q.dtype(), dev, op, "qkv");
  check_mla_positions(positions, R, dev, op);
  return R;
}
// mla_qkv_backward's checks on dev (every tensor of dqkv's dtype); returns R.
inline int64_t check_mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r,
                                      int64_t B, const Tensor& positions, const Tensor& dq,
                                      const Tensor& dkv, const Tensor& dkpe, Device dev,
                                      const char* op) {
  check_mla_dims(d, op);
  check_mla_rope(r, op);
  const int64_t R = mla_rows(dqkv, d.heads * 3 * d.Dq(), B, op, "dqkv");
  check_mla_tensor(dqkv, R, d.heads * 3 * d.Dq(), dqkv.dtype(), dev, op, "dqkv");
  check_mla_tensor(dq, R, d.heads * d.Dq(), dqkv.dtype(), dev, op, "dq");
  check_mla_tensor(dkv, R, d.heads * (d.Dn + d.Dv), dqkv.dtype(), dev, op, "dkv");
  check_mla_tensor(dkpe, R, d.Dr, dqkv.dtype(), dev, op, "dkpe");
  check_mla_positions(positions, R, dev, op);
  return R;
}
// mla_ctx_narrow's (wide = ctx, narrow = out) and mla_ctx_pad's (narrow = dout, wide = dctx)
// checks on dev; returns R.
inline int64_t check_mla_ctx(const Tensor& wide, const Tensor& narrow, const MlaDims& d, Device dev,
                             const char* op, const char* wide_name, const char* narrow_name) {
  check_mla_dims(d, op);
  const int64_t R = mla_rows(wide, d.heads * d.Dq(), 1, op, wide_name);
  check_mla_tensor(wide, R, d.heads * d.Dq(), wide.dtype(), dev, op, wide_name);
  check_mla_tensor(narrow, R, d.heads * d.Dv, wide.dtype(), dev, op, narrow_name);
  return R;
}

// ---- the ops ------------------------------------------------------------------------------
// Declared once, in mcpp::ops (the entry points, which dispatch on s.device), mcpp::ops::cpu
// and mcpp::ops::cuda (the backends, same signatures). Position of row r:
// positions.defined() ? positions[r] (i64 [R] on the op's device) : pos0 + r / B.
//
// mla_qkv_forward:  q, kv, kpe -> qkv as above (=).
// mla_qkv_backward: its adjoint (=): the copies reversed, the rotation inverted (sn -> -sn,
//   still times mscale) and re-interleaved; dkpe[r] sums the heads' key position gradients
//   in head order (deterministic); the value block's padding in dqkv is ignored.
// mla_ctx_narrow:   ctx [R, heads, Dq] -> out [R, heads, Dv], the first Dv of each head (=):
//   the attention output of the padded values back to v_head_dim for linear_proj.
// mla_ctx_pad:      its adjoint, dout [R, heads, Dv] -> dctx [R, heads, Dq], zero padding (=).
#define MCPP_MLA_OPS                                                                           \
  void mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& d, \
                       const MlaRope& r, int64_t B, int64_t pos0, const Tensor& positions,     \
                       Tensor& qkv, Stream& s);                                                \
  void mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r, int64_t B,     \
                        int64_t pos0, const Tensor& positions, Tensor& dq, Tensor& dkv,        \
                        Tensor& dkpe, Stream& s);                                              \
  void mla_ctx_narrow(const Tensor& ctx, const MlaDims& d, Tensor& out, Stream& s);            \
  void mla_ctx_pad(const Tensor& dout, const MlaDims& d, Tensor& dctx, Stream& s);

MCPP_MLA_OPS

namespace cpu {
MCPP_MLA_OPS
}  // namespace cpu

#ifdef MCPP_HAVE_CUDA
namespace cuda {
MCPP_MLA_OPS
}  // namespace cuda
#endif

#undef MCPP_MLA_OPS

}  // namespace mcpp::ops
