// Context-parallel causal attention (TransformerEngine's context_parallel.py, re-derived):
// each of the CP ranks holds two chunks of the sequence -- rank r the global chunks r
// and 2CP-1-r of length C = S_local/2, which balances the causal work -- and attention
// runs over the whole sequence by one of three exchanges:
//
//   p2p (ring)   K/V (in the fused qkv) travel the ring r -> r+1 while the rank computes
//                on the block it holds (double-buffered: the next transfer is in flight
//                during the blocks). Step i holds rank j = (r - i) mod CP's chunks. Each
//                (query chunk a, key chunk c) pair is a block: c < a all keys visible,
//                c == a causal, c > a skipped -- which gives TE's three step shapes
//                (diagonal; i <= r: both Q chunks x the first KV chunk; i > r: the second
//                Q chunk x both KV chunks). Each block returns (O_i, LSE_i), merged by
//                ops::attention_lse_merge. Backward: [KV, dKV] travel the same ring; each
//                block's backward uses the FINAL O and LSE; dQ accumulates locally and
//                dK/dV arrive back at their owner after CP steps.
//   all_gather   K/V all-gathered, the same blocks; backward reduce-scatters dK/dV.
//   a2a          (Ulysses) all-to-all turns [2C rows, all local heads] into [whole
//                sequence, heads/CP], plain causal attention, and back.
//
//   qkv  [2C*B, QKVW]  this rank's rows (grouped layout), chunk 0 then chunk 1
//   out  [2C*B, NH*HD] (=)
//   lse  B*NH*2C values (=): p2p / all_gather: [2][B, NH, C] (per local chunk);
//        a2a: [B, NH/CP, CP*2C] (the gathered sequence's heads). Only backward reads it.
//   dqkv [2C*B, QKVW]  (=)
// Attention dropout stays a function of the global (b, h, q, k) index, so every variant
// draws the serial run's mask. Every variant runs on either backend's tensors: the blocks
// and merge are the op catalogue's (ops/cuda/attention_cp.cu on the GPU), a2a's reshuffles
// are row gathers (ops::gather_rows) around the all-to-all, and the document starts of a
// rank's chunks are rearranged on the host (small i64 tensors, copied once per call).
#pragma once
#include "comm/communicator.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::parallel::context_parallel {

enum class CommType : uint8_t { P2P, A2A, AllGather };

struct CpAttention {
  CommType type = CommType::P2P;
  ops::AttentionDims ad;  // this rank: S = 2C rows, local heads; b/h offsets, NH_global
  double scale = 1, dropout_p = 0;
  ops::DropoutKey key;
};

void attention_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp,
                       Tensor& out, Tensor& lse, Stream& s);
void attention_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, comm::Communicator& cp,
                        Tensor& dqkv, Stream& s);

}  // namespace mcpp::parallel::context_parallel
