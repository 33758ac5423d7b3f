// The generation loop, and the inference forward built from the model's own modules
// (model/stage.h): Embedding, TransformerLayer::forward_cached (Attention appends to the
// KV cache), LmHead::logits_forward. No layer math lives here.
#include "inference/generator.h"

#include <algorithm>
#include <chrono>

#include "base/error.h"
#include "model/stage.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::inference {

// Reused across calls; shapes follow the call's [B, Sq].
struct Generator::Buffers {
  model::Embedding::Saved emb;
  model::LayerSaved layer;  // one set for every layer: nothing is kept for a backward
  model::Workspace ws;
  model::LmHead::Saved head;
  Tensor x;            // [T, H] the residual stream
  Tensor logits_full;  // [rows, Vp] gathered over TP
  Tensor logits_host;  // the logits on the host when the model runs on a GPU
};

Generator::Generator(const model::ParamStore& params, const model::TransformerConfig& cfg,
                     comm::Communicator* tp)
    : cfg_(cfg), tp_(cfg.tp_size > 1 ? tp : nullptr), buf_(std::make_unique<Buffers>()) {
  cfg_.validate();
  MCPP_CHECK_HINT(cfg_.tp_size == 1 || (tp_ && tp_->size() == cfg_.tp_size &&
                                        tp_->rank() == cfg_.tp_rank),
                  "load the checkpoint with tp_size 1, or pass the TP group",
                  "generation at tp_size {} (rank {}) needs that TP communicator", cfg_.tp_size,
                  cfg_.tp_rank);
  cfg_.sequence_parallel = false;  // whole sequences on every rank: decode steps are 1 row
  const model::PipelinePart whole = model::normalized_part(cfg_, {});
  for (const auto& p : model::Stage::parameters(cfg_, whole))
    MCPP_CHECK(params.has(p.name), "Generator: the parameter store lacks {}", p.name);
  stage_ = std::make_unique<model::Stage>(cfg_, whole, &params);
}

Generator::~Generator() = default;

const Tensor& Generator::forward(const Tensor& tokens, KVCache& cache, bool all_positions) {
  const auto& c = cfg_;
  auto& bf = *buf_;
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
  const model::StepContext cx = model::make_inference_context(c, Sq, B, p0, tp_);
  const bool copy_batch = tokens.device() != cx.dev;
  model::TransformerBlock& block = stage_->block(0);
  model::allocate(
      [&](const model::TensorVisitor& v) {
        model::Embedding::saved_specs(cx, copy_batch, bf.emb, v);
        block.layer(0).inference_specs(cx, bf.layer, bf.ws, v);
        v(bf.x, {T, H}, cx.dt, true);
      },
      cx.dev, false);
  if (cx.tp_comm) ops::fill(bf.ws.ones, 1.0, cx.stream());  // the row-parallel bias add

  // Embedding (learned positions at the absolute positions p0 + s), then the layers.
  stage_->embedding().forward(tokens, bf.emb, bf.x, cx);
  for (int l = 0; l < block.size(); ++l)
    block.layer(l).forward_cached(bf.x, bf.layer, cache.k(l), cache.v(l), p0, bf.x, bf.ws, cx);
  cache.advance(Sq);

  // Head on the rows whose logits are wanted: all, or the last position's B rows.
  const Tensor xs = all_positions ? bf.x : bf.x.narrow((Sq - 1) * B, B);
  stage_->head().logits_forward(xs, bf.head, cx);
  Tensor* out = &bf.head.logits;
  if (cx.tp_comm) {  // vocab-parallel logits: every rank gets the whole vocabulary
    model::ensure(bf.logits_full, {xs.size(0), c.padded_vocab_size}, cx.dt, cx.dev);
    parallel::gather_from_tp(*out, bf.logits_full, *cx.tp_comm, cx.stream());
    out = &bf.logits_full;
  }
  if (cx.dev != Device::CPU) {
    // f32 on the host for sampling (bf16/f16 logits converted by the copy).
    const DType host_dt = out->dtype() == DType::F64 ? DType::F64 : DType::F32;
    model::ensure(bf.logits_host, out->shape(), host_dt, Device::CPU);
    ops::copy(*out, bf.logits_host, cx.stream());
    out = &bf.logits_host;
  }
  if (all_positions) *out = out->view({Sq, B, c.padded_vocab_size});
  return *out;
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
