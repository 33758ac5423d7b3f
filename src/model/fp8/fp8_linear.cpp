#include "model/fp8/fp8_linear.h"

#include <algorithm>
#include <cstdint>

#include "model/fp8/fp8_param.h"
#include "model/moe/experts.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

namespace {

// The state's prefix: a linear's name (its weight's without ".weight"); a routed expert's
// GEMM, whose weight is "<linear>.weight<e>" (model/moe/experts.h), the weight's name itself.
std::string prefix_of(const std::string& weight) {
  const std::string suffix = ".weight";
  if (weight.size() > suffix.size() &&
      weight.compare(weight.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight.substr(0, weight.size() - suffix.size());
  const size_t dot = weight.rfind(suffix);
  const bool expert =
      dot != std::string::npos && dot + suffix.size() < weight.size() &&
      weight.find_first_not_of("0123456789", dot + suffix.size()) == std::string::npos;
  MCPP_CHECK(expert, "Fp8Linear: '{}' is not a weight name", weight);
  return weight;
}

// Bit k set: operand k is E5M2.
int64_t e5m2_columns(const Fp8Config& f) { return f.grads_e5m2() ? int64_t(1) << kFp8Grad : 0; }

}  // namespace

ops::Fp8Format fp8_format_of(const Fp8Config& f, Fp8Operand k) {
  return k == kFp8Grad && f.grads_e5m2() ? ops::Fp8Format::E5M2 : ops::Fp8Format::E4M3;
}

Tensor as_2d(const Tensor& t) { return t.view({t.numel() / t.size(-1), t.size(-1)}); }

// Megatron puts every linear inside the layer in FP8; embedding, output layer, core
// attention and norms are not among them.
std::vector<std::string> fp8_linear_prefixes(const TransformerConfig& c, int layer) {
  std::vector<std::string> names;
  if (c.mla.on) {  // MLA's latent down projections and per-head up projections
    if (c.mla.q_lora_rank > 0)
      names = {"self_attention.linear_q_down_proj", "self_attention.linear_q_up_proj"};
    else
      names = {"self_attention.linear_q_proj"};
    names.insert(names.end(),
                 {"self_attention.linear_kv_down_proj", "self_attention.linear_kv_up_proj"});
  } else {
    names = {"self_attention.linear_qkv"};
  }
  names.push_back("self_attention.linear_proj");
  const bool moe = c.is_moe_layer(layer);
  if (!moe || c.moe.shared_ffn_hidden_size > 0) {  // a MoE layer's dense MLP: its shared experts
    const char* mlp = moe ? "mlp.shared_experts." : "mlp.";
    names.push_back(std::string(mlp) + "linear_fc1");
    names.push_back(std::string(mlp) + "linear_fc2");
  }
  for (std::string& n : names) n = layer_param_name(layer, n);
  return names;
}

std::string fp8_history_name(const std::string& prefix) { return prefix + ".fp8_amax_history"; }
std::string fp8_scale_name(const std::string& prefix) { return prefix + ".fp8_scale"; }

void add_fp8_buffers(const TransformerConfig& c, const std::vector<int>& layers,
                     ParamStore& store) {
  if (!c.fp8.delayed()) return;
  for (int l : layers) {
    if (!c.fp8.layer_in_fp8(l, c.num_layers)) continue;
    const bool moe = c.is_moe_layer(l);
    if (moe) {  // the routed experts' GEMMs, one state each, carrying the expert index
      std::vector<BufferInfo> experts;
      moe::GroupedExperts::add_fp8_buffers(c, l, experts);
      for (BufferInfo& b : experts) store.add_buffer(std::move(b));
    }
    // The scales start at 1 (Transformer Engine's initial scale); the history empty.
    auto add = [&](const std::string& p) {
      store.add_buffer({fp8_history_name(p),
                        {c.fp8.amax_history_len, 3},
                        {},
                        DType::F32,
                        TpSplit::None,
                        l,
                        -1,
                        Init::Zeros,
                        {}});
      store.add_buffer(
          {fp8_scale_name(p), {3}, {}, DType::F32, TpSplit::None, l, -1, Init::Ones, {}});
    };
    for (const std::string& p : fp8_linear_prefixes(c, l)) add(p);
    if (TransformerConfig::is_mtp_layer(l))  // the depth's eh_proj (model/mtp.h)
      add(mtp_eh_proj_name(int(l - TransformerConfig::kMtpLayerBase)));
  }
}

std::vector<Tensor> fp8_histories(const ParamStore& store, bool experts) {
  std::vector<Tensor> out;
  const auto& infos = store.buffer_infos();
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::string& n = infos[i].name;
    if ((infos[i].expert >= 0) != experts) continue;
    const std::string tail = ".fp8_amax_history";
    if (n.size() > tail.size() && n.compare(n.size() - tail.size(), tail.size(), tail) == 0)
      out.push_back(store.buffer(i));
  }
  return out;
}

void fp8_update_scales(const TransformerConfig& c, ParamStore& store, Stream& s) {
  if (!c.fp8.delayed()) return;
  const auto& infos = store.buffer_infos();
  for (size_t i = 0; i < infos.size(); ++i) {
    const std::string& n = infos[i].name;
    const std::string tail = ".fp8_amax_history";
    if (n.size() <= tail.size() || n.compare(n.size() - tail.size(), tail.size(), tail) != 0)
      continue;
    Tensor h = store.buffer(i);
    Tensor sc = store.buffer(n.substr(0, n.size() - tail.size()) + ".fp8_scale");
    ops::fp8_scale_update(h, sc, e5m2_columns(c.fp8), c.fp8.margin, c.fp8.amax_max,
                          /*roll=*/true, s);
  }
}

Fp8Linear::Fp8Linear(const ParamStore* store, const std::string& weight) {
  bind_param_weight(store, weight);  // --fp8-param-gather
  if (!store || !store->has(weight)) return;  // shape-only
  layer_ = store->info(weight).layer;
  if (layer_ < 0) layer_ = mtp_layer_of(weight);
  const std::string p = prefix_of(weight);
  if (store->has_buffer(fp8_history_name(p))) {
    history_ = store->buffer(fp8_history_name(p));
    scale_ = store->buffer(fp8_scale_name(p));
  }
}

bool Fp8Linear::on(const StepContext& cx) const {
  return layer_ >= 0 && cx.cfg && cx.cfg->fp8.layer_in_fp8(layer_, cx.cfg->num_layers);
}

Tensor Fp8Linear::scale_for(const Tensor& v, Fp8Operand k, bool tp_split, bool record,
                            Tensor* fused_amax, const StepContext& cx) const {
  const Fp8Config& f = cx.cfg->fp8;
  Stream& st = cx.stream();
  if (f.recipe == Fp8Config::Recipe::Delayed) {
    MCPP_CHECK(history_.defined(),
               "FP8 layer {}: no delayed-scaling state registered (add_fp8_buffers)", layer_);
    if (record && cx.keys.training) {
      Tensor amax = history_.view({history_.numel()}).narrow(k, 1);  // row 0, column k
      if (fused_amax)
        *fused_amax = amax;
      else
        ops::fp8_amax(v, amax, st);
    }
    return scale_.narrow(k, 1);
  }
  // tensorwise: the tensor's own amax (over TP when it is split)
  if (!cur_scale_.defined()) {
    ensure(cur_amax_, {1, 3}, DType::F32, v.device());
    ensure(cur_scale_, {3}, DType::F32, v.device());
    ops::fill(cur_scale_, 1.0, st);
  }
  Tensor amax = cur_amax_.view({3}).narrow(k, 1);
  ops::fill(amax, 0.0, st);
  ops::fp8_amax(v, amax, st);
  if (tp_split && cx.tp_comm) parallel::max_from_tp(amax, *cx.tp_comm, st);
  // A zero tensor keeps the previous scale: any scale quantises it to zeros.
  ops::fp8_scale_update(cur_amax_, cur_scale_, e5m2_columns(f), 0, false, false, st);
  return cur_scale_.narrow(k, 1);
}

const Tensor& Fp8Linear::quantize(const Tensor& v, Fp8Operand k, bool tp_split, bool record,
                                  const StepContext& cx) const {
  Tensor& q = q_[k];
  ensure(q, v.shape(), v.dtype(), v.device());
  const Tensor scale = scale_for(v, k, tp_split, record, nullptr, cx);
  ops::fp8_quantize(v, fp8_format_of(cx.cfg->fp8, k), scale, q, cx.stream());
  return q;
}

namespace {

// Activation and gradient casts go to scratch shared by every layer (one per operand
// kind and copy), grown to the largest tensor: each is read by the GEMM right after it on
// the same stream, so a later layer may overwrite it.
// Slots: the input and the weight one each (their row-wise copy is read only in the
// forward, their column-wise copy only in the backward: never both live), the gradient two
// (dgrad reads its row-wise copy, wgrad its column-wise one, after one cast). Sharing the
// input's slot takes the largest input's FP8 size (fc2's [T, F]: 256 MiB on GPT-3 XL) off
// the peak.
int slot_of(int k, bool colwise) { return k == kFp8Grad ? 2 * k + (colwise ? 1 : 0) : 2 * k; }

Tensor scratch_view(int slot, const Shape& shape, DType dt, Device dev) {
  static Tensor pool[6];
  Tensor& buf = pool[slot];
  const int64_t n = shape_numel(shape);
  if (!buf.defined() || buf.numel() < n || buf.dtype() != dt || buf.device() != dev)
    buf = Tensor::empty({std::max<int64_t>(n, buf.defined() ? buf.numel() : 0)}, dt, dev);
  return buf.narrow(0, n).view(shape);
}

// The bf16 tensors the fused casts take: every dimension the FP8 GEMMs accept (multiples
// of 16), 16-byte aligned.
bool fusable(const Tensor& v) {
  if (v.dtype() != DType::BF16 || v.device() != Device::CUDA || v.dim() < 2) return false;
  const int64_t C = v.size(-1), R = v.numel() / std::max<int64_t>(C, 1);
  return R % 16 == 0 && C % 16 == 0 && (reinterpret_cast<uintptr_t>(v.raw()) & 15) == 0;
}

}  // namespace

Fp8Linear::Cast& Fp8Linear::shared_cast(int k) {
  static Cast shared[3];
  return shared[k];
}

bool Fp8Linear::fused(const Tensor& v, const StepContext& cx) const {
  return on(cx) && cx.cfg->fp8.delayed() && fusable(v);
}

bool Fp8Linear::fused_swiglu(const Tensor& pre, const StepContext& cx) const {
  return fused(pre, cx) && wgrad(cx) && pre.size(-1) % 128 == 0;  // F % 64
}

void Fp8Linear::precast_act_input(const Tensor& pre, Tensor& act, bool backward, bool swiglu,
                                  const StepContext& cx) const {
  const Fp8Config& f = cx.cfg->fp8;
  const Tensor p2 = as_2d(pre);
  const int64_t R = p2.size(0), C = swiglu ? p2.size(1) / 2 : p2.size(1);
  Cast& c = shared_cast(kFp8Input);
  // act FP8: the kept column-wise copy (keeps_input_t), written with the row-wise one
  const bool keep = !backward && act.defined() && act.dtype() == kept_input_dtype();
  c.q = !backward ? scratch_view(slot_of(kFp8Input, false), {R, C}, DType::FP8E4M3, pre.device())
                  : Tensor();
  c.qt = backward ? scratch_view(slot_of(kFp8Input, true), {C, R}, DType::FP8E4M3, pre.device())
                  : keep ? act : Tensor();
  ensure(c.scale_inv, {1}, DType::F32, pre.device());
  Tensor amax;
  const Tensor scale = scale_for(p2, kFp8Input, false, !backward, &amax, cx);
  Tensor a2 = act.defined() && !keep ? as_2d(act) : Tensor();
  if (swiglu)
    ops::fp8_swiglu_cast(p2, fp8_format_of(f, kFp8Input), scale, a2, c.q, c.qt, amax, c.scale_inv,
                         cx.stream());
  else
    ops::fp8_gelu_cast(p2, fp8_format_of(f, kFp8Input), scale, a2, c.q, c.qt, amax, c.scale_inv,
                       cx.stream());
  if (keep) {
    ensure(kept_scale_inv_, {1}, DType::F32, pre.device());
    ops::copy(c.scale_inv, kept_scale_inv_, cx.stream());
  }
  precast_ |= 1u << kFp8Input;
}

void Fp8Linear::precast_act_grad(const Tensor& dact, const Tensor& pre, Tensor& dpre,
                                 const ParamView& b, bool swiglu, const StepContext& cx) const {
  const Fp8Config& f = cx.cfg->fp8;
  const ops::Fp8Format fmt = fp8_format_of(f, kFp8Grad);
  const DType dt = fmt == ops::Fp8Format::E5M2 ? DType::FP8E5M2 : DType::FP8E4M3;
  const Tensor d2 = as_2d(dact), p2 = as_2d(pre);
  const int64_t R = d2.size(0), C = p2.size(1);  // the gradient is pre's shape
  MCPP_CHECK(!swiglu || wgrad(cx), "Fp8Linear: the fused SwiGLU gradient cast needs FP8 wgrad");
  Cast& c = shared_cast(kFp8Grad);
  c.q = scratch_view(slot_of(kFp8Grad, false), {R, C}, dt, dact.device());
  c.qt = wgrad(cx) ? scratch_view(slot_of(kFp8Grad, true), {C, R}, dt, dact.device()) : Tensor();
  ensure(c.scale_inv, {1}, DType::F32, dact.device());
  Tensor amax;
  const Tensor scale = scale_for(d2, kFp8Grad, false, true, &amax, cx);
  Tensor out = wgrad(cx) ? Tensor() : as_2d(dpre);
  Tensor db = b.g;
  if (swiglu)
    ops::fp8_dswiglu_cast(d2, p2, fmt, scale, out, c.q, c.qt, amax, c.scale_inv, db, cx.stream());
  else
    ops::fp8_dgelu_cast(d2, p2, fmt, scale, out, c.q, c.qt, amax, c.scale_inv, db, cx.stream());
  precast_ |= 1u << kFp8Grad;
  if (db.defined()) precast_ |= kPrecastDb;
}

bool Fp8Linear::keeps_input_t(const TransformerConfig& c, const Dims& d, int64_t cols) const {
  const Fp8Config& f = c.fp8;
  return layer_ >= 0 && f.delayed() && f.wgrad && f.layer_in_fp8(layer_, c.num_layers) &&
         d.dev == Device::CUDA && d.dt == DType::BF16 && d.T % 16 == 0 && cols % 16 == 0;
}

void Fp8Linear::precast_input(const Tensor& x, Tensor& kept, const StepContext& cx) const {
  const Tensor x2 = as_2d(x);
  const int64_t R = x2.size(0), C = x2.size(1);
  MCPP_CHECK(fused(x2, cx) && kept.dtype() == kept_input_dtype() && kept.numel() == R * C,
             "Fp8Linear::precast_input: x {} / kept {} are not a fused FP8 cast's", x.str(),
             kept.str());
  Cast& c = shared_cast(kFp8Input);
  c.q = scratch_view(slot_of(kFp8Input, false), {R, C}, DType::FP8E4M3, x.device());
  c.qt = kept.view({C, R});
  ensure(c.scale_inv, {1}, DType::F32, x.device());
  Tensor amax;
  const Tensor scale = scale_for(x2, kFp8Input, false, true, &amax, cx);
  ops::fp8_cast_transpose(x2, fp8_format_of(cx.cfg->fp8, kFp8Input), scale, c.q, c.qt, amax,
                          c.scale_inv, cx.stream());
  ensure(kept_scale_inv_, {1}, DType::F32, x.device());
  ops::copy(c.scale_inv, kept_scale_inv_, cx.stream());
  precast_ |= 1u << kFp8Input;
}

void Fp8Linear::use_kept_input(const Tensor& kept, const StepContext& cx) const {
  MCPP_CHECK(kept.dtype() == kept_input_dtype() && kept.dim() == 2 && kept_scale_inv_.defined(),
             "Fp8Linear: kept input {} was not written by this step's forward", kept.str());
  Cast& c = shared_cast(kFp8Input);
  c.q = Tensor();
  c.qt = kept;
  ensure(c.scale_inv, {1}, DType::F32, kept.device());
  ops::copy(kept_scale_inv_, c.scale_inv, cx.stream());
  precast_ |= 1u << kFp8Input;
}

const Fp8Linear::Cast& Fp8Linear::cast(const Tensor& v, Fp8Operand k, bool tp_split, bool record,
                                       bool rowwise, bool colwise, const StepContext& cx,
                                       Tensor* db, bool* db_done) const {
  const Fp8Config& f = cx.cfg->fp8;
  const DType dt = fp8_format_of(f, k) == ops::Fp8Format::E5M2 ? DType::FP8E5M2 : DType::FP8E4M3;
  if ((precast_ >> k) & 1u) {  // cast already by a fused kernel
    if (db_done && (precast_ & kPrecastDb)) *db_done = true;
    return shared_cast(k);
  }
  const Tensor v2 = as_2d(v);
  const int64_t R = v2.size(0), C = v2.size(1);
  // The weight too is cast when a GEMM needs it, the copy that GEMM reads (row-wise in
  // fprop, column-wise in dgrad), into the shared scratch: no FP8 copy of any weight is
  // kept, so FP8 adds no weight-sized memory (docs/fp8.md: 2.4 GB on GPT-3 XL), for about
  // 0.6 ms more a step on the XL than one both-copies cast a step (more with several
  // micro-batches: each casts the weights again).
  Cast& c = shared_cast(k);
  MCPP_CHECK(k == kFp8Grad || !(rowwise && colwise),
             "Fp8Linear: operand {} cast both ways at once shares one scratch slot", int(k));
  c.q = rowwise ? scratch_view(slot_of(k, false), {R, C}, dt, v.device()) : Tensor();
  c.qt = colwise ? scratch_view(slot_of(k, true), {C, R}, dt, v.device()) : Tensor();
  ensure(c.scale_inv, {1}, DType::F32, v.device());
  Tensor amax;
  const Tensor scale = scale_for(v2, k, tp_split, record, &amax, cx);
  Tensor q = rowwise ? c.q : Tensor(), qt = colwise ? c.qt : Tensor();
  const bool with_db = db && db->defined() && (rowwise || colwise);
  if ((with_db || (rowwise && colwise)) && fusable(v2)) {
    // the bias gradient from the same read (its column sums); without one, the fused
    // kernel is still the faster both-copies cast (its row-wise stores are whole sectors)
    Tensor none;
    ops::fp8_cast_transpose_dbias(v2, fp8_format_of(f, k), scale, q, qt, amax, c.scale_inv,
                                  with_db ? *db : none, cx.stream());
    if (with_db && db_done) *db_done = true;
  } else {
    ops::fp8_cast_transpose(v2, fp8_format_of(f, k), scale, q, qt, amax, c.scale_inv, cx.stream());
  }
  return c;
}

void Fp8Linear::forward(const Tensor& x, bool x_split, const Tensor& w, const Tensor& b,
                        const Tensor& residual, Tensor& y, const StepContext& cx) const {
  if (blockwise(cx)) return block_forward(x, w, b, residual, y, cx);
  Stream& st = cx.stream();
  const bool tp = cx.tp_comm != nullptr;
  const Fp8ParamWeight* pw = param_weight();  // --fp8-param-gather: the optimizer's FP8 weight
  // Delayed: the weight's amax as measured by the optimizer's cast, recorded as this
  // layer's own weight cast would record it (training passes only).
  if (pw && cx.cfg->fp8.delayed()) scale_for(pw->amax, kFp8Weight, false, true, nullptr, cx);
  if (x.device() == Device::CPU) {  // the emulation
    const Tensor& xq = quantize(x, kFp8Input, x_split, true, cx);
    const Tensor& wq = pw ? pw->deq : quantize(w, kFp8Weight, tp, true, cx);
    if (residual.defined())
      ops::linear_residual_forward(xq, wq, b, residual, y, st);
    else
      ops::linear_forward(xq, wq, b, y, st);
    return;
  }
  const Cast& X = cast(x, kFp8Input, x_split, true, true, false, cx);
  const Cast pwc = pw ? Cast{pw->q, Tensor(), pw->scale_inv, Tensor(), Tensor()} : Cast{};
  const Cast& W = pw ? pwc : cast(w, kFp8Weight, tp, true, true, false, cx);
  Tensor y2 = as_2d(y);
  // fprop with Hopper's fast FP8 accumulation, as Transformer Engine
  ops::fp8_gemm(X.q, X.scale_inv, W.q, W.scale_inv, b, residual, false, true, y2, st);
}

void Fp8Linear::backward(const Tensor& dy, bool dy_split, const Tensor& x, bool x_split,
                         const ParamView& w, const ParamView& b, Tensor& dx, bool weights,
                         const StepContext& cx) const {
  Stream& st = cx.stream();
  Tensor none;
  const bool tp = cx.tp_comm != nullptr;
  const bool fp8_wgrad = weights && w.g.defined() && wgrad(cx);
  bool db_done = false;  // the bias gradient taken in the gradient's cast
  const Fp8ParamWeight* pw = param_weight();  // --fp8-param-gather: the optimizer's FP8 weight
  if (blockwise(cx)) {
    block_backward(dy, x, w, dx, fp8_wgrad, cx);
  } else if (dy.device() == Device::CPU) {  // the emulation
    const Tensor& gq = quantize(dy, kFp8Grad, dy_split, true, cx);
    if (dx.defined())
      ops::linear_backward(gq, x, pw ? pw->deq : quantize(w.w, kFp8Weight, tp, false, cx), dx,
                           false, none, none, st);
    if (fp8_wgrad) {
      Tensor dw = w.g;
      ops::linear_backward(gq, quantize(x, kFp8Input, x_split, false, cx), w.w, none, false, dw,
                           none, st);
    }
  } else {
    Tensor db = weights ? b.g : Tensor();
    const Cast& G = cast(dy, kFp8Grad, dy_split, true, dx.defined(), fp8_wgrad, cx, &db, &db_done);
    if (dx.defined()) {
      const Cast pwc = pw ? Cast{Tensor(), pw->qt, pw->scale_inv, Tensor(), Tensor()} : Cast{};
      const Cast& W = pw ? pwc : cast(w.w, kFp8Weight, tp, false, false, true, cx);
      Tensor dx2 = as_2d(dx);
      ops::fp8_gemm(G.q, G.scale_inv, W.qt, W.scale_inv, none, none, false, false, dx2, st);
    }
    if (fp8_wgrad) {
      const Cast& X = cast(x, kFp8Input, x_split, false, false, true, cx);
      Tensor dw = w.g;
      ops::fp8_gemm(G.qt, G.scale_inv, X.qt, X.scale_inv, none, none, true, false, dw, st);
    }
  }
  if (weights && w.g.defined() && !fp8_wgrad) {  // --no-fp8-wgrad
    Tensor dw = w.g;
    ops::linear_backward(dy, x, w.w, none, false, dw, none, st);
  }
  if (weights && b.g.defined() && !db_done) {  // from the unquantised gradient (TE's dbias)
    Tensor db = b.g;
    ops::linear_backward(dy, x, w.w, none, false, none, db, st);
  }
}

// ---- --fp8-param-gather (model/fp8/fp8_param.h) ---------------------------------------

void Fp8Linear::bind_param_weight(const ParamStore* store, const std::string& weight) {
  pg_store_ = store, pg_weight_ = weight;
}

// Looked up at each use: the optimizer attaches the FP8 weights after the layers exist.
const Fp8ParamWeight* Fp8Linear::param_weight() const {
  return find_fp8_param_weight(pg_store_, pg_weight_);
}

}  // namespace mcpp::model
