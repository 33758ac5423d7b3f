// The module contract (docs/model.md): every piece of the model (Norm, the parallel
// linears, Embedding, Attention and its CoreAttention, the MLP, TransformerLayer, LmHead)
// has
//   - add_params(...): the parameters it registers, with their TP split, sequence-parallel
//     flag and gradient group set here, never inferred from names later;
//   - a constructor binding views of those parameters and gradients (or none: a
//     shape-only module, what the memory estimate builds);
//   - a `Saved` struct: what its forward keeps for its backward, one micro-batch;
//   - saved_specs(...) / scratch_specs(...): its tensors listed ONCE as (tensor, shape,
//     dtype, needed). allocate() allocates from that list, predicted_bytes() sums the
//     same list (memory_estimate, `megatron plan`), measured_bytes() sums what is really
//     allocated: the prediction cannot drift from the allocation;
//   - forward(...) and backward(...), the backward mirroring the forward block by block
//     with the formula on top. Accumulation: parameter gradients +=; everything else =.
//
// Activations are sequence-first: [S, B, H] stored as T = S*B rows. Under
// --sequence-parallel the norms, dropout and residual stream hold Tl = S/TP*B rows (this
// rank's sequence shard [s0, s0 + Sl)); the parallel linears see the gathered T rows.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::comm {
class Communicator;  // a process group; model code reaches it only through parallel/
}  // namespace mcpp::comm

