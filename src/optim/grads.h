// The gradient side of a training step, read from the parameter registry (model::ParamInfo)
// and never from parameter names:
//
//   * grad_params: each parameter's part in parallel::finalize_model_grads (a partial sum
//     over TP under sequence parallelism: ParamInfo::sequence_parallel; a tied weight's
//     copy summed over the embedding group: ParamInfo::pipeline_duplicate and its
//     original on the first stage);
//   * grad_norm: Megatron's get_grad_norm_fp32 -- the L2 norm of the whole model's
//     gradients, each element counted once: this rank's sum of squares over the
//     parameters it holds a distinct copy of (TP-duplicated ones on TP rank 0 only; the
//     last stage's copy of the tied embedding never), summed over the ranks holding
//     distinct gradients (parallel::grad_norm_group).
//   * expert parallelism (EP > 1): the EP ranks hold different experts, so the expert
//     parameters' squares are summed over `expert_group` (ETP x EP (x PP): Megatron's
//     expert-model-parallel group) and the dense ones over `group` as before; the two sums
//     are added. Null (EP 1): every parameter over `group`, bit for bit as before.
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/parallel_state.h"

namespace mcpp::optim {

// Collective over the embedding group (see parallel::embedding_group_params); call once.
std::vector<parallel::GradParam> grad_params(const model::ParamStore& params,
                                             const parallel::ParallelState& ps);

// Whether parameter p's gradient counts in the norm on TP rank `tp_rank`.
bool counts_in_grad_norm(const model::ParamInfo& p, int tp_rank);

// The global gradient norm (sqrt of the squared norm summed over `group`); non-finite when
// any gradient is (an fp16 overflow). In a group of one every parameter counts (TP rank 0,
// no pipeline copy) and the optimizer reduces its buffer as it likes best.
double grad_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                 comm::Communicator& group, comm::Communicator* expert_group = nullptr);

// --log-params-norm: Megatron's calc_params_l2_norm -- the L2 norm of the whole model's
// parameters (the fp32 main parameters where the optimizer holds them unsharded, else the
// model's), each element counted once as in grad_norm, summed over `model_parallel`
// (TP x PP: DP replicas are equal).
double params_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                   comm::Communicator& model_parallel, comm::Communicator* expert_group = nullptr);

// --log-num-zeros-in-grad: Megatron's count_zeros_fp32 -- the gradient elements (after
// clipping) that are exactly zero, over the parameters grad_norm counts, summed over the
// same group as the norm. Copies the gradients to the host (a diagnostic, run on logging
// iterations only).
int64_t count_zeros_in_grads(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                             comm::Communicator& group, comm::Communicator* expert_group = nullptr);

}  // namespace mcpp::optim
