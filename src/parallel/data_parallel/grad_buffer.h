// Data-parallel gradient reduction over the contiguous fp32 gradient buffer, in buckets
// (Megatron-Core's ParamAndGradBuffer / DistributedDataParallel, simplified):
//
//   * The buffer holds every parameter's gradient at its registry offset. Buckets are
//     runs of whole parameters taken in backprop order (the registry reversed), each of
//     at least `bucket_size` elements (--ddp-bucket-size; the last may be smaller), so a
//     bucket is one contiguous range of the buffer.
//   * Without the distributed optimizer a bucket is all-reduced (SUM: the loss is already
//     normalised by the masked tokens of the whole global batch). With it, a bucket is
//     reduce-scattered: DP rank r receives block r of the bucket into its shard buffer
//     (bucket lengths must be multiples of DP: the caller aligns every parameter to one).
//   * --overlap-grad-reduce: the model reports finished layers during the last
//     micro-batch's backward (layer_ready); a bucket's asynchronous collective starts as
//     soon as its last parameter is reported, and finish() waits for all of them. OpenMPI
//     progresses nonblocking collectives only inside MPI calls, so every layer_ready also
//     polls the buckets in flight (Work::test).
//   * --grad-reduce-in-bf16 (reduce_in_bf16): the collectives carry bf16, half the bytes
//     of fp32. Gradients still accumulate in the fp32 buffer (the GEMMs add into it); a
//     bucket is cast fp32 -> bf16 (round to nearest even) into a staging buffer when it
//     starts, reduced there, and cast back once its collective is complete (finish):
//     into the buffer (all-reduce) or into the fp32 shard (reduce-scatter). The staging
//     buffer is one bf16 allocation: [total] for the buckets, plus [total / DP] for the
//     reduce-scatter blocks. Megatron reduces its bf16 main_grad buffer in place instead
//     (its gradients then also accumulate in bf16); here only the transfer is bf16.
//   Every DP rank runs the same backward, so the buckets start in the same order on all
//   of them, as the communicator's sequence numbers require.
//   * Expert parallelism (Megatron's expert_data_parallel buffers): expert parameters
//     (ParamSpan::expert) are reduced over the expert-data-parallel group instead, given
//     as `expert_dp` when it differs from `dp` (EP > 1: the EP ranks of one DP group hold
//     different experts at the same offsets, so a DP sum would mix them). Buckets then
//     never mix dense and expert parameters; each bucket reduces over its own group. The
//     gradients are pre-scaled by the global token count already, so a sum over EDP is the
//     sum over every micro-batch that routed rows to these experts. With reduce-scatter an
//     expert bucket is scattered over EDP: its blocks are len / EDP (block(k)), and the
//     shard holds rank edp's block (Megatron's expert distributed optimizer).
//   * Several distributed-optimizer instances (--num-distributed-optimizer-instances N,
//     Megatron's partial distributed optimizer): `dp` is then the intra-instance group
//     (DP x CP / N ranks) and `inter` joins the ranks at the same place of every instance.
//     A bucket is reduce-scattered within the instance, then this rank's block is
//     all-reduced over `inter` (Megatron's start_grad_sync), so every instance holds the
//     same reduced shard. The inter all-reduces start in finish(), in bucket order, once
//     each bucket's reduce-scatter is complete (MPI does not order two nonblocking
//     collectives on different communicators); with --grad-reduce-in-bf16 they sum the
//     bf16 staging block, as Megatron's sum its bf16 grad buffer.
// This file knows spans of a flat buffer, not the model (parallel/ sits below model/).
#pragma once
#include <cstdint>
#include <vector>

#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::parallel {

// One parameter's place in the flat buffer. numel: the padded extent (up to the next
// parameter's offset), so the spans tile [0, total).
struct ParamSpan {
  int64_t offset = 0, numel = 0;
  int layer = -1;  // the model's layer index, -1 for embedding/head (ready last)
  bool expert = false;  // reduced over the expert-data-parallel group (when one is given)
};

// A run of one parameter's elements in two buffers laid out differently: elements
// [flat, flat + len) of the flat parameter/gradient buffers sit at [shard, shard + len) of
// another buffer. The distributed optimizer's segments place a parameter's part of this
// rank's DP shard (shard() and its moments); AdamW's are one per parameter with
// shard == flat; a checkpoint writes the moments by them (checkpoint::ShardSegment is this
// type).
struct ShardSegment {
  size_t param = 0;  // index in the parameter registry
  int64_t flat = 0, shard = 0, len = 0;
};

