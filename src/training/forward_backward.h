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

  // Runs the batch; training: with backward, each micro-batch's loss gradient scaled by
  // grad_scale (loss scale / masked tokens of the global batch). Returns the sum of masked
  // token losses of this rank's micro-batches (with pipelining: of its pipeline, summed
  // over the stages, which only the last holds).
  double run(const data::LocalBatch& batch, model::StepKeys keys, double grad_scale, bool training);

 private:
  double run_pipeline(const data::LocalBatch& batch, model::StepKeys keys, double grad_scale,
                      bool training);
};

}  // namespace mcpp::training
