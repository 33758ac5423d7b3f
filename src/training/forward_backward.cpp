#include "training/forward_backward.h"

#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "parallel/pipeline/executor.h"

namespace mcpp::training {

comm::Communicator& data_cp_group(const parallel::ParallelState& ps) {
  return ps.layout().cp() > 1 ? ps.dp_cp() : ps.dp();
}

LossScales loss_scales(const data::LocalBatch& batch, const parallel::ParallelState& ps,
                       bool per_token_loss, double loss_scale) {
  LossScales r;
  const size_t M = batch.micro_batches.size();
  r.tokens = parallel::sum_over(data_cp_group(ps), batch.loss_tokens);
  if (per_token_loss) {
    r.grad_scale.assign(M, r.tokens > 0 ? loss_scale / r.tokens : 0.0);
    return r;
  }
  const double per_step = double(M) * double(ps.layout().dp());
  for (size_t j = 0; j < M; ++j) {
    const Tensor& mask = batch.micro_batches[j].loss_mask;
    double n = 0;
    for (int64_t i = 0; i < mask.numel(); ++i) n += mask.data<float>()[i];
    if (ps.layout().cp() > 1) n = parallel::sum_over(ps.cp(), n);
    r.grad_scale.push_back(n > 0 ? loss_scale / (n * per_step) : 0.0);
  }
  return r;
}

double ForwardBackward::run(const data::LocalBatch& batch, model::StepKeys keys,
                            const std::vector<double>& grad_scale, bool training) {
  if (ps.layout().pp() > 1) return run_pipeline(batch, keys, grad_scale, training);
  const size_t M = batch.micro_batches.size();
  // The losses are read after the last backward is queued: no wait between micro-batches.
  std::vector<model::PendingLoss> losses;
  for (size_t j = 0; j < M; ++j) {
    keys.sample_offset = batch.sample_offsets[j];
    if (timer) timer("forward-compute", true);
    losses.push_back(model.forward_pending(batch.micro_batches[j], keys));
    if (timer) timer("forward-compute", false);
    if (!training) continue;
    // The grad-ready hooks of the last backward start the data-parallel buckets.
    if (j == M - 1 && dp_grads) dp_grads->begin_final_backward();
    if (timer) timer("backward-compute", true);
    model.backward(grad_scale[j]);
    if (timer) timer("backward-compute", false);
  }
  double loss_sum = 0;
  for (const model::PendingLoss& l : losses) loss_sum += l.value();  // in order: same bits
  return loss_sum;
}

// This pipeline stage's actions (forward-only for evaluation), then the loss (held by the
// last stage) summed over the pipeline.
double ForwardBackward::run_pipeline(const data::LocalBatch& batch, model::StepKeys keys,
                                     const std::vector<double>& grad_scale, bool training) {
  namespace pl = parallel::pipeline;
  const int M = int(batch.micro_batches.size());
  std::vector<model::PendingLoss> losses;  // read after the stage's actions, in their order
  pl::StageCallbacks cb;
  cb.forward = [&](int m, int c, const Tensor& in) {
    keys.sample_offset = batch.sample_offsets[size_t(m)];
    if (timer) timer("forward-compute", true);
    auto r = model.forward_chunk(c, m, batch.micro_batches[size_t(m)], keys, in);
    if (timer) timer("forward-compute", false);
    if (!training) model.drop_chunk(c, m);
    if (r.loss.partial.defined()) losses.push_back(r.loss);
    return r.output;
  };
  cb.backward = [&](int m, int c, const Tensor& g) {
    if (timer) timer("backward-compute", true);
    Tensor dx = model.backward_chunk(c, m, g, grad_scale[size_t(m)], /*final=*/m == M - 1);
    if (timer) timer("backward-compute", false);
    return dx;
  };
  // Gradient hooks fire only in each chunk's last backward (final above).
  if (training && dp_grads) dp_grads->begin_final_backward();
  const auto& c = model.config();
  pl::ExecutorOptions o;
  // The stages exchange this batch's micro-batches (evaluation's may be of another size)
  const int64_t B = M > 0 ? batch.micro_batches[0].tokens.size(0) : micro_batch_size;
  o.activation_shape = {c.seq_local() * B, c.hidden_size};
  o.dtype = c.dtype, o.device = c.device;
  o.timer = timer;
  Stream& st = ops::default_stream(c.device);
  pl::run_stage(training ? *train_actions : *eval_actions, ps.pp(), *pp_grads, o, cb, st);
  double loss_sum = 0;
  for (const model::PendingLoss& l : losses) loss_sum += l.value();
  return parallel::sum_over(ps.pp(), loss_sum);
}

}  // namespace mcpp::training
