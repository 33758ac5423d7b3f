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
//                block's backward uses the FINAL O and LSE; dQ accumulates locally; the
//                diagonal step's dK/dV stay home and the other ranks' arrive back at
//                their owner after CP-1 steps.
//   all_gather   K/V all-gathered, the same blocks; backward reduce-scatters dK/dV.
//   a2a          (Ulysses) all-to-all turns [2C rows, all local heads] into [whole
//                sequence, heads/CP], plain causal attention, and back.
//   a2a+p2p      (--hierarchical-context-parallel-sizes A Q, A x Q = CP) an all-to-all
//                inside each group of A consecutive CP ranks turns their 2A chunks into
//                two "super-chunks" of A*C rows on heads/A, which are exactly a ring
//                rank's two chunks of a ring of Q ranks (the CP ranks A apart); the ring
//                runs on them as p2p does, and the all-to-all goes back. A level of one
//                is the other level's exchange over the whole group.
//
//   qkv  [2C*B, QKVW]  this rank's rows (grouped layout), chunk 0 then chunk 1
//   out  [2C*B, NH*HD] (=)
//   lse  B*NH*2C values (=): p2p / all_gather: [B, NH, 2C] where the steps are fused
//        (below), else [2][B, NH, C] (per local chunk); a2a: [B, NH/CP, CP*2C] (the
//        gathered sequence's heads); a2a+p2p: the ring's layout on the super-chunks
//        ([B, NH/A, 2AC] or [2][B, NH/A, AC]). Only backward reads it.
//
// Fused steps (p2p, all_gather): where the blocks run on cuDNN's fused attention (bf16/f16,
// no dropout, no document mask: ops::attention_block_rect_supported; MCPP_CP_FUSED_STEPS=0
// turns it off), each ring step is one block of Megatron's shape (ring_step) instead of
// up to four chunk-sized blocks: fewer, larger calls, and the diagonal step writes the
// running output directly (it comes first and covers every row).
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

enum class CommType : uint8_t { P2P, A2A, AllGather, A2AP2P };

struct CpAttention {
  CommType type = CommType::P2P;
  ops::AttentionDims ad;  // this rank: S = 2C rows, local heads; b/h offsets, NH_global
  double scale = 1, dropout_p = 0;
  ops::DropoutKey key;
  // a2a+p2p: the hierarchical levels (parallel::Group::CpA2A, CpP2P), with this rank at
  // p2p->rank() * a2a->size() + a2a->rank() of the CP group.
  comm::Communicator* a2a = nullptr;
  comm::Communicator* p2p = nullptr;
  // Attention sinks (--softmax-type; ops::attention_sink_forward): the local heads' sink
  // logits, joined to the final (out, lse) of p2p, all_gather and a2a (a2a: on the gathered
  // heads, before the way back); the backward adds their gradient into dsink (f32 on CUDA).
  // Undefined: none. a2a+p2p refuses them (validate_attention_sink.cpp).
  Tensor sink, dsink;
};

// The block of ring step (rank r, K/V of rank j) with fused steps: local query chunks
// [x0, x0 + nx) against local key chunks [y0, y0 + ny) of j:
//   j == r: both x both, causal (the rank's chunks r < 2CP-1-r are in sequence order, so the
//           plain causal mask over its 2C rows is the chunks' mask);
//   j <  r: both query chunks x j's first (j's second, 2CP-1-j, comes after both);
//   j >  r: the second query chunk x both of j's (the first, r, comes before both).
// MCPP_CP_FUSED_STEPS (docs/environment.md): "0" keeps the chunk blocks everywhere; unset or
// any other value lets the ring fuse its steps where the blocks run on cuDNN. The ring and
// the memory plan both ask here.
bool fused_steps_enabled();

struct RingStep {
  int x0, nx, y0, ny;
  bool causal;
};
RingStep ring_step(int64_t r, int64_t j);
// Its dims: `local` the rank's (S = 2C rows) with S = nx*C query rows, S_kv = ny*C key
// rows, lse rows 2C apart (the [B, NH, 2C] lse), offsets of the first chunks.
ops::AttentionDims ring_step_dims(const ops::AttentionDims& local, int64_t cp_size, int64_t r,
                                  int64_t j);

// One rank's share of the ring (p2p, all_gather) without the communication: its blocks
// against one rank's K/V at a time, merged into the running (out, lse), and their
// backward. attention_forward/backward drive it over the ring or the gathered K/V;
// bench_cp_blocks and the GPU tests drive every rank of a ring on one device.
struct RingRank {
  RingRank(const CpAttention& a, int64_t cp_size, int64_t rank, DType dt, Stream& s);
  // Before the forward's first step, which is the diagonal (j == rank).
  void start_forward(Tensor& out, Tensor& lse, Stream& s);
  // The blocks against rank j's qkv `kv`, merged into out / lse.
  void forward_step(const Tensor& qkv, const Tensor& kv, int64_t j, Tensor& out, Tensor& lse,
                    Stream& s);
  // Their backward from the final out / lse: dQ += into dqkv, dK and dV += into dkv (j's).
  void backward_step(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                     const Tensor& lse, const Tensor& kv, int64_t j, Tensor& dqkv, Tensor& dkv,
                     Stream& s) const;
  // The backward's first step, the diagonal (j == rank, its own K/V): writes dqkv (=) with
  // dQ of its queries against its own keys and its own keys' dK/dV from them. With fused
  // steps this is one causal self-attention backward over the 2C rows (no zero fill, no
  // scratch to add, and these dK/dV never travel); else a fill and the step's blocks.
  void backward_diagonal(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                         const Tensor& lse, Tensor& dqkv, Stream& s) const;
  // Attention sinks (a.sink defined) on the final (out, lse), in either lse layout, and
  // their gradient into a.dsink (before the steps' backward, which reads the same out, lse).
  void apply_sink(Tensor& out, Tensor& lse, Stream& s) const;
  void sink_backward(const Tensor& dout, const Tensor& out, const Tensor& lse, Stream& s) const;

  CpAttention a;
  int64_t P, r, C, B, W, O;  // CP size and rank, chunk rows, batch, qkv and out widths
  Tensor ks[2];  // document masking (p2p, all_gather): local chunk k's [B, C] key starts
  // One block per ring step (ring_step) where the blocks run on cuDNN
  // (ops::attention_block_rect_supported; lse [B, NH, 2C]); otherwise the visible chunk
  // pairs one by one (lse [2][B, NH, C]).
  bool fused = false;
  Tensor o_i, lse_i;  // a block's output and lse before the merge

  // Global chunk of local chunk k (0, 1) of rank j.
  int64_t chunk(int64_t j, int k) const { return k == 0 ? j : 2 * P - 1 - j; }
  int64_t rows() const { return C * B; }  // rows of one chunk in a [S*B, width] tensor

 private:
  Tensor chunk_rows(const Tensor& t, int x0, int n) const;  // local chunks [x0, x0 + n)
  ops::AttentionDims block_dims(int x, int64_t qa, int64_t kc) const;
  template <class F>
  void for_each_block(int64_t j, F&& f) const;  // f(x, y, qa, kc, causal): visible pairs
};

void attention_forward(const CpAttention& a, const Tensor& qkv, comm::Communicator& cp,
                       Tensor& out, Tensor& lse, Stream& s);
void attention_backward(const CpAttention& a, const Tensor& dout, const Tensor& qkv,
                        const Tensor& out, const Tensor& lse, comm::Communicator& cp,
                        Tensor& dqkv, Stream& s);

}  // namespace mcpp::parallel::context_parallel
