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

#include <omp.h>

#include <chrono>
#include <cmath>

#include "base/log.h"
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
  int global = 0;  // global layer id (parameter names, dropout streams, hooks)
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
  Tensor d_ln1_w, d_ln1_b, d_qkv_w, d_qkv_b, d_proj_w, d_proj_b, d_ln2_w, d_ln2_b, d_fc1_w,
      d_fc1_b, d_fc2_w, d_fc2_b;
};

// What one layer's forward keeps for its backward.
struct GPTModel::LayerActs {
  Tensor ln1, mean1, rstd1;   // [Tl,H], [Tl], [Tl]
  Tensor ln1_full, ln2_full;  // [T,H] gathered norm outputs (SP only)
  Tensor qkv;                 // [T,QKVW], after RoPE: exactly what attention saw
  Tensor ctx, lse;            // [T,NH*HD], [B,NH,S] (not kept under selective recompute)
  Tensor x2;                  // [Tl,H] residual stream after attention
  Tensor ln2, mean2, rstd2;   // [Tl,H], [Tl], [Tl]
  Tensor fc1;                 // [T,FC1W]
  Tensor act;                 // [T,F] the MLP activation, kept (--keep-mlp-activations) or
                              // undefined: then Scratch::act, recomputed from fc1 in backward
  int64_t nbytes() const {
    int64_t n = 0;
    for (const Tensor* t : {&ln1, &mean1, &rstd1, &ln1_full, &ln2_full, &qkv, &ctx, &lse, &x2, &ln2,
                            &mean2, &rstd2, &fc1, &act})
      if (t->defined()) n += int64_t(t->nbytes());
    return n;
  }
};

// One micro-batch's saved activations for one model chunk.
struct GPTModel::Slot {
  int microbatch = -1;  // -1: free
  int64_t S = 0, B = 0;
  MicroBatch mb;
  StepKeys keys;
  std::vector<Tensor> hidden;    // n+1 x [Tl,H]: hidden[i] is local layer i's input,
                                 // hidden[n] the chunk's output (not kept inside groups)
  std::vector<LayerActs> acts;   // per local layer (empty for recomputed layers)
  Tensor tokens;                 // the batch on the model's device, [B, S]
  Tensor emb;                    // [Tl,H] embedding before dropout (first stage)
  Tensor emb_full;               // [T,H] partial word embeddings before the reduce-scatter (SP)
  Tensor lnf, meanf, rstdf;      // final norm, [Tl,H] (last stage)
  Tensor lnf_full;               // [T,H] (SP)
  Tensor logits;                 // [T,Vp]; overwritten by its gradient in backward
  Tensor labels, mask_bs;        // the batch on the model's device, [B, S]
  Tensor targets, mask;          // [T] i64, [T] stat dtype (sequence-first order)
  Tensor mask_f32;               // [T] f32 (mask before a cast to f64 on CPU)
  Tensor row_max, sum_exp, target_logit, losses;  // [T]
  int64_t bytes = 0;             // of everything above, once the forward is done
  int64_t nbytes() const {
    int64_t n = 0;
    for (const auto& h : hidden)
      if (h.defined()) n += int64_t(h.nbytes());
    for (const auto& a : acts) n += a.nbytes();
    for (const Tensor* t : {&tokens, &emb, &emb_full, &lnf, &meanf, &rstdf, &lnf_full, &logits,
                            &labels, &mask_bs, &targets, &mask, &mask_f32, &row_max, &sum_exp,
                            &target_logit, &losses})
      if (t->defined()) n += int64_t(t->nbytes());
    if (mask.defined() && mask.raw() == mask_f32.raw()) n -= int64_t(mask.nbytes());
    return n;
  }
};

// Buffers shared by every micro-batch: forward and backward scratch, and the
// recomputation workspace.
struct GPTModel::Scratch {
  Tensor tmp;       // [Tl,H] forward scratch
  Tensor tmp_full;  // [T,H] row-parallel partial output (SP)
  Tensor ones;      // [Tl,1] of ones: the bias add after a TP reduction
  // [T,F] the MLP's activation (GELU or SwiGLU of fc1) of the layers that do not keep
  // their own (LayerActs::act, --keep-mlp-activations): written in forward, read by fc2,
  // and recomputed from the saved fc1 output in backward (the memory of one [T,F] per
  // layer for one elementwise pass per layer in backward; with SwiGLU no extra pass:
  // swiglu_backward_recompute writes it with the gradient). Not allocated when every
  // layer keeps its own.
  Tensor act;
  Tensor dx, dtmp, dln, dfc1, dact, dctx, dqkv, dloss;
  Tensor dtmp_full, dln_full;          // [T,H] (SP)
  Tensor local_max;                    // [T] this rank's row max of the logits (TP, last stage)
  std::vector<LayerActs> rc_acts;      // full recompute: one per layer of a group
  std::vector<Tensor> rc_hidden;       // full recompute: hidden states inside a group
  Tensor sel_ctx, sel_lse;             // selective recompute: the attention core's output
  int64_t nbytes() const {
    int64_t n = 0;
    for (const Tensor* t : {&tmp, &tmp_full, &ones, &act, &dx, &dtmp, &dln, &dfc1, &dact, &dctx,
                            &dqkv, &dloss, &dtmp_full, &dln_full, &local_max, &sel_ctx, &sel_lse})
      if (t->defined()) n += int64_t(t->nbytes());
    for (const auto& a : rc_acts) n += a.nbytes();
    for (const auto& h : rc_hidden)
      if (h.defined()) n += int64_t(h.nbytes());
    return n;
  }
};

// Sizes and keys of one micro-batch's pass.
struct GPTModel::Ctx {
  int64_t S = 0, B = 0, T = 0, H = 0, Sl = 0, s0 = 0, Tl = 0;
  bool sp = false;
  StepKeys keys;
  double p_hidden = 0, p_attn = 0, scale = 0;
  ops::GlobalIndex3 g;
  ops::AttentionDims ad;
  DType dt = DType::F32, sdt = DType::F32;
  Device dev = Device::CPU;
};

namespace {

PipelinePart normalized(const TransformerConfig& c, PipelinePart part) {
  if (part.chunks.empty()) {
    MCPP_CHECK(part.first_stage && part.last_stage,
               "GPTModel: a pipeline part without layers must be the whole model");
    part.chunks.emplace_back();
    for (int l = 0; l < c.num_layers; ++l) part.chunks[0].push_back(l);
  }
  return part;
}

std::vector<std::pair<int, int>> recompute_groups(const TransformerConfig& c, int n) {
  // Megatron's _checkpointed_forward: uniform = consecutive groups of k layers over the
  // chunk (the last may be shorter); block = each of the first k layers alone.
  std::vector<std::pair<int, int>> g;
  if (c.recompute != TransformerConfig::Recompute::Full) return g;
  const int k = int(c.recompute_num_layers);
  MCPP_CHECK(k >= 1, "--recompute-num-layers must be >= 1 with full recomputation, got {}", k);
  if (c.recompute_method == TransformerConfig::RecomputeMethod::Uniform)
    for (int a = 0; a < n; a += k) g.push_back({a, std::min(n, a + k)});
  else
    for (int a = 0; a < std::min(n, k); ++a) g.push_back({a, a + 1});
  return g;
}

}  // namespace

