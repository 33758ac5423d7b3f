#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>

#include "ops/ops.h"

namespace mcpp::optim {

Stream& Optimizer::stream() const { return ops::default_stream(ps_.device()); }

double Optimizer::grad_sq_norm(const ParamFilter* counted) const {
  // Runs in buffer order: the distributed optimizer's segments are in bucket order, which
  // is not the shard's.
  std::vector<const ShardSegment*> order;
  for (const auto& s : segments()) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const ShardSegment* a, const ShardSegment* b) { return a->shard < b->shard; });
  Stream& st = ops::default_stream(grads().device());
  const Tensor& g = grads();
  double sum = 0;
  int64_t begin = -1, end = -1;
  auto flush = [&] {
    if (begin >= 0) sum += ops::sum_squares(g.narrow(begin, end - begin), st);
    begin = -1;
  };
  for (const ShardSegment* s : order) {
    if (counted && !(*counted)(s->param)) {
      flush();
      continue;
    }
    if (begin < 0) begin = s->shard;
    end = s->shard + s->len;
  }
  flush();
  return sum;
}

void Optimizer::clip(double max_norm, double total_norm) {
  grad_scale_ = 1.0;
  if (max_norm <= 0) return;
  const double coeff = max_norm / (total_norm + 1e-6);
  if (coeff < 1.0) grad_scale_ = coeff;
}

void Optimizer::scale_grads(double factor) {
  ops::scale(grads(), factor, ops::default_stream(grads().device()));
}

bool Optimizer::unscale_and_check(double inv_scale) {
  Stream& st = ops::default_stream(grads().device());
  if (inv_scale != 1.0) ops::scale(grads(), inv_scale, st);
  return ops::has_nonfinite(grads(), st);
}

AdamW::AdamW(model::ParamStore& ps, AdamWConfig cfg) : Optimizer(ps, cfg) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    segs_.push_back({i, p.offset, p.offset, p.numel()});
  }
  const Tensor& p = ps.flat_params();
  const DType pd = p.dtype();
  const bool in_place = pd == DType::F32 || pd == DType::F64;
  const DType sd = in_place ? pd : DType::F32;  // optimizer state dtype
  Stream& st = ops::default_stream(p.device());
  if (!in_place) {
    main_ = Tensor::empty(p.shape(), DType::F32, p.device());
    ops::copy(p, main_, st);
  }
  m_ = Tensor::empty(p.shape(), sd, p.device());
  v_ = Tensor::empty(p.shape(), sd, p.device());
  ops::fill(m_, 0.0, st);
  ops::fill(v_, 0.0, st);
}

double AdamW::grad_sq_norm(const ParamFilter* counted) const {
  if (counted) return Optimizer::grad_sq_norm(counted);
  return ops::sum_squares(ps_.flat_grads(), stream());
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&m_, &v_, &main_})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

void AdamW::load_state(const Tensor& values, const Tensor* exp_avg, const Tensor* exp_avg_sq) {
  set_params(values);
  if (exp_avg) ops::copy(*exp_avg, m_, stream());
  if (exp_avg_sq) ops::copy(*exp_avg_sq, v_, stream());
}

void AdamW::set_params(const Tensor& values) {
  Stream& st = ops::default_stream(ps_.device());
  if (main_.defined()) {
    ops::copy(values, main_, st);
    ops::copy(main_, ps_.flat_params(), st);
  } else {
    ops::copy(values, ps_.flat_params(), st);
  }
}

void AdamW::step(double lr, double wd) {
  ++step_;
  Stream& st = ops::default_stream(ps_.device());
  ops::AdamWParams p;
  p.lr = lr, p.beta1 = cfg_.beta1, p.beta2 = cfg_.beta2, p.eps = cfg_.eps, p.step = step_;
  p.grad_scale = grad_scale_;  // clip()'s factor, in this pass
  grad_scale_ = 1.0;
  Tensor& weights = main_.defined() ? main_ : ps_.flat_params();
  // One call per run of consecutive parameters with the same decay setting. With fp32 main
  // params the call also writes the run's model params (bf16/f16, rounded to nearest even):
  // Megatron's _copy_main_params_to_model_params, done in the step's own pass. The padding
  // between runs is never stepped, so it keeps the zeros both buffers start with.
  const auto& infos = ps_.infos();
  size_t i = 0;
  while (i < infos.size()) {
    size_t j = i;
    while (j + 1 < infos.size() && infos[j + 1].weight_decay == infos[i].weight_decay &&
           lr_of(j + 1, lr) == lr_of(i, lr))
      ++j;
    const int64_t begin = infos[i].offset, end = infos[j].offset + infos[j].numel();
    p.weight_decay = infos[i].weight_decay ? wd : 0.0;
    p.lr = lr_of(i, lr);
    Tensor w = weights.narrow(begin, end - begin);
    Tensor g = ps_.flat_grads().narrow(begin, end - begin);
    Tensor m = m_.narrow(begin, end - begin), v = v_.narrow(begin, end - begin);
    Tensor model = main_.defined() ? ps_.flat_params().narrow(begin, end - begin) : Tensor();
    ops::adamw_step(w, g, m, v, model, p, st);
    i = j + 1;
  }
}

}  // namespace mcpp::optim
