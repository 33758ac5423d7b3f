// Causal self-attention with grouped-query heads, CPU backend; f32 or f64 (all tensors
// of one dtype T, statistics and accumulators in T too).
//
//   qkv  [S, B, NG, NH/NG + 2, HD]  linear_qkv's grouped layout: per query group its
//                                   NH/NG query heads, then its key head, then its value
//   out  [S, B, NH*HD]              head h in columns h*HD .. h*HD + HD - 1      (=)
//   lse  [B, NH, S]                 log-sum-exp of the scaled scores of a query row (=)
//   dout [S, B, NH*HD]
//   dqkv [S, B, NG, NH/NG + 2, HD]  overwritten (=); a group's dK and dV are the sums
//                                   over its NH/NG query heads
// Query head h reads the key and value of group h / (NH/NG); row q sees keys k <= q.
//
// FlashAttention-2 (Dao, 2023) on 64 x 64 tiles: the forward keeps a running row max
// and row sum (online softmax) so only a query tile's output accumulator and one score
// tile live per thread, O(block * (block + HD)); the backward recomputes the
// probabilities from lse one tile at a time. Tiles strictly above the diagonal are
// never visited. Attention dropout multiplies the (normalised) probability P[q, k] by
// keep / (1 - p_q), keep = DropoutMask::uniform(seed, stream, global (b, h, q, k)
// index) >= p (base/philox.h: p quantised to p_q = ceil(p 2^16) / 2^16);
// lse is that of the undropped softmax, as in FlashAttention.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "base/error.h"
#include "base/philox.h"
#include "ops/cpu/attention_tiles.h"
#include "ops/ops.h"

namespace mcpp::ops::cpu {
namespace {

using tiles::Buffer;
using tiles::kLanes;
using tiles::kMR;
using tiles::round_up;
using tiles::tile_gemm;

constexpr int64_t kBlk = 64;  // queries per tile and keys per tile

void check_attention_args(const char* op, const Tensor& qkv, const AttentionDims& d,
                          double softmax_scale, double dropout_p, Stream& s) {
  MCPP_CHECK_HINT(s.device == Device::CPU, "pass Stream::cpu() or call mcpp::ops::",
                  "{}: the CPU backend was called with a CUDA stream", op);
  MCPP_CHECK(d.S > 0 && d.B > 0 && d.NH > 0 && d.NG > 0 && d.HD > 0,
             "{}: dims S={} B={} NH={} NG={} HD={} must all be positive", op, d.S, d.B, d.NH, d.NG,
             d.HD);
  MCPP_CHECK_HINT(d.NH % d.NG == 0, "--num-query-groups must divide --num-attention-heads",
                  "{}: NH={} is not a multiple of NG={}", op, d.NH, d.NG);
  MCPP_CHECK(softmax_scale > 0.0, "{}: softmax_scale={} must be positive", op, softmax_scale);
  MCPP_CHECK(dropout_p >= 0.0 && dropout_p < 1.0, "{}: dropout_p={} is outside [0, 1)", op,
             dropout_p);
  MCPP_CHECK(qkv.defined() && qkv.device() == Device::CPU, "{}: qkv must be a CPU tensor", op);
  MCPP_CHECK(qkv.dtype() == DType::F32 || qkv.dtype() == DType::F64,
             "{}: qkv is {}; the CPU backend computes in f32 or f64", op, qkv.str());
  MCPP_CHECK(qkv.numel() == d.S * d.B * d.qkv_width(),
             "{}: qkv {} does not hold S*B*NG*(NH/NG+2)*HD = {} elements", op, qkv.str(),
             d.S * d.B * d.qkv_width());
}

void check_like(const char* op, const char* name, const Tensor& t, DType dt, int64_t numel) {
  MCPP_CHECK(t.defined() && t.device() == Device::CPU, "{}: '{}' must be a CPU tensor", op, name);
  MCPP_CHECK(t.dtype() == dt, "{}: '{}' is {}, expected {}", op, name, t.str(), dtype_name(dt));
  MCPP_CHECK(t.numel() == numel, "{}: '{}' is {}, expected {} elements", op, name, t.str(), numel);
}

void check_key_start(const char* op, const AttentionDims& d) {
  if (!d.key_start.defined()) return;
  MCPP_CHECK(d.key_start.device() == Device::CPU && d.key_start.dtype() == DType::I64 &&
                 d.key_start.numel() == d.B * d.S,
             "{}: key_start {} must be i64 [B={}, S={}] on the CPU", op, d.key_start.str(), d.B,
             d.S);
}

// Where a head's rows live in the fused qkv (or dqkv) tensor.
struct Layout {
  int64_t S, B, NH, NG, HD, G, W;
  explicit Layout(const AttentionDims& d)
      : S(d.S), B(d.B), NH(d.NH), NG(d.NG), HD(d.HD), G(d.NH / d.NG), W(d.qkv_width()) {}
  int64_t row_stride() const { return B * W; }  // from sequence position s to s + 1
  int64_t q(int64_t b, int64_t h) const { return b * W + ((h / G) * (G + 2) + h % G) * HD; }
  int64_t k(int64_t b, int64_t g) const { return b * W + (g * (G + 2) + G) * HD; }
  int64_t v(int64_t b, int64_t g) const { return b * W + (g * (G + 2) + G + 1) * HD; }
  int64_t out_stride() const { return B * NH * HD; }
  int64_t out(int64_t b, int64_t h) const { return (b * NH + h) * HD; }
};

// The dropout mask of attention probabilities, drawn from the global (b, h, q, k) index
// so that splitting B (DP), heads (TP) or the sequence (CP) draws the same mask
// (DropoutMask in base/philox.h: 16-bit uniforms, eight per Philox-4x32-7 block).
template <typename T>
struct AttnDropout {
  bool on = false;
  uint32_t threshold = 0;  // keep iff u16 >= threshold  <=>  u16 / 2^16 >= p
  T keep_scale = 1;
  uint64_t seed = 0, stream = 0;
  int64_t b_off = 0, h_off = 0, NHg = 0, q_off = 0, k_off = 0, Sg = 0;

