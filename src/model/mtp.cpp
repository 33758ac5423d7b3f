#include "model/mtp.h"

#include <string>

#include "ops/ops.h"

namespace mcpp::model {

namespace {

std::string mtp_prefix(int depth) { return "mtp.layers." + std::to_string(depth) + "."; }

int layer_id(int depth) { return TransformerConfig::kMtpLayerBase + depth; }

// x [B,S] rolled left by k along S, the last k columns zero (Megatron's roll_tensor applied
// k times).
template <class E>
Tensor rolled(const Tensor& x, int64_t k) {
  const int64_t B = x.size(0), S = x.size(1);
  Tensor y = Tensor::empty({B, S}, x.dtype());
  const E* in = x.data<E>();
  E* out = y.data<E>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s) out[b * S + s] = s + k < S ? in[b * S + s + k] : E(0);
  return y;
}

}  // namespace

MicroBatch mtp_rolled(const MicroBatch& mb, int64_t k) {
  for (const Tensor* t : {&mb.tokens, &mb.labels, &mb.loss_mask})
    MCPP_CHECK(t->dim() == 2 && t->device() == Device::CPU,
               "multi-token prediction: the micro-batch must arrive on the host as [B, S], got "
               "{}",
               t->str());
  MicroBatch r;
  r.tokens = rolled<int64_t>(mb.tokens, k);
  r.labels = rolled<int64_t>(mb.labels, k);
  r.loss_mask = rolled<float>(mb.loss_mask, k);
  return r;
}

void MtpLayer::add_params(const TransformerConfig& c, int depth, std::vector<ParamInfo>& params) {
  const std::string p = mtp_prefix(depth);
  const int64_t H = c.hidden_size;
  Norm::add_params(c, p + "enorm", -1, params);
  Norm::add_params(c, p + "hnorm", -1, params);
  // Megatron's eh_proj: a column-parallel linear without bias, initialised like the others.
  params.push_back(make_param(mtp_eh_proj_name(depth) + ".weight", {H, 2 * H}, TpSplit::None,
                              Init::Normal, c.init_method_std, true, -1, c.tp_size, /*sp=*/true));
  TransformerLayer::add_params(c, layer_id(depth), params);
  Norm::add_params(c, p + "final_layernorm", -1, params);
}

void MtpLayer::add_buffers(const TransformerConfig& c, int depth, std::vector<BufferInfo>& out) {
  TransformerLayer::add_buffers(c, layer_id(depth), out);
}

MtpLayer::MtpLayer(const TransformerConfig& c, int depth, const ParamStore* store)
    : cfg_(&c),
      depth_(depth),
      enorm_(c, store, mtp_prefix(depth) + "enorm"),
      hnorm_(c, store, mtp_prefix(depth) + "hnorm"),
      eh_proj_(ParamStore::view(store, mtp_eh_proj_name(depth) + ".weight")),
      eh_fp8_(store, mtp_eh_proj_name(depth) + ".weight"),
      layer_(std::make_unique<TransformerLayer>(c, layer_id(depth), store)),
      head_(c, store, mtp_prefix(depth) + "final_layernorm") {}

void MtpLayer::saved_specs(const Dims& d, bool copy_batch, Saved& s,
                           const TensorVisitor& v) const {
  Embedding::saved_specs(d, copy_batch, s.emb, v);
  v(s.e, {d.Tl, d.H}, d.dt, true);
  Norm::saved_specs(*cfg_, d, s.en, v);
  Norm::saved_specs(*cfg_, d, s.hn, v);
  v(s.cat, {d.Tl, 2 * d.H}, d.dt, true);
  v(s.x, {d.Tl, d.H}, d.dt, true);
  layer_->saved_specs(d, /*keep_mlp_activation=*/false, s.layer, v);
  v(s.t, {d.Tl, d.H}, d.dt, true);
  LmHead::saved_specs(*cfg_, d, copy_batch, s.head, v);
}

