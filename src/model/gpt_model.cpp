// GPTModel forward and backward. Shapes: T = S*B token rows (sequence-first),
// H hidden, QKVW = NG*(NH/NG+2)*HD (local), F ffn (local), Vp padded vocab (local).
// Accumulation: parameter gradients +=; everything else =.
#include "model/gpt_model.h"

#include <cmath>

#include "ops/ops.h"

namespace mcpp::model {

std::string layer_param_name(int layer, const std::string& suffix) {
  return "decoder.layers." + std::to_string(layer) + "." + suffix;
}

namespace {

// Dropout sites inside a layer; each gets its own Philox stream per iteration.
enum Site : uint64_t { kAttnProbs = 0, kAfterProj = 1, kAfterFc2 = 2, kEmbedding = 3 };

ops::DropoutKey dropout_key(const TransformerConfig& c, const StepKeys& k, int64_t layer,
                            Site site) {
  // Seed separated from initialisation's streams; (iteration, layer, site) -> stream.
  return {c.seed ^ 0x9e3779b97f4a7c15ull,
          (uint64_t(k.iteration + 1) << 24) ^ (uint64_t(layer) << 4) ^ uint64_t(site)};
}

}  // namespace

// Named views of one layer's parameters and gradients (undefined when absent).
struct GPTModel::Layer {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  Tensor d_ln1_w, d_ln1_b, d_qkv_w, d_qkv_b, d_proj_w, d_proj_b, d_ln2_w, d_ln2_b, d_fc1_w,
      d_fc1_b, d_fc2_w, d_fc2_b;
  // Saved activations (reused across micro-batches).
  Tensor ln1, mean1, rstd1;  // [T,H], [T], [T]
  Tensor qkv;                // [T,QKVW], after RoPE: exactly what attention saw
  Tensor ctx, lse;           // [T,NH*HD], [B,NH,S]
  Tensor x2;                 // [T,H] residual stream after attention
  Tensor ln2, mean2, rstd2;  // [T,H], [T], [T]
  Tensor fc1, act;           // [T,FC1W], [T,F]
};

// Model-level activations and backward scratch.
struct GPTModel::Saved {
  int64_t S = 0, B = 0;
  MicroBatch mb;
  StepKeys keys;
  std::vector<Tensor> hidden;  // L+1 x [T,H]: hidden[l] is layer l's input
  Tensor emb;                  // [T,H] embedding before dropout
  Tensor lnf, meanf, rstdf;    // final norm
  Tensor logits;               // [T,Vp]; overwritten by its gradient in backward
  Tensor tokens, labels, mask_bs;  // the batch on the model's device, [B, S]
  Tensor targets, mask;        // [T] i64, [T] stat dtype (sequence-first order)
  Tensor mask_f32;             // [T] f32 (mask before a cast to f64 on CPU)
  Tensor row_max, sum_exp, target_logit, losses;  // [T]
  Tensor tmp;                  // [T,H] forward scratch
  // Backward scratch.
  Tensor dx, dtmp, dln, dfc1, dact, dctx, dqkv, dloss;
};

GPTModel::GPTModel(const TransformerConfig& cfg) : cfg_(cfg), saved_(std::make_unique<Saved>()) {
  cfg_.validate();
  register_params();
  params_.allocate(cfg_.dtype, cfg_.grad_dtype(), cfg_.device, cfg_.tp_rank, cfg_.tp_size);
  params_.initialize(cfg_.seed);
  for (int l = 0; l < cfg_.num_layers; ++l) {
    auto L = std::make_unique<Layer>();
    auto get = [&](const std::string& suffix, Tensor& p, Tensor& g) {
      std::string n = layer_param_name(l, suffix);
      if (params_.has(n)) p = params_.param(n), g = params_.grad(n);
    };
    get("input_layernorm.weight", L->ln1_w, L->d_ln1_w);
    get("input_layernorm.bias", L->ln1_b, L->d_ln1_b);
    get("self_attention.linear_qkv.weight", L->qkv_w, L->d_qkv_w);
    get("self_attention.linear_qkv.bias", L->qkv_b, L->d_qkv_b);
    get("self_attention.linear_proj.weight", L->proj_w, L->d_proj_w);
    get("self_attention.linear_proj.bias", L->proj_b, L->d_proj_b);
    get("pre_mlp_layernorm.weight", L->ln2_w, L->d_ln2_w);
    get("pre_mlp_layernorm.bias", L->ln2_b, L->d_ln2_b);
    get("mlp.linear_fc1.weight", L->fc1_w, L->d_fc1_w);
    get("mlp.linear_fc1.bias", L->fc1_b, L->d_fc1_b);
    get("mlp.linear_fc2.weight", L->fc2_w, L->d_fc2_w);
    get("mlp.linear_fc2.bias", L->fc2_b, L->d_fc2_b);
    layers_.push_back(std::move(L));
  }
}

GPTModel::~GPTModel() = default;

void GPTModel::register_params() {
  const auto& c = cfg_;
  const int64_t H = c.hidden_size, tp = c.tp_size;
  const double std_out = c.init_method_std / std::sqrt(2.0 * double(c.num_layers));
  auto add = [&](std::string name, Shape global, TpSplit split, Init init, double sd, bool wd,
                 int layer) {
    Shape local = global;
    if (split == TpSplit::Rows || split == TpSplit::SwigluRows) local[0] /= tp;
    if (split == TpSplit::Cols) local[1] /= tp;
    params_.add({std::move(name), global, local, split, init, sd, wd, layer, 0});
  };
  add("embedding.word_embeddings.weight", {c.padded_vocab_size, H}, TpSplit::Rows, Init::Normal,
      c.init_method_std, true, -1);
  if (!c.rope)
    add("embedding.position_embeddings.weight", {c.max_position_embeddings, H}, TpSplit::None,
        Init::Normal, c.init_method_std, true, -1);
  const int64_t F = c.ffn_hidden_size, fc1 = (c.swiglu ? 2 : 1) * F;
  const int64_t NHD = c.num_attention_heads * c.kv_channels;
  for (int l = 0; l < c.num_layers; ++l) {
    auto n = [&](const char* s) { return layer_param_name(l, s); };
    add(n("input_layernorm.weight"), {H}, TpSplit::None, Init::Ones, 0, false, l);
    if (!c.rmsnorm) add(n("input_layernorm.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
    add(n("self_attention.linear_qkv.weight"), {c.qkv_width(), H}, TpSplit::Rows, Init::Normal,
        c.init_method_std, true, l);
    if (c.add_bias_linear)
      add(n("self_attention.linear_qkv.bias"), {c.qkv_width()}, TpSplit::Rows, Init::Zeros, 0,
          false, l);
    add(n("self_attention.linear_proj.weight"), {H, NHD}, TpSplit::Cols, Init::Normal, std_out,
        true, l);
    if (c.add_bias_linear)
      add(n("self_attention.linear_proj.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
    add(n("pre_mlp_layernorm.weight"), {H}, TpSplit::None, Init::Ones, 0, false, l);
    if (!c.rmsnorm) add(n("pre_mlp_layernorm.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
    TpSplit fc1_split = c.swiglu ? TpSplit::SwigluRows : TpSplit::Rows;
    add(n("mlp.linear_fc1.weight"), {fc1, H}, fc1_split, Init::Normal, c.init_method_std, true, l);
    if (c.add_bias_linear)
      add(n("mlp.linear_fc1.bias"), {fc1}, fc1_split, Init::Zeros, 0, false, l);
    add(n("mlp.linear_fc2.weight"), {H, F}, TpSplit::Cols, Init::Normal, std_out, true, l);
    if (c.add_bias_linear)
      add(n("mlp.linear_fc2.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
  }
  add("decoder.final_layernorm.weight", {H}, TpSplit::None, Init::Ones, 0, false, -1);
  if (!c.rmsnorm)
    add("decoder.final_layernorm.bias", {H}, TpSplit::None, Init::Zeros, 0, false, -1);
  if (!c.tie_embeddings)
    add("output_layer.weight", {c.padded_vocab_size, H}, TpSplit::Rows, Init::Normal,
        c.init_method_std, true, -1);
}

namespace {

// (Re)allocates t when its shape or dtype differs; activations are reused across
// micro-batches, so a training step allocates nothing once shapes are settled.
void ensure(Tensor& t, const Shape& shape, DType dt, Device dev) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dt || t.device() != dev)
    t = Tensor::empty(shape, dt, dev);
}

// The batch tensor on the model's device: `src` itself when it is there, else a copy
// into the reused buffer `buf`.
const Tensor& on_device(const Tensor& src, Tensor& buf, Device dev, Stream& st) {
  if (src.device() == dev) return src;
  ensure(buf, src.shape(), src.dtype(), dev);
  ops::copy(src, buf, st);
  return buf;
}

void norm_forward(const TransformerConfig& c, const Tensor& x, const Tensor& w, const Tensor& b,
                  Tensor& y, Tensor& mean, Tensor& rstd, Stream& s) {
  if (c.rmsnorm) ops::rmsnorm_forward(x, w, c.norm_epsilon, y, rstd, s);
  else ops::layernorm_forward(x, w, b, c.norm_epsilon, y, mean, rstd, s);
}

void norm_backward(const TransformerConfig& c, const Tensor& dy, const Tensor& x,
                   const Tensor& w, const Tensor& mean, const Tensor& rstd, Tensor& dx,
                   bool accumulate, Tensor& dw, Tensor& db, Stream& s) {
  if (c.rmsnorm) ops::rmsnorm_backward(dy, x, w, rstd, dx, accumulate, dw, s);
  else ops::layernorm_backward(dy, x, w, mean, rstd, dx, accumulate, dw, db, s);
}

}  // namespace

double GPTModel::forward(const MicroBatch& mb, const StepKeys& keys) {
  const auto& c = cfg_;
  auto& sv = *saved_;
  Stream& st = ops::default_stream(c.device);
  MCPP_CHECK(mb.tokens.dim() == 2 && mb.tokens.dtype() == DType::I64,
             "tokens must be i64 [B, S], got {}", mb.tokens.str());
  const int64_t B = mb.tokens.size(0), S = mb.tokens.size(1), T = S * B, H = c.hidden_size;
  MCPP_CHECK(S <= c.seq_length || c.rope, "sequence {} longer than --seq-length {}", S,
             c.seq_length);
  const DType dt = c.dtype, sdt = c.stat_dtype();
  const Device dev = c.device;
  sv.S = S, sv.B = B, sv.mb = mb, sv.keys = keys;
  const Tensor& tokens = on_device(mb.tokens, sv.tokens, dev, st);
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  const double p_hidden = keys.training ? c.hidden_dropout : 0.0;
  const double p_attn = keys.training ? c.attention_dropout : 0.0;
  ops::GlobalIndex3 g{{0, keys.sample_offset, 0}, {S, Bg, H}};

  sv.hidden.resize(c.num_layers + 1);
  for (auto& h : sv.hidden) ensure(h, {T, H}, dt, dev);
  ensure(sv.emb, {S, B, H}, dt, dev);

  // Embedding: word (+ learned position), then embedding dropout.
  Tensor emb3 = sv.emb;
  ops::embedding_forward(tokens, params_.param("embedding.word_embeddings.weight"),
                         c.tp_rank * c.vocab_local(), emb3, st);
  if (!c.rope)
    ops::position_embedding_forward(params_.param("embedding.position_embeddings.weight"), 0,
                                    emb3, st);
  Tensor h0 = sv.hidden[0].view({S, B, H});
  ops::dropout_add_forward(emb3, Tensor(), p_hidden, dropout_key(c, keys, c.num_layers, kEmbedding),
                           g, h0, st);

  ops::AttentionDims ad;
  ad.S = S, ad.B = B, ad.NH = c.local_heads(), ad.NG = c.local_groups(), ad.HD = c.kv_channels;
  ad.b_offset = keys.sample_offset, ad.h_offset = c.tp_rank * c.local_heads();
  ad.NH_global = c.num_attention_heads, ad.S_global = S;
  const double scale = 1.0 / std::sqrt(double(c.kv_channels));
  const int64_t NHD = c.local_heads() * c.kv_channels;
  ensure(sv.tmp, {T, H}, dt, dev);
  Tensor& tmp = sv.tmp;

  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = *layers_[l];
    const Tensor& x = sv.hidden[l];
    ensure(L.ln1, {T, H}, dt, dev), ensure(L.rstd1, {T}, sdt, dev);
    if (!c.rmsnorm) ensure(L.mean1, {T}, sdt, dev);
    ensure(L.qkv, {T, c.qkv_width_local()}, dt, dev);
    ensure(L.ctx, {T, NHD}, dt, dev), ensure(L.lse, {B, c.local_heads(), S}, sdt, dev);
    ensure(L.x2, {T, H}, dt, dev);
    ensure(L.ln2, {T, H}, dt, dev), ensure(L.rstd2, {T}, sdt, dev);
    if (!c.rmsnorm) ensure(L.mean2, {T}, sdt, dev);
    ensure(L.fc1, {T, c.fc1_width_local()}, dt, dev), ensure(L.act, {T, c.ffn_local()}, dt, dev);

    norm_forward(c, x, L.ln1_w, L.ln1_b, L.ln1, L.mean1, L.rstd1, st);
    ops::linear_forward(L.ln1, L.qkv_w, L.qkv_b, L.qkv, st);
    if (c.rope) ops::rope_forward(L.qkv, ad, c.rot_dim(), c.rotary_base, 0, L.qkv, st);
    ops::attention_forward(L.qkv, ad, scale, p_attn, dropout_key(c, keys, l, kAttnProbs), L.ctx,
                           L.lse, st);
    ops::linear_forward(L.ctx, L.proj_w, L.proj_b, tmp, st);
    Tensor tmp3 = tmp.view({S, B, H}), x3 = x.view({S, B, H}), x23 = L.x2.view({S, B, H});
    ops::dropout_add_forward(tmp3, x3, p_hidden, dropout_key(c, keys, l, kAfterProj), g, x23, st);

    norm_forward(c, L.x2, L.ln2_w, L.ln2_b, L.ln2, L.mean2, L.rstd2, st);
    ops::linear_forward(L.ln2, L.fc1_w, L.fc1_b, L.fc1, st);
    if (c.swiglu) ops::swiglu_forward(L.fc1, L.act, st);
    else ops::gelu_forward(L.fc1, L.act, st);
    ops::linear_forward(L.act, L.fc2_w, L.fc2_b, tmp, st);
    Tensor out3 = sv.hidden[l + 1].view({S, B, H});
    ops::dropout_add_forward(tmp3, x23, p_hidden, dropout_key(c, keys, l, kAfterFc2), g, out3,
                             st);
  }

  // Head: final norm, output layer (tied: the word embedding), cross-entropy.
  const int64_t V = c.vocab_local();
  ensure(sv.lnf, {T, H}, dt, dev), ensure(sv.rstdf, {T}, sdt, dev);
  if (!c.rmsnorm) ensure(sv.meanf, {T}, sdt, dev);
  ensure(sv.logits, {T, V}, dt, dev);
  norm_forward(c, sv.hidden[c.num_layers], params_.param("decoder.final_layernorm.weight"),
               c.rmsnorm ? Tensor() : params_.param("decoder.final_layernorm.bias"), sv.lnf,
               sv.meanf, sv.rstdf, st);
  const Tensor w_out = c.tie_embeddings ? params_.param("embedding.word_embeddings.weight")
                                        : params_.param("output_layer.weight");
  ops::linear_forward(sv.lnf, w_out, Tensor(), sv.logits, st);

  // Labels and mask to sequence-first order: row t = s*B + b.
  MCPP_CHECK(mb.labels.dtype() == DType::I64 && mb.loss_mask.dtype() == DType::F32,
             "labels must be i64 and loss_mask f32 [B, S], got {} and {}", mb.labels.str(),
             mb.loss_mask.str());
  const Tensor& labels = on_device(mb.labels, sv.labels, dev, st);
  const Tensor& mask_bs = on_device(mb.loss_mask, sv.mask_bs, dev, st);
  ensure(sv.targets, {S, B}, DType::I64, dev), ensure(sv.mask_f32, {S, B}, DType::F32, dev);
  ops::transpose(labels, sv.targets, st);
  ops::transpose(mask_bs, sv.mask_f32, st);
  if (sdt == DType::F32) {
    sv.mask = sv.mask_f32;
  } else {
    ensure(sv.mask, {S, B}, sdt, dev);
    ops::copy(sv.mask_f32, sv.mask, st);
  }
  ensure(sv.row_max, {T}, sdt, dev), ensure(sv.sum_exp, {T}, sdt, dev);
  ensure(sv.target_logit, {T}, sdt, dev), ensure(sv.losses, {T}, sdt, dev);
  // With TP the row_max (MAX) and sum_exp / target_logit (SUM) are all-reduced here.
  ops::ce_row_max(sv.logits, sv.row_max, st);
  ops::ce_sum_exp_target(sv.logits, sv.row_max, sv.targets, c.tp_rank * V, sv.sum_exp,
                         sv.target_logit, st);
  ops::ce_loss(sv.row_max, sv.sum_exp, sv.target_logit, sv.losses, st);
  return ops::dot(sv.losses, sv.mask, st);  // synchronises: the caller logs it
}

void GPTModel::backward(double grad_scale) {
  const auto& c = cfg_;
  auto& sv = *saved_;
  MCPP_CHECK(sv.S > 0, "GPTModel::backward without a forward");
  Stream& st = ops::default_stream(c.device);
  const int64_t S = sv.S, B = sv.B, T = S * B, H = c.hidden_size, V = c.vocab_local();
  const DType dt = c.dtype, sdt = c.stat_dtype();
  const Device dev = c.device;
  const auto& keys = sv.keys;
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  const double p_hidden = keys.training ? c.hidden_dropout : 0.0;
  const double p_attn = keys.training ? c.attention_dropout : 0.0;
  ops::GlobalIndex3 g{{0, keys.sample_offset, 0}, {S, Bg, H}};
  ensure(sv.dx, {T, H}, dt, dev), ensure(sv.dtmp, {T, H}, dt, dev);
  ensure(sv.dln, {T, H}, dt, dev), ensure(sv.dloss, {S, B}, sdt, dev);

  // d loss / d token_loss = mask * grad_scale.
  ops::copy(sv.mask, sv.dloss, st);
  ops::scale(sv.dloss, grad_scale, st);
  ops::ce_backward(sv.logits, sv.row_max, sv.sum_exp, sv.targets, c.tp_rank * V, sv.dloss,
                   sv.logits, st);
  const bool tied = c.tie_embeddings;
  const std::string w_out_name = tied ? "embedding.word_embeddings.weight" : "output_layer.weight";
  Tensor w_out = params_.param(w_out_name), dw_out = params_.grad(w_out_name), none;
  ops::linear_backward(sv.logits, sv.lnf, w_out, sv.dln, false, dw_out, none, st);
  Tensor dwf = params_.grad("decoder.final_layernorm.weight");
  Tensor dbf = c.rmsnorm ? Tensor() : params_.grad("decoder.final_layernorm.bias");
  norm_backward(c, sv.dln, sv.hidden[c.num_layers],
                params_.param("decoder.final_layernorm.weight"), sv.meanf, sv.rstdf, sv.dx, false,
                dwf, dbf, st);

  ops::AttentionDims ad;
  ad.S = S, ad.B = B, ad.NH = c.local_heads(), ad.NG = c.local_groups(), ad.HD = c.kv_channels;
  ad.b_offset = keys.sample_offset, ad.h_offset = c.tp_rank * c.local_heads();
  ad.NH_global = c.num_attention_heads, ad.S_global = S;
  const double scale = 1.0 / std::sqrt(double(c.kv_channels));
  const int64_t NHD = c.local_heads() * c.kv_channels;
  ensure(sv.dfc1, {T, c.fc1_width_local()}, dt, dev);
  ensure(sv.dact, {T, c.ffn_local()}, dt, dev);
  ensure(sv.dctx, {T, NHD}, dt, dev), ensure(sv.dqkv, {T, c.qkv_width_local()}, dt, dev);
  Tensor dx3 = sv.dx.view({S, B, H}), dtmp3 = sv.dtmp.view({S, B, H});

  for (int l = int(c.num_layers) - 1; l >= 0; --l) {
    Layer& L = *layers_[l];
    // MLP block: out = x2 + dropout(fc2(act(fc1(norm(x2))))).
    ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, l, kAfterFc2), g, dtmp3, st);
    ops::linear_backward(sv.dtmp, L.act, L.fc2_w, sv.dact, false, L.d_fc2_w, L.d_fc2_b, st);
    if (c.swiglu) ops::swiglu_backward(sv.dact, L.fc1, sv.dfc1, st);
    else ops::gelu_backward(sv.dact, L.fc1, sv.dfc1, st);
    ops::linear_backward(sv.dfc1, L.ln2, L.fc1_w, sv.dln, false, L.d_fc1_w, L.d_fc1_b, st);
    norm_backward(c, sv.dln, L.x2, L.ln2_w, L.mean2, L.rstd2, sv.dx, true, L.d_ln2_w, L.d_ln2_b,
                  st);
    // Attention block: x2 = x + dropout(proj(attn(rope(qkv(norm(x)))))).
    ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, l, kAfterProj), g, dtmp3, st);
    ops::linear_backward(sv.dtmp, L.ctx, L.proj_w, sv.dctx, false, L.d_proj_w, L.d_proj_b, st);
    ops::attention_backward(sv.dctx, L.qkv, L.ctx, L.lse, ad, scale, p_attn,
                            dropout_key(c, keys, l, kAttnProbs), sv.dqkv, st);
    if (c.rope) ops::rope_backward(sv.dqkv, ad, c.rot_dim(), c.rotary_base, 0, sv.dqkv, st);
    ops::linear_backward(sv.dqkv, L.ln1, L.qkv_w, sv.dln, false, L.d_qkv_w, L.d_qkv_b, st);
    norm_backward(c, sv.dln, sv.hidden[l], L.ln1_w, L.mean1, L.rstd1, sv.dx, true, L.d_ln1_w,
                  L.d_ln1_b, st);
  }

  // Embedding dropout, then the scatter-add into the word (and position) tables.
  ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, c.num_layers, kEmbedding), g, dtmp3,
                        st);
  Tensor dwe = params_.grad("embedding.word_embeddings.weight");
  const Tensor& tokens = sv.mb.tokens.device() == dev ? sv.mb.tokens : sv.tokens;
  ops::embedding_backward(dtmp3, tokens, c.tp_rank * V, dwe, st);
  if (!c.rope) {
    Tensor dpos = params_.grad("embedding.position_embeddings.weight");
    ops::position_embedding_backward(dtmp3, 0, dpos, st);
  }
  sv.S = 0;  // activations consumed
}

const Tensor& GPTModel::logits() const { return saved_->logits; }
const Tensor& GPTModel::token_losses() const { return saved_->losses; }

}  // namespace mcpp::model
