// The distributed optimizer (ZeRO-1; Megatron-Core's DistributedOptimizer): DP rank r
// owns block r of every gradient bucket (DataParallelGrads with reduce-scatter), and
// keeps fp32 main parameters and Adam moments for those elements only. A step is:
// reduce-scattered gradients (already in the shard buffer) -> AdamW on the shard ->
// all-gather of the updated parameters, bucket by bucket, into every rank's flat
// parameter buffer. Rank r's block of a bucket is one contiguous span of the flat buffer,
// so for bf16/f16 models the step writes its rounded result straight into that span
// (adamw_step's model_param) and the all-gather runs in place there, as Megatron's
// param all-gather does in its param buffer; f32/f64 models gather from the main params.
// Optimizer state bytes per rank are 1/DP of AdamW's.
#pragma once
#include <functional>

#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"

namespace mcpp::optim {

class DistributedAdamW {
 public:
  DistributedAdamW(model::ParamStore& params, AdamWConfig cfg, parallel::DataParallelGrads& grads);

  // Sum of squares of this rank's gradient shard over the parameters `count` accepts
  // (the caller drops TP-duplicated ones on TP ranks > 0 and all-reduces over TP x DP).
  double grad_sq_norm(const std::function<bool(size_t)>& count) const;
  void clip(double max_norm, double total_norm);
  // All-reduces over `group` this rank's gradient shard of the parameters `which` accepts
  // (sequence-parallel partial gradients over TP: TP ranks have identical flat layouts,
  // so their shards hold the same elements).
  void all_reduce_grads(comm::Communicator& group, const std::function<bool(size_t)>& which);
  // Steps this rank's shard, then all-gathers the updated parameters bucket by bucket:
  // synchronously, or (overlap_param_gather) asynchronously, completed by
  // wait_params(layer) before the next forward reads them, or by wait_params_all().
  void step(double lr, double wd);
  void set_overlap_param_gather(bool on, std::vector<int> param_layers);
  void wait_params(int layer);
  void wait_params_all();
  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }
  // Bytes of optimizer state this rank holds (main params + moments).
  int64_t state_bytes() const;

  // Loading a checkpoint: keeps this rank's part of whole flat moments (laid out like
  // the parameters). Saving writes segments() of exp_avg()/exp_avg_sq() directly.
  void scatter_state(const Tensor& exp_avg, const Tensor& exp_avg_sq);
  // Re-reads the main parameters from the model (after a checkpoint load).
  void reload_main_params();
  // Reads this rank's main parameters from `values`, a flat [total] tensor laid out like
  // the model's parameters on any device (a checkpoint's fp32 values, exact).
  void reload_main_params(const Tensor& values);
  // The fp32 main parameters of every rank, all-gathered bucket by bucket into one flat
  // [total] tensor (collective over DP): what a checkpoint of a bf16/f16 model saves.
  Tensor gather_main_params();
  // Multiplies this rank's gradient shard by `factor` (fp16 loss scaling: 1 / scale).
  void scale_grads(double factor);
  const AdamWConfig& config() const { return cfg_; }

  // A parameter's intersection with this rank's shard.
  struct Segment {
    size_t param = 0;
    int64_t flat = 0, shard = 0, len = 0;  // flat-buffer offset, shard offset, length
  };
  const std::vector<Segment>& segments() const { return segs_; }
  // This rank's moments, [shard] (laid out as the gradient shard).
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }

 private:
  // Every rank's block of each bucket into `flat` [total]: from `shard` (laid out as the
  // gradient shard), or, when shard is undefined, from each rank's own block of `flat`
  // itself (an all-gather in place).
  void all_gather_flat(const Tensor& shard, Tensor& flat, bool async = false);

  model::ParamStore& ps_;
  AdamWConfig cfg_;
  parallel::DataParallelGrads& grads_;
  std::vector<Segment> segs_;
  bool overlap_ = false;
  std::vector<int> param_layer_;              // parameter -> layer
  std::vector<comm::Work> gather_work_;       // per bucket, in flight
  std::vector<Tensor> gather_keep_;           // their buffers
  std::vector<std::vector<int>> bucket_layers_;
  Tensor main_, m_, v_;  // [shard]
  int64_t step_ = 0;
};

}  // namespace mcpp::optim
