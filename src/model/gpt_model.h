// GPTModel: embedding -> L pre-norm transformer layers -> final norm -> output
// layer -> vocab cross-entropy, assembled from the modules of src/model (docs/model.md):
// each with its own forward, backward, saved activations and their bytes. GPT-2 style
// (learned positions, LayerNorm, GELU, biases, tied embeddings) and Llama style (RoPE,
// RMSNorm, SwiGLU, GQA, untied, no biases) are the same code with TransformerConfig
// switches.
//
// Activations are sequence-first [S, B, H]; the batch arrives as [B, S] ids.
//
// Pipeline parallelism: a GPTModel holds one pipeline stage's part of the model
// (PipelinePart, stage.h): one or more model chunks (virtual stages) of consecutive global
// layers, the embedding when it is the first stage, the final norm, output layer and
// loss when it is the last. forward_chunk()/backward_chunk() run one chunk on one
// micro-batch; what a forward saves for its backward lives in a slot of a per-chunk
// pool, one slot per micro-batch in flight, reused once its backward is done (shapes
// are static, so a step allocates nothing once the pool has grown to the schedule's
// in-flight count). forward()/backward() are the whole-model form (one chunk holding
// every layer): what serial and TP/DP runs, tests and tools use.
//
// Activation recomputation (--recompute-granularity): `full` is the TransformerBlock's
// (transformer_block.h), `selective` the CoreAttention's (core_attention.h); the MLP's
// keep-or-recompute policy (--keep-mlp-activations) is the MLP's (mlp.h). Dropout masks
// are functions of global coordinates, so a recomputed forward is bitwise the original.
#pragma once
#include <functional>
#include <memory>
#include <vector>


#include "model/config.h"
#include "model/memory_estimate.h"
#include "model/module.h"
#include "model/params.h"
#include "model/stage.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::model {

// Bytes of saved activations (what forwards keep for their backwards).
struct ActivationMemory {
  int64_t live = 0;          // held now by micro-batches in flight
  int64_t peak = 0;          // the most held at once since reset_activation_peak()
  int64_t per_slot_max = 0;  // the largest single micro-batch's (chunk's) saved set
  int64_t scratch = 0;       // shared buffers: backward scratch and recompute workspace
  int max_in_flight = 0;     // the most micro-batch chunks held at once
};

class GPTModel {
 public:
  // tp: the tensor-parallel group (cfg.tp_size ranks, this one cfg.tp_rank); null for
  // tp_size 1. Communication happens only through parallel/'s region transitions.
  // part: the pipeline stage's share of the model (default: all of it).
  explicit GPTModel(const TransformerConfig& cfg, comm::Communicator* tp = nullptr,
                    PipelinePart part = {});
  ~GPTModel();
  // The context-parallel group (cfg.cp_size members, this rank at cfg.cp_rank): every
  // layer's attention exchanges keys and values over it. Needed before the first forward
  // when cfg.cp_size > 1. a2a, p2p: the group's hierarchical levels, which a2a+p2p layers
  // (--hierarchical-context-parallel-sizes) need.
  void set_cp_comm(comm::Communicator* cp, comm::Communicator* a2a = nullptr,
                   comm::Communicator* p2p = nullptr);

  const TransformerConfig& config() const { return cfg_; }
  ParamStore& params() { return params_; }
  Stage& stage() { return *stage_; }  // its modules (training/moe_step.cpp walks the MoE layers)
  const ParamStore& params() const { return params_; }

  // Runs the forward pass and the loss; returns the sum over tokens of
  // loss_mask * token_loss (not normalised). Saves activations for backward.
  double forward(const MicroBatch& mb, const StepKeys& keys);
  // The same without waiting for the loss: read it (value()) once the step's backward
  // passes are queued.
  PendingLoss forward_pending(const MicroBatch& mb, const StepKeys& keys);
  // Backpropagates d(loss)/d(token_loss[t]) = loss_mask[t] * grad_scale and
  // accumulates (+=) every parameter gradient. Needs the preceding forward().
  void backward(double grad_scale);