void MtpLayer::scratch_specs(const Dims& d, Workspace& ws, const TensorVisitor& v) const {
  layer_->scratch_specs(d, /*uses_scratch_activation=*/true, ws, v);
  Embedding::scratch_specs(d, ws, v);
  LmHead::scratch_specs(*cfg_, d, ws, v);
  v(ws.mtp_catT, {2 * d.H, d.Tl}, d.dt, true);
  v(ws.mtp_dcat, {d.Tl, 2 * d.H}, d.dt, true);
  for (Tensor& t : ws.mtp_dh) v(t, {d.Tl, d.H}, d.dt, true);
}

PendingLoss MtpLayer::forward(const Tensor& h_prev, const MicroBatch& mb, Saved& s,
                              Workspace& ws, const StepContext& cx, const Embedding& emb) const {
  Stream& st = cx.stream();
  const int64_t k = depth_ + 1, H = cx.H;
  // This depth's batch: every [B,S] tensor rolled k places left, zeros rolled in; under
  // context parallelism rolled over the whole sequence by the data loader, with the whole
  // sequence's token count.
  if (!mb.mtp.empty()) {
    MCPP_CHECK(mb.mtp.size() > size_t(depth_) && mb.mtp_tokens.size() > size_t(k),
               "multi-token prediction: the micro-batch carries {} rolled batches, depth {} "
               "needs its own",
               mb.mtp.size(), k);
    s.mb = mb.mtp[size_t(depth_)];
    s.n = mb.mtp_tokens[size_t(k)];
  } else {
    s.mb = mtp_rolled(mb, k);
    s.n = 0;
    for (int64_t i = 0; i < s.mb.loss_mask.numel(); ++i) s.n += s.mb.loss_mask.data<float>()[i];
  }
  emb.forward(s.mb.tokens, s.emb, s.e, cx, layer_id(depth_));
  enorm_.forward(s.e, s.en, cx);
  hnorm_.forward(h_prev, s.hn, cx);
  // [enorm(e) | hnorm(h)] row by row: both halves into the transposed buffer, then back.
  Tensor top = ws.mtp_catT.narrow(0, H), bottom = ws.mtp_catT.narrow(H, H);
  ops::transpose(s.en.y, top, st);
  ops::transpose(s.hn.y, bottom, st);
  ops::transpose(ws.mtp_catT, s.cat, st);
  // Under SP each TP rank holds its rows of cat: FP8's current scaling then takes the amax
  // over TP (x_split), so every rank quantises with the serial run's scale.
  if (eh_fp8_.on(cx))
    eh_fp8_.forward(s.cat, cx.sp && cx.tp_comm, eh_proj_.w, Tensor(), Tensor(), s.x, cx);
  else
    ops::linear_forward(s.cat, eh_proj_.w, Tensor(), s.x, st);
  layer_->forward(s.x, s.layer, s.t, ws, cx);
  return head_.forward(s.t, s.mb, s.head, ws, cx);
}

void MtpLayer::backward(const Tensor& h_prev, double scale, Saved& s, const Tensor* dh_next,
                        Tensor& dh_prev, Workspace& ws, const StepContext& cx, Embedding& emb) {
  Stream& st = cx.stream();
  const int64_t H = cx.H;
  head_.backward(s.t, scale, s.head, ws, cx, dh_next);  // ws.dx = d t
  layer_->backward(s.x, s.layer, ws, cx);                // ws.dx = d x
  if (eh_fp8_.on(cx)) {
    const bool split = cx.sp && cx.tp_comm;
    eh_fp8_.backward(ws.dx, split, s.cat, split, eh_proj_, ParamView{}, ws.mtp_dcat, true, cx);
  } else {
    Tensor none;
    ops::linear_backward(ws.dx, s.cat, eh_proj_.w, ws.mtp_dcat, false, eh_proj_.g, none, st);
  }
  ops::transpose(ws.mtp_dcat, ws.mtp_catT, st);
  const Tensor de = ws.mtp_catT.narrow(0, H), dh = ws.mtp_catT.narrow(H, H);
  ops::transpose(de, ws.dln, st);
  ops::transpose(dh, ws.dtmp, st);
  hnorm_.backward(ws.dtmp, h_prev, s.hn, dh_prev, false, cx);
  enorm_.backward(ws.dln, s.e, s.en, ws.dx, false, cx);  // ws.dx = d e
  emb.backward(s.mb.tokens, s.emb, ws, cx, layer_id(depth_));
}

}  // namespace mcpp::model