  AttnDropout(const AttentionDims& d, double p, DropoutKey key) {
    on = p > 0;
    threshold = DropoutMask::threshold(p);
    keep_scale = T(DropoutMask::keep_scale(p));
    seed = key.seed, stream = key.stream;
    b_off = d.b_offset, h_off = d.h_offset, q_off = d.q_offset, k_off = d.k_offset;
    NHg = d.NH_global > 0 ? d.NH_global : d.NH;
    Sg = d.S_global > 0 ? d.S_global : d.S;
  }
  // z[j] = keep(b, h, q, k0 + j) ? keep_scale : 0 for j < n <= kBlk. Element i's number is
  // 16-bit half i & 7 of the Philox block at counter i >> 3, so whole blocks are drawn for
  // the aligned groups of eight covering the row and then picked from.
  void fill(T* z, int64_t b, int64_t h, int64_t q, int64_t k0, int64_t n) const {
    const uint64_t idx =
        uint64_t((((b + b_off) * NHg + h + h_off) * Sg + q + q_off) * Sg + k0 + k_off);
    const uint64_t first = idx >> 3, nblocks = ((idx + uint64_t(n) - 1) >> 3) - first + 1;
    uint32_t r[(kBlk + 16) / 2];  // 8 uniforms of 16 bits per block
    for (uint64_t blk = 0; blk < nblocks; ++blk)
      DropoutMask::block(seed, stream, first + blk, r + 4 * blk);
    const uint64_t e0 = idx & 7;
    for (int64_t j = 0; j < n; ++j)
      z[j] = DropoutMask::pick(r, int(e0 + uint64_t(j))) >= threshold ? keep_scale : T(0);
  }
};

// Copies rows [r0, r0 + rn) of a head (stride `stride`, HD values each) into a [kBlk, ld]
// tile, zero-padding rows and columns; `transpose` writes it as [HD, kBlk] instead.
template <typename T>
void pack_rows(const T* src, int64_t stride, int64_t rn, int64_t HD, T* dst, int64_t ld) {
  for (int64_t r = 0; r < rn; ++r) {
    const T* s = src + r * stride;
    T* t = dst + r * ld;
    for (int64_t c = 0; c < HD; ++c) t[c] = s[c];
    for (int64_t c = HD; c < ld; ++c) t[c] = 0;
  }
  for (int64_t r = rn; r < kBlk; ++r)
    for (int64_t c = 0; c < ld; ++c) dst[r * ld + c] = 0;
}
template <typename T>
void pack_rows_t(const T* src, int64_t stride, int64_t rn, int64_t HD, T* dst) {
  for (int64_t r = 0; r < rn; ++r) {
    const T* s = src + r * stride;
    for (int64_t c = 0; c < HD; ++c) dst[c * kBlk + r] = s[c];
  }
  for (int64_t c = 0; c < HD; ++c)
    for (int64_t r = rn; r < kBlk; ++r) dst[c * kBlk + r] = 0;
}

// Queries from qsrc, keys and values from kvsrc (both in the grouped layout, S rows each;
// the same tensor for self-attention). causal: row q sees keys k <= q; otherwise all.
template <typename T>
void forward_impl(const T* qsrc, const T* kvsrc, const AttentionDims& d, bool causal, T scale,
                  double p, DropoutKey key, T* out, T* lse) {
  const Layout lay(d);
  const int64_t S = d.S, HD = d.HD, NH = d.NH;
  const int64_t HDp = round_up(HD, kLanes<T>);
  const int64_t nqb = (S + kBlk - 1) / kBlk;
  const int64_t heads = d.B * NH;
  const AttnDropout<T> drop(d, p, key);
  const int64_t rs = lay.row_stride();
  // Document masking: the first visible global key of each (b, q) row.
  const int64_t* ks = d.key_start.defined() ? d.key_start.data<int64_t>() : nullptr;
  const int64_t kg0 = d.k_offset;  // global position of key row 0

  // K^T and V tiles of every (b, group), packed once: query tiles of all the group's
  // heads read them, and packing inside the task would gather the same scattered rows
  // nqb/2 times per head. Costs one extra copy of K and V. The loop walks qkv in memory
  // order (position, sample, group) since one head's rows are B*W apart; even so this
  // copy is memory-bound, about a fifth of the forward at S = 256, HD = 32.
  const int64_t kv_tile = kBlk * HDp, NG = d.NG, G = lay.G;
  T* Kt_all = tiles::thread_scratch<T, 0>(d.B * NG * nqb * kv_tile);
  T* V_all = tiles::thread_scratch<T, 1>(d.B * NG * nqb * kv_tile);
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t kb = 0; kb < nqb; ++kb)
    for (int64_t b = 0; b < d.B; ++b) {
      const int64_t k0 = kb * kBlk, kn = std::min(kBlk, S - k0);
      for (int64_t r = 0; r < kBlk; ++r)
        for (int64_t g = 0; g < NG; ++g) {
          T* Kt = Kt_all + ((b * NG + g) * nqb + kb) * kv_tile;  // [HD, kBlk]
          T* Vt = V_all + ((b * NG + g) * nqb + kb) * kv_tile;   // [kBlk, HDp]
          if (r < kn) {
            const T* k = kvsrc + (k0 + r) * rs + lay.k(b, g);
            const T* v = k + HD;
            for (int64_t c = 0; c < HD; ++c) Kt[c * kBlk + r] = k[c];
            for (int64_t c = 0; c < HD; ++c) Vt[r * HDp + c] = v[c];
          } else {
            for (int64_t c = 0; c < HD; ++c) Kt[c * kBlk + r] = 0;
            for (int64_t c = 0; c < HD; ++c) Vt[r * HDp + c] = 0;
          }
          for (int64_t c = HD; c < HDp; ++c) Vt[r * HDp + c] = 0;
        }
    }

#pragma omp parallel
  {
    Buffer<T> Qt(kBlk * HDp), Sc(kBlk * kBlk), O(kBlk * HDp);
    T m[kBlk], l[kBlk];

    // Largest tasks (query blocks far down the causal triangle) first, for balance.
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < nqb * heads; ++t) {
      const int64_t qb = nqb - 1 - t / heads, b = (t % heads) / NH, h = t % NH;
      const int64_t g = h / G;
      const int64_t q0 = qb * kBlk, qn = std::min(kBlk, S - q0), Mq = round_up(qn, kMR);
      pack_rows(qsrc + q0 * rs + lay.q(b, h), rs, qn, HD, Qt.get(), HDp);
      O.zero();
      std::fill(m, m + kBlk, -std::numeric_limits<T>::infinity());
      std::fill(l, l + kBlk, T(0));

      for (int64_t kb = 0; kb < (causal ? qb + 1 : nqb); ++kb) {
        const int64_t k0 = kb * kBlk, kn = std::min(kBlk, S - k0);
        const T* Kt = Kt_all + ((b * NG + g) * nqb + kb) * kv_tile;
        const T* Vt = V_all + ((b * NG + g) * nqb + kb) * kv_tile;
        // Sc = Q K^T (unscaled; the scale is folded into the exp below)
        tile_gemm(Mq, kBlk, HD, Qt.get(), HDp, Kt, kBlk, Sc.get(), kBlk, false);
        const bool diag = causal && kb == qb;  // the only tile with masked keys
        for (int64_t i = 0; i < Mq; ++i) {
          T* row = Sc.get() + i * kBlk;
          if (i >= qn) {  // padding rows: contribute nothing
            std::fill(row, row + kBlk, T(0));
            continue;
          }
          const int64_t nvalid = diag ? std::min(kn, q0 + i - k0 + 1) : kn;
          std::fill(row + nvalid, row + kBlk, -std::numeric_limits<T>::infinity());
          if (ks) {  // keys before the row's document start are masked too
            const int64_t first = std::clamp<int64_t>(ks[b * S + q0 + i] - kg0 - k0, 0, kBlk);
            std::fill(row, row + first, -std::numeric_limits<T>::infinity());
            if (first >= nvalid && m[i] == -std::numeric_limits<T>::infinity()) {
              std::fill(row, row + kBlk, T(0));  // nothing visible yet: adds nothing
              continue;
            }
          }
          const T m_new = std::max(m[i], tiles::row_max(row, kBlk) * scale);
          // 0 on the first tile (m = -inf); 1, without a call to exp, once the row max
          // has settled, which is most tiles.
          const T alpha = m_new == m[i] ? T(1) : std::exp(m[i] - m_new);
          l[i] = l[i] * alpha + tiles::row_exp_sum(row, kBlk, scale, m_new);
          m[i] = m_new;
          if (drop.on) {
            T z[kBlk];
            drop.fill(z, b, h, q0 + i, k0, nvalid);
            for (int64_t j = 0; j < nvalid; ++j) row[j] *= z[j];
          }
          if (alpha != T(1)) {
            T* o = O.get() + i * HDp;
            for (int64_t c = 0; c < HDp; ++c) o[c] *= alpha;
          }
        }
        // O += P V
        tile_gemm(Mq, HDp, kn, Sc.get(), kBlk, Vt, HDp, O.get(), HDp, true);
      }

      T* lse_row = lse + (b * NH + h) * S + q0;
      for (int64_t i = 0; i < qn; ++i) {
        T* dst = out + (q0 + i) * lay.out_stride() + lay.out(b, h);
        if (l[i] == T(0)) {  // no visible key in this block (document masking): empty
          for (int64_t c = 0; c < HD; ++c) dst[c] = 0;
          lse_row[i] = -std::numeric_limits<T>::infinity();
          continue;
        }
        const T inv = T(1) / l[i];
        const T* o = O.get() + i * HDp;
        for (int64_t c = 0; c < HD; ++c) dst[c] = o[c] * inv;
        lse_row[i] = m[i] + std::log(l[i]);
      }
    }
  }
}