  // ---- pipeline form ---------------------------------------------------------------------
  int num_chunks() const;
  const PipelinePart& part() const { return part_; }
  // Runs model chunk `chunk` forward on micro-batch `microbatch` (any id unique among
  // those in flight). Input: the batch's tokens for chunk 0 of the first stage, else
  // `input` [S/TP(SP) * B, H] (copied; the caller may reuse it). Returns the chunk's
  // output activation (valid until the next forward_chunk of this chunk) and, for the
  // last chunk of the last stage, the masked loss sum in `loss`. What it saved stays
  // until backward_chunk() or drop_chunk() (forward-only evaluation).
  struct ChunkOutput {
    PendingLoss loss;  // the masked loss sum (last chunk of the last stage)
    Tensor output;  // undefined on the last chunk of the last stage
  };
  ChunkOutput forward_chunk(int chunk, int microbatch, const MicroBatch& mb,
                            const StepKeys& keys, const Tensor& input = Tensor());
  // Its backward: `output_grad` is d(loss)/d(output) (ignored, may be undefined, on the
  // last chunk of the last stage, where grad_scale applies as in backward()). Returns
  // d(loss)/d(input) (undefined for chunk 0 of the first stage; valid until the next
  // backward_chunk). final: the last backward of this chunk in the step; the grad-ready
  // hook fires for the chunk's layers only then (never for layer -1: the caller
  // reports it once embedding gradients are complete).
  Tensor backward_chunk(int chunk, int microbatch, const Tensor& output_grad, double grad_scale,
                        bool final);
  void drop_chunk(int chunk, int microbatch);
  ActivationMemory activation_memory() const;
  // The same quantities predicted from the shapes, before anything is allocated: the
  // bytes one micro-batch of B x S tokens keeps for chunk `chunk`, and the shared scratch
  // once a forward and a backward have run. A step's peak is the schedule's in-flight
  // count times the former (exact for one chunk a rank) plus the latter.
  int64_t saved_bytes_per_microbatch(int chunk, int64_t B, int64_t S) const;
  int64_t scratch_bytes(int64_t B, int64_t S) const;
  void reset_activation_peak();

  // Called during backward() when gradients are final for this micro-batch: with l after
  // transformer layer l's backward (its parameters, registry `layer` == l), and with -1 at
  // the end (every parameter with layer -1). The data-parallel reducer starts a bucket's
  // reduction from here (--overlap-grad-reduce). Empty: no calls.
  void set_grad_ready_hook(std::function<void(int layer)> hook) { grad_ready_ = std::move(hook); }
  // Called during forward() before parameters are read: with -1 first (embedding, final
  // norm, output layer), then with l before transformer layer l. The distributed
  // optimizer waits there for the all-gather of those parameters (--overlap-param-gather).
  void set_params_needed_hook(std::function<void(int layer)> hook) {
    params_needed_ = std::move(hook);
  }

  // How gradients are reduced after backward (embedding group, DP, the sequence-parallel
  // partial sums over TP) is parallel/finalize_model_grads', driven by the registry's
  // ParamInfo (pipeline_duplicate, sequence_parallel, tp_duplicated()).

  // Logits [S, B, Vp] of the last forward() (valid until backward()).
  const Tensor& logits() const;
  // Per-token losses [S, B] of the last forward().
  const Tensor& token_losses() const;
  // Multi-token prediction (mtp.h): the MTP depths' losses of the training forwards since
  // the caller last cleared them (training/mtp_step.cpp reads them once per global batch).
  MtpStats& mtp_stats() { return mtp_stats_; }

 private:
  struct Slot;
  Slot& acquire(int chunk, int microbatch);
  void release(int chunk, int microbatch);

  TransformerConfig cfg_;
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* cp_ = nullptr;  // context parallelism (cfg.cp_size > 1)
  comm::Communicator* cp_a2a_ = nullptr;  // its hierarchical levels (a2a+p2p layers)
  comm::Communicator* cp_p2p_ = nullptr;
  PipelinePart part_;
  std::function<void(int)> grad_ready_, params_needed_;
  ParamStore params_;
  std::unique_ptr<Stage> stage_;                          // the modules, over params_
  std::unique_ptr<Workspace> ws_;                         // shared scratch
  std::vector<std::vector<std::unique_ptr<Slot>>> pool_;  // chunk -> slots
  std::vector<std::pair<int, Slot*>> live_;               // (chunk, microbatch) in flight
  Slot* last_head_ = nullptr;
  MtpStats mtp_stats_;
  int64_t live_bytes_ = 0, peak_bytes_ = 0, slot_max_ = 0;
  int in_flight_ = 0, max_in_flight_ = 0;
};

// parameter_registry, saved_activation_bytes, scratch_activation_bytes: memory_estimate.h;
// keeps_mlp_activation: transformer_block.h; layer_param_name: module.h.

}  // namespace mcpp::model
