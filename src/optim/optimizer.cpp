#include "optim/optimizer.h"

#include <cmath>

#include "ops/ops.h"

namespace mcpp::optim {

AdamW::AdamW(model::ParamStore& ps, AdamWConfig cfg) : ps_(ps), cfg_(cfg) {
  m_ = Tensor::zeros(ps.flat_params().shape(), ps.flat_params().dtype());
  v_ = Tensor::zeros(ps.flat_params().shape(), ps.flat_params().dtype());
}

double AdamW::grad_sq_norm() const { return ops::sum_squares(ps_.flat_grads(), Stream::cpu()); }

void AdamW::clip(double max_norm, double total_norm) {
  if (max_norm <= 0) return;
  const double coeff = max_norm / (total_norm + 1e-6);
  if (coeff < 1.0) ops::scale(ps_.flat_grads(), coeff, Stream::cpu());
}

void AdamW::step(double lr, double wd) {
  ++step_;
  ops::AdamWParams p;
  p.lr = lr, p.beta1 = cfg_.beta1, p.beta2 = cfg_.beta2, p.eps = cfg_.eps, p.step = step_;
  // One call per run of consecutive parameters with the same decay setting.
  const auto& infos = ps_.infos();
  size_t i = 0;
  while (i < infos.size()) {
    size_t j = i;
    while (j + 1 < infos.size() && infos[j + 1].weight_decay == infos[i].weight_decay) ++j;
    const int64_t begin = infos[i].offset, end = infos[j].offset + infos[j].numel();
    p.weight_decay = infos[i].weight_decay ? wd : 0.0;
    Tensor w = ps_.flat_params().narrow(begin, end - begin);
    Tensor g = ps_.flat_grads().narrow(begin, end - begin);
    Tensor m = m_.narrow(begin, end - begin), v = v_.narrow(begin, end - begin);
    ops::adamw_step(w, g, m, v, p, Stream::cpu());
    i = j + 1;
  }
}

}  // namespace mcpp::optim
