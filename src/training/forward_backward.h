// Forward and backward over one global batch's micro-batches on this rank (Megatron's
// forward_backward_func: forward_backward_no_pipelining, or a pipeline schedule's actions
// run by parallel/pipeline's executor). Gradients accumulate (+=) into the model's flat
// buffer; nothing here reduces them across ranks (parallel/finalize_model_grads does,
// after the last micro-batch).
#pragma once
#include <functional>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "data/micro_batches.h"
#include "model/gpt_model.h"
#include "parallel/data_parallel/grad_buffer.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/schedule.h"

namespace mcpp::training {

// The group that reduces gradients, token counts and the loss: dp-cp under context
// parallelism, else dp (the same ranks; dp keeps CP-less runs' communication log as it was).
comm::Communicator& data_cp_group(const parallel::ParallelState& ps);

// The loss normalisation of one global batch, defined once from global token counts
// (Megatron's loss_func + forward_step + finalize_model_grads), as the gradient scale of
// each micro-batch's summed token losses:
//   --calculate-per-token-loss: sum of masked token losses / masked tokens of the global
//     batch (summed over DP x CP before any backward);
//   default (Megatron): the mean of the micro-batches' masked means over DP ranks and
//     micro-batches, 1 / (tokens of the micro-batch x M x DP). A micro-batch's tokens are
//     counted over its whole sequences (summed over CP), so a CP rank whose tokens are all
//     masked adds nothing instead of Megatron's NaN (#1764); a micro-batch with no token
//     at all adds 0. Both equal each other when every micro-batch has as many tokens.
// loss_scale multiplies every scale (fp16). Collective over DP x CP and CP.
struct LossScales {
  std::vector<double> grad_scale;  // per micro-batch of this rank
  double tokens = 0;               // masked tokens of the global batch
};
LossScales loss_scales(const data::LocalBatch& batch, const parallel::ParallelState& ps,
                       bool per_token_loss, double loss_scale);

struct ForwardBackward {
  model::GPTModel& model;
  const parallel::ParallelState& ps;
  parallel::DataParallelGrads* dp_grads = nullptr;  // armed before the last backward
  // Pipeline parallelism (PP > 1): the gradients' communicator over the pipeline group
  // (activations use ps.pp()), and this stage's actions for a training step and for
  // evaluation.
  comm::Communicator* pp_grads = nullptr;
  const std::vector<parallel::pipeline::Action>* train_actions = nullptr;
  const std::vector<parallel::pipeline::Action>* eval_actions = nullptr;
  int64_t micro_batch_size = 1;
  // Megatron's level-2 timers ("forward-compute", "backward-compute", the pipeline's
  // "forward-send", "backward-recv", ...): start/stop callbacks, or none.
  std::function<void(std::string_view, bool)> timer = nullptr;

  // Runs the batch; training: with backward, micro-batch j's loss gradient scaled by
  // grad_scale[j] (loss_scales). Returns the sum of masked token losses of this rank's
  // micro-batches (with pipelining: of its pipeline, summed over the stages, which only
  // the last holds).
  double run(const data::LocalBatch& batch, model::StepKeys keys,
             const std::vector<double>& grad_scale, bool training);

 private:
  double run_pipeline(const data::LocalBatch& batch, model::StepKeys keys,
                      const std::vector<double>& grad_scale, bool training);
};

}  // namespace mcpp::training
