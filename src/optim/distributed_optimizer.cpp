#include "optim/distributed_optimizer.h"

#include <algorithm>

#include "ops/ops.h"
#include "ops/split_main.h"
#include "optim/fp8_param_gather.h"

namespace mcpp::optim {

DistributedAdamW::DistributedAdamW(model::ParamStore& ps, OptimizerConfig cfg,
                                   parallel::DataParallelGrads& grads, bool overlap_param_gather)
    : Optimizer(ps, cfg), grads_(grads), overlap_(overlap_param_gather) {
  MCPP_CHECK(grads.reduce_scatter(), "DistributedAdamW needs reduce-scattered gradients");
  const auto& infos = ps.infos();
  for (size_t b = 0; b < grads.buckets().size(); ++b) {
    const auto& bk = grads.buckets()[b];
    // The bucket's group: DP, or the expert-data-parallel group for expert buckets (EP > 1).
    const int r = bk.group->rank();
    const int64_t n = grads.block(b), lo = bk.begin + r * n, hi = lo + n;
    for (size_t i : bk.params) {
      const int64_t p0 = std::max(lo, infos[i].offset);
      const int64_t p1 = std::min(hi, infos[i].offset + infos[i].numel());
      if (p1 > p0) segs_.push_back({i, p0, bk.shard_offset + (p0 - lo), p1 - p0});
    }
  }
  const Tensor& sh = grads.shard();
  // fp32 state, as AdamW (f64 for the CPU's f64 reference models).
  const DType sd = ps.flat_params().dtype() == DType::F64 ? DType::F64 : DType::F32;
  Stream& st = ops::default_stream(sh.device());
  // bf16 models: the main parameters as the model's values and lower halves (a shard of
  // them, laid out as the gradient shard): ops/split_main.h. f16 models: an fp32 shard.
  // f32/f64 models: the model's own blocks are the main parameters (no copy, as Megatron's
  // shard of an fp32 parameter is a view of it); the step updates them in place.
  if (wants_split_main(ps.flat_params().dtype()))
    lo_ = Tensor::empty(sh.shape(), DType::U16, sh.device());
  else if (!wide_model())
    main_ = Tensor::empty(sh.shape(), sd, sh.device());
  allocate_state(sh.shape(), sd, sh.device());
  if (main_.defined()) ops::fill(main_, 0.0, st);
  if (lo_.defined()) ops::clear_main_lo(lo_, st);
  reload_main_params();
  // The layers whose parameters each bucket holds: wait_params(layer) waits for those.
  bucket_layers_.assign(grads.buckets().size(), {});
  for (size_t b = 0; b < grads.buckets().size(); ++b)
    for (size_t i : grads.buckets()[b].params) bucket_layers_[b].push_back(infos.at(i).layer);
}

DistributedAdamW::~DistributedAdamW() = default;

bool DistributedAdamW::wide_model() const {
  const DType d = ps_.flat_params().dtype();
  return d == DType::F32 || d == DType::F64;
}

void DistributedAdamW::enable_fp8_param_gather(const model::TransformerConfig& c,
                                               comm::Communicator* tp) {
  // The FP8 cast reads an fp32 main shard: an f32 model's blocks, copied once.
  if (!main_.defined() && !lo_.defined()) {
    const Tensor& sh = grads_.shard();
    main_ = Tensor::empty(sh.shape(), ps_.flat_params().dtype(), sh.device());
    ops::fill(main_, 0.0, ops::default_stream(sh.device()));
    reload_main_params(ps_.flat_params());
  }
  // The FP8 cast reads whole fp32 main parameters: join split ones once.
  if (lo_.defined()) {
    Stream& st = ops::default_stream(lo_.device());
    main_ = Tensor::empty(lo_.shape(), DType::F32, lo_.device());
    ops::fill(main_, 0.0, st);
    for (const auto& s : segs_) {
      Tensor dst = main_.narrow(s.shard, s.len);
      ops::join_main_params(ps_.flat_params().narrow(s.flat, s.len), lo_.narrow(s.shard, s.len),
                            dst, st);
    }
    lo_ = Tensor();
  }
  pg_ = std::make_unique<Fp8ParamGather>(ps_, grads_, c, tp);
}

void DistributedAdamW::refresh_fp8_params() {
  MCPP_CHECK(pg_, "refresh_fp8_params: --fp8-param-gather is not enabled");
  pg_->cast_and_gather(main_, ps_.flat_params().dtype() != main_.dtype(), false);
}

Tensor DistributedAdamW::full_main_params() {
  const DType pd = ps_.flat_params().dtype();
  // --fp8-param-gather: the model's copy of an FP8 weight is current only in this rank's
  // blocks; the main parameters are the values.
  if ((pd == DType::F32 || pd == DType::F64) && !pg_) return Tensor();
  return gather_main_params();
}

void DistributedAdamW::load_state(const Tensor& values, const Tensor* exp_avg,
                                  const Tensor* exp_avg_sq) {
  // Split main parameters: every rank rounds the whole model as its step rounds its blocks.
  Stream& st = ops::default_stream(ps_.device());
  if (lo_.defined())
    split_from(values, ps_.flat_params(), Tensor(), st);
  else
    ops::copy(values, ps_.flat_params(), st);
  reload_main_params(values);
  MCPP_CHECK(!exp_avg_sq || v_.defined(),
             "DistributedAdamW::load_state: a second moment given to the {} rule",
             rule_name(cfg_.rule));
  MCPP_CHECK(!exp_avg == !exp_avg_sq || !v_.defined(),
             "DistributedAdamW::load_state: both moments or neither");
  if (exp_avg) scatter_state(*exp_avg, exp_avg_sq);
  set_state_loaded(exp_avg != nullptr);
}

void DistributedAdamW::reload_main_params() {
  if (!lo_.defined()) return reload_main_params(ps_.flat_params());
  // From the bf16 model parameters themselves: lower halves zero.
  ops::clear_main_lo(lo_, ops::default_stream(lo_.device()));
}

void DistributedAdamW::reload_main_params(const Tensor& values) {
  if (!main_.defined() && !lo_.defined()) {  // f32/f64: the model's blocks are the values
    Tensor& flat = ps_.flat_params();
    if (values.raw() == flat.raw()) return;
    Stream& st = ops::default_stream(flat.device());
    for (const auto& s : segs_) {
      Tensor dst = flat.narrow(s.flat, s.len);
      ops::copy(values.narrow(s.flat, s.len), dst, st);
    }
    return;
  }
  if (lo_.defined()) {
    Stream& st = ops::default_stream(lo_.device());
    for (const auto& s : segs_)
      split_from(values.narrow(s.flat, s.len), ps_.flat_params().narrow(s.flat, s.len),
                 lo_.narrow(s.shard, s.len), st);
    return;
  }
  Stream& st = ops::default_stream(main_.device());
  for (const auto& s : segs_) {
    Tensor dst = main_.narrow(s.shard, s.len);
    ops::copy(values.narrow(s.flat, s.len), dst, st);
  }
}

Tensor DistributedAdamW::gather_main_params() {
  if (lo_.defined()) {
    // Every rank's lower halves (2 bytes an element), then joined with the model's
    // parameters (current once the step's gather is done) onto the host.
    wait_params_all();
    Stream& st = ops::default_stream(lo_.device());
    Tensor full_lo = Tensor::empty({ps_.total_numel()}, DType::U16, lo_.device());
    ops::clear_main_lo(full_lo, st);
    all_gather_flat(lo_, full_lo);
    Tensor out = Tensor::empty({ps_.total_numel()}, DType::F32);
    join_to(ps_.flat_params(), full_lo, out, st);
    return out;
  }
  if (!main_.defined()) {  // f32/f64: every rank's blocks are in the model's buffer
    wait_params_all();
    Tensor full = Tensor::empty(ps_.flat_params().shape(), ps_.flat_params().dtype(),
                                ps_.flat_params().device());
    ops::copy(ps_.flat_params(), full, ops::default_stream(full.device()));
    return full;
  }
  Tensor full = Tensor::empty({ps_.total_numel()}, main_.dtype(), main_.device());
  all_gather_flat(main_, full);
  return full;
}

int64_t DistributedAdamW::state_bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&main_, &lo_, &m_, &v_})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

