// The argument checks every attention-over-a-KV-cache op shares (attention_kv_cache_forward,
// decode_attention; CPU and CUDA): dims, positions, one dtype, element counts and the cache
// shape [B, Tmax, NG, HD] for keys and values alike. Each device adds its own (the CPU:
// every sequence's rows inside the cache; CUDA: device residency, the head-dim limit).
#pragma once
#include "base/error.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops {

inline void check_kv_cache_args(const char* op, const Tensor& qkv, const AttentionDims& d,
                                const Tensor& pos, const Tensor& k_cache, const Tensor& v_cache,
                                const Tensor& out) {
  MCPP_CHECK(d.S > 0 && d.B > 0 && d.NH > 0 && d.NG > 0 && d.HD > 0 && d.NH % d.NG == 0,
             "{}: invalid dims S={} B={} NH={} NG={} HD={} (all positive, NG | NH)", op, d.S,
             d.B, d.NH, d.NG, d.HD);
  MCPP_CHECK(d.window_left >= -1, "{}: window_left {} is neither -1 (no window) nor >= 0", op,
             d.window_left);
  MCPP_CHECK(pos.dtype() == DType::I64 && pos.numel() == d.B, "{}: pos {} is not i64 [B={}]", op,
             pos.str(), d.B);
  for (const Tensor* t : {&k_cache, &v_cache, &out})
    MCPP_CHECK(t->dtype() == qkv.dtype(), "{}: {} differs in dtype from qkv {}", op, t->str(),
               qkv.str());
  MCPP_CHECK(qkv.numel() == d.S * d.B * d.qkv_width(), "{}: qkv {} does not hold {} elements",
             op, qkv.str(), d.S * d.B * d.qkv_width());
  MCPP_CHECK(out.numel() == d.S * d.B * d.NH * d.HD, "{}: out {} does not hold {} elements", op,
             out.str(), d.S * d.B * d.NH * d.HD);
  for (const Tensor* t : {&k_cache, &v_cache})
    MCPP_CHECK(t->dim() == 4 && t->size(0) == d.B && t->size(2) == d.NG && t->size(3) == d.HD,
               "{}: cache {} is not [B={}, Tmax, NG={}, HD={}]", op, t->str(), d.B, d.NG, d.HD);
  MCPP_CHECK(v_cache.shape() == k_cache.shape(), "{}: k_cache {} and v_cache {} differ", op,
             k_cache.str(), v_cache.str());
}

}  // namespace mcpp::ops
