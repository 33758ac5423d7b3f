// GPTModel forward and backward. Shapes: T = S*B token rows (sequence-first),
// H hidden, QKVW = NG*(NH/NG+2)*HD (local), F ffn (local), Vp padded vocab (local).
// Accumulation: parameter gradients +=; everything else =.
//
// Tensor parallelism (Megatron-Core's ColumnParallelLinear / RowParallelLinear /
// VocabParallelEmbedding / vocab_parallel_cross_entropy): QKV, fc1 and the output layer
// are column-parallel (input through copy_to_tp, or the sequence-parallel all-gather),
// proj and fc2 row-parallel (output through reduce_from_tp, or the sequence-parallel
// reduce-scatter, then the bias once). With --sequence-parallel the norms, dropout and
// residual stream hold Tl = S/TP*B rows [S/TP, B, H] of the sequence; the *_full buffers
// hold the gathered T = S*B rows the parallel linears see. Without SP, Tl = T and every
// *_full tensor is the local one.
#include "model/gpt_model.h"

#include <cmath>

#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

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
  Tensor ln1, mean1, rstd1;  // [Tl,H], [Tl], [Tl]
  Tensor ln1_full, ln2_full;  // [T,H] gathered norm outputs (SP only)
  Tensor qkv;                // [T,QKVW], after RoPE: exactly what attention saw
  Tensor ctx, lse;           // [T,NH*HD], [B,NH,S]
  Tensor x2;                 // [Tl,H] residual stream after attention
  Tensor ln2, mean2, rstd2;  // [Tl,H], [Tl], [Tl]
  Tensor fc1, act;           // [T,FC1W], [T,F]
};

// Model-level activations and backward scratch.
struct GPTModel::Saved {
  int64_t S = 0, B = 0;
  MicroBatch mb;
  StepKeys keys;
  std::vector<Tensor> hidden;  // L+1 x [Tl,H]: hidden[l] is layer l's input
  Tensor emb;                  // [Tl,H] embedding before dropout
  Tensor emb_full;             // [T,H] partial word embeddings before the reduce-scatter (SP)
  Tensor lnf, meanf, rstdf;    // final norm, [Tl,H]
  Tensor lnf_full;             // [T,H] (SP)
  Tensor logits;               // [T,Vp]; overwritten by its gradient in backward
  Tensor tokens, labels, mask_bs;  // the batch on the model's device, [B, S]
  Tensor targets, mask;        // [T] i64, [T] stat dtype (sequence-first order)
  Tensor mask_f32;             // [T] f32 (mask before a cast to f64 on CPU)
  Tensor row_max, sum_exp, target_logit, losses;  // [T]
  Tensor tmp;                  // [Tl,H] forward scratch
  Tensor tmp_full;             // [T,H] row-parallel partial output (SP)
  Tensor ones;                 // [Tl,1] of ones: the bias add after a TP reduction
  // Backward scratch.
  Tensor dx, dtmp, dln, dfc1, dact, dctx, dqkv, dloss;
  Tensor dtmp_full, dln_full;  // [T,H] (SP)
};