void DistributedAdamW::step(double lr, double wd) {
  ++step_;
  Stream& st = ops::default_stream(m_.device());
  // A 16-bit model: each segment's updated main params go, rounded, straight into this
  // rank's own block of the model's flat parameters (a segment is one contiguous span of
  // both), which the all-gather below then sends in place.
  Tensor& flat = ps_.flat_params();
  const bool cast = flat.dtype() == DType::BF16 || flat.dtype() == DType::F16;
  // The previous step's gathers read those blocks: done by now (the forward waited for
  // every layer), but make sure before they are written again.
  if (overlap_) wait_params_all();
  const auto& infos = ps_.infos();
  for (const auto& s : segs_) {
    if (muon_ && muon_steps(infos[s.param])) continue;  // muon_step below
    auto shard = [&](const Tensor& t) { return t.defined() ? t.narrow(s.shard, s.len) : t; };
    Tensor model = cast ? flat.narrow(s.flat, s.len) : Tensor();
    // f32/f64 models without a main copy: the step updates the model's own block.
    Tensor main = main_.defined() ? shard(main_) : lo_.defined() ? Tensor()
                                                                  : flat.narrow(s.flat, s.len);
    // --decoupled-lr and muP: lr_of, eps_of
    update_span(main, shard(lo_), shard(grads_.shard()), shard(m_), shard(v_), model,
                lr_of(s.param, lr), infos[s.param].weight_decay ? wd : 0.0, eps_of(s.param),
                st);
  }
  if (muon_) muon_step(lr, wd, st);
  finish_step();
  // Updated blocks -> every rank's model parameters (Megatron: the param all-gather, in
  // place in its param buffer for 16-bit models); --fp8-param-gather: the FP8 weights
  // cast here and gathered as FP8.
  if (pg_)
    pg_->cast_and_gather(main_, cast, overlap_);
  else
    all_gather_flat(cast ? Tensor() : main_, flat, overlap_);
}

