// Megatron-Core's finalize_model_grads (core/distributed/finalize_model_grads.py) for the
// flat gradient buffer: after the last micro-batch's backward, the reductions that make
// every rank's gradients the gradients of the whole global batch, in this order:
//
//   1. pipeline: the tied word embedding's two copies (first and last stage) get the sum
//      of both gradients over the embedding group (_allreduce_word_embedding_grads) --
//      before the data-parallel reduction, which with the distributed optimizer leaves
//      only shards -- and, with --overlap-grad-reduce, the embedding's buckets are
//      reported ready (the model does not: its gradients were not final before this);
//   2. data parallel: DataParallelGrads::finish (all-reduce, or reduce-scatter into the
//      shard for the distributed optimizer) -- the part backward did not hide;
//   3. tensor parallel: under --sequence-parallel, parameters that act on the rank's
//      sequence shard (norms, learned position embeddings) hold partial sums over TP:
//      all-reduced over TP (_allreduce_layernorm_grads), in the buffer the optimizer
//      steps from (the flat buffer, or the DP shard: TP ranks have identical flat
//      layouts, so their shards hold the same elements).
//
// Which parameter takes part in what is data (GradParam, filled from model::ParamInfo by
// the layer above: parallel/ sits below model/), never a parameter's name.
#pragma once
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "parallel/data_parallel/grad_buffer.h"
#include "parallel/parallel_state.h"

namespace mcpp::parallel {

// One parameter, as finalize_model_grads sees it.
struct GradParam {
  int64_t offset = 0, numel = 0;   // its gradient in the flat buffer
  bool sequence_parallel = false;  // a partial sum over TP under --sequence-parallel
  bool tp_partial = false;         // a partial sum over TP always
  bool embedding_group = false;    // summed over the embedding group (a tied weight's copies)
};

struct FinalizeOptions {
  bool sequence_parallel = false;    // --sequence-parallel
  bool overlap_grad_reduce = false;  // --overlap-grad-reduce
  // Brackets the exposed data-parallel reduction as the section "grads-reduce" (the
  // trainer's timers); may be empty.
  std::function<void(std::string_view section, bool start)> timer;
};

// flat_grads: the model's flat gradient buffer; opt_grads / segments: the buffer the
// optimizer steps from and where each parameter's elements sit in it (its segments).
void finalize_model_grads(const ParallelState& ps, std::span<const GradParam> params,
                          Tensor& flat_grads, DataParallelGrads& dp, Tensor& opt_grads,
                          std::span<const ShardSegment> segments, const FinalizeOptions& o,
                          Stream& st);

// Which of this rank's parameters are summed over its embedding group: those marked as a
// copy (`duplicate`: the last stage's tied output weight) and, on the other members, the
// parameters of the same name (the first stage's word embedding). Collective over the
// embedding group (the members exchange their copies' names once, at set-up); all false
// when this rank is in no embedding group of more than one rank.
std::vector<bool> embedding_group_params(const ParallelState& ps,
                                         std::span<const std::string> names,
                                         std::span<const bool> duplicate);

// The ranks whose gradients are distinct parts of the model's, over which the squared
// grad norm is summed: TP x PP, and DP too when the optimizer holds DP shards of the
// gradients (get_grad_norm_fp32's model-parallel group; the distributed optimizer's is the
// world; with several distributed-optimizer instances, the ranks of this one). `world`:
// the communicator of every rank.
comm::Communicator& grad_norm_group(const ParallelState& ps, comm::Communicator& world,
                                    bool sharded_over_dp);

}  // namespace mcpp::parallel
