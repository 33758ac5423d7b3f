// The distributed optimizer (ZeRO-1; Megatron-Core's DistributedOptimizer): DP rank r
// owns block r of every gradient bucket (DataParallelGrads with reduce-scatter), and
// keeps fp32 main parameters and Adam moments for those elements only. A step is:
// reduce-scattered gradients (already in the shard buffer) -> AdamW on the shard ->
// all-gather of the updated parameters, bucket by bucket, into every rank's flat
// parameter buffer. Rank r's block of a bucket is one contiguous span of the flat buffer,
// so for bf16/f16 models the step writes its rounded result straight into that span
// (adamw_step's model_param) and the all-gather runs in place there, as Megatron's
// param all-gather does in its param buffer; f32/f64 models keep no main copy: the step
// updates their blocks of the flat buffer in place, and the same in-place gather follows.
// Optimizer state bytes per rank are 1/DP of AdamW's. Behind optim::Optimizer (optimizer.h)
// it is AdamW's twin: grads() is the shard, segments() place each parameter's part of it;
// like AdamW it runs SGD or Lion instead by OptimizerConfig::rule, or (enable_muon) Muon for
// the matrices, as Megatron's layer-wise distributed optimizer does for --optimizer muon
// --use-distributed-optimizer: each rank keeps the momentum of its blocks, and every matrix
// is orthogonalised whole by one rank of the bucket's group (muon_step below).
#pragma once
#include <memory>

#include "model/params.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"

namespace mcpp::model {
struct TransformerConfig;
}

namespace mcpp::optim {

class Fp8ParamGather;

class DistributedAdamW final : public Optimizer {
 public:
  // overlap_param_gather: the step's all-gather runs asynchronously, completed by
  // wait_params(layer) before the next forward reads a layer's parameters
  // (--overlap-param-gather), or by wait_params_all().
  DistributedAdamW(model::ParamStore& params, OptimizerConfig cfg,
                   parallel::DataParallelGrads& grads,
                   bool overlap_param_gather = false);
  ~DistributedAdamW() override;

  // This rank's reduced gradient shard.
  Tensor& grads() override { return grads_.shard(); }
  using Optimizer::grads;
  // A parameter's intersection with this rank's shard, bucket after bucket.
  const std::vector<ShardSegment>& segments() const override { return segs_; }
  bool state_sharded() const override { return true; }
  // Steps this rank's shard, then all-gathers the updated parameters bucket by bucket.
  void step(double lr, double wd) override;
  void wait_params(int layer) override;
  void wait_params_all() override;
  int64_t state_bytes() const override;
  // The fp32 main parameters of every rank, all-gathered bucket by bucket (collective over
  // DP) for bf16/f16 models; undefined for f32/f64 ones.
  Tensor full_main_params() override;
  void load_state(const Tensor& values, const Tensor* exp_avg, const Tensor* exp_avg_sq) override;

  // Loading a checkpoint: keeps this rank's part of whole flat moments (laid out like
  // the parameters; exp_avg_sq null for the rules without a second moment).
  void scatter_state(const Tensor& exp_avg, const Tensor* exp_avg_sq);
  // Re-reads the main parameters from the model.
  void reload_main_params();
  // Reads this rank's main parameters from `values`, a flat [total] tensor laid out like
  // the model's parameters on any device (a checkpoint's fp32 values, exact).
  void reload_main_params(const Tensor& values);
  // The fp32 main parameters of every rank, all-gathered bucket by bucket into one flat
  // [total] tensor (collective over DP), in any dtype.
  Tensor gather_main_params();

  // ---- --fp8-param-gather (optim/fp8_param_gather.h) -----------------------------------
  // From now on the step casts this rank's main parameters of the FP8 layers' weights to
  // FP8 and all-gathers those as FP8 bytes (the layers read them); the model's own copy of
  // those weights is then current only in this rank's blocks, so full_main_params()
  // gathers the main parameters for every model dtype. tp: null at TP 1.
  void enable_fp8_param_gather(const model::TransformerConfig& c, comm::Communicator* tp);
  // The FP8 weights from the current main parameters (collective over DP): call once the
  // model's start-up values (or a checkpoint's) are loaded, before the first forward.
  void refresh_fp8_params();
  const Fp8ParamGather* fp8_param_gather() const { return pg_.get(); }

 private:
  // Every rank's block of each bucket into `flat` [total]: from `shard` (laid out as the
  // gradient shard), or, when shard is undefined, from each rank's own block of `flat`
  // itself (an all-gather in place).
  void all_gather_flat(const Tensor& shard, Tensor& flat, bool async = false);
  bool wide_model() const;  // f32/f64 parameters: no main copy, the blocks are updated in place
  // Muon's part of step() (distributed_muon.cpp), bucket by bucket, in windows of whole
  // matrices (Optimizer::muon_window_bytes): each rank's momentum of its blocks, sent piece
  // by piece to the matrices' owners (muon_owners: the Newton-Schulz work shared out) by an
  // all-to-all over the bucket's group; each owner orthogonalises its whole matrices; the
  // updates' pieces go back the same way and each rank applies them to its blocks.
  void muon_step(double lr, double wd, Stream& st);

  parallel::DataParallelGrads& grads_;
  std::vector<ShardSegment> segs_;
  bool overlap_ = false;
  std::vector<comm::Work> gather_work_;          // per bucket, in flight
  std::vector<Tensor> gather_keep_;              // their buffers
  std::vector<std::vector<int>> bucket_layers_;  // per bucket, the layers of its parameters
  std::unique_ptr<Fp8ParamGather> pg_;           // --fp8-param-gather
};

}  // namespace mcpp::optim