// Queries from qsrc, keys and values from kvsrc (see forward_impl). dQ goes to the query
// slots of dq, dK and dV to the key/value slots of dkv (both the grouped layout; they may
// be one tensor): = (accumulate false) or += (accumulate true). Other slots are untouched.
template <typename T>
void backward_impl(const T* dout, const T* qsrc, const T* kvsrc, const T* out, const T* lse,
                   const AttentionDims& d, bool causal, T scale, double p, DropoutKey key, T* dq,
                   T* dkv, bool accumulate) {
  const Layout lay(d);
  const int64_t S = d.S, HD = d.HD, NH = d.NH, G = lay.G;
  const int64_t HDp = round_up(HD, kLanes<T>);
  const int64_t nb = (S + kBlk - 1) / kBlk, Sp = nb * kBlk;
  const int64_t heads = d.B * NH;
  const AttnDropout<T> drop(d, p, key);
  const int64_t rs = lay.row_stride(), os = lay.out_stride();
  const int64_t* ks = d.key_start.defined() ? d.key_start.data<int64_t>() : nullptr;
  const int64_t kg0 = d.k_offset;

  // One task per (b, h) owns its dQ (accumulated over key tiles in a private buffer),
  // so no atomics are needed; dK and dV of a key tile are complete when its loop over
  // query tiles ends. With GQA several heads share one key head: their dK/dV go to a
  // per-head scratch [B, NH, S, HD] and are summed after the parallel loop, which keeps
  // B*NH tasks of parallelism instead of B*NG.
  T* dk_scratch = G > 1 ? tiles::thread_scratch<T, 5>(heads * S * HD) : nullptr;
  T* dv_scratch = G > 1 ? tiles::thread_scratch<T, 6>(heads * S * HD) : nullptr;

#pragma omp parallel
  {
    // Qa and dOa are packed in full (padding included) before use; dQa is zeroed per task.
    T* Qa = tiles::thread_scratch<T, 2>(Sp * HDp);
    T* dOa = tiles::thread_scratch<T, 3>(Sp * HDp);
    T* dQa = tiles::thread_scratch<T, 4>(Sp * HDp);
    Buffer<T> Dv(Sp), Lv(Sp);
    Buffer<T> Kt(HDp * kBlk), Vt(HDp * kBlk), Kp(kBlk * HDp);
    Buffer<T> Sc(kBlk * kBlk), dP(kBlk * kBlk), PT(kBlk * kBlk), dST(kBlk * kBlk);
    Buffer<T> dK(kBlk * HDp), dV(kBlk * HDp);
    T z[kBlk];

#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < heads; ++t) {
      const int64_t b = t / NH, h = t % NH, g = h / G;
      for (int64_t qb = 0; qb < nb; ++qb) {
        const int64_t q0 = qb * kBlk, qn = std::min(kBlk, S - q0);
        pack_rows(qsrc + q0 * rs + lay.q(b, h), rs, qn, HD, Qa + q0 * HDp, HDp);
        pack_rows(dout + q0 * os + lay.out(b, h), os, qn, HD, dOa + q0 * HDp, HDp);
      }
      // D_i = rowsum(dO_i * O_i) = sum_k P_ik dP_ik (also with dropout: O = (P*Z) V)
      for (int64_t i = 0; i < S; ++i) {
        const T* o = out + i * os + lay.out(b, h);
        const T* go = dOa + i * HDp;
        T acc = 0;
        for (int64_t c = 0; c < HD; ++c) acc += o[c] * go[c];
        Dv.get()[i] = acc;
        Lv.get()[i] = lse[(b * NH + h) * S + i];
      }
      std::fill(dQa, dQa + Sp * HDp, T(0));

      for (int64_t kb = 0; kb < nb; ++kb) {
        const int64_t k0 = kb * kBlk, kn = std::min(kBlk, S - k0);
        pack_rows_t(kvsrc + k0 * rs + lay.k(b, g), rs, kn, HD, Kt.get());
        pack_rows_t(kvsrc + k0 * rs + lay.v(b, g), rs, kn, HD, Vt.get());
        pack_rows(kvsrc + k0 * rs + lay.k(b, g), rs, kn, HD, Kp.get(), HDp);
        dK.zero();
        dV.zero();
        for (int64_t qb = causal ? kb : 0; qb < nb; ++qb) {
          const int64_t q0 = qb * kBlk, qn = std::min(kBlk, S - q0), Mq = round_up(qn, kMR);
          const T* Q = Qa + q0 * HDp;
          const T* dO = dOa + q0 * HDp;
          tile_gemm(Mq, kBlk, HD, Q, HDp, Kt.get(), kBlk, Sc.get(), kBlk, false);   // Q K^T
          tile_gemm(Mq, kBlk, HD, dO, HDp, Vt.get(), kBlk, dP.get(), kBlk, false);  // dO V^T
          const bool diag = causal && kb == qb;
          for (int64_t i = 0; i < Mq; ++i) {
            T* P = Sc.get() + i * kBlk;  // becomes dS in place
            T* dp = dP.get() + i * kBlk;
            if (i >= qn) {
              std::fill(P, P + kBlk, T(0));
              continue;
            }
            const int64_t nvalid = diag ? std::min(kn, q0 + i - k0 + 1) : kn;
            std::fill(P + nvalid, P + kBlk, -std::numeric_limits<T>::infinity());
            if (ks)
              std::fill(P, P + std::clamp<int64_t>(ks[b * S + q0 + i] - kg0 - k0, 0, kBlk),
                        -std::numeric_limits<T>::infinity());
            tiles::row_exp_sum(P, kBlk, scale, Lv.get()[q0 + i]);  // P = exp(s - lse)
            const T Di = Dv.get()[q0 + i];
            if (drop.on) {
              drop.fill(z, b, h, q0 + i, k0, nvalid);
              std::fill(z + nvalid, z + kBlk, T(0));
              for (int64_t j = 0; j < kBlk; ++j) {
                PT.get()[j * kBlk + i] = P[j] * z[j];  // dropped P: what multiplied V
                P[j] = P[j] * (dp[j] * z[j] - Di);     // dS = P * (dP - D)
                dST.get()[j * kBlk + i] = P[j];
              }
            } else {
              for (int64_t j = 0; j < kBlk; ++j) {
                PT.get()[j * kBlk + i] = P[j];
                P[j] = P[j] * (dp[j] - Di);
                dST.get()[j * kBlk + i] = P[j];
              }
            }
          }
          tile_gemm(kBlk, HDp, qn, PT.get(), kBlk, dO, HDp, dV.get(), HDp, true);  // P^T dO
          tile_gemm(kBlk, HDp, qn, dST.get(), kBlk, Q, HDp, dK.get(), HDp, true);  // dS^T Q
          tile_gemm(Mq, HDp, kn, Sc.get(), kBlk, Kp.get(), HDp, dQa + q0 * HDp, HDp,
                    true);  // dS K
        }
        // dK = scale * dS^T Q (s = scale * q.k); dV as accumulated.
        T *dk_dst, *dv_dst;
        int64_t dst_stride;
        const bool acc = accumulate && G == 1;
        if (G == 1) {
          dk_dst = dkv + k0 * rs + lay.k(b, g);
          dv_dst = dkv + k0 * rs + lay.v(b, g);
          dst_stride = rs;
        } else {
          dk_dst = dk_scratch + (t * S + k0) * HD;
          dv_dst = dv_scratch + (t * S + k0) * HD;
          dst_stride = HD;
        }
        for (int64_t r = 0; r < kn; ++r)
          for (int64_t c = 0; c < HD; ++c) {
            const T dk = dK.get()[r * HDp + c] * scale, dv = dV.get()[r * HDp + c];
            T& kd = dk_dst[r * dst_stride + c];
            T& vd = dv_dst[r * dst_stride + c];
            kd = acc ? kd + dk : dk;
            vd = acc ? vd + dv : dv;
          }
      }
      for (int64_t i = 0; i < S; ++i) {
        T* dst = dq + i * rs + lay.q(b, h);
        const T* src = dQa + i * HDp;
        if (accumulate)
          for (int64_t c = 0; c < HD; ++c) dst[c] += src[c] * scale;
        else
          for (int64_t c = 0; c < HD; ++c) dst[c] = src[c] * scale;
      }
    }
  }

  if (G > 1) {
    const T* dks = dk_scratch;
    const T* dvs = dv_scratch;
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t i = 0; i < S; ++i)
      for (int64_t bg = 0; bg < d.B * d.NG; ++bg) {
        const int64_t b = bg / d.NG, g = bg % d.NG;
        T* dk = dkv + i * rs + lay.k(b, g);
        T* dv = dkv + i * rs + lay.v(b, g);
        if (!accumulate)
          for (int64_t c = 0; c < HD; ++c) dk[c] = dv[c] = 0;
        for (int64_t j = 0; j < G; ++j) {
          const int64_t src = ((b * NH + g * G + j) * S + i) * HD;
          for (int64_t c = 0; c < HD; ++c) {
            dk[c] += dks[src + c];
            dv[c] += dvs[src + c];
          }
        }
      }
  }
}

}  // namespace