GPTModel::GPTModel(const TransformerConfig& cfg, comm::Communicator* tp)
    : cfg_(cfg), tp_(tp), saved_(std::make_unique<Saved>()) {
  cfg_.validate();
  if (cfg_.tp_size > 1) {
    // Without a communicator the model holds one TP rank's parameters (checkpoint
    // conversion, tests) but cannot run: forward() says so.
    MCPP_CHECK(!tp_ || (tp_->size() == cfg_.tp_size && tp_->rank() == cfg_.tp_rank),
               "GPTModel with tp_size {} (rank {}) got the TP communicator {} of rank {}",
               cfg_.tp_size, cfg_.tp_rank, tp_ ? tp_->describe() : "", tp_ ? tp_->rank() : -1);
  } else {
    tp_ = nullptr;  // a group of one: every region transition is the identity
  }
  register_params();
  params_.allocate(cfg_.dtype, cfg_.grad_dtype(), cfg_.device, cfg_.tp_rank, cfg_.tp_size,
                   cfg_.param_align);
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

// ---- tensor-parallel region transitions around the parallel linears -------------------

void GPTModel::tp_all_reduce(Tensor& t, comm::ReduceOp op, Stream& st) {
  if (tp_) tp_->all_reduce(t, op, st);
}

// Column-parallel input: x [Tl,H] -> x_full [T,H] (SP all-gather); else the identity
// copy_to_tp (x_full is x).
void GPTModel::column_input(const Tensor& x, Tensor& x_full, Stream& st) {
  if (!tp_) return;
  if (cfg_.sp()) parallel::gather_from_sp(x, x_full, *tp_, st);
  else parallel::copy_to_tp(x, *tp_, st);
}

// Its dual: dx_full [T,H] partial over TP -> dx [Tl,H] (SP reduce-scatter), or the
// all-reduce in place (dx_full is dx).
void GPTModel::column_input_backward(Tensor& dx_full, Tensor& dx, Stream& st) {
  if (!tp_) return;
  if (cfg_.sp()) parallel::gather_from_sp_backward(dx_full, dx, *tp_, st);
  else parallel::copy_to_tp_backward(dx_full, *tp_, st);
}

// Row-parallel linear: y = x @ w^T summed over TP (x [T, in/TP], w [H, in/TP]), then
// the bias once, after the reduction. SP: the partial y_full [T,H] is reduce-scattered
// into y [Tl,H]; else y_full is y and is all-reduced.
void GPTModel::row_output(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y_full,
                          Tensor& y, Stream& st) {
  if (!tp_) {
    ops::linear_forward(x, w, b, y, st);
    return;
  }
  ops::linear_forward(x, w, Tensor(), y_full, st);
  if (cfg_.sp()) parallel::reduce_scatter_to_sp(y_full, y, *tp_, st);
  else parallel::reduce_from_tp(y, *tp_, st);
  if (b.defined()) {  // y[Tl,H] += ones[Tl,1] @ b[1,H]
    Tensor b2 = b.view({1, b.numel()});
    ops::gemm(false, false, 1.0, saved_->ones, b2, 1.0, y, st);
  }
}

// Its dual: dy [Tl,H] -> dy_full [T,H] (SP all-gather; else the identity), then the local
// GEMMs. The bias gradient is taken from the whole dy_full, so it is complete (and equal)
// on every TP rank and needs no reduction afterwards.
void GPTModel::row_output_backward(const Tensor& dy, Tensor& dy_full, const Tensor& x,
                                   const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                                   Stream& st) {
  if (tp_) {
    if (cfg_.sp()) parallel::reduce_scatter_to_sp_backward(dy, dy_full, *tp_, st);
    else parallel::reduce_from_tp_backward(dy, *tp_, st);
  }
  ops::linear_backward(cfg_.sp() ? dy_full : dy, x, w, dx, false, dw, db, st);
}

bool GPTModel::tp_duplicated(size_t i) const {
  return cfg_.tp_size > 1 && params_.infos()[i].split == TpSplit::None;
}

bool GPTModel::sp_partial_grad(size_t i) const {
  // Every TP-duplicated parameter acts on the sequence shard under SP (norms, position
  // embeddings); row-parallel biases are complete already (see row_output_backward).
  const auto& p = params_.infos()[i];
  return tp_ && cfg_.sp() && p.split == TpSplit::None &&
         !p.name.ends_with("linear_proj.bias") && !p.name.ends_with("linear_fc2.bias");
}

void GPTModel::finalize_tp_grads() {
  if (!tp_ || !cfg_.sp()) return;
  Stream& st = ops::default_stream(cfg_.device);
  for (size_t i = 0; i < params_.infos().size(); ++i) {
    if (!sp_partial_grad(i)) continue;
    Tensor g = params_.grad(i);
    tp_->all_reduce(g, comm::ReduceOp::Sum, st);
  }
}

double GPTModel::forward(const MicroBatch& mb, const StepKeys& keys) {
  const auto& c = cfg_;
  auto& sv = *saved_;
  Stream& st = ops::default_stream(c.device);
  MCPP_CHECK(mb.tokens.dim() == 2 && mb.tokens.dtype() == DType::I64,
             "tokens must be i64 [B, S], got {}", mb.tokens.str());
  const int64_t B = mb.tokens.size(0), S = mb.tokens.size(1), T = S * B, H = c.hidden_size;
  MCPP_CHECK(S <= c.seq_length || c.rope, "sequence {} longer than --seq-length {}", S,
             c.seq_length);
  MCPP_CHECK(c.tp_size == 1 || tp_, "GPTModel::forward at tp_size {} without the TP communicator",
             c.tp_size);
  const bool sp = c.sp();
  MCPP_CHECK(!sp || S % c.tp_size == 0,
             "sequence parallelism needs the sequence ({}) divisible by TP ({})", S, c.tp_size);
  // This rank's sequence shard: rows [s0, s0 + Sl) of the sequence.
  const int64_t Sl = sp ? S / c.tp_size : S, s0 = sp ? c.tp_rank * Sl : 0, Tl = Sl * B;
  const DType dt = c.dtype, sdt = c.stat_dtype();
  const Device dev = c.device;
  sv.S = S, sv.B = B, sv.mb = mb, sv.keys = keys;
  const Tensor& tokens = on_device(mb.tokens, sv.tokens, dev, st);
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  const double p_hidden = keys.training ? c.hidden_dropout : 0.0;
  const double p_attn = keys.training ? c.attention_dropout : 0.0;
  // Dropout masks on global (s, b, h) indices: the same for any TP/SP/DP split.
  ops::GlobalIndex3 g{{s0, keys.sample_offset, 0}, {S, Bg, H}};

  sv.hidden.resize(c.num_layers + 1);
  for (auto& h : sv.hidden) ensure(h, {Tl, H}, dt, dev);
  ensure(sv.emb, {Sl, B, H}, dt, dev);
  if (tp_) {
    ensure(sv.ones, {Tl, 1}, dt, dev);
    ops::fill(sv.ones, 1.0, st);
  }
  if (sp) ensure(sv.emb_full, {S, B, H}, dt, dev), ensure(sv.tmp_full, {T, H}, dt, dev);

  // Embedding: vocab-parallel word lookup (rows outside this rank's vocabulary slice are
  // zero), summed over TP (SP: reduce-scattered to the sequence shard), + learned
  // position, then embedding dropout.
  Tensor emb3 = sv.emb;
  Tensor& word = sp ? sv.emb_full : emb3;
  ops::embedding_forward(tokens, params_.param("embedding.word_embeddings.weight"),
                         c.tp_rank * c.vocab_local(), word, st);
  if (tp_) {
    if (sp) parallel::reduce_scatter_to_sp(word, emb3, *tp_, st);
    else parallel::reduce_from_tp(emb3, *tp_, st);
  }
  if (!c.rope)
    ops::position_embedding_forward(params_.param("embedding.position_embeddings.weight"), s0,
                                    emb3, st);
  Tensor h0 = sv.hidden[0].view({Sl, B, H});
  ops::dropout_add_forward(emb3, Tensor(), p_hidden, dropout_key(c, keys, c.num_layers, kEmbedding),
                           g, h0, st);

  ops::AttentionDims ad;
  ad.S = S, ad.B = B, ad.NH = c.local_heads(), ad.NG = c.local_groups(), ad.HD = c.kv_channels;
  ad.b_offset = keys.sample_offset, ad.h_offset = c.tp_rank * c.local_heads();
  ad.NH_global = c.num_attention_heads, ad.S_global = S;
  const double scale = 1.0 / std::sqrt(double(c.kv_channels));
  const int64_t NHD = c.local_heads() * c.kv_channels;
  ensure(sv.tmp, {Tl, H}, dt, dev);
  Tensor& tmp = sv.tmp;
  Tensor& tmp_full = sp ? sv.tmp_full : tmp;

  for (int l = 0; l < c.num_layers; ++l) {
    Layer& L = *layers_[l];
    const Tensor& x = sv.hidden[l];
    ensure(L.ln1, {Tl, H}, dt, dev), ensure(L.rstd1, {Tl}, sdt, dev);
    if (!c.rmsnorm) ensure(L.mean1, {Tl}, sdt, dev);
    ensure(L.qkv, {T, c.qkv_width_local()}, dt, dev);
    ensure(L.ctx, {T, NHD}, dt, dev), ensure(L.lse, {B, c.local_heads(), S}, sdt, dev);
    ensure(L.x2, {Tl, H}, dt, dev);
    ensure(L.ln2, {Tl, H}, dt, dev), ensure(L.rstd2, {Tl}, sdt, dev);
    if (!c.rmsnorm) ensure(L.mean2, {Tl}, sdt, dev);
    ensure(L.fc1, {T, c.fc1_width_local()}, dt, dev), ensure(L.act, {T, c.ffn_local()}, dt, dev);
    if (sp) ensure(L.ln1_full, {T, H}, dt, dev), ensure(L.ln2_full, {T, H}, dt, dev);
    Tensor& ln1 = sp ? L.ln1_full : L.ln1;
    Tensor& ln2 = sp ? L.ln2_full : L.ln2;

    norm_forward(c, x, L.ln1_w, L.ln1_b, L.ln1, L.mean1, L.rstd1, st);
    column_input(L.ln1, ln1, st);
    ops::linear_forward(ln1, L.qkv_w, L.qkv_b, L.qkv, st);
    if (c.rope) ops::rope_forward(L.qkv, ad, c.rot_dim(), c.rotary_base, 0, L.qkv, st);
    ops::attention_forward(L.qkv, ad, scale, p_attn, dropout_key(c, keys, l, kAttnProbs), L.ctx,
                           L.lse, st);
    row_output(L.ctx, L.proj_w, L.proj_b, tmp_full, tmp, st);
    Tensor tmp3 = tmp.view({Sl, B, H}), x3 = x.view({Sl, B, H}), x23 = L.x2.view({Sl, B, H});
    ops::dropout_add_forward(tmp3, x3, p_hidden, dropout_key(c, keys, l, kAfterProj), g, x23, st);

    norm_forward(c, L.x2, L.ln2_w, L.ln2_b, L.ln2, L.mean2, L.rstd2, st);
    column_input(L.ln2, ln2, st);
    ops::linear_forward(ln2, L.fc1_w, L.fc1_b, L.fc1, st);
    if (c.swiglu) ops::swiglu_forward(L.fc1, L.act, st);
    else ops::gelu_forward(L.fc1, L.act, st);
    row_output(L.act, L.fc2_w, L.fc2_b, tmp_full, tmp, st);
    Tensor out3 = sv.hidden[l + 1].view({Sl, B, H});
    ops::dropout_add_forward(tmp3, x23, p_hidden, dropout_key(c, keys, l, kAfterFc2), g, out3,
                             st);
  }

  // Head: final norm, column-parallel output layer (tied: the word embedding) giving this
  // rank's vocabulary slice of the logits, vocab-parallel cross-entropy.
  const int64_t V = c.vocab_local();
  ensure(sv.lnf, {Tl, H}, dt, dev), ensure(sv.rstdf, {Tl}, sdt, dev);
  if (!c.rmsnorm) ensure(sv.meanf, {Tl}, sdt, dev);
  if (sp) ensure(sv.lnf_full, {T, H}, dt, dev);
  Tensor& lnf = sp ? sv.lnf_full : sv.lnf;
  ensure(sv.logits, {T, V}, dt, dev);
  norm_forward(c, sv.hidden[c.num_layers], params_.param("decoder.final_layernorm.weight"),
               c.rmsnorm ? Tensor() : params_.param("decoder.final_layernorm.bias"), sv.lnf,
               sv.meanf, sv.rstdf, st);
  column_input(sv.lnf, lnf, st);
  const Tensor w_out = c.tie_embeddings ? params_.param("embedding.word_embeddings.weight")
                                        : params_.param("output_layer.weight");
  ops::linear_forward(lnf, w_out, Tensor(), sv.logits, st);

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
  // Megatron's vocab_parallel_cross_entropy: the row max is all-reduced (MAX) before the
  // exponentials, the sums of exponentials and the target logit (SUM) after.
  ops::ce_row_max(sv.logits, sv.row_max, st);
  tp_all_reduce(sv.row_max, comm::ReduceOp::Max, st);
  ops::ce_sum_exp_target(sv.logits, sv.row_max, sv.targets, c.tp_rank * V, sv.sum_exp,
                         sv.target_logit, st);
  tp_all_reduce(sv.sum_exp, comm::ReduceOp::Sum, st);
  tp_all_reduce(sv.target_logit, comm::ReduceOp::Sum, st);
  ops::ce_loss(sv.row_max, sv.sum_exp, sv.target_logit, sv.losses, st);
  return ops::dot(sv.losses, sv.mask, st);  // synchronises: the caller logs it
}

void GPTModel::backward(double grad_scale) {
  const auto& c = cfg_;
  auto& sv = *saved_;
  MCPP_CHECK(sv.S > 0, "GPTModel::backward without a forward");
  Stream& st = ops::default_stream(c.device);
  const int64_t S = sv.S, B = sv.B, T = S * B, H = c.hidden_size, V = c.vocab_local();
  const bool sp = c.sp();
  const int64_t Sl = sp ? S / c.tp_size : S, s0 = sp ? c.tp_rank * Sl : 0, Tl = Sl * B;
  const DType dt = c.dtype, sdt = c.stat_dtype();
  const Device dev = c.device;
  const auto& keys = sv.keys;
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  const double p_hidden = keys.training ? c.hidden_dropout : 0.0;
  const double p_attn = keys.training ? c.attention_dropout : 0.0;
  ops::GlobalIndex3 g{{s0, keys.sample_offset, 0}, {S, Bg, H}};
  ensure(sv.dx, {Tl, H}, dt, dev), ensure(sv.dtmp, {Tl, H}, dt, dev);
  ensure(sv.dln, {Tl, H}, dt, dev), ensure(sv.dloss, {S, B}, sdt, dev);
  if (sp) ensure(sv.dtmp_full, {T, H}, dt, dev), ensure(sv.dln_full, {T, H}, dt, dev);
  Tensor& dln_full = sp ? sv.dln_full : sv.dln;
  auto ready = [&](int layer) {
    if (grad_ready_) grad_ready_(layer);
  };

  // d loss / d token_loss = mask * grad_scale.
  ops::copy(sv.mask, sv.dloss, st);
  ops::scale(sv.dloss, grad_scale, st);
  ops::ce_backward(sv.logits, sv.row_max, sv.sum_exp, sv.targets, c.tp_rank * V, sv.dloss,
                   sv.logits, st);
  const bool tied = c.tie_embeddings;
  const std::string w_out_name = tied ? "embedding.word_embeddings.weight" : "output_layer.weight";
  Tensor w_out = params_.param(w_out_name), dw_out = params_.grad(w_out_name), none;
  ops::linear_backward(sv.logits, sp ? sv.lnf_full : sv.lnf, w_out, dln_full, false, dw_out,
                       none, st);
  column_input_backward(dln_full, sv.dln, st);
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
  Tensor dx3 = sv.dx.view({Sl, B, H}), dtmp3 = sv.dtmp.view({Sl, B, H});
  Tensor& dtmp_full = sp ? sv.dtmp_full : sv.dtmp;

  for (int l = int(c.num_layers) - 1; l >= 0; --l) {
    Layer& L = *layers_[l];
    // MLP block: out = x2 + dropout(fc2(act(fc1(norm(x2))))).
    ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, l, kAfterFc2), g, dtmp3, st);
    row_output_backward(sv.dtmp, dtmp_full, L.act, L.fc2_w, sv.dact, L.d_fc2_w, L.d_fc2_b, st);
    if (c.swiglu) ops::swiglu_backward(sv.dact, L.fc1, sv.dfc1, st);
    else ops::gelu_backward(sv.dact, L.fc1, sv.dfc1, st);
    ops::linear_backward(sv.dfc1, sp ? L.ln2_full : L.ln2, L.fc1_w, dln_full, false, L.d_fc1_w,
                         L.d_fc1_b, st);
    column_input_backward(dln_full, sv.dln, st);
    norm_backward(c, sv.dln, L.x2, L.ln2_w, L.mean2, L.rstd2, sv.dx, true, L.d_ln2_w, L.d_ln2_b,
                  st);
    // Attention block: x2 = x + dropout(proj(attn(rope(qkv(norm(x)))))).
    ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, l, kAfterProj), g, dtmp3, st);
    row_output_backward(sv.dtmp, dtmp_full, L.ctx, L.proj_w, sv.dctx, L.d_proj_w, L.d_proj_b,
                        st);
    ops::attention_backward(sv.dctx, L.qkv, L.ctx, L.lse, ad, scale, p_attn,
                            dropout_key(c, keys, l, kAttnProbs), sv.dqkv, st);
    if (c.rope) ops::rope_backward(sv.dqkv, ad, c.rot_dim(), c.rotary_base, 0, sv.dqkv, st);
    ops::linear_backward(sv.dqkv, sp ? L.ln1_full : L.ln1, L.qkv_w, dln_full, false, L.d_qkv_w,
                         L.d_qkv_b, st);
    column_input_backward(dln_full, sv.dln, st);
    norm_backward(c, sv.dln, sv.hidden[l], L.ln1_w, L.mean1, L.rstd1, sv.dx, true, L.d_ln1_w,
                  L.d_ln1_b, st);
    ready(l);
  }

  // Embedding dropout, then the scatter-add into the word (and position) tables. The
  // word embedding's dual: identity after an all-reduce, all-gather after the SP
  // reduce-scatter.
  ops::dropout_backward(dx3, p_hidden, dropout_key(c, keys, c.num_layers, kEmbedding), g, dtmp3,
                        st);
  if (!c.rope) {
    Tensor dpos = params_.grad("embedding.position_embeddings.weight");
    ops::position_embedding_backward(dtmp3, s0, dpos, st);
  }
  Tensor dword = dtmp3;
  if (tp_) {
    if (sp) {
      dword = sv.dtmp_full.view({S, B, H});
      parallel::reduce_scatter_to_sp_backward(dtmp3, dword, *tp_, st);
    } else {
      parallel::reduce_from_tp_backward(dtmp3, *tp_, st);
    }
  }
  Tensor dwe = params_.grad("embedding.word_embeddings.weight");
  const Tensor& tokens = sv.mb.tokens.device() == dev ? sv.mb.tokens : sv.tokens;
  ops::embedding_backward(dword, tokens, c.tp_rank * V, dwe, st);
  ready(-1);
  sv.S = 0;  // activations consumed
}


const Tensor& GPTModel::logits() const { return saved_->logits; }
const Tensor& GPTModel::token_losses() const { return saved_->losses; }

}  // namespace mcpp::model
