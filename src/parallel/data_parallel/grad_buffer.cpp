#include "parallel/data_parallel/grad_buffer.h"

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel {

DataParallelGrads::DataParallelGrads(Tensor grads, std::vector<ParamSpan> spans,
                                     comm::Communicator& dp, int64_t bucket_size, bool overlap,
                                     bool reduce_scatter, bool reduce_in_bf16,
                                     comm::Communicator* expert_dp, comm::Communicator* inter)
    : grads_(std::move(grads)),
      spans_(std::move(spans)),
      dp_(dp),
      inter_(inter && inter->size() > 1 ? inter : nullptr),
      overlap_(overlap),
      reduce_scatter_(reduce_scatter) {
  MCPP_CHECK(grads_.dim() == 1, "DataParallelGrads: flat buffer expected, got {}", grads_.str());
  MCPP_CHECK(!spans_.empty(), "DataParallelGrads: no parameters");
  const int64_t total = grads_.numel();
  bucket_size = std::max<int64_t>(bucket_size, 1);
  bucket_of_.assign(spans_.size(), -1);
  // Expert spans get their own group only when it is another one (EP > 1).
  const bool split = expert_dp && expert_dp != &dp_;
  MCPP_CHECK(!inter_ || reduce_scatter_,
             "DataParallelGrads: several distributed-optimizer instances need reduce-scatter");
  MCPP_CHECK(!inter_ || !split,
             "DataParallelGrads: several distributed-optimizer instances with a separate "
             "expert-data-parallel group are not implemented");
  auto group_of = [&](size_t k) { return split && spans_[k].expert ? expert_dp : &dp_; };
  // Backprop order: the last registered parameter first.
  GradBucket cur;
  cur.end = total;
  int64_t lo = total;
  for (size_t k = spans_.size(); k-- > 0;) {
    const auto& p = spans_[k];
    MCPP_CHECK(p.offset + p.numel == lo, "DataParallelGrads: spans do not tile the buffer at {}",
               k);
    lo = p.offset;
    cur.params.push_back(k);
    cur.group = group_of(k);
    // A bucket ends at its size, at the first parameter, or where the next parameter (in
    // backprop order) is reduced over another group.
    if (cur.end - lo >= bucket_size || k == 0 || group_of(k - 1) != cur.group) {
      cur.begin = lo;
      buckets_.push_back(cur);
      cur = GradBucket{};
      cur.end = lo;
    }
  }
  MCPP_CHECK(lo == 0, "DataParallelGrads: the first parameter does not start at 0");
  int64_t shard_total = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    auto& bk = buckets_[b];
    for (size_t k : bk.params) bucket_of_[k] = int(b);
    if (reduce_scatter_) {
      const int g = bk.group->size();  // DP, or EDP (a divisor of DP) for expert buckets
      MCPP_CHECK((bk.end - bk.begin) % g == 0,
                 "bucket [{}, {}) is not a multiple of its data-parallel size {}: align the "
                 "parameters to it",
                 bk.begin, bk.end, g);
      bk.shard_offset = shard_total;
      shard_total += (bk.end - bk.begin) / g;
    }
  }
  if (reduce_scatter_) {
    shard_ = Tensor::empty({shard_total}, grads_.dtype(), grads_.device());
    ops::fill(shard_, 0.0, ops::default_stream(grads_.device()));
  }
  if (reduce_in_bf16 && (dp_.size() > 1 || inter_)) {
    MCPP_CHECK_HINT(grads_.dtype() == DType::F32, "train with --bf16 (fp32 main grads)",
                    "--grad-reduce-in-bf16 casts an fp32 gradient buffer to bf16, found {}",
                    grads_.str());
    staging_ = Tensor::empty({total + shard_total}, DType::BF16, grads_.device());
  }
  pending_.assign(buckets_.size(), 0);
  started_.assign(buckets_.size(), false);
  work_.resize(buckets_.size());
  inter_work_.resize(buckets_.size());
  views_.resize(2 * buckets_.size());
}

void DataParallelGrads::begin_final_backward() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b] = int64_t(buckets_[b].params.size());
    started_[b] = false;
  }
  armed_ = true;
}

void DataParallelGrads::start(size_t b, Stream& s) {
  const auto& bk = buckets_[b];
  const int64_t len = bk.end - bk.begin;
  Tensor in = grads_.narrow(bk.begin, len);
  comm::Communicator& g = *bk.group;
  if (g.size() == 1 && !reduce_scatter_) {
    views_[2 * b] = in;
    started_[b] = true;
    return;
  }
  if (staging_.defined()) {
    // The bucket's gradients are final: this is the only rounding to bf16 before the sum.
    Tensor staged = staging_.narrow(bk.begin, len);
    ops::copy(in, staged, s);
    in = staged;
  }
  views_[2 * b] = in;
  if (reduce_scatter_) {
    Tensor out = staging_.defined() ? staging_.narrow(grads_.numel() + bk.shard_offset, block(b))
                                    : shard_.narrow(bk.shard_offset, block(b));
    views_[2 * b + 1] = out;
    work_[b] = g.reduce_scatter_async(views_[2 * b], views_[2 * b + 1], s);
  } else {
    work_[b] = g.all_reduce_async(views_[2 * b], comm::ReduceOp::Sum, s);
  }
  started_[b] = true;
}

void DataParallelGrads::layer_ready(int layer, Stream& s) {
  if (!overlap_ || !armed_) return;
  for (size_t k = 0; k < spans_.size(); ++k) {
    if (spans_[k].layer != layer) continue;
    const int b = bucket_of_[k];
    if (--pending_[size_t(b)] == 0) start(size_t(b), s);
  }
  for (auto& w : work_) w.test();  // progress the collectives in flight
}

void DataParallelGrads::unstage(size_t b, Stream& s) {
  const auto& bk = buckets_[b];
  if (reduce_scatter_) {
    Tensor out = shard_.narrow(bk.shard_offset, block(b));
    ops::copy(views_[2 * b + 1], out, s);
  } else {
    Tensor out = grads_.narrow(bk.begin, bk.end - bk.begin);
    ops::copy(views_[2 * b], out, s);
  }
}

void DataParallelGrads::finish(Stream& s) {
  started_during_backward_ = 0;
  if (armed_)
    for (size_t b = 0; b < buckets_.size(); ++b) started_during_backward_ += started_[b];
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!armed_ || !started_[b]) start(b, s);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    // wait(): on the CPU the result is in place; on a CUDA stream, `s` now waits for the
    // collective, so the cast back below is ordered after it.
    work_[b].wait();
    work_[b] = comm::Work();
    // Several instances: this rank's reduced block, summed over the instances (in bucket
    // order on every rank, as the inter group's sequence numbers require).
    if (inter_) {
      inter_work_[b] = inter_->all_reduce_async(views_[2 * b + 1], comm::ReduceOp::Sum, s);
      continue;
    }
    // A bucket of a group of one (expert parameters at EDP 1) was never staged.
    if (staging_.defined() && (reduce_scatter_ || buckets_[b].group->size() > 1)) unstage(b, s);
  }
  if (inter_)
    for (size_t b = 0; b < buckets_.size(); ++b) {
      inter_work_[b].wait();
      inter_work_[b] = comm::Work();
      if (staging_.defined()) unstage(b, s);
    }
  armed_ = false;
}

}  // namespace mcpp::parallel