std::vector<bool> keeps_mlp_activation(const TransformerConfig& c, int n) {
  std::vector<bool> recomputed(size_t(n), false), keep(size_t(n), false);
  for (const auto& [a, e] : recompute_groups(c, n))
    for (int i = a; i < e; ++i) recomputed[size_t(i)] = true;
  int64_t left = c.keep_mlp_activations;
  for (int i = 0; i < n && left > 0; ++i)
    if (!recomputed[size_t(i)]) keep[size_t(i)] = true, --left;
  return keep;
}

GPTModel::GPTModel(const TransformerConfig& cfg, comm::Communicator* tp, PipelinePart part)
    : cfg_(cfg), tp_(tp), part_(std::move(part)), scratch_(std::make_unique<Scratch>()) {
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
  part_ = normalized(cfg_, part_);
  for (const auto& ch : part_.chunks) {
    MCPP_CHECK(!ch.empty(), "GPTModel: a model chunk without layers");
    for (int l : ch)
      MCPP_CHECK(l >= 0 && l < cfg_.num_layers, "GPTModel: layer {} outside [0, {})", l,
                 cfg_.num_layers);
  }
  for (auto& p : parameter_registry(cfg_, part_)) params_.add(std::move(p));
  params_.allocate(cfg_.dtype, cfg_.grad_dtype(), cfg_.device, cfg_.tp_rank, cfg_.tp_size,
                   cfg_.param_align);
  const auto t0 = std::chrono::steady_clock::now();
  params_.initialize(cfg_.seed);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > 1.0)
    log::info("> parameters initialized in {:.1f} s on the host ({} OpenMP threads; under "
              "mpirun, --bind-to none gives each rank more cores)",
              secs, omp_get_max_threads());
  for (const auto& ch : part_.chunks) {
    chunk_layers_.emplace_back();
    groups_.emplace_back();
    const int n = int(ch.size());
    for (int i = 0; i < n; ++i) {
      chunk_layers_.back().push_back(int(layers_.size()));
      auto L = std::make_unique<Layer>();
      L->global = ch[size_t(i)];
      auto get = [&](const std::string& suffix, Tensor& p, Tensor& g) {
        std::string nm = layer_param_name(L->global, suffix);
        if (params_.has(nm)) p = params_.param(nm), g = params_.grad(nm);
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
    groups_.back() = recompute_groups(cfg_, n);
    keep_act_.push_back(keeps_mlp_activation(cfg_, n));
  }
  scratch_act_ = false;
  for (const auto& ch : keep_act_)
    for (bool k : ch) scratch_act_ = scratch_act_ || !k;
  pool_.resize(part_.chunks.size());
}

GPTModel::~GPTModel() = default;

bool GPTModel::pipeline_duplicate(size_t i) const { return params_.infos()[i].pipeline_duplicate; }

std::vector<ParamInfo> parameter_registry(const TransformerConfig& c, const PipelinePart& part_in) {
  const PipelinePart part_ = normalized(c, part_in);
  std::vector<ParamInfo> out;
  const int64_t H = c.hidden_size, tp = c.tp_size;
  const double std_out = c.init_method_std / std::sqrt(2.0 * double(c.num_layers));
  // sp: the parameter acts on the sequence shard under SP (see ParamInfo).
  auto add = [&](std::string name, Shape global, TpSplit split, Init init, double sd, bool wd,
                 int layer, bool duplicate = false, bool sp = false) {
    Shape local = global;
    if (split == TpSplit::Rows || split == TpSplit::SwigluRows) local[0] /= tp;
    if (split == TpSplit::Cols) local[1] /= tp;
    ParamInfo p{std::move(name), global, local, split, init, sd, wd, layer, 0};
    p.pipeline_duplicate = duplicate;
    p.sequence_parallel = sp;
    out.push_back(std::move(p));
  };
  if (part_.first_stage) {
    add("embedding.word_embeddings.weight", {c.padded_vocab_size, H}, TpSplit::Rows,
        Init::Normal, c.init_method_std, true, -1);
    if (!c.rope)
      add("embedding.position_embeddings.weight", {c.max_position_embeddings, H},
          TpSplit::None, Init::Normal, c.init_method_std, true, -1, false, true);
  }
  const int64_t F = c.ffn_hidden_size, fc1 = (c.swiglu ? 2 : 1) * F;
  const int64_t NHD = c.num_attention_heads * c.kv_channels;
  for (const auto& ch : part_.chunks)
    for (int l : ch) {
      auto n = [&](const char* s) { return layer_param_name(l, s); };
      add(n("input_layernorm.weight"), {H}, TpSplit::None, Init::Ones, 0, false, l, false, true);
      if (!c.rmsnorm)
        add(n("input_layernorm.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l, false, true);
      add(n("self_attention.linear_qkv.weight"), {c.qkv_width(), H}, TpSplit::Rows, Init::Normal,
          c.init_method_std, true, l);
      if (c.add_bias_linear)
        add(n("self_attention.linear_qkv.bias"), {c.qkv_width()}, TpSplit::Rows, Init::Zeros, 0,
            false, l);
      add(n("self_attention.linear_proj.weight"), {H, NHD}, TpSplit::Cols, Init::Normal, std_out,
          true, l);
      if (c.add_bias_linear)
        add(n("self_attention.linear_proj.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
      add(n("pre_mlp_layernorm.weight"), {H}, TpSplit::None, Init::Ones, 0, false, l, false,
          true);
      if (!c.rmsnorm)
        add(n("pre_mlp_layernorm.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l, false,
            true);
      TpSplit fc1_split = c.swiglu ? TpSplit::SwigluRows : TpSplit::Rows;
      add(n("mlp.linear_fc1.weight"), {fc1, H}, fc1_split, Init::Normal, c.init_method_std, true,
          l);
      if (c.add_bias_linear)
        add(n("mlp.linear_fc1.bias"), {fc1}, fc1_split, Init::Zeros, 0, false, l);
      add(n("mlp.linear_fc2.weight"), {H, F}, TpSplit::Cols, Init::Normal, std_out, true, l);
      if (c.add_bias_linear)
        add(n("mlp.linear_fc2.bias"), {H}, TpSplit::None, Init::Zeros, 0, false, l);
    }
  if (part_.last_stage) {
    add("decoder.final_layernorm.weight", {H}, TpSplit::None, Init::Ones, 0, false, -1, false,
        true);
    if (!c.rmsnorm)
      add("decoder.final_layernorm.bias", {H}, TpSplit::None, Init::Zeros, 0, false, -1, false,
          true);
    if (!c.tie_embeddings)
      add("output_layer.weight", {c.padded_vocab_size, H}, TpSplit::Rows, Init::Normal,
          c.init_method_std, true, -1);
    else if (!part_.first_stage)  // the tied output weight: a copy of the first stage's
      add("embedding.word_embeddings.weight", {c.padded_vocab_size, H}, TpSplit::Rows,
          Init::Normal, c.init_method_std, true, -1, /*duplicate=*/true);
  }
  return out;
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
    ops::gemm(false, false, 1.0, scratch_->ones, b2, 1.0, y, st);
  }
}

// Its dual: dy [Tl,H] -> dy_full [T,H] (SP all-gather; else the identity); returns the
// gradient the local GEMMs take.
const Tensor& GPTModel::row_output_grad(const Tensor& dy, Tensor& dy_full, Stream& st) {
  if (tp_) {
    if (cfg_.sp()) parallel::reduce_scatter_to_sp_backward(dy, dy_full, *tp_, st);
    else parallel::reduce_from_tp_backward(dy, *tp_, st);
  }
  return cfg_.sp() ? dy_full : dy;
}

// row_output_grad, then the local GEMMs. The bias gradient is taken from the whole
// dy_full, so it is complete (and equal) on every TP rank and needs no reduction
// afterwards.
void GPTModel::row_output_backward(const Tensor& dy, Tensor& dy_full, const Tensor& x,
                                   const Tensor& w, Tensor& dx, Tensor& dw, Tensor& db,
                                   Stream& st, const Tensor* gelu_pre) {
  const Tensor& g = row_output_grad(dy, dy_full, st);
  if (gelu_pre) ops::linear_gelu_backward(g, x, w, *gelu_pre, dx, dw, db, st);
  else ops::linear_backward(g, x, w, dx, false, dw, db, st);
}

bool GPTModel::tp_duplicated(size_t i) const {
  return cfg_.tp_size > 1 && params_.infos()[i].split == TpSplit::None;
}

bool GPTModel::sp_partial_grad(size_t i) const {
  // Norms and position embeddings act on the sequence shard under SP; row-parallel
  // biases are complete already (see row_output_backward). The registry says which.
  return tp_ && cfg_.sp() && params_.infos()[i].sequence_parallel;
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

// ---- slots -------------------------------------------------------------------------------

GPTModel::Slot& GPTModel::acquire(int chunk, int microbatch) {
  for (auto& [c, sl] : live_)
    MCPP_CHECK(!(c == chunk && sl->microbatch == microbatch),
               "GPTModel: micro-batch {} of chunk {} is already in flight (forward twice "
               "without its backward)",
               microbatch, chunk);
  Slot* slot = nullptr;
  for (auto& p : pool_[size_t(chunk)])
    if (p->microbatch < 0) {
      slot = p.get();
      break;
    }
  if (!slot) {
    pool_[size_t(chunk)].push_back(std::make_unique<Slot>());
    slot = pool_[size_t(chunk)].back().get();
  }
  slot->microbatch = microbatch;
  live_.push_back({chunk, slot});
  return *slot;
}

void GPTModel::release(int chunk, int microbatch) {
  for (size_t i = 0; i < live_.size(); ++i)
    if (live_[i].first == chunk && live_[i].second->microbatch == microbatch) {
      Slot* s = live_[i].second;
      live_bytes_ -= s->bytes, --in_flight_;
      s->microbatch = -1;
      live_.erase(live_.begin() + std::ptrdiff_t(i));
      return;
    }
  MCPP_CHECK(false, "GPTModel: backward of micro-batch {} of chunk {} without its forward",
             microbatch, chunk);
}

ActivationMemory GPTModel::activation_memory() const {
  ActivationMemory m;
  m.live = live_bytes_, m.peak = peak_bytes_, m.per_slot_max = slot_max_;
  m.scratch = scratch_->nbytes(), m.max_in_flight = max_in_flight_;
  return m;
}

void GPTModel::reset_activation_peak() {
  peak_bytes_ = live_bytes_, max_in_flight_ = in_flight_, slot_max_ = 0;
}

namespace {
int64_t elem(DType t) { return int64_t(dtype_size(t)); }

// Bytes of one layer's LayerActs with T tokens (Tl local rows) without a kept MLP
// activation, and of its attention core (context and log-sum-exp) alone.
std::pair<int64_t, int64_t> layer_bytes(const TransformerConfig& c, int64_t T, int64_t Tl) {
  const int64_t H = c.hidden_size, dt = elem(c.dtype), st = elem(c.stat_dtype());
  const int64_t stats = c.rmsnorm ? 1 : 2;  // rstd (+ mean) per norm
  const int64_t core = T * c.local_heads() * c.kv_channels * dt + c.local_heads() * T * st;
  const int64_t all = 3 * Tl * H * dt + 2 * stats * Tl * st + T * c.qkv_width_local() * dt +
                      core + T * c.fc1_width_local() * dt + (c.sp() ? 2 * T * H * dt : 0);
  return {all, core};
}
}  // namespace

// Mirrors what forward_chunk()/backward_chunk() allocate (see ensure_acts, the Slot and
// the Scratch); tests/model/test_pipeline_model.cpp checks it against the measured bytes.
int64_t saved_activation_bytes(const TransformerConfig& c, const PipelinePart& part_in, int chunk,
                               int64_t B, int64_t S) {
  const PipelinePart part_ = normalized(c, part_in);
  MCPP_CHECK(chunk >= 0 && size_t(chunk) < part_.chunks.size(), "no model chunk {}", chunk);
  const int num_chunks = int(part_.chunks.size());
  const bool sp = c.sp();
  const int64_t T = S * B, Tl = sp ? T / c.tp_size : T, H = c.hidden_size;
  const int64_t dt = elem(c.dtype), st = elem(c.stat_dtype());
  const int64_t stats = c.rmsnorm ? 1 : 2;  // rstd (+ mean) per norm
  const auto [layer, core] = layer_bytes(c, T, Tl);
  const int n = int(part_.chunks[size_t(chunk)].size());
  int64_t bytes = 0;
  int kept_hidden = n + 1, stored = n;
  for (const auto& [a, e] : recompute_groups(c, n)) kept_hidden -= e - a - 1, stored -= e - a;
  const bool selective = c.recompute == TransformerConfig::Recompute::Selective;
  bytes += int64_t(stored) * (selective ? layer - core : layer);
  bytes += int64_t(kept_hidden) * Tl * H * dt;
  for (bool k : keeps_mlp_activation(c, n))  // --keep-mlp-activations
    if (k) bytes += T * c.ffn_local() * dt;
  const bool on_host = c.device == Device::CPU;
  if (part_.first_stage && chunk == 0) {
    bytes += Tl * H * dt + (sp ? T * H * dt : 0);
    if (!on_host) bytes += T * 8;  // the tokens on the device
  }
  if (part_.last_stage && chunk == num_chunks - 1) {
    bytes += Tl * H * dt + stats * Tl * st + (sp ? T * H * dt : 0);  // final norm
    bytes += T * c.vocab_local() * dt;                                // logits
    if (!on_host) bytes += T * 8 + T * 4;                            // labels, mask on device
    bytes += T * 8 + T * 4 + (st != 4 ? T * st : 0);                 // targets, mask
    bytes += 4 * T * st;                                              // CE statistics, losses
  }
  return bytes;
}

int64_t scratch_activation_bytes(const TransformerConfig& c, const PipelinePart& part_in, int64_t B,
                                 int64_t S) {
  const PipelinePart part_ = normalized(c, part_in);
  const bool sp = c.sp();
  const int64_t T = S * B, Tl = sp ? T / c.tp_size : T, H = c.hidden_size;
  const int64_t dt = elem(c.dtype), st = elem(c.stat_dtype());
  const int64_t nhd = c.local_heads() * c.kv_channels;
  int64_t bytes = Tl * H * dt + (sp ? T * H * dt : 0) + (c.tp_size > 1 ? Tl * dt : 0);  // tmp, ones
  bool scratch_act = false;  // act: unless every layer keeps its own
  for (const auto& ch : part_.chunks)
    for (bool k : keeps_mlp_activation(c, int(ch.size()))) scratch_act = scratch_act || !k;
  if (scratch_act) bytes += T * c.ffn_local() * dt;
  bytes += 3 * Tl * H * dt + S * B * st + (sp ? 2 * T * H * dt : 0);          // dx, dtmp, dln
  if (c.tp_size > 1 && part_.last_stage) bytes += T * st;                     // local_max
  // dfc1, dact (SwiGLU only: GELU's gradient comes out of fc2's GEMM epilogue), dctx, dqkv
  bytes += T * (c.fc1_width_local() + (c.swiglu ? c.ffn_local() : 0) + nhd + c.qkv_width_local()) *
           dt;
  size_t group = 0;
  for (const auto& ch : part_.chunks)
    for (const auto& [a, e] : recompute_groups(c, int(ch.size())))
      group = std::max(group, size_t(e - a));
  if (group) bytes += int64_t(group) * layer_bytes(c, T, Tl).first + int64_t(group + 1) * Tl * H * dt;
  if (c.recompute == TransformerConfig::Recompute::Selective)
    bytes += T * nhd * dt + c.local_heads() * T * st;
  return bytes;
}

int64_t GPTModel::saved_bytes_per_microbatch(int chunk, int64_t B, int64_t S) const {
  return saved_activation_bytes(cfg_, part_, chunk, B, S);
}
int64_t GPTModel::scratch_bytes(int64_t B, int64_t S) const {
  return scratch_activation_bytes(cfg_, part_, B, S);
}

GPTModel::Ctx GPTModel::make_ctx(int64_t S, int64_t B, const StepKeys& keys) const {
  const auto& c = cfg_;
  MCPP_CHECK(S <= c.seq_length || c.rope, "sequence {} longer than --seq-length {}", S,
             c.seq_length);
  MCPP_CHECK(c.tp_size == 1 || tp_, "GPTModel::forward at tp_size {} without the TP communicator",
             c.tp_size);
  Ctx x;
  x.sp = c.sp();
  MCPP_CHECK(!x.sp || S % c.tp_size == 0,
             "sequence parallelism needs the sequence ({}) divisible by TP ({})", S, c.tp_size);
  // This rank's sequence shard: rows [s0, s0 + Sl) of the sequence.
  x.S = S, x.B = B, x.T = S * B, x.H = c.hidden_size;
  x.Sl = x.sp ? S / c.tp_size : S, x.s0 = x.sp ? c.tp_rank * x.Sl : 0, x.Tl = x.Sl * B;
  x.keys = keys;
  x.dt = c.dtype, x.sdt = c.stat_dtype(), x.dev = c.device;
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  x.p_hidden = keys.training ? c.hidden_dropout : 0.0;
  x.p_attn = keys.training ? c.attention_dropout : 0.0;
  // Dropout masks on global (s, b, h) indices: the same for any TP/SP/DP/PP split.
  x.g = ops::GlobalIndex3{{x.s0, keys.sample_offset, 0}, {S, Bg, x.H}};
  x.ad.S = S, x.ad.B = B, x.ad.NH = c.local_heads(), x.ad.NG = c.local_groups();
  x.ad.HD = c.kv_channels;
  x.ad.b_offset = keys.sample_offset, x.ad.h_offset = c.tp_rank * c.local_heads();
  x.ad.NH_global = c.num_attention_heads, x.ad.S_global = S;
  x.scale = 1.0 / std::sqrt(double(c.kv_channels));
  return x;
}

void GPTModel::ensure_acts(LayerActs& A, const Ctx& x, bool attn_core, bool mlp_act) {
  const auto& c = cfg_;
  const int64_t Tl = x.Tl, T = x.T, H = x.H;
  ensure(A.ln1, {Tl, H}, x.dt, x.dev), ensure(A.rstd1, {Tl}, x.sdt, x.dev);
  if (!c.rmsnorm) ensure(A.mean1, {Tl}, x.sdt, x.dev);
  ensure(A.qkv, {T, c.qkv_width_local()}, x.dt, x.dev);
  if (attn_core)
    ensure(A.ctx, {T, c.local_heads() * c.kv_channels}, x.dt, x.dev),
        ensure(A.lse, {x.B, c.local_heads(), x.S}, x.sdt, x.dev);
  ensure(A.x2, {Tl, H}, x.dt, x.dev);
  ensure(A.ln2, {Tl, H}, x.dt, x.dev), ensure(A.rstd2, {Tl}, x.sdt, x.dev);
  if (!c.rmsnorm) ensure(A.mean2, {Tl}, x.sdt, x.dev);
  ensure(A.fc1, {T, c.fc1_width_local()}, x.dt, x.dev);
  if (mlp_act) ensure(A.act, {T, c.ffn_local()}, x.dt, x.dev);
  else A.act = Tensor();
  if (x.sp) ensure(A.ln1_full, {T, H}, x.dt, x.dev), ensure(A.ln2_full, {T, H}, x.dt, x.dev);
}

// ---- one transformer layer --------------------------------------------------------------

// out = layer(x); the attention core writes `ctx`/`lse` (A's own, or the selective-
// recompute scratch).
void GPTModel::layer_forward(const Layer& L, LayerActs& A, Tensor& ctx, Tensor& lse,
                             const Tensor& x, Tensor& out, const Ctx& cx) {
  const auto& c = cfg_;
  Stream& st = ops::default_stream(c.device);
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H;
  const int l = L.global;
  Tensor& tmp = scratch_->tmp;
  Tensor& tmp_full = cx.sp ? scratch_->tmp_full : tmp;
  Tensor& act = A.act.defined() ? A.act : scratch_->act;  // kept, or the shared scratch
  Tensor& ln1 = cx.sp ? A.ln1_full : A.ln1;
  Tensor& ln2 = cx.sp ? A.ln2_full : A.ln2;

  norm_forward(c, x, L.ln1_w, L.ln1_b, A.ln1, A.mean1, A.rstd1, st);
  column_input(A.ln1, ln1, st);
  ops::linear_forward(ln1, L.qkv_w, L.qkv_b, A.qkv, st);
  if (c.rope) ops::rope_forward(A.qkv, cx.ad, c.rot_dim(), c.rotary_base, 0, A.qkv, st);
  ops::attention_forward(A.qkv, cx.ad, cx.scale, cx.p_attn,
                         dropout_key(c, cx.keys, l, kAttnProbs), ctx, lse, st);
  // Without TP and hidden dropout the residual add runs in the GEMM's epilogue.
  const bool fuse_residual = !tp_ && cx.p_hidden == 0;
  Tensor tmp3 = tmp.view({Sl, B, H}), x3 = x.view({Sl, B, H}), x23 = A.x2.view({Sl, B, H});
  if (fuse_residual) {
    ops::linear_residual_forward(ctx, L.proj_w, L.proj_b, x, A.x2, st);
  } else {
    row_output(ctx, L.proj_w, L.proj_b, tmp_full, tmp, st);
    ops::dropout_add_forward(tmp3, x3, cx.p_hidden, dropout_key(c, cx.keys, l, kAfterProj), cx.g,
                             x23, st);
  }

  norm_forward(c, A.x2, L.ln2_w, L.ln2_b, A.ln2, A.mean2, A.rstd2, st);
  column_input(A.ln2, ln2, st);
  if (c.swiglu) {
    ops::linear_forward(ln2, L.fc1_w, L.fc1_b, A.fc1, st);
    ops::swiglu_forward(A.fc1, act, st);
  } else {
    ops::linear_gelu_forward(ln2, L.fc1_w, L.fc1_b, A.fc1, act, st);  // GEMM epilogue
  }
  if (fuse_residual) {
    ops::linear_residual_forward(act, L.fc2_w, L.fc2_b, A.x2, out, st);
  } else {
    row_output(act, L.fc2_w, L.fc2_b, tmp_full, tmp, st);
    Tensor out3 = out.view({Sl, B, H});
    ops::dropout_add_forward(tmp3, x23, cx.p_hidden, dropout_key(c, cx.keys, l, kAfterFc2), cx.g,
                             out3, st);
  }
}

// scratch dx: d(out) in, d(x) out. Parameter gradients accumulate.
void GPTModel::layer_backward(Layer& L, LayerActs& A, const Tensor& ctx,
                              const Tensor& lse, const Tensor& x, const Ctx& cx) {
  const auto& c = cfg_;
  auto& sc = *scratch_;
  Stream& st = ops::default_stream(c.device);
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H;
  const int l = L.global;
  const bool sp = cx.sp;
  Tensor dx3 = sc.dx.view({Sl, B, H}), dtmp3 = sc.dtmp.view({Sl, B, H});
  Tensor& dtmp_full = sp ? sc.dtmp_full : sc.dtmp;
  Tensor& dln_full = sp ? sc.dln_full : sc.dln;
  // Without hidden dropout its gradient is d(out) itself: read sc.dx in place of a copy
  // (norm_backward accumulates into sc.dx only after the GEMMs have read it).
  const bool dropout = cx.p_hidden > 0;
  const Tensor& dproj = dropout ? sc.dtmp : sc.dx;
  // MLP block: out = x2 + dropout(fc2(act(fc1(norm(x2))))).
  if (dropout)
    ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, l, kAfterFc2), cx.g, dtmp3,
                          st);
  // The activation: kept by this layer (--keep-mlp-activations), or again from the saved
  // fc1 output (see Scratch::act).
  const bool kept = A.act.defined();
  if (c.swiglu && kept) {  // the same GEMMs and element functions as below, minus the y pass
    const Tensor& g = row_output_grad(dproj, dtmp_full, st);
    Tensor none;
    ops::linear_backward(g, A.act, L.fc2_w, sc.dact, false, none, none, st);
    ops::swiglu_backward(sc.dact, A.fc1, sc.dfc1, st);
    ops::linear_backward(g, A.act, L.fc2_w, none, false, L.d_fc2_w, L.d_fc2_b, st);
  } else if (c.swiglu) {
    // fc2's input gradient first (it does not read the activation), then the SwiGLU
    // gradient and the activation from one read of fc1's output, then fc2's weight and
    // bias gradients, which need the activation. The same GEMMs as one linear_backward.
    const Tensor& g = row_output_grad(dproj, dtmp_full, st);
    Tensor none;
    ops::linear_backward(g, sc.act, L.fc2_w, sc.dact, false, none, none, st);
    ops::swiglu_backward_recompute(sc.dact, A.fc1, sc.dfc1, sc.act, st);
    ops::linear_backward(g, sc.act, L.fc2_w, none, false, L.d_fc2_w, L.d_fc2_b, st);
  } else {  // the GELU gradient in the fc2 input-gradient GEMM's epilogue
    // On CUDA a kept activation is the fc1 GEMM epilogue's GELU (of the fp32 accumulator),
    // the recomputed one gelu_forward's of the rounded fc1 output: they may differ in the
    // last bits (docs/cuda-backend.md); on the CPU both are gelu_forward's.
    if (!kept) ops::gelu_forward(A.fc1, sc.act, st);
    row_output_backward(dproj, dtmp_full, kept ? A.act : sc.act, L.fc2_w, sc.dfc1, L.d_fc2_w,
                        L.d_fc2_b, st, &A.fc1);
  }
  ops::linear_backward(sc.dfc1, sp ? A.ln2_full : A.ln2, L.fc1_w, dln_full, false, L.d_fc1_w,
                       L.d_fc1_b, st);
  column_input_backward(dln_full, sc.dln, st);
  norm_backward(c, sc.dln, A.x2, L.ln2_w, A.mean2, A.rstd2, sc.dx, true, L.d_ln2_w, L.d_ln2_b,
                st);
  // Attention block: x2 = x + dropout(proj(attn(rope(qkv(norm(x)))))).
  if (dropout)
    ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, l, kAfterProj), cx.g, dtmp3,
                          st);
  row_output_backward(dproj, dtmp_full, ctx, L.proj_w, sc.dctx, L.d_proj_w, L.d_proj_b, st);
  ops::attention_backward(sc.dctx, A.qkv, ctx, lse, cx.ad, cx.scale, cx.p_attn,
                          dropout_key(c, cx.keys, l, kAttnProbs), sc.dqkv, st);
  if (c.rope) ops::rope_backward(sc.dqkv, cx.ad, c.rot_dim(), c.rotary_base, 0, sc.dqkv, st);
  ops::linear_backward(sc.dqkv, sp ? A.ln1_full : A.ln1, L.qkv_w, dln_full, false, L.d_qkv_w,
                       L.d_qkv_b, st);
  column_input_backward(dln_full, sc.dln, st);
  norm_backward(c, sc.dln, x, L.ln1_w, A.mean1, A.rstd1, sc.dx, true, L.d_ln1_w, L.d_ln1_b, st);
}

// ---- embedding and head ------------------------------------------------------------------

// Vocab-parallel word lookup (rows outside this rank's vocabulary slice are zero),
// summed over TP (SP: reduce-scattered to the sequence shard), + learned position, then
// embedding dropout, into hidden[0].
void GPTModel::embed_forward(Slot& sv, const Tensor& tokens_in, const Ctx& cx) {
  const auto& c = cfg_;
  Stream& st = ops::default_stream(c.device);
  MCPP_CHECK(tokens_in.dim() == 2 && tokens_in.dtype() == DType::I64,
             "tokens must be i64 [B, S], got {}", tokens_in.str());
  const Tensor& tokens = on_device(tokens_in, sv.tokens, cx.dev, st);
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H, S = cx.S;
  ensure(sv.emb, {Sl, B, H}, cx.dt, cx.dev);
  if (cx.sp) ensure(sv.emb_full, {S, B, H}, cx.dt, cx.dev);
  Tensor emb3 = sv.emb;
  Tensor& word = cx.sp ? sv.emb_full : emb3;
  ops::embedding_forward(tokens, params_.param("embedding.word_embeddings.weight"),
                         c.tp_rank * c.vocab_local(), word, st);
  if (tp_) {
    if (cx.sp) parallel::reduce_scatter_to_sp(word, emb3, *tp_, st);
    else parallel::reduce_from_tp(emb3, *tp_, st);
  }
  if (!c.rope)
    ops::position_embedding_forward(params_.param("embedding.position_embeddings.weight"),
                                    cx.s0, emb3, st);
  Tensor h0 = sv.hidden[0].view({Sl, B, H});
  ops::dropout_add_forward(emb3, Tensor(), cx.p_hidden,
                           dropout_key(c, cx.keys, c.num_layers, kEmbedding), cx.g, h0, st);
}

// Scratch dx holds d(hidden[0]): embedding dropout, then the scatter-add into the word
// (and position) tables. The word embedding's dual: identity after an all-reduce,
// all-gather after the SP reduce-scatter.
void GPTModel::embed_backward(Slot& sv, const Ctx& cx) {
  const auto& c = cfg_;
  auto& sc = *scratch_;
  Stream& st = ops::default_stream(c.device);
  const int64_t Sl = cx.Sl, B = cx.B, H = cx.H, S = cx.S;
  Tensor dx3 = sc.dx.view({Sl, B, H}), dtmp3 = sc.dtmp.view({Sl, B, H});
  ops::dropout_backward(dx3, cx.p_hidden, dropout_key(c, cx.keys, c.num_layers, kEmbedding), cx.g,
                        dtmp3, st);
  if (!c.rope) {
    Tensor dpos = params_.grad("embedding.position_embeddings.weight");
    ops::position_embedding_backward(dtmp3, cx.s0, dpos, st);
  }
  Tensor dword = dtmp3;
  if (tp_) {
    if (cx.sp) {
      dword = sc.dtmp_full.view({S, B, H});
      parallel::reduce_scatter_to_sp_backward(dtmp3, dword, *tp_, st);
    } else {
      parallel::reduce_from_tp_backward(dtmp3, *tp_, st);
    }
  }
  Tensor dwe = params_.grad("embedding.word_embeddings.weight");
  const Tensor& tokens = sv.mb.tokens.device() == cx.dev ? sv.mb.tokens : sv.tokens;
  ops::embedding_backward(dword, tokens, c.tp_rank * c.vocab_local(), dwe, st);
}

// Final norm, column-parallel output layer (tied: the word embedding) giving this rank's
// vocabulary slice of the logits, vocab-parallel cross-entropy. Returns the masked sum.
double GPTModel::head_forward(Slot& sv, const Tensor& x, const MicroBatch& mb, const Ctx& cx) {
  const auto& c = cfg_;
  Stream& st = ops::default_stream(c.device);
  const int64_t V = c.vocab_local(), T = cx.T, Tl = cx.Tl, H = cx.H, S = cx.S, B = cx.B;
  const DType dt = cx.dt, sdt = cx.sdt;
  const Device dev = cx.dev;
  ensure(sv.lnf, {Tl, H}, dt, dev), ensure(sv.rstdf, {Tl}, sdt, dev);
  if (!c.rmsnorm) ensure(sv.meanf, {Tl}, sdt, dev);
  if (cx.sp) ensure(sv.lnf_full, {T, H}, dt, dev);
  Tensor& lnf = cx.sp ? sv.lnf_full : sv.lnf;
  ensure(sv.logits, {T, V}, dt, dev);
  norm_forward(c, x, params_.param("decoder.final_layernorm.weight"),
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
  // One pass over the logits (online softmax) for this rank's row max, sum of exponentials
  // and target logit. Megatron's vocab_parallel_cross_entropy all-reduces the max before
  // the exponentials, which takes a second pass; here each rank's sum is moved to the
  // global max afterwards (sum_exp * exp(local max - global max)), then summed.
  ops::ce_stats(sv.logits, sv.targets, c.tp_rank * V, sv.row_max, sv.sum_exp, sv.target_logit, st);
  if (tp_) {
    Tensor& local_max = scratch_->local_max;
    ensure(local_max, {T}, sdt, dev);
    ops::copy(sv.row_max, local_max, st);
    tp_all_reduce(sv.row_max, comm::ReduceOp::Max, st);
    ops::ce_rescale_sum_exp(local_max, sv.row_max, sv.sum_exp, st);
    tp_all_reduce(sv.sum_exp, comm::ReduceOp::Sum, st);
    tp_all_reduce(sv.target_logit, comm::ReduceOp::Sum, st);
  }
  ops::ce_loss(sv.row_max, sv.sum_exp, sv.target_logit, sv.losses, st);
  return ops::dot(sv.losses, sv.mask, st);  // synchronises: the caller logs it
}

// d loss / d token_loss = mask * grad_scale, back to scratch dx = d(x).
void GPTModel::head_backward(Slot& sv, const Tensor& x, double grad_scale, const Ctx& cx) {
  const auto& c = cfg_;
  auto& sc = *scratch_;
  Stream& st = ops::default_stream(c.device);
  const int64_t V = c.vocab_local();
  Tensor& dln_full = cx.sp ? sc.dln_full : sc.dln;
  ops::copy(sv.mask, sc.dloss, st);
  ops::scale(sc.dloss, grad_scale, st);
  ops::ce_backward(sv.logits, sv.row_max, sv.sum_exp, sv.targets, c.tp_rank * V, sc.dloss,
                   sv.logits, st);
  const std::string w_out_name =
      c.tie_embeddings ? "embedding.word_embeddings.weight" : "output_layer.weight";
  Tensor w_out = params_.param(w_out_name), dw_out = params_.grad(w_out_name), none;
  ops::linear_backward(sv.logits, cx.sp ? sv.lnf_full : sv.lnf, w_out, dln_full, false, dw_out,
                       none, st);
  column_input_backward(dln_full, sc.dln, st);
  Tensor dwf = params_.grad("decoder.final_layernorm.weight");
  Tensor dbf = c.rmsnorm ? Tensor() : params_.grad("decoder.final_layernorm.bias");
  norm_backward(c, sc.dln, x, params_.param("decoder.final_layernorm.weight"), sv.meanf,
                sv.rstdf, sc.dx, false, dwf, dbf, st);
}

// ---- a model chunk ----------------------------------------------------------------------

GPTModel::ChunkOutput GPTModel::forward_chunk(int chunk, int microbatch, const MicroBatch& mb,
                                              const StepKeys& keys, const Tensor& input) {
  const auto& c = cfg_;
  MCPP_CHECK(chunk >= 0 && chunk < num_chunks(), "GPTModel: chunk {} outside [0, {})", chunk,
             num_chunks());
  MCPP_CHECK(mb.tokens.dim() == 2, "tokens must be [B, S], got {}", mb.tokens.str());
  const Ctx cx = make_ctx(mb.tokens.size(1), mb.tokens.size(0), keys);
  const bool has_embed = part_.first_stage && chunk == 0;
  const bool has_head = part_.last_stage && chunk == num_chunks() - 1;
  auto& sc = *scratch_;
  Stream& st = ops::default_stream(c.device);
  const DType dt = cx.dt;
  const Device dev = cx.dev;
  const int64_t Tl = cx.Tl, H = cx.H;
  Slot& sv = acquire(chunk, microbatch);
  sv.S = cx.S, sv.B = cx.B, sv.mb = mb, sv.keys = keys;
  const auto& idx = chunk_layers_[size_t(chunk)];
  const auto& grp = groups_[size_t(chunk)];
  const int n = int(idx.size());
  const bool selective = c.recompute == TransformerConfig::Recompute::Selective;
  // Which hidden states this slot keeps: all but those inside a recompute group.
  std::vector<bool> keep(size_t(n) + 1, true);
  std::vector<int> group_of(size_t(n), -1);
  size_t max_group = 0;
  for (size_t k = 0; k < grp.size(); ++k) {
    for (int i = grp[k].first; i < grp[k].second; ++i) group_of[size_t(i)] = int(k);
    for (int i = grp[k].first + 1; i < grp[k].second; ++i) keep[size_t(i)] = false;
    max_group = std::max(max_group, size_t(grp[k].second - grp[k].first));
  }
  sv.hidden.resize(size_t(n) + 1);
  sv.acts.resize(size_t(n));
  for (int i = 0; i <= n; ++i)
    if (keep[size_t(i)]) ensure(sv.hidden[size_t(i)], {Tl, H}, dt, dev);
  ensure(sc.tmp, {Tl, H}, dt, dev);
  if (scratch_act_) ensure(sc.act, {cx.T, c.ffn_local()}, dt, dev);
  if (cx.sp) ensure(sc.tmp_full, {cx.T, H}, dt, dev);
  if (tp_) {
    ensure(sc.ones, {Tl, 1}, dt, dev);
    ops::fill(sc.ones, 1.0, st);
  }
  if (max_group) {
    sc.rc_acts.resize(std::max(sc.rc_acts.size(), max_group));
    sc.rc_hidden.resize(std::max(sc.rc_hidden.size(), max_group + 1));
    for (size_t j = 0; j < max_group; ++j) ensure_acts(sc.rc_acts[j], cx, true, false);
    for (size_t j = 0; j <= max_group; ++j) ensure(sc.rc_hidden[j], {Tl, H}, dt, dev);
  }
  if (selective) {
    ensure(sc.sel_ctx, {cx.T, c.local_heads() * c.kv_channels}, dt, dev);
    ensure(sc.sel_lse, {cx.B, c.local_heads(), cx.S}, cx.sdt, dev);
  }

  if (params_needed_ && (has_embed || has_head)) params_needed_(-1);
  if (has_embed) {
    embed_forward(sv, mb.tokens, cx);
  } else {
    MCPP_CHECK(input.defined() && input.numel() == Tl * H,
               "GPTModel: chunk {} needs its input activation [{} x {}], got {}", chunk, Tl, H,
               input.defined() ? input.str() : std::string("none"));
    Tensor h0 = sv.hidden[0];
    ops::copy(input.view({Tl, H}), h0, st);
  }
  for (int i = 0; i < n; ++i) {
    const Layer& L = *layers_[size_t(idx[size_t(i)])];
    if (params_needed_) params_needed_(L.global);
    const int k = group_of[size_t(i)];
    if (k >= 0) {  // inside a recompute group: the workspace, nothing kept
      const int a = grp[size_t(k)].first, e = grp[size_t(k)].second;
      LayerActs& A = sc.rc_acts[size_t(i - a)];
      const Tensor& x = i == a ? sv.hidden[size_t(a)] : sc.rc_hidden[size_t(i - a)];
      Tensor& out = i == e - 1 ? sv.hidden[size_t(e)] : sc.rc_hidden[size_t(i - a + 1)];
      layer_forward(L, A, A.ctx, A.lse, x, out, cx);
    } else {
      LayerActs& A = sv.acts[size_t(i)];
      ensure_acts(A, cx, !selective, keep_act_[size_t(chunk)][size_t(i)]);
      layer_forward(L, A, selective ? sc.sel_ctx : A.ctx, selective ? sc.sel_lse : A.lse,
                    sv.hidden[size_t(i)], sv.hidden[size_t(i + 1)], cx);
    }
  }
  ChunkOutput out;
  if (has_head) {
    out.loss = head_forward(sv, sv.hidden[size_t(n)], mb, cx);
    last_head_ = &sv;
  } else {
    out.output = sv.hidden[size_t(n)];
  }
  sv.bytes = sv.nbytes();
  live_bytes_ += sv.bytes, ++in_flight_;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  slot_max_ = std::max(slot_max_, sv.bytes);
  max_in_flight_ = std::max(max_in_flight_, in_flight_);
  return out;
}

Tensor GPTModel::backward_chunk(int chunk, int microbatch, const Tensor& output_grad,
                                double grad_scale, bool final) {
  const auto& c = cfg_;
  Slot* svp = nullptr;
  for (auto& [ch, sl] : live_)
    if (ch == chunk && sl->microbatch == microbatch) svp = sl;
  MCPP_CHECK(svp, "GPTModel: backward of micro-batch {} of chunk {} without its forward",
             microbatch, chunk);
  Slot& sv = *svp;
  const Ctx cx = make_ctx(sv.S, sv.B, sv.keys);
  auto& sc = *scratch_;
  Stream& st = ops::default_stream(c.device);
  const int64_t Tl = cx.Tl, T = cx.T, H = cx.H;
  const DType dt = cx.dt;
  const Device dev = cx.dev;
  const bool has_embed = part_.first_stage && chunk == 0;
  const bool has_head = part_.last_stage && chunk == num_chunks() - 1;
  const bool selective = c.recompute == TransformerConfig::Recompute::Selective;
  ensure(sc.dx, {Tl, H}, dt, dev), ensure(sc.dtmp, {Tl, H}, dt, dev);
  ensure(sc.dln, {Tl, H}, dt, dev), ensure(sc.dloss, {cx.S, cx.B}, cx.sdt, dev);
  if (cx.sp) ensure(sc.dtmp_full, {T, H}, dt, dev), ensure(sc.dln_full, {T, H}, dt, dev);
  ensure(sc.dfc1, {T, c.fc1_width_local()}, dt, dev);
  if (c.swiglu) ensure(sc.dact, {T, c.ffn_local()}, dt, dev);
  ensure(sc.dctx, {T, c.local_heads() * c.kv_channels}, dt, dev);
  ensure(sc.dqkv, {T, c.qkv_width_local()}, dt, dev);
  const auto& idx = chunk_layers_[size_t(chunk)];
  const auto& grp = groups_[size_t(chunk)];
  const int n = int(idx.size());

  if (has_head) {
    head_backward(sv, sv.hidden[size_t(n)], grad_scale, cx);
  } else {
    MCPP_CHECK(output_grad.defined() && output_grad.numel() == Tl * H,
               "GPTModel: backward of chunk {} needs its output gradient [{} x {}], got {}",
               chunk, Tl, H, output_grad.defined() ? output_grad.str() : std::string("none"));
    ops::copy(output_grad.view({Tl, H}), sc.dx, st);
  }
  auto ready = [&](const Layer& L) {
    if (final && grad_ready_) grad_ready_(L.global);
  };
  int i = n - 1;
  size_t k = grp.size();
  while (i >= 0) {
    while (k > 0 && grp[k - 1].first > i) --k;
    const bool in_group = k > 0 && grp[k - 1].first <= i && i < grp[k - 1].second;
    if (in_group) {
      // Re-run the group's forward from its kept input, then its backward.
      const int a = grp[k - 1].first, e = grp[k - 1].second;
      for (int j = a; j < e; ++j) {
        Layer& L = *layers_[size_t(idx[size_t(j)])];
        LayerActs& A = sc.rc_acts[size_t(j - a)];
        const Tensor& x = j == a ? sv.hidden[size_t(a)] : sc.rc_hidden[size_t(j - a)];
        Tensor& out = sc.rc_hidden[size_t(j - a + 1)];
        layer_forward(L, A, A.ctx, A.lse, x, out, cx);
      }
      for (int j = e - 1; j >= a; --j) {
        Layer& L = *layers_[size_t(idx[size_t(j)])];
        LayerActs& A = sc.rc_acts[size_t(j - a)];
        const Tensor& x = j == a ? sv.hidden[size_t(a)] : sc.rc_hidden[size_t(j - a)];
        layer_backward(L, A, A.ctx, A.lse, x, cx);
        ready(L);
      }
      i = a - 1;
      --k;
      continue;
    }
    Layer& L = *layers_[size_t(idx[size_t(i)])];
    LayerActs& A = sv.acts[size_t(i)];
    if (selective) {  // rebuild the attention core's output from the kept q, k, v
      ops::attention_forward(A.qkv, cx.ad, cx.scale, cx.p_attn,
                             dropout_key(c, cx.keys, L.global, kAttnProbs), sc.sel_ctx,
                             sc.sel_lse, st);
      layer_backward(L, A, sc.sel_ctx, sc.sel_lse, sv.hidden[size_t(i)], cx);
    } else {
      layer_backward(L, A, A.ctx, A.lse, sv.hidden[size_t(i)], cx);
    }
    ready(L);
    --i;
  }
  Tensor result;
  if (has_embed) embed_backward(sv, cx);
  else result = sc.dx;
  release(chunk, microbatch);
  return result;
}

void GPTModel::drop_chunk(int chunk, int microbatch) { release(chunk, microbatch); }

// ---- the whole model ---------------------------------------------------------------------

double GPTModel::forward(const MicroBatch& mb, const StepKeys& keys) {
  MCPP_CHECK(num_chunks() == 1 && part_.first_stage && part_.last_stage,
             "GPTModel::forward runs the whole model; this one holds a pipeline stage's part "
             "(use forward_chunk)");
  for (auto& [c, sl] : live_)
    if (sl->microbatch == 0) {  // a forward without backward before (evaluation, tests)
      release(c, 0);
      break;
    }
  return forward_chunk(0, 0, mb, keys).loss;
}

void GPTModel::backward(double grad_scale) {
  MCPP_CHECK(!live_.empty(), "GPTModel::backward without a forward");
  backward_chunk(0, 0, Tensor(), grad_scale, true);
  if (grad_ready_) grad_ready_(-1);
}

const Tensor& GPTModel::logits() const {
  MCPP_CHECK(last_head_, "GPTModel::logits before any forward");
  return last_head_->logits;
}
const Tensor& GPTModel::token_losses() const {
  MCPP_CHECK(last_head_, "GPTModel::token_losses before any forward");
  return last_head_->losses;
}

}  // namespace mcpp::model
