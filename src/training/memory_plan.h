// What one rank of a training run will hold, predicted from the flags before anything is
// allocated: `megatron train` prints it at start-up (Megatron's "Theoretical memory
// footprints" line) and compares it with what it allocated and measured; `megatron plan`
// prints it for every pipeline stage of a layout without running anything.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/memory_estimate.h"  // the modules' own saved/scratch bytes
#include "parallel/pipeline/schedule.h"
#include "training/arguments.h"

namespace mcpp::training {

// The model configuration the flags describe (device and dtype chosen by the caller;
// TP rank 0). args must be validated and have padded_vocab_size set.
model::TransformerConfig model_config(const Args& a, Device dev, DType dt);
// Every (pipeline rank, model chunk)'s decoder layers, [rank * vpp + chunk]: the layout,
// the uneven first/last counts or the even split (parallel/pipeline/layout.h). The one
// place a run's flags become its partition: train, plan and checkpoints all use it.
std::vector<std::vector<int>> stage_layers(const Args& a);
// Pipeline stage `stage`'s part of the model (all of it without PP).
model::PipelinePart pipeline_part(const Args& a, int stage);
// The schedule a pipelined run uses: interleaved 1F1B with virtual stages, else 1F1B or
// GPipe (--pipeline-schedule).
parallel::pipeline::ScheduleKind schedule_kind(const Args& a);
// Parameter alignment in the flat buffers: the distributed optimizer needs every
// parameter a multiple of DP (and of 64 elements, as Megatron pads); else 16.
int64_t param_alignment(const Args& a);

struct StageMemory {
  int64_t parameters = 0;       // elements of the rank's flat buffer (its TP shard, padded)
  int64_t weights = 0;          // bytes: parameters in the model dtype
  int64_t grads = 0;            // bytes: gradients (fp32 on GPUs), the distributed
                                // optimizer's shard, --grad-reduce-in-bf16's staging copy
  int64_t optimizer = 0;        // bytes: fp32 main params (16-bit models) + Adam moments (/DP
                                // with the distributed optimizer)
  int64_t per_microbatch = 0;   // bytes of activations one micro-batch keeps (largest chunk)
  int in_flight = 0;            // the schedule's most micro-batches in flight on this stage
  int64_t scratch = 0;          // bytes of shared activation buffers
  int64_t attention_workspace = 0;  // bytes: cuDNN's deterministic attention backward (GPU)
  int64_t cp_exchange = 0;  // bytes: context parallelism's transient exchange buffers
  // bytes by which an evaluation micro-batch of --eval-micro-batch-size (forward only: one
  // micro-batch's activations, dropped after it, its scratch and CP buffers) needs more than
  // the training step's activations, workspace and CP buffers; 0 when it needs less
  int64_t eval_extra = 0;
  int64_t activations() const { return int64_t(in_flight) * per_microbatch + scratch; }
  int64_t weights_and_optimizer() const { return weights + grads + optimizer; }
  int64_t total() const {
    return weights_and_optimizer() + activations() + attention_workspace + cp_exchange +
           eval_extra;
  }
};

// The buffers one layer's context-parallel attention backward holds at once besides the
// saved activations (parallel/context_parallel/cp_attention.cpp), in units of the rank's
// qkv [S/CP * B, QKVW/TP]: p2p, K/V and dK/dV double-buffered on the ring plus the
// travelling dK/dV (5); all_gather, the gathered K/V and their gradients (2 CP) and this
// rank's reduce-scattered share (1); a2a, the gathered qkv, output, its gradient and the
// qkv gradient with the all-to-all's send and receive buffers (6). On cuDNN the blocks'
// backward adds its scratch (a fused step: at most 1.5 units; a chunk block: 0.5). The
// largest over the layers' comm types; 0 without CP.
int64_t cp_exchange_bytes(const Args& a, const model::TransformerConfig& cfg);

// The memory of pipeline stage `stage` (TP rank 0, DP rank 0) for model config `cfg`.
StageMemory plan_stage_memory(const Args& a, const model::TransformerConfig& cfg, int stage);

// The workspace cuDNN's deterministic attention backward takes on a GPU
// (ops/cuda/cudnn_attention.cpp), by ops/types.h's cudnn_attention_bwd_workspace_bytes: dP
// of every (sequence, local head) of one cuDNN call, Bc*NHc*S*S*2 bytes, and Bc*NHc*S*HD*4
// bytes more with grouped-query attention, where a call holds the sequences of one batch
// chunk under MCPP_ATTENTION_BWD_WORKSPACE_MB (default 8192), or, when one sequence is over
// it, the heads of a chunk of whole key/value groups (NHc < NH/TP); the op checks each cuDNN plan's workspace against the same
// formula at run time and warns, naming the linked cuDNN, if it asks for more. Where the
// own flash kernel runs instead (ops::choose_attention_backend with --attention-backend,
// assuming cuDNN is present on a GPU run unless MCPP_ATTENTION_CUDNN=0: attention dropout,
// --attention-backend flash, no cuDNN), its dS hand-over buffer, ops::flash_ds_bytes of
// the sequences of one chunk under the same cap (or, with MCPP_FLASH_DQ_FROM_DS=0 or a
// sequence over the cap, the keep bits its dK/dV kernel hands to a recomputing dQ kernel
// when the layer keeps none). 0 where neither runs: CPU, f32, head dims that are not a
// multiple of 8 up to 128, --attention-backend unfused/local. MCPP_ATTENTION_DETERMINISTIC=0 (cuDNN's atomic dQ path): its f32
// dQ accumulators instead, 2 * B*NH*S*HD*4 bytes. With context parallelism: the ring's largest block (the diagonal step over the
// rank's two chunks, or one chunk where the steps run chunk by chunk), or a2a's attention
// over the whole sequence on heads / CP. cap_bytes: the cap to plan under (-1: the
// environment's MCPP_ATTENTION_BWD_WORKSPACE_MB, as the op uses).
int64_t attention_workspace_bytes(const Args& a, const model::TransformerConfig& cfg,
                                  int64_t cap_bytes = -1);

// Whether stage `stage` fits in `budget` bytes, and if not, what would make it fit: empty
// when the plan fits, else one line saying by how much it does not and the changes to try
// (fewer --keep-mlp-activations, computed; a smaller micro-batch; activation
// recomputation; the distributed optimizer; more TP or PP), each only where it applies.
// What the plan leaves out of a GPU run is a few MiB (cuBLASLt's workspace), so a plan over
// budget cannot fit.
std::string memory_fit_advice(const Args& a, const model::TransformerConfig& cfg, int stage,
                              int64_t budget);

// Bytes this host can still give (Linux: /proc/meminfo's MemAvailable, lowered to the
// cgroup v2 limit's headroom when one is set), or -1 when unknown.
int64_t host_memory_available();
// Ranks of this job on this host, from the launcher's environment (Open MPI, MPICH/Hydra,
// Slurm), 1 when none says: the host's memory is shared by that many trainers.
int host_local_ranks();

}  // namespace mcpp::training