void attention_forward(const Tensor& qkv, const AttentionDims& d, double softmax_scale,
                       double dropout_p, DropoutKey key, Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_forward";
  check_attention_args(op, qkv, d, softmax_scale, dropout_p, s);
  check_key_start(op, d);
  check_like(op, "out", out, qkv.dtype(), d.S * d.B * d.NH * d.HD);
  check_like(op, "lse", lse, qkv.dtype(), d.B * d.NH * d.S);
  if (qkv.dtype() == DType::F32)
    forward_impl<float>(qkv.data<float>(), qkv.data<float>(), d, true, float(softmax_scale),
                        dropout_p, key, out.data<float>(), lse.data<float>());
  else
    forward_impl<double>(qkv.data<double>(), qkv.data<double>(), d, true, softmax_scale,
                         dropout_p, key, out.data<double>(), lse.data<double>());
}

void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                        const AttentionDims& d, double softmax_scale, double dropout_p,
                        DropoutKey key, Tensor& dqkv, Stream& s) {
  const char* op = "attention_backward";
  check_attention_args(op, qkv, d, softmax_scale, dropout_p, s);
  check_key_start(op, d);
  check_like(op, "dout", dout, qkv.dtype(), d.S * d.B * d.NH * d.HD);
  check_like(op, "out", out, qkv.dtype(), d.S * d.B * d.NH * d.HD);
  check_like(op, "lse", lse, qkv.dtype(), d.B * d.NH * d.S);
  check_like(op, "dqkv", dqkv, qkv.dtype(), qkv.numel());
  MCPP_CHECK(dqkv.raw() != qkv.raw(), "{}: dqkv must not alias qkv (it is read throughout)", op);
  if (qkv.dtype() == DType::F32)
    backward_impl<float>(dout.data<float>(), qkv.data<float>(), qkv.data<float>(),
                         out.data<float>(), lse.data<float>(), d, true, float(softmax_scale),
                         dropout_p, key, dqkv.data<float>(), dqkv.data<float>(), false);
  else
    backward_impl<double>(dout.data<double>(), qkv.data<double>(), qkv.data<double>(),
                          out.data<double>(), lse.data<double>(), d, true, softmax_scale,
                          dropout_p, key, dqkv.data<double>(), dqkv.data<double>(), false);
}