struct GradBucket {
  int64_t begin = 0, end = 0;   // [begin, end) of the flat buffer
  std::vector<size_t> params;   // indices into the spans
  int64_t shard_offset = 0;     // distributed optimizer: where block `rank` lands in shard()
  comm::Communicator* group = nullptr;  // the group that reduces it (dp, or expert_dp)
};

class DataParallelGrads {
 public:
  // grads: the flat gradient buffer [total]; spans: every parameter, registry order.
  // reduce_in_bf16 needs an fp32 buffer; in a group of one there is nothing to reduce,
  // so it has no effect there (no staging buffer, reduce_dtype() stays the buffer's).
  // expert_dp: the group that reduces expert spans (null, or &dp: the same as dense ones).
  // inter: with reduce_scatter, the group across distributed-optimizer instances (null or
  // a group of one: a single instance); not together with a separate expert_dp.
  DataParallelGrads(Tensor grads, std::vector<ParamSpan> spans, comm::Communicator& dp,
                    int64_t bucket_size, bool overlap, bool reduce_scatter,
                    bool reduce_in_bf16 = false, comm::Communicator* expert_dp = nullptr,
                    comm::Communicator* inter = nullptr);

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  comm::Communicator& dp() const { return dp_; }
  // The group across distributed-optimizer instances; null with a single instance.
  comm::Communicator* inter() const { return inter_; }
  bool reduce_scatter() const { return reduce_scatter_; }
  // The dtype the collectives carry: bf16 with reduce_in_bf16 (DP > 1), else the buffer's.
  DType reduce_dtype() const { return staging_.defined() ? DType::BF16 : grads_.dtype(); }
  // Bytes of the bf16 staging buffer (0 without it): 2 per element of the buffer, plus 2
  // per element of the shard with reduce-scatter.
  int64_t staging_bytes() const { return staging_.defined() ? int64_t(staging_.nbytes()) : 0; }
  // Distributed optimizer: this rank's reduced gradient blocks, bucket after bucket.
  Tensor& shard() { return shard_; }
  // Bytes of the shard buffer (0 without reduce-scatter).
  int64_t shard_bytes() const { return shard_.defined() ? int64_t(shard_.nbytes()) : 0; }
  // Elements of bucket k that rank r of its group owns: [begin + r*n, begin + (r+1)*n),
  // n = len / (its group's size: DP, or EDP for an expert bucket).
  int64_t block(size_t k) const {
    return (buckets_[k].end - buckets_[k].begin) / buckets_[k].group->size();
  }

  // Before the backward whose gradients are final (the last micro-batch): arms the counts.
  void begin_final_backward();
  // The model's grad-ready hook: every parameter of `layer` is final.
  void layer_ready(int layer, Stream& s);
  // Starts every bucket not started yet (all of them without overlap) and waits for all.
  void finish(Stream& s);
  // Buckets the last finish() found already started by layer_ready(): those whose
  // reduction began during backward (0 without --overlap-grad-reduce). A count, not a
  // time: what the overlap did, whatever the machine's load.
  size_t started_during_backward() const { return started_during_backward_; }

 private:
  void start(size_t k, Stream& s);
  // bf16 reduction, after bucket k's collective completed: the result back into fp32.
  void unstage(size_t k, Stream& s);

  Tensor grads_, shard_;
  // bf16 [total + shard total] with reduce_in_bf16 when anything is reduced (a group of
  // several, or several instances), else undefined.
  Tensor staging_;
  std::vector<ParamSpan> spans_;
  comm::Communicator& dp_;
  comm::Communicator* inter_ = nullptr;  // several instances: across them, else null
  bool overlap_ = false, reduce_scatter_ = false, armed_ = false;
  std::vector<GradBucket> buckets_;
  std::vector<int> bucket_of_;        // parameter -> bucket
  std::vector<int64_t> pending_;      // per bucket: parameters not yet ready
  std::vector<bool> started_;
  size_t started_during_backward_ = 0;
  std::vector<comm::Work> work_;
  std::vector<comm::Work> inter_work_;  // per bucket: the all-reduce across instances
  std::vector<Tensor> views_;         // the tensors in flight (kept alive)
};

}  // namespace mcpp::parallel
