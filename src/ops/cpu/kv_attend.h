// The attend half of the CPU attention over a KV cache (ops/cpu/attention_kv_cache.cpp),
// shared by attention_kv_cache_forward (after its append) and decode_attention: head h of
// row i of sequence b over its slot's keys AttentionDims::first_key(pos[b] + i) .. pos[b] + i
// (every key from 0 without a sliding window), with the sinks of AttentionDims::sink.
// Arguments checked by the callers (ops/kv_cache_checks.h, the rows inside the cache).
#pragma once
#include <cstdint>

#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cpu {

void kv_cache_attend(const Tensor& qkv, const AttentionDims& d, const int64_t* pos,
                     double softmax_scale, const Tensor& k_cache, const Tensor& v_cache,
                     Tensor& out);

}  // namespace mcpp::ops::cpu