// ---- context parallel: attention blocks and their merge -------------------------------

void attention_block_forward(const Tensor& q_src, const Tensor& kv_src, const AttentionDims& d,
                             bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                             Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_block_forward";
  MCPP_CHECK(!d.rectangular(),
             "{}: a block of {} query and {} key rows (lse stride {}) runs on the GPU's cuDNN "
             "only (ops::attention_block_rect_supported)",
             op, d.S, d.kv_rows(), d.lse_stride());
  check_attention_args(op, q_src, d, softmax_scale, dropout_p, s);
  check_key_start(op, d);
  check_like(op, "kv_src", kv_src, q_src.dtype(), q_src.numel());
  check_like(op, "out", out, q_src.dtype(), d.S * d.B * d.NH * d.HD);
  check_like(op, "lse", lse, q_src.dtype(), d.B * d.NH * d.S);
  if (q_src.dtype() == DType::F32)
    forward_impl<float>(q_src.data<float>(), kv_src.data<float>(), d, causal,
                        float(softmax_scale), dropout_p, key, out.data<float>(),
                        lse.data<float>());
  else
    forward_impl<double>(q_src.data<double>(), kv_src.data<double>(), d, causal, softmax_scale,
                         dropout_p, key, out.data<double>(), lse.data<double>());
}

