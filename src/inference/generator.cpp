// Inference forward pass and the generation loop. Shapes: T = Sq*B new token rows
// (sequence-first), H hidden, QKVW = NG*(NH/NG+2)*HD, F ffn, Vp padded vocab.
// Mirrors model::GPTModel::forward with dropout off; attention goes through the cache.
#include "inference/generator.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/error.h"
#include "model/gpt_model.h"
#include "ops/ops.h"

namespace mcpp::inference {

struct Generator::Layer {
  Tensor ln1_w, ln1_b, qkv_w, qkv_b, proj_w, proj_b, ln2_w, ln2_b, fc1_w, fc1_b, fc2_w, fc2_b;
};

struct Generator::Buffers {
  Tensor x, ln, mean, rstd, qkv, ctx, tmp, fc1, act;  // [T, ...]
  Tensor lnf, meanf, rstdf, logits;                   // [rows, H], [rows], [rows, Vp]
};

namespace {

void ensure(Tensor& t, const Shape& shape, DType dt) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dt) t = Tensor::empty(shape, dt);
}

void norm(const model::TransformerConfig& c, const Tensor& x, const Tensor& w, const Tensor& b,
          Tensor& y, Tensor& mean, Tensor& rstd, Stream& s) {
  if (c.rmsnorm)
    ops::rmsnorm_forward(x, w, c.norm_epsilon, y, rstd, s);
  else
    ops::layernorm_forward(x, w, b, c.norm_epsilon, y, mean, rstd, s);
}

}  // namespace

Generator::Generator(const model::ParamStore& params, const model::TransformerConfig& cfg)
    : cfg_(cfg), buf_(std::make_unique<Buffers>()) {
  cfg_.validate();
  MCPP_CHECK_HINT(cfg_.tp_size == 1, "load the checkpoint with tp_size 1 for generation",
                  "generation runs serially, got tp_size {}", cfg_.tp_size);
  auto get = [&](const std::string& n) { return params.has(n) ? params.param(n) : Tensor(); };
  word_emb_ = get("embedding.word_embeddings.weight");
  if (!cfg_.rope) pos_emb_ = get("embedding.position_embeddings.weight");
  final_w_ = get("decoder.final_layernorm.weight");
  final_b_ = get("decoder.final_layernorm.bias");
  out_w_ = cfg_.tie_embeddings ? word_emb_ : get("output_layer.weight");
  MCPP_CHECK(word_emb_.defined() && final_w_.defined() && out_w_.defined() &&
                 (cfg_.rope || pos_emb_.defined()),
             "Generator: the parameter store lacks the embedding, final norm or output layer");
  for (int l = 0; l < cfg_.num_layers; ++l) {
    auto n = [&](const char* s) { return get(model::layer_param_name(l, s)); };
    layers_.push_back({n("input_layernorm.weight"), n("input_layernorm.bias"),
                       n("self_attention.linear_qkv.weight"), n("self_attention.linear_qkv.bias"),
                       n("self_attention.linear_proj.weight"), n("self_attention.linear_proj.bias"),
                       n("pre_mlp_layernorm.weight"), n("pre_mlp_layernorm.bias"),
                       n("mlp.linear_fc1.weight"), n("mlp.linear_fc1.bias"),
                       n("mlp.linear_fc2.weight"), n("mlp.linear_fc2.bias")});
    MCPP_CHECK(layers_.back().qkv_w.defined() && layers_.back().fc2_w.defined(),
               "Generator: layer {} is missing from the parameter store", l);
  }
}

Generator::~Generator() = default;