namespace mcpp::model {

// One micro-batch: tokens, labels [B, S] i64; loss_mask [B, S] f32. Document masking
// (host tensors, defined only with the flag): position_ids [B, S] i64 (--reset-position-ids,
// each token's position in its document), key_start [B, S] i64 (--reset-attention-mask, the
// global position of its document's first token).
struct MicroBatch {
  Tensor tokens, labels, loss_mask;
  Tensor position_ids, key_start;
  // Multi-token prediction under context parallelism (made by data/micro_batches.cpp):
  // mtp[k-1] holds tokens, labels and loss mask rolled k places left over the whole
  // sequence, then cut as the others; mtp_tokens the whole sequence's loss-mask sums, [0]
  // this batch's and [k] depth k's. Empty: the MTP layers roll the batch themselves.
  std::vector<MicroBatch> mtp;
  std::vector<double> mtp_tokens;
};
// Depth k's batch of multi-token prediction (model/mtp.h): tokens, labels and loss mask
// [B,S] rolled k places left along S, zeros rolled in (Megatron's roll_tensor, k times).
MicroBatch mtp_rolled(const MicroBatch& mb, int64_t k);

// The part of the model one pipeline stage holds.
struct PipelinePart {
  // Global layer ids of each local model chunk, in execution order. Empty: one chunk
  // with every layer (no pipeline parallelism).
  std::vector<std::vector<int>> chunks;
  bool first_stage = true;  // chunk 0 starts with the embedding
  bool last_stage = true;   // the last chunk ends with final norm, output layer and loss
};

// Keys that make dropout a function of global coordinates: the same masks for
// any split of the global batch into micro-batches and data-parallel ranks.
struct StepKeys {
  int64_t iteration = 0;
  int64_t sample_offset = 0;  // index of this micro-batch's first sample in the global batch
  int64_t global_batch = 0;   // global batch size (0: this micro-batch is the whole batch)
  bool training = true;       // false: no dropout (evaluation, generation)
  // --fp16's loss scale (1 otherwise): the gradients the layers inject themselves (the MoE
  // aux / z losses') carry it as the LM loss's gradient does (Megatron's
  // MoEAuxLossAutoScaler.set_loss_scale), so the optimizer's unscaling treats them alike.
  double loss_scale = 1.0;
  // --calculate-per-token-loss: the global batch's loss tokens (0: Megatron's per-micro-batch
  // mean). Megatron divides every gradient by them and pre-multiplies the aux / z losses by
  // the micro-batch's tokens (Sg x B), so their gradients scale by Sg x B / loss_tokens.
  double loss_tokens = 0;
};

// Sizes of one micro-batch's pass: everything a tensor shape needs, computable without a
// communicator (the memory estimate uses it with no model built).
struct Dims {
  int64_t S = 0, B = 0, T = 0, H = 0;       // sequence, micro-batch, tokens S*B, hidden
  int64_t Sl = 0, s0 = 0, Tl = 0;           // this rank's sequence shard (SP) and its rows
  bool sp = false;                          // sequence parallelism (TP > 1)
  bool tp = false;                          // tensor parallelism (TP > 1)
  DType dt = DType::F32, sdt = DType::F32;  // activations, per-row statistics
  Device dev = Device::CPU;
  // Context parallelism: S is this CP rank's part of the Sg-token sequence, two chunks of
  // S/2 rows, global chunks cp_rank and 2*cp-1-cp_rank (cp = 1: one chunk, Sg = S).
  int64_t cp = 1, cp_rank = 0, Sg = 0;
  // Global position of local chunk k (0 or 1) of this rank's rows.
  int64_t cp_chunk_start(int k) const {
    return cp == 1 ? 0 : (k == 0 ? cp_rank : 2 * cp - 1 - cp_rank) * (S / 2);
  }
};
Dims make_dims(const TransformerConfig& c, int64_t S, int64_t B);

// Rows [first, first + n) of this CP rank's S rows as runs of consecutive global
// positions: f(local row offset from `first`, rows, global position of the run's first
// row). One run at CP 1 (global = local), at most two under CP (the chunk boundary S/2).
template <class F>
void for_each_global_run(const Dims& d, int64_t first, int64_t n, F&& f) {
  if (d.cp == 1) {
    f(int64_t(0), n, first);
    return;
  }
  const int64_t C = d.S / 2, end = first + n;
  if (first < C) f(int64_t(0), std::min(end, C) - first, d.cp_chunk_start(0) + first);
  if (end > C) {
    const int64_t a = std::max(first, C);
    f(a - first, end - a, d.cp_chunk_start(1) + a - C);
  }
}

// Dims plus what a pass needs to run: dropout keys and probabilities, the global
// coordinates of this rank's elements, the attention shapes, the TP group and the stream.
struct StepContext : Dims {
  const TransformerConfig* cfg = nullptr;
  StepKeys keys;
  double p_hidden = 0, p_attn = 0, scale = 0;
  ops::GlobalIndex3 g;                    // [S, B, H] dropout masks on global (s, b, h) indices
  ops::AttentionDims ad;                  // local heads, global offsets for attention dropout
  comm::Communicator* tp_comm = nullptr;  // null at TP 1: every region transition is identity
  comm::Communicator* cp_comm = nullptr;  // null at CP 1 (context parallelism)
  // a2a+p2p layers: the CP group's hierarchical levels (all-to-all, ring); else null.
  comm::Communicator* cp_a2a_comm = nullptr;
  comm::Communicator* cp_p2p_comm = nullptr;
  // --reset-position-ids: this rank's positions, sequence-first [S, B] i64 on the model's
  // device (rows s*B + b, as activations); undefined: positions by row. The document mask
  // (--reset-attention-mask) travels in ad.key_start.
  Tensor position_ids;
  // Sliding-window layers (TransformerConfig::is_window_layer): their key_start [B, S] i64
  // on the model's device, max(document start, global position - window_left), shared by
  // every window layer of the pass; undefined without window layers (model/gpt_model.cpp).
  Tensor window_key_start;
  Stream* st = nullptr;
  // Generation: each sequence's first new position (its KV-cache length), [B] on the host
  // and the same [B] i64 on the model's device (for the KV-cache attention op). When they
  // differ, Sq is 1 and the position-dependent steps (RoPE, learned positions) run per
  // sequence; when all are equal, s0 is that position.
  const int64_t* pos = nullptr;
  Tensor pos_dev;
  bool uniform_pos = true;
  Stream& stream() const { return *st; }
};
// S: the rows of this CP rank (the whole sequence at CP 1); cp: the CP group (CP > 1).
StepContext make_step_context(const TransformerConfig& c, int64_t S, int64_t B,
                              const StepKeys& keys, comm::Communicator* tp,
                              comm::Communicator* cp = nullptr);

// Generation (inference/): sequence b's new rows are positions [pos[b], pos[b] + Sq) of its
// KV-cache slot, dropout off, the whole sequence on every TP rank (no SP). pos [B] must
// outlive the context; positions that differ need Sq == 1. The caller sets pos_dev.
StepContext make_inference_context(const TransformerConfig& c, int64_t Sq, int64_t B,
                                   const int64_t* pos, comm::Communicator* tp);

// Dropout sites; each gets its own Philox stream per (iteration, layer). The values are
// part of the masks: changing them changes every run.
// RouterLogits / RouterBias / RouterJitter: the MoE routers' random logits, bias and input
// jitter (moe/router.h).
enum class DropoutSite : uint64_t {
  AttnProbs = 0,
  AfterProj = 1,
  AfterFc2 = 2,
  Embedding = 3,
  RouterLogits = 4,
  RouterBias = 5,
  RouterJitter = 6
};
ops::DropoutKey dropout_key(const TransformerConfig& c, const StepKeys& k, int64_t layer,
                            DropoutSite site);

// Megatron-Core parameter names: "decoder.layers.<layer>." + suffix ("mtp.layers.<k>.
// mtp_model_layer." for the MTP layer ids, TransformerConfig::kMtpLayerBase + k).
std::string layer_param_prefix(int layer);
std::string layer_param_name(int layer, const std::string& suffix);
// Multi-token prediction depth k's eh_proj ("mtp.layers.<k>.eh_proj"; its weight + ".weight").
std::string mtp_eh_proj_name(int depth);
// The layer id (kMtpLayerBase + k) of a parameter named "mtp.layers.<k>.*", else -1. An MTP
// depth's parameters are registered under layer -1 (they are gathered with the head's:
// TransformerLayer::add_params); what acts per layer (FP8) finds the depth by name.
int mtp_layer_of(const std::string& param_name);
// The initialisation std of the output projections (linear_proj, linear_fc2): Megatron's
// scaled_init_method_normal, init_method_std / sqrt(2 * num_layers).
double output_init_std(const TransformerConfig& c);

// (Re)allocates t when its shape, dtype or device differs; activations are reused across
// micro-batches, so a training step allocates nothing once shapes are settled.
void ensure(Tensor& t, const Shape& shape, DType dt, Device dev);
// The batch tensor on the model's device: `src` itself when it is there, else a copy
// into `buf` (allocated by the owner's specs).
const Tensor& on_device(const Tensor& src, Tensor& buf, Device dev, Stream& st);

// ---- tensor lists: one listing for allocation, prediction and measurement -------------

// (tensor, shape, dtype, needed): `needed` false means this configuration has no such
// tensor (a LayerNorm mean under RMSNorm, an SP buffer without SP, ...).
using TensorVisitor = std::function<void(Tensor& t, const Shape& shape, DType dt, bool needed)>;
using TensorList = std::function<void(const TensorVisitor&)>;

// Allocates every needed tensor of the list on `dev`. reset_unneeded: drop the others
// (a module's own Saved); false for the shared workspace, where another module's entry
// may need the same buffer.
void allocate(const TensorList& list, Device dev, bool reset_unneeded);
// The bytes allocate() would hold: the needed entries, each distinct tensor once.
int64_t predicted_bytes(const TensorList& list);
// The bytes really held by the list's tensors (defined ones, each allocation once).
int64_t measured_bytes(const TensorList& list);

// Buffers shared by every micro-batch and module: forward and backward scratch, the
// full-recompute workspace. Each module lists the members it uses in scratch_specs();
// two modules listing the same member share it (and it counts once).
struct LayerSaved;  // transformer_layer.h
struct MlpSaved;    // mlp.h
struct Workspace {
  Tensor tmp;                  // [Tl,H] row-parallel output before dropout-add
  Tensor tmp_full;             // [T,H] row-parallel partial output before the reduce-scatter (SP)
  Tensor ones;                 // [Tl,1] of ones: the bias add after a TP reduction
  Tensor act;                  // [T,F] the MLP activation of layers that do not keep their own
  Tensor dx, dtmp, dln;        // [Tl,H] residual-stream gradient, dropout / norm gradients
  Tensor ln_y;                 // [Tl,H] the norms' outputs when recomputed (layernorm module)
  Tensor dtmp_full, dln_full;  // [T,H] (SP)
  Tensor dloss;                // [S,B] d loss / d token loss
  Tensor local_max;            // [T] this rank's row max of the logits (TP, last stage)
  Tensor dfc1, dact, dctx, dqkv;    // [T,FC1W], [T,F] (SwiGLU), [T,NH*HD], [T,QKVW]
  Tensor fc1;                       // [T,FC1W] dense fc1's output when recomputed (mlp module)
  Tensor sel_ctx, sel_lse;          // selective recompute: the attention core's output
  // Multi-latent attention (mla_attention.h): q [T,NHl*Dq], kv [T,NHl*(Dn+Dv)], kpe [T,Dr]
  // (backward: their gradients), the core's output narrowed to Dv per head and its
  // gradient, the latents' gradients and their norms' output gradients.
  Tensor mla_q, mla_kv, mla_kpe, mla_ctx, mla_dctx, mla_dql, mla_dkvl, mla_dqln, mla_dkvln;
  Tensor mla_qkv;  // --recompute-modules mla_up_proj: the core's qkv, rebuilt in backward
  // MLA in FP8: linear_kv_down_proj's whole output [T, rkv+Dr] (backward: its gradient),
  // its transpose (the column split), and the second down projection's d x [T, H].
  Tensor mla_kvd, mla_kvdT, mla_dx2;
  // Multi-token prediction (mtp.h): eh_proj's input transposed [2H,Tl] (forward) and its
  // gradient [Tl,2H], and the gradients of the depths' inputs h_{k-1} [Tl,H] (two, in turn).
  Tensor mtp_catT, mtp_dcat;
  std::array<Tensor, 2> mtp_dh;
  std::vector<LayerSaved> rc_acts;  // full recompute: one per layer of the largest group
  std::vector<Tensor> rc_hidden;    // full recompute: hidden states inside a group
  std::shared_ptr<void> moe;        // model/moe: the MoE layers' scratch, one for all of them
  // --recompute-modules moe: what a MoE layer's forward saves, one set for all of them,
  // written by the forward and again by the backward's re-run just before it is read.
  std::unique_ptr<MlpSaved> moe_rc;
  Workspace();
  ~Workspace();
};

}  // namespace mcpp::model