void attention_block_backward(const Tensor& dout, const Tensor& q_src, const Tensor& kv_src,
                              const Tensor& out, const Tensor& lse, const AttentionDims& d,
                              bool causal, double softmax_scale, double dropout_p, DropoutKey key,
                              Tensor& dq, Tensor& dkv, Stream& s) {
  const char* op = "attention_block_backward";
  MCPP_CHECK(!d.rectangular(),
             "{}: a block of {} query and {} key rows (lse stride {}) runs on the GPU's cuDNN "
             "only (ops::attention_block_rect_supported)",
             op, d.S, d.kv_rows(), d.lse_stride());
  check_attention_args(op, q_src, d, softmax_scale, dropout_p, s);
  check_key_start(op, d);
  const DType dt = q_src.dtype();
  check_like(op, "kv_src", kv_src, dt, q_src.numel());
  check_like(op, "dout", dout, dt, d.S * d.B * d.NH * d.HD);
  check_like(op, "out", out, dt, d.S * d.B * d.NH * d.HD);
  check_like(op, "lse", lse, dt, d.B * d.NH * d.S);
  check_like(op, "dq", dq, dt, q_src.numel());
  check_like(op, "dkv", dkv, dt, q_src.numel());
  for (const Tensor* t : {&dq, &dkv})
    MCPP_CHECK(t->raw() != q_src.raw() && t->raw() != kv_src.raw(),
               "{}: dq and dkv must not alias the inputs", op);
  if (dt == DType::F32)
    backward_impl<float>(dout.data<float>(), q_src.data<float>(), kv_src.data<float>(),
                         out.data<float>(), lse.data<float>(), d, causal, float(softmax_scale),
                         dropout_p, key, dq.data<float>(), dkv.data<float>(), true);
  else
    backward_impl<double>(dout.data<double>(), q_src.data<double>(), kv_src.data<double>(),
                          out.data<double>(), lse.data<double>(), d, causal, softmax_scale,
                          dropout_p, key, dq.data<double>(), dkv.data<double>(), true);
}