const Tensor& Generator::forward(const Tensor& tokens, KVCache& cache, bool all_positions) {
  const auto& c = cfg_;
  auto& bf = *buf_;
  Stream& st = Stream::cpu();
  MCPP_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64,
             "Generator::forward: tokens must be i64 [B, Sq], got {}", tokens.str());
  const int64_t B = tokens.size(0), Sq = tokens.size(1), T = Sq * B, H = c.hidden_size;
  const int64_t p0 = cache.length();
  MCPP_CHECK(B == cache.batch(), "Generator::forward: batch {} but the cache holds {}", B,
             cache.batch());
  MCPP_CHECK_HINT(p0 + Sq <= cache.max_seq(), "shorten the prompt or --num-tokens-to-generate",
                  "positions [{}, {}) exceed the KV cache of {} positions", p0, p0 + Sq,
                  cache.max_seq());
  MCPP_CHECK_HINT(p0 + Sq <= c.max_position_embeddings,
                  "shorten the prompt or --num-tokens-to-generate",
                  "position {} is beyond the model's max_position_embeddings {}", p0 + Sq - 1,
                  c.max_position_embeddings);
  const DType dt = c.dtype;
  const int64_t NHD = c.num_attention_heads * c.kv_channels;
  ensure(bf.x, {T, H}, dt), ensure(bf.ln, {T, H}, dt), ensure(bf.tmp, {T, H}, dt);
  ensure(bf.mean, {T}, dt), ensure(bf.rstd, {T}, dt);
  ensure(bf.qkv, {T, c.qkv_width()}, dt), ensure(bf.ctx, {T, NHD}, dt);
  ensure(bf.fc1, {T, c.fc1_width_local()}, dt), ensure(bf.act, {T, c.ffn_local()}, dt);

  // Embedding: word (+ learned position at the absolute position p0 + s).
  Tensor x3 = bf.x.view({Sq, B, H});
  ops::embedding_forward(tokens, word_emb_, 0, x3, st);
  if (!c.rope) ops::position_embedding_forward(pos_emb_, p0, x3, st);

  ops::AttentionDims ad;
  ad.S = Sq, ad.B = B, ad.NH = c.num_attention_heads, ad.NG = c.num_query_groups;
  ad.HD = c.kv_channels, ad.NH_global = c.num_attention_heads, ad.S_global = Sq;
  const double scale = 1.0 / std::sqrt(double(c.kv_channels));
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Layer& L = layers_[size_t(l)];
    norm(c, bf.x, L.ln1_w, L.ln1_b, bf.ln, bf.mean, bf.rstd, st);
    ops::linear_forward(bf.ln, L.qkv_w, L.qkv_b, bf.qkv, st);
    if (c.rope) ops::rope_forward(bf.qkv, ad, c.rot_dim(), c.rotary_base, p0, bf.qkv, st);
    ops::attention_kv_cache_forward(bf.qkv, ad, p0, scale, cache.k(l), cache.v(l), bf.ctx, st);
    ops::linear_forward(bf.ctx, L.proj_w, L.proj_b, bf.tmp, st);
    ops::add(bf.x, bf.tmp, bf.x, st);
    norm(c, bf.x, L.ln2_w, L.ln2_b, bf.ln, bf.mean, bf.rstd, st);
    ops::linear_forward(bf.ln, L.fc1_w, L.fc1_b, bf.fc1, st);
    if (c.swiglu)
      ops::swiglu_forward(bf.fc1, bf.act, st);
    else
      ops::gelu_forward(bf.fc1, bf.act, st);
    ops::linear_forward(bf.act, L.fc2_w, L.fc2_b, bf.tmp, st);
    ops::add(bf.x, bf.tmp, bf.x, st);
  }
  cache.advance(Sq);

  // Head on the rows whose logits are wanted: all, or the last position's B rows.
  const int64_t rows = all_positions ? T : B;
  const Tensor xs = all_positions ? bf.x : bf.x.narrow((Sq - 1) * B, B);
  ensure(bf.lnf, {rows, H}, dt), ensure(bf.meanf, {rows}, dt), ensure(bf.rstdf, {rows}, dt);
  ensure(bf.logits, {rows, c.padded_vocab_size}, dt);
  norm(c, xs, final_w_, final_b_, bf.lnf, bf.meanf, bf.rstdf, st);
  ops::linear_forward(bf.lnf, out_w_, Tensor(), bf.logits, st);
  if (all_positions) bf.logits = bf.logits.view({Sq, B, c.padded_vocab_size});
  return bf.logits;
}

namespace {

std::vector<float> row_as_f32(const Tensor& logits, int64_t row) {
  const int64_t V = logits.size(-1);
  std::vector<float> r(size_t(V), 0.f);
  if (logits.dtype() == DType::F32) {
    const float* p = logits.data<float>() + row * V;
    std::copy(p, p + V, r.begin());
  } else {
    const double* p = logits.data<double>() + row * V;
    for (int64_t i = 0; i < V; ++i) r[size_t(i)] = float(p[i]);
  }
  return r;
}

}  // namespace

GenerateResult generate(Generator& g, KVCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, uint64_t sequence_index,
                        const std::function<void(int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto& c = g.config();
  validate(opts.sampling);
  MCPP_CHECK(cache.batch() == 1, "generate: runs one prompt at a time (cache batch {})",
             cache.batch());
  MCPP_CHECK_HINT(!prompt.empty(), "give a non-empty prompt", "generate: the prompt is empty");
  const int64_t P = int64_t(prompt.size());
  const int64_t limit = std::min(cache.max_seq(), c.max_position_embeddings);
  MCPP_CHECK_HINT(P <= limit, fmt::format("shorten the prompt to at most {} tokens", limit),
                  "the prompt has {} tokens, more than the model's {} positions", P, limit);
  MCPP_CHECK(opts.tokens_to_generate >= 0, "--num-tokens-to-generate {} must be >= 0",
             opts.tokens_to_generate);
  const int64_t V =
      opts.vocab_size > 0 ? std::min(opts.vocab_size, c.padded_vocab_size) : c.padded_vocab_size;
  for (int32_t id : prompt)
    MCPP_CHECK_HINT(id >= 0 && id < c.padded_vocab_size,
                    "the tokenizer does not match the checkpoint's vocabulary",
                    "prompt token {} is outside the model's vocabulary of {}", id,
                    c.padded_vocab_size);
  cache.reset();
  GenerateResult res;
  res.prompt_tokens = P;
  res.stop_reason = "max_tokens";
  if (opts.tokens_to_generate == 0) return res;

  Tensor tokens = Tensor::empty({1, P}, DType::I64);
  for (int64_t i = 0; i < P; ++i) tokens.data<int64_t>()[i] = prompt[size_t(i)];
  auto t0 = Clock::now();
  const Tensor* logits = &g.forward(tokens, cache);
  auto t1 = Clock::now();
  res.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();

  Tensor one = Tensor::empty({1, 1}, DType::I64);
  for (int64_t step = 0;; ++step) {
    const int64_t id =
        sample(row_as_f32(*logits, 0), V, opts.sampling, sequence_index, uint64_t(step));
    res.tokens.push_back(int32_t(id));
    if (on_token) on_token(int32_t(id));
    if (!opts.ignore_eod && id == opts.eod) {
      res.stop_reason = "eod";
      break;
    }
    if (std::find(opts.stop_tokens.begin(), opts.stop_tokens.end(), id) != opts.stop_tokens.end()) {
      res.stop_reason = "stop_token";
      break;
    }
    if (int64_t(res.tokens.size()) >= opts.tokens_to_generate) break;
    if (cache.length() >= limit) {
      res.stop_reason = "max_positions";
      break;
    }
    one.data<int64_t>()[0] = id;
    logits = &g.forward(one, cache);
    ++res.decode_steps;
  }
  res.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
  return res;
}

}  // namespace mcpp::inference