void DistributedAdamW::wait_params(int layer) {
  if (pg_) return pg_->wait(layer);
  for (size_t b = 0; b < gather_work_.size(); ++b) {
    const auto& ls = bucket_layers_[b];
    if (std::find(ls.begin(), ls.end(), layer) == ls.end()) {
      gather_work_[b].test();  // progress the others (MPI needs polling)
      continue;
    }
    gather_work_[b].wait();
    gather_work_[b] = comm::Work();
  }
}

void DistributedAdamW::wait_params_all() {
  if (pg_) pg_->wait_all();
  for (auto& w : gather_work_) {
    w.wait();
    w = comm::Work();
  }
}

void DistributedAdamW::all_gather_flat(const Tensor& shard, Tensor& flat, bool async) {
  Stream& st = ops::default_stream(m_.device());
  for (size_t b = 0; b < grads_.buckets().size(); ++b) {
    const auto& bk = grads_.buckets()[b];
    comm::Communicator& dp = *bk.group;  // DP, or expert-DP for an expert bucket
    const int64_t n = grads_.block(b);
    Tensor out = flat.narrow(bk.begin, bk.end - bk.begin);
    Tensor in = shard.defined() ? shard.narrow(bk.shard_offset, n) : out.narrow(dp.rank() * n, n);
    if (!async) {
      dp.all_gather(in, out, st);
      continue;
    }
    gather_work_.resize(grads_.buckets().size());
    gather_keep_.resize(2 * grads_.buckets().size());
    gather_keep_[2 * b] = in, gather_keep_[2 * b + 1] = out;
    gather_work_[b] = dp.all_gather_async(gather_keep_[2 * b], gather_keep_[2 * b + 1], st);
  }
}

void DistributedAdamW::scatter_state(const Tensor& exp_avg, const Tensor* exp_avg_sq) {
  Stream& st = ops::default_stream(m_.device());
  for (const auto& s : segs_) {
    Tensor m = m_.narrow(s.shard, s.len);
    ops::copy(exp_avg.narrow(s.flat, s.len), m, st);
    if (!exp_avg_sq) continue;
    Tensor v = v_.narrow(s.shard, s.len);
    ops::copy(exp_avg_sq->narrow(s.flat, s.len), v, st);
  }
}

}  // namespace mcpp::optim