namespace {
// (out, lse) <- the softmax-weighted union of (out, lse) and (o_i, lse_i): lse' =
// max + log1p(exp(min - max)), out' = exp(lse - lse') out + exp(lse_i - lse') o_i.
// lse and lse_i: [B, NH] rows `ld` apart, the first S of each this call's.
template <typename T>
void merge_impl(const T* o_i, const T* lse_i, T* out, T* lse, int64_t S, int64_t B, int64_t NH,
                int64_t HD, int64_t ld) {
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t bh = 0; bh < B * NH; ++bh)
    for (int64_t q = 0; q < S; ++q) {
      const int64_t b = bh / NH, h = bh % NH;
      T& l = lse[bh * ld + q];
      const T li = lse_i[bh * ld + q];
      const T hi = std::max(l, li), lo = std::min(l, li);
      if (hi == -std::numeric_limits<T>::infinity()) continue;  // neither saw a key
      const T ln = hi + std::log1p(std::exp(lo - hi));
      const T a = std::exp(l - ln), c = std::exp(li - ln);
      T* o = out + (q * B + b) * NH * HD + h * HD;
      const T* oi = o_i + (q * B + b) * NH * HD + h * HD;
      for (int64_t k = 0; k < HD; ++k) o[k] = a * o[k] + c * oi[k];
      l = ln;
    }
}
}  // namespace

