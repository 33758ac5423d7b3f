#include "training/forward_backward.h"

#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "parallel/pipeline/executor.h"

namespace mcpp::training {

double ForwardBackward::run(const data::LocalBatch& batch, model::StepKeys keys, double grad_scale,
                            bool training) {
  if (ps.layout().pp() > 1) return run_pipeline(batch, keys, grad_scale, training);
  const size_t M = batch.micro_batches.size();
  double loss_sum = 0;
  for (size_t j = 0; j < M; ++j) {
    keys.sample_offset = batch.sample_offsets[j];
    if (timer) timer("forward-compute", true);
    loss_sum += model.forward(batch.micro_batches[j], keys);
    if (timer) timer("forward-compute", false);
    if (!training) continue;
    // The grad-ready hooks of the last backward start the data-parallel buckets.
    if (j == M - 1 && dp_grads) dp_grads->begin_final_backward();
    if (timer) timer("backward-compute", true);
    model.backward(grad_scale);
    if (timer) timer("backward-compute", false);
  }
  return loss_sum;
}

// This pipeline stage's actions (forward-only for evaluation), then the loss (held by the
// last stage) summed over the pipeline.
double ForwardBackward::run_pipeline(const data::LocalBatch& batch, model::StepKeys keys,
                                     double grad_scale, bool training) {
  namespace pl = parallel::pipeline;
  const int M = int(batch.micro_batches.size());
  double loss_sum = 0;
  pl::StageCallbacks cb;
  cb.forward = [&](int m, int c, const Tensor& in) {
    keys.sample_offset = batch.sample_offsets[size_t(m)];
    if (timer) timer("forward-compute", true);
    auto r = model.forward_chunk(c, m, batch.micro_batches[size_t(m)], keys, in);
    if (timer) timer("forward-compute", false);
    if (!training) model.drop_chunk(c, m);
    loss_sum += r.loss;
    return r.output;
  };
  cb.backward = [&](int m, int c, const Tensor& g) {
    if (timer) timer("backward-compute", true);
    Tensor dx = model.backward_chunk(c, m, g, grad_scale, /*final=*/m == M - 1);
    if (timer) timer("backward-compute", false);
    return dx;
  };
  // Gradient hooks fire only in each chunk's last backward (final above).
  if (training && dp_grads) dp_grads->begin_final_backward();
  const auto& c = model.config();
  pl::ExecutorOptions o;
  o.activation_shape = {c.seq_local() * micro_batch_size, c.hidden_size};
  o.dtype = c.dtype, o.device = c.device;
  o.timer = timer;
  Stream& st = ops::default_stream(c.device);
  pl::run_stage(training ? *train_actions : *eval_actions, ps.pp(), *pp_grads, o, cb, st);
  return parallel::sum_over(ps.pp(), loss_sum);
}

}  // namespace mcpp::training
