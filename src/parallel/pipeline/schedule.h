// Pipeline schedules as data (ARCHITECTURE.md, "Schedules are data").
//
// build_schedule() returns, for every pipeline stage, the list of actions that
// stage runs in one training step: forward / backward of (micro-batch, model
// chunk) and the point-to-point sends and receives around them, in exactly the
// order Megatron-LM's schedules issue them
// (megatron/core/pipeline_parallel/schedules.py):
//
//   AllForwardAllBackward  GPipe: every forward, then every backward (FIFO).
//                          Not in Megatron; the baseline that holds M activations.
//   OneFOneB               forward_backward_pipelining_without_interleaving
//                          (also forward_backward_no_pipelining when PP = 1).
//   Interleaved1F1B        forward_backward_pipelining_with_interleaving with
//                          P2P overlap off (batch_p2p_comm), V model chunks a rank.
//
// Point-to-point model. Megatron posts several transfers as one
// batch_isend_irecv (send_forward_recv_backward, send_forward_backward_recv_
// forward_backward, ...) and waits for all of them. Such transfers are
// consecutive actions that share one `batch` id (>= 0); a lone transfer has
// batch = -1. An executor posts a whole batch before waiting on any of it.
//
// Chunk of a transfer: the local model chunk the tensor belongs to on *this*
// stage: for a send the chunk that produced it, for a receive the chunk that
// will consume it. Activations flow stage s -> s+1 within a chunk and wrap from
// the last stage, chunk c, to stage 0, chunk c+1; gradients flow the other way.
// Transfers on one channel (src stage, dst stage, activation|gradient) match in
// order: the n-th send with the n-th receive.
//
// Differences from Megatron, on purpose:
//   * Megatron rejects the interleaved schedule with PP = 2 unless P2P overlap
//     is on, because with batched p2p both directions go to the same peer and
//     activation and gradient could pair up wrongly. Here activation and
//     gradient are separate channels (an executor gives them distinct tags), so
//     PP = 2 with virtual stages is valid; PP >= 2 is what we enforce.
//   * --overlap-moe-expert-parallel-comm (one extra warm-up forward) and the
//     overlap_p2p_comm variants are not modelled; the order of forwards and
//     backwards is the same with and without P2P overlap, only the grouping of
//     transfers differs.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mcpp::parallel::pipeline {

enum class Op : uint8_t {
  Forward,         // run model chunk `chunk` forward on micro-batch `microbatch`
  Backward,        // its backward (consumes what that forward saved)
  SendActivation,  // output of (microbatch, chunk) to peer_stage
  RecvActivation,  // input of (microbatch, chunk) from peer_stage
  SendGrad,        // input gradient of (microbatch, chunk) to peer_stage
  RecvGrad,        // output gradient of (microbatch, chunk) from peer_stage
};

struct Action {
  Op op;
  int microbatch;
  int chunk;            // local model chunk (virtual stage index on this rank), 0..V-1
  int peer_stage = -1;  // transfers only: the other pipeline stage
  int batch = -1;       // transfers posted together (one batch_isend_irecv) share an id >= 0
  bool operator==(const Action&) const = default;
};

enum class ScheduleKind : uint8_t { AllForwardAllBackward /*GPipe*/, OneFOneB, Interleaved1F1B };

using Schedule = std::vector<std::vector<Action>>;  // [stage][step]

// Per stage, the action list of one training step. microbatch_group_size is
// --microbatch-group-size-per-virtual-pipeline-stage (0 = pp), used by the
// interleaved schedule only. Throws mcpp::Error for invalid combinations:
// pp < 1, vpp < 1, M < 1, vpp > 1 with a non-interleaved kind, interleaved with
// pp < 2, group size outside [pp, M], or M mod group size in (0, pp) (Megatron's
// "dependency bubbles" error).
Schedule build_schedule(ScheduleKind kind, int pp, int vpp, int num_microbatches,
                        int microbatch_group_size = 0);

// The forward-only form of a schedule (evaluation, Megatron's forward_only=True): every
// stage's forwards and activation transfers in the same order, without backwards and
// gradient transfers (a batch loses its gradient members).
Schedule forward_only(const Schedule& schedule);

// Megatron's get_schedule_table: the (microbatch, chunk) of the k-th forward on
// every rank of the interleaved schedule. Micro-batches go in groups of
// `group_size`; inside a group all of chunk 0, then all of chunk 1, ...; the
// last group takes every remaining micro-batch. The k-th backward runs
// (table[k].first, V - 1 - table[k].second).
std::vector<std::pair<int, int>> interleaved_schedule_table(int num_microbatches, int vpp,
                                                            int group_size);

// Warm-up forwards on pipeline rank `rank` (get_pp_rank_microbatches):
//   OneFOneB: min(pp - rank - 1, M); Interleaved: min((pp - rank - 1)·2 + (V - 1)·G, M·V);
//   AllForwardAllBackward: M.
int warmup_microbatches(ScheduleKind kind, int pp, int rank, int vpp, int num_microbatches,
                        int microbatch_group_size = 0);

// The most (microbatch, chunk) activations a stage holds at once under this
// schedule: warm-up + 1, clamped to the total (M for GPipe).
int promised_in_flight(ScheduleKind kind, int pp, int rank, int vpp, int num_microbatches,
                       int microbatch_group_size = 0);

// "F0 F1 B0 ..." (micro-batch ids; "F0.1" = micro-batch 0, chunk 1, when any
// chunk > 0 appears). with_p2p adds transfers: ">a0" send activation, "<a0"
// receive activation, ">g0"/"<g0" for gradients, a batch in brackets "[>a1 <g0]".
std::string format_actions(const std::vector<Action>& actions, bool with_p2p = false);
std::string to_string(Op op);
std::string to_string(ScheduleKind kind);

// ---- layer partition -----------------------------------------------------------------

// Global layer ids of every (pipeline rank, model chunk): result[rank * vpp + chunk].
// Megatron's get_transformer_layer_offset: the layers are cut into vpp rounds; in
// each round stage s takes its share (first, middle..., last) of consecutive
// layers. 16 layers, PP 4, V 2: rank 0 = [0 1] [8 9], rank 1 = [2 3] [10 11], ...
// first_stage_layers / last_stage_layers are --decoder-first/last-pipeline-num-layers;
// the other stages split the rest evenly. Every stage's count must divide by vpp.
std::vector<std::vector<int>> assign_layers(int num_layers, int pp, int vpp,
                                            std::optional<int> first_stage_layers = std::nullopt,
                                            std::optional<int> last_stage_layers = std::nullopt);

// V from --num-layers-per-virtual-pipeline-stage K: (num_layers / pp) / K, which must divide.
int virtual_stages_from_layers_per_stage(int num_layers, int pp, int layers_per_virtual_stage);

// Megatron's num_microbatches: gbs / (mbs · dp), which must divide.
int num_microbatches(int64_t global_batch_size, int64_t micro_batch_size, int64_t data_parallel);

}  // namespace mcpp::parallel::pipeline
