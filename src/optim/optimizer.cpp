#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "ops/momentum_step.h"
#include "ops/ops.h"
#include "ops/split_main.h"

namespace mcpp::optim {

const char* rule_name(UpdateRule r) {
  switch (r) {
    case UpdateRule::Adam: return "adam";
    case UpdateRule::Sgd: return "sgd";
    case UpdateRule::Lion: return "lion";
  }
  return "?";
}

Stream& Optimizer::stream() const { return ops::default_stream(ps_.device()); }

std::string Optimizer::state_name() const {
  if (!muon_) return rule_name(cfg_.rule);
  const std::string base = muon_->adaptive ? "adaptive_muon" : "muon";
  return cfg_.rule == UpdateRule::Lion ? base + "_lion" : base;
}

void Optimizer::allocate_state(const Shape& shape, DType dtype, Device dev) {
  Stream& st = ops::default_stream(dev);
  const bool f32 = dtype == DType::F32;
  MCPP_CHECK(cfg_.rule == UpdateRule::Adam ||
                 (cfg_.exp_avg_dtype == DType::F32 && cfg_.exp_avg_sq_dtype == DType::F32),
             "the {} optimizer keeps its state in fp32 (bf16 moments are Adam's)",
             rule_name(cfg_.rule));
  m_ = Tensor::empty(shape, f32 ? cfg_.exp_avg_dtype : dtype, dev);
  ops::fill(m_, 0.0, st);
  if (cfg_.rule != UpdateRule::Adam) return;
  v_ = Tensor::empty(shape, f32 ? cfg_.exp_avg_sq_dtype : dtype, dev);
  ops::fill(v_, 0.0, st);
}

bool Optimizer::mup_matrix_like(const model::ParamInfo& p) {
  // Megatron's is_vector_like_parameter: one dimension, or an embedding parameter (the word
  // and position embeddings, the output layer).
  return p.global_shape.size() >= 2 && !p.embedding_or_output &&
         p.name != "embedding.position_embeddings.weight";
}

bool Optimizer::mup_hidden(size_t param) const {
  const auto& p = ps_.infos()[param];
  return mup_matrix_like(p) && !(muon_ && muon_steps(p));
}

double Optimizer::lr_of(size_t param, double lr) const {
  if (decoupled_lr_ && ps_.infos()[param].embedding_or_output) return *decoupled_lr_;
  if (mup_) {
    const bool hidden = mup_hidden(param);
    if (hidden && mup_->hidden_lr) return *mup_->hidden_lr;
    if (!hidden && mup_->vector_lr) return *mup_->vector_lr;
  }
  return lr;
}

double Optimizer::eps_of(size_t param) const {
  return mup_ && mup_->hidden_eps && mup_hidden(param) ? *mup_->hidden_eps : cfg_.eps;
}

void Optimizer::update_span(Tensor w, Tensor lo, const Tensor& g, Tensor m, Tensor v,
                            Tensor model, double lr, double wd, double eps, Stream& st) {
  if (cfg_.rule == UpdateRule::Adam) {
    ops::AdamWParams p;
    p.lr = lr, p.beta1 = cfg_.beta1, p.beta2 = cfg_.beta2, p.eps = eps, p.step = step_;
    p.weight_decay = wd, p.grad_scale = grad_scale_;  // clip()'s factor, in this pass
    if (lo.defined()) return ops::adamw_step_split(model, lo, g, m, v, p, st);
    return ops::adamw_step(w, g, m, v, model, p, st);
  }
  ops::MomentumStepParams p;
  p.rule = cfg_.rule == UpdateRule::Lion ? ops::MomentumStepParams::Rule::Lion
                                         : ops::MomentumStepParams::Rule::Sgd;
  p.lr = lr, p.weight_decay = wd, p.grad_scale = grad_scale_;
  p.momentum = cfg_.sgd_momentum, p.first = !momentum_started_;
  p.beta1 = cfg_.lion_beta1, p.beta2 = cfg_.lion_beta2;
  // SGD without momentum keeps no state: its (zero) buffer is not passed.
  if (p.rule == ops::MomentumStepParams::Rule::Sgd && p.momentum == 0) m = Tensor();
  if (lo.defined()) return ops::momentum_step_split(model, lo, g, m, p, st);
  ops::momentum_step(w, g, m, model, p, st);
}

double Optimizer::grad_sq_norm(const ParamFilter* counted) const {
  // Runs in buffer order: the distributed optimizer's segments are in bucket order, which
  // is not the shard's.
  std::vector<const ShardSegment*> order;
  for (const auto& s : segments()) order.push_back(&s);
  std::sort(order.begin(), order.end(),
            [](const ShardSegment* a, const ShardSegment* b) { return a->shard < b->shard; });
  Stream& st = ops::default_stream(grads().device());
  const Tensor& g = grads();
  std::vector<Tensor> runs;  // the counted runs of the buffer, summed with one wait
  int64_t begin = -1, end = -1;
  auto flush = [&] {
    if (begin >= 0) runs.push_back(g.narrow(begin, end - begin));
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
  double sum = 0;
  for (double v : ops::sum_squares_each(runs, st)) sum += v;
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

bool Optimizer::wants_split_main(DType model_dtype) {
  const char* e = std::getenv("MCPP_FP32_MAIN_PARAMS");
  return model_dtype == DType::BF16 && !(e && std::strcmp(e, "1") == 0);
}

int64_t Optimizer::main_param_bytes(DType model_dtype, bool fp8_param_gather) {
  if (model_dtype == DType::F32 || model_dtype == DType::F64) return 0;
  return !fp8_param_gather && wants_split_main(model_dtype) ? 2 : 4;
}

// The device buffer of split_from / join_to: 16M elements (64 MiB) at a time.
static constexpr int64_t kSplitChunk = int64_t(1) << 24;

void Optimizer::split_from(const Tensor& values, Tensor model, Tensor lo, Stream& st) {
  if (values.device() == model.device()) return ops::split_main_params(values, model, lo, st);
  const int64_t n = model.numel();
  Tensor tmp = Tensor::empty({std::min(n, kSplitChunk)}, DType::F32, model.device());
  for (int64_t i = 0; i < n; i += kSplitChunk) {
    const int64_t c = std::min(kSplitChunk, n - i);
    Tensor t = tmp.narrow(0, c);
    ops::copy(values.narrow(i, c), t, st);
    Tensor mc = model.narrow(i, c), lc = lo.defined() ? lo.narrow(i, c) : Tensor();
    ops::split_main_params(t, mc, lc, st);
  }
}

void Optimizer::join_to(const Tensor& model, const Tensor& lo, Tensor out, Stream& st) {
  if (out.device() == model.device()) return ops::join_main_params(model, lo, out, st);
  const int64_t n = model.numel();
  Tensor tmp = Tensor::empty({std::min(n, kSplitChunk)}, DType::F32, model.device());
  for (int64_t i = 0; i < n; i += kSplitChunk) {
    const int64_t c = std::min(kSplitChunk, n - i);
    Tensor t = tmp.narrow(0, c), o = out.narrow(i, c);
    ops::join_main_params(model.narrow(i, c), lo.narrow(i, c), t, st);
    ops::copy(t, o, st);
  }
}

AdamW::AdamW(model::ParamStore& ps, OptimizerConfig cfg) : Optimizer(ps, cfg) {
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    segs_.push_back({i, p.offset, p.offset, p.numel()});
  }
  const Tensor& p = ps.flat_params();
  const DType pd = p.dtype();
  const bool in_place = pd == DType::F32 || pd == DType::F64;
  const DType sd = in_place ? pd : DType::F32;  // optimizer state dtype
  Stream& st = ops::default_stream(p.device());
  if (wants_split_main(pd)) {
    // The main parameters start as the model's bf16 values: lower halves zero.
    lo_ = Tensor::empty(p.shape(), DType::U16, p.device());
    ops::clear_main_lo(lo_, st);
  } else if (!in_place) {
    main_ = Tensor::empty(p.shape(), DType::F32, p.device());
    ops::copy(p, main_, st);
  }
  allocate_state(p.shape(), sd, p.device());
}

double AdamW::grad_sq_norm(const ParamFilter* counted) const {
  if (counted) return Optimizer::grad_sq_norm(counted);
  return ops::sum_squares(ps_.flat_grads(), stream());
}

int64_t AdamW::state_bytes() const {
  int64_t b = 0;
  for (const Tensor* t : {&m_, &v_, &main_, &lo_})
    if (t->defined()) b += int64_t(t->nbytes());
  return b;
}

double AdamW::main_sum_squares(int64_t offset, int64_t n) const {
  Stream& st = stream();
  if (main_.defined()) return ops::sum_squares(main_.narrow(offset, n), st);
  const Tensor& p = ps_.flat_params();
  if (!lo_.defined()) return ops::sum_squares(p.narrow(offset, n), st);
  double sum = 0;
  Tensor tmp = Tensor::empty({std::min(n, kSplitChunk)}, DType::F32, p.device());
  for (int64_t i = 0; i < n; i += kSplitChunk) {
    const int64_t c = std::min(kSplitChunk, n - i);
    Tensor t = tmp.narrow(0, c);
    ops::join_main_params(p.narrow(offset + i, c), lo_.narrow(offset + i, c), t, st);
    sum += ops::sum_squares(t, st);
  }
  return sum;
}

Tensor AdamW::full_main_params() {
  if (!lo_.defined()) return main_;
  const Tensor& p = ps_.flat_params();
  Tensor out = Tensor::empty(p.shape(), DType::F32);
  join_to(p, lo_, out, stream());
  return out;
}

void AdamW::load_state(const Tensor& values, const Tensor* exp_avg, const Tensor* exp_avg_sq) {
  set_params(values);
  MCPP_CHECK(!exp_avg_sq || v_.defined(),
             "AdamW::load_state: a second moment given to the {} rule", rule_name(cfg_.rule));
  if (exp_avg) ops::copy(*exp_avg, m_, stream());
  if (exp_avg_sq) ops::copy(*exp_avg_sq, v_, stream());
  set_state_loaded(exp_avg != nullptr);
}

void AdamW::set_params(const Tensor& values) {
  Stream& st = ops::default_stream(ps_.device());
  if (lo_.defined()) {
    split_from(values, ps_.flat_params(), lo_, st);
  } else if (main_.defined()) {
    ops::copy(values, main_, st);
    ops::copy(main_, ps_.flat_params(), st);
  } else {
    ops::copy(values, ps_.flat_params(), st);
  }
}

void AdamW::step(double lr, double wd) {
  ++step_;
  Stream& st = ops::default_stream(ps_.device());
  Tensor& weights = main_.defined() ? main_ : ps_.flat_params();
  // One call per run of consecutive parameters with the same decay setting. With fp32 main
  // params the call also writes the run's model params (bf16/f16, rounded to nearest even):
  // Megatron's _copy_main_params_to_model_params, done in the step's own pass; split ones
  // (bf16) are the model params and their lower halves, both written by the step. The padding
  // between runs is never stepped, so it keeps the zeros both buffers start with.
  const auto& infos = ps_.infos();
  auto by_muon = [&](size_t k) { return muon_ && muon_steps(infos[k]); };
  std::vector<size_t> muon_params;
  size_t i = 0;
  while (i < infos.size()) {
    if (by_muon(i)) {
      muon_params.push_back(i++);
      continue;
    }
    size_t j = i;
    while (j + 1 < infos.size() && infos[j + 1].weight_decay == infos[i].weight_decay &&
           lr_of(j + 1, lr) == lr_of(i, lr) && eps_of(j + 1) == eps_of(i) && !by_muon(j + 1))
      ++j;
    const int64_t begin = infos[i].offset, end = infos[j].offset + infos[j].numel();
    auto span = [&](const Tensor& t) { return t.defined() ? t.narrow(begin, end - begin) : t; };
    Tensor model = main_.defined() || lo_.defined() ? span(ps_.flat_params()) : Tensor();
    update_span(span(weights), span(lo_), span(ps_.flat_grads()), span(m_), span(v_), model,
                lr_of(i, lr), infos[i].weight_decay ? wd : 0.0, eps_of(i), st);
    i = j + 1;
  }
  // Muon's matrices in windows of at most muon_window_bytes() of fp32 updates (at least one
  // matrix): the matrices of one shape in a window share their Newton-Schulz GEMMs, and
  // the window bounds the step's temporary memory.
  const int64_t window = muon_window_bytes();
  for (size_t a = 0; a < muon_params.size();) {
    size_t b = a;
    int64_t bytes = 0;
    std::vector<const model::ParamInfo*> ps;
    std::vector<Tensor> us;
    while (b < muon_params.size() &&
           (b == a || bytes + infos[muon_params[b]].numel() * 4 <= window)) {
      bytes += infos[muon_params[b]].numel() * 4;
      ps.push_back(&infos[muon_params[b]]);
      us.push_back(muon_momentum(muon_params[b], st));
      ++b;
    }
    const std::vector<Tensor> upd = muon_updates(ps, us, *muon_, muon_groups_, st);
    us.clear();
    for (size_t k = a; k < b; ++k) {
      const size_t p = muon_params[k];
      if (muon_->adaptive) {  // adaptive_muon: the second moment, the scale again
        Tensor u = upd[k - a], v = v_.narrow(infos[p].offset, infos[p].numel());
        ops::adamuon_normalize(u, v, muon_->adaptive_beta2, muon_->adaptive_eps,
                               muon_adaptive_scale(infos[p], *muon_), st);
      }
      muon_apply(p, lr_of(p, lr), infos[p].weight_decay ? wd : 0.0, upd[k - a], st);
    }
    a = b;
  }
  finish_step();
}

void Optimizer::enable_muon(const MuonConfig& c, const MuonGroups& g) {
  MCPP_CHECK(cfg_.rule == UpdateRule::Adam || cfg_.rule == UpdateRule::Lion,
             "Muon's scalar rule is adam or lion, not {}", rule_name(cfg_.rule));
  MCPP_CHECK(m_.dtype() == DType::F32, "Muon keeps its momentum in fp32, not {}",
             dtype_name(m_.dtype()));
  muon_ = c;
  muon_groups_ = g;
  // adaptive_muon's second moment sits where Adam's is (zero on the matrices until now);
  // with Lion as the scalar rule there is no such buffer yet.
  if (c.adaptive && !v_.defined()) {
    v_ = Tensor::empty(m_.shape(), DType::F32, m_.device());
    ops::fill(v_, 0.0, ops::default_stream(m_.device()));
  }
}

int64_t Optimizer::muon_window_bytes() {
  static const int64_t n = [] {
    const char* e = std::getenv("MCPP_MUON_WINDOW_BYTES");
    const long long v = e ? std::strtoll(e, nullptr, 10) : 0;
    return v > 0 ? int64_t(v) : int64_t(256) << 20;
  }();
  return n;
}

void Optimizer::muon_momentum_span(const Tensor& g_in, Tensor m, Tensor u, Stream& st) const {
  const MuonConfig& c = *muon_;
  Tensor g = g_in;
  if (g.dtype() != DType::F32) {  // bf16 gradients: widened once
    g = Tensor::empty(g_in.shape(), DType::F32, g_in.device());
    ops::copy(g_in, g, st);
  }
  ops::scale(m, c.momentum, st);
  ops::axpy((1.0 - c.momentum) * grad_scale_, g, m, st);
  if (!u.defined()) return;
  ops::copy(m, u, st);
  ops::scale(u, c.momentum, st);
  ops::axpy((1.0 - c.momentum) * grad_scale_, g, u, st);
}

void Optimizer::muon_apply_span(Tensor model, Tensor main, Tensor lo, const Tensor& update,
                                double lr, double wd, Stream& st) const {
  Tensor w = main;
  if (!w.defined() && lo.defined()) {
    w = Tensor::empty(model.shape(), DType::F32, model.device());
    ops::join_main_params(model, lo, w, st);
  } else if (!w.defined()) {
    MCPP_CHECK(model.dtype() == DType::F32, "Muon: parameters of {}; f32, bf16 or f16 expected",
               dtype_name(model.dtype()));
    w = model;
  }
  if (wd != 0.0) ops::axpy(-wd * lr, w, w, st);  // decoupled: W -= lr wd W
  ops::axpy(-lr, update, w, st);
  if (main.defined())
    ops::copy(w, model, st);  // rounded to the model's dtype, as after the other rules
  else if (lo.defined())
    ops::split_main_params(w, model, lo, st);
}

Tensor AdamW::muon_momentum(size_t i, Stream& st) {
  const model::ParamInfo& p = ps_.infos()[i];
  const int64_t off = p.offset, n = p.numel();
  const Shape& shape = p.local_shape;
  // U may be M itself: muon_updates reads, never writes.
  Tensor m = m_.narrow(off, n).view(shape);
  Tensor u = muon_->nesterov ? Tensor::empty(shape, DType::F32, ps_.device()) : Tensor();
  muon_momentum_span(ps_.flat_grads().narrow(off, n).view(shape), m, u, st);
  return u.defined() ? u : m;
}

void AdamW::muon_apply(size_t i, double lr, double wd, const Tensor& update, Stream& st) {
  const model::ParamInfo& p = ps_.infos()[i];
  const int64_t off = p.offset, n = p.numel();
  const Shape& shape = p.local_shape;
  auto span = [&](const Tensor& t) { return t.defined() ? t.narrow(off, n).view(shape) : t; };
  muon_apply_span(span(ps_.flat_params()), span(main_), span(lo_), update, lr, wd, st);
}

}  // namespace mcpp::optim
