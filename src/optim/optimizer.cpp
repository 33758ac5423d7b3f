#include "optim/optimizer.h"

#include <cmath>

#include "ops/ops.h"

namespace mcpp::optim {

AdamW::AdamW(model::ParamStore& ps, AdamWConfig cfg) : ps_(ps), cfg_(cfg) {
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

double AdamW::grad_sq_norm() const {
  return ops::sum_squares(ps_.flat_grads(), ops::default_stream(ps_.device()));
}

void AdamW::clip(double max_norm, double total_norm) {
  if (max_norm <= 0) return;
  const double coeff = max_norm / (total_norm + 1e-6);
  if (coeff < 1.0) ops::scale(ps_.flat_grads(), coeff, ops::default_stream(ps_.device()));
}

bool AdamW::unscale_and_check(double inv_scale) {
  Stream& st = ops::default_stream(ps_.device());
  if (inv_scale != 1.0) ops::scale(ps_.flat_grads(), inv_scale, st);
  return ops::has_nonfinite(ps_.flat_grads(), st);
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
  Tensor& weights = main_.defined() ? main_ : ps_.flat_params();
  // One call per run of consecutive parameters with the same decay setting. With fp32 main
  // params the call also writes the run's model params (bf16/f16, rounded to nearest even):
  // Megatron's _copy_main_params_to_model_params, done in the step's own pass. The padding
  // between runs is never stepped, so it keeps the zeros both buffers start with.
  const auto& infos = ps_.infos();
  size_t i = 0;
  while (i < infos.size()) {
    size_t j = i;
    while (j + 1 < infos.size() && infos[j + 1].weight_decay == infos[i].weight_decay) ++j;
    const int64_t begin = infos[i].offset, end = infos[j].offset + infos[j].numel();
    p.weight_decay = infos[i].weight_decay ? wd : 0.0;
    Tensor w = weights.narrow(begin, end - begin);
    Tensor g = ps_.flat_grads().narrow(begin, end - begin);
    Tensor m = m_.narrow(begin, end - begin), v = v_.narrow(begin, end - begin);
    Tensor model = main_.defined() ? ps_.flat_params().narrow(begin, end - begin) : Tensor();
    ops::adamw_step(w, g, m, v, model, p, st);
    i = j + 1;
  }
}

}  // namespace mcpp::optim