void attention_lse_merge(const Tensor& out_i, const Tensor& lse_i, const AttentionDims& d,
                         Tensor& out, Tensor& lse, Stream& s) {
  const char* op = "attention_lse_merge";
  MCPP_CHECK(s.device == Device::CPU, "{}: the CPU backend was called with a CUDA stream", op);
  const DType dt = out.dtype();
  MCPP_CHECK(dt == DType::F32 || dt == DType::F64, "{}: out is {}; f32 or f64 expected", op,
             out.str());
  check_like(op, "out_i", out_i, dt, d.S * d.B * d.NH * d.HD);
  check_like(op, "out", out, dt, d.S * d.B * d.NH * d.HD);
  check_like(op, "lse_i", lse_i, dt, d.lse_span());
  check_like(op, "lse", lse, dt, d.lse_span());
  if (dt == DType::F32)
    merge_impl<float>(out_i.data<float>(), lse_i.data<float>(), out.data<float>(),
                      lse.data<float>(), d.S, d.B, d.NH, d.HD, d.lse_stride());
  else
    merge_impl<double>(out_i.data<double>(), lse_i.data<double>(), out.data<double>(),
                       lse.data<double>(), d.S, d.B, d.NH, d.HD, d.lse_stride());
}

bool attention_block_rect_supported(DType, const AttentionDims&, bool, double, Stream&) {
  return false;  // the CPU ring runs square chunk blocks
}

}  // namespace mcpp::ops::cpu
