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
  Tensor pos_host;     // [B] i64 each sequence's first new position
  Tensor pos_dev;      // the same on the model's device
};

Generator::Generator(const model::ParamStore& params, const model::TransformerConfig& cfg,
                     comm::Communicator* tp)
    : cfg_(cfg), tp_(cfg.tp_size > 1 ? tp : nullptr), buf_(std::make_unique<Buffers>()) {
  cfg_.validate();
  MCPP_CHECK_HINT(
      cfg_.tp_size == 1 || (tp_ && tp_->size() == cfg_.tp_size && tp_->rank() == cfg_.tp_rank),
      "load the checkpoint with tp_size 1, or pass the TP group",
      "generation at tp_size {} (rank {}) needs that TP communicator", cfg_.tp_size, cfg_.tp_rank);
  cfg_.sequence_parallel = false;  // whole sequences on every rank: decode steps are 1 row
  const model::PipelinePart whole = model::normalized_part(cfg_, {});
  for (const auto& p : model::Stage::parameters(cfg_, whole))
    MCPP_CHECK(params.has(p.name), "Generator: the parameter store lacks {}", p.name);
  stage_ = std::make_unique<model::Stage>(cfg_, whole, &params);
}

Generator::~Generator() = default;

const Tensor& Generator::forward(const Tensor& tokens, KVCache& cache, bool all_positions) {
  return run(tokens, cache, 0, all_positions);
}

const Tensor& Generator::prefill(const Tensor& tokens, KVCache& cache, int64_t slot,
                                 bool all_positions) {
  MCPP_CHECK(tokens.dim() == 2 && tokens.size(0) == 1,
             "Generator::prefill: tokens must be [1, Sq], got {}", tokens.str());
  return run(tokens, cache, slot, all_positions);
}

const Tensor& Generator::run(const Tensor& tokens, KVCache& cache, int64_t first,
                             bool all_positions) {
  const auto& c = cfg_;
  auto& bf = *buf_;
  MCPP_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64,
             "Generator::forward: tokens must be i64 [B, Sq], got {}", tokens.str());
  const int64_t B = tokens.size(0), Sq = tokens.size(1), T = Sq * B, H = c.hidden_size;
  MCPP_CHECK(first >= 0 && first + B <= cache.batch(),
             "Generator::forward: slots [{}, {}) but the cache holds {}", first, first + B,
             cache.batch());
  // Each sequence's first new position: its slot's length.
  model::ensure(bf.pos_host, {B}, DType::I64, Device::CPU);
  int64_t* pos = bf.pos_host.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = cache.length(first + b);
    MCPP_CHECK_HINT(pos[b] + Sq <= cache.max_seq(),
                    "shorten the prompt or --num-tokens-to-generate",
                    "positions [{}, {}) exceed the KV cache of {} positions", pos[b], pos[b] + Sq,
                    cache.max_seq());
    MCPP_CHECK_HINT(pos[b] + Sq <= c.max_position_embeddings,
                    "shorten the prompt or --num-tokens-to-generate",
                    "position {} is beyond the model's max_position_embeddings {}", pos[b] + Sq - 1,
                    c.max_position_embeddings);
  }
  model::StepContext cx = model::make_inference_context(c, Sq, B, pos, tp_);
  cx.pos_dev = model::on_device(bf.pos_host, bf.pos_dev, cx.dev, cx.stream());
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

  // Embedding (learned positions at each sequence's absolute positions), then the layers
  // over the slots' views of the cache (the first B slots from `first`: contiguous).
  stage_->embedding().forward(tokens, bf.emb, bf.x, cx);
  for (int l = 0; l < block.size(); ++l) {
    Tensor k = cache.k(l).narrow(first, B), v = cache.v(l).narrow(first, B);
    block.layer(l).forward_cached(bf.x, bf.layer, k, v, bf.x, bf.ws, cx);
  }
  cache.advance(first, B, Sq);

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

std::vector<GenerateResult> generate_batch(Generator& g, KVCache& cache,
                                           const std::vector<std::span<const int32_t>>& prompts,
                                           const GenerateOptions& opts,
                                           uint64_t first_sequence_index,
                                           const std::function<void(size_t, int32_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const auto& c = g.config();
  validate(opts.sampling);
  const int64_t N = int64_t(prompts.size());
  MCPP_CHECK(N >= 1 && N <= cache.batch(),
             "generate: {} prompts for a KV cache of {} sequences (at least 1)", N, cache.batch());
  const int64_t limit = std::min(cache.max_seq(), c.max_position_embeddings);
  MCPP_CHECK(opts.tokens_to_generate >= 0, "--num-tokens-to-generate {} must be >= 0",
             opts.tokens_to_generate);
  for (int64_t i = 0; i < N; ++i) {
    const auto& prompt = prompts[size_t(i)];
    MCPP_CHECK_HINT(!prompt.empty(), "give a non-empty prompt", "generate: prompt {} is empty",
                    i + 1);
    const int64_t P = int64_t(prompt.size());
    MCPP_CHECK_HINT(P <= limit, fmt::format("shorten the prompt to at most {} tokens", limit),
                    "the prompt has {} tokens, more than the model's {} positions", P, limit);
    for (int32_t id : prompt)
      MCPP_CHECK_HINT(id >= 0 && id < c.padded_vocab_size,
                      "the tokenizer does not match the checkpoint's vocabulary",
                      "prompt token {} is outside the model's vocabulary of {}", id,
                      c.padded_vocab_size);
  }
  const int64_t V =
      opts.vocab_size > 0 ? std::min(opts.vocab_size, c.padded_vocab_size) : c.padded_vocab_size;
  cache.reset();
  std::vector<GenerateResult> res(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) {
    res[size_t(i)].prompt_tokens = int64_t(prompts[size_t(i)].size());
    res[size_t(i)].stop_reason = "max_tokens";
  }
  if (opts.tokens_to_generate == 0) return res;

  // Chooses prompt i's next token from a logits row; false when the sequence stops.
  auto choose = [&](int64_t i, const Tensor& logits, int64_t row, int64_t slot) {
    GenerateResult& r = res[size_t(i)];
    const int64_t id = sample(row_as_f32(logits, row), V, opts.sampling,
                              first_sequence_index + uint64_t(i), uint64_t(r.tokens.size()));
    r.tokens.push_back(int32_t(id));
    if (on_token) on_token(size_t(i), int32_t(id));
    if (!opts.ignore_eod && id == opts.eod) {
      r.stop_reason = "eod";
      return false;
    }
    if (std::find(opts.stop_tokens.begin(), opts.stop_tokens.end(), id) != opts.stop_tokens.end()) {
      r.stop_reason = "stop_token";
      return false;
    }
    if (int64_t(r.tokens.size()) >= opts.tokens_to_generate) return false;
    if (cache.length(slot) >= limit) {
      r.stop_reason = "max_positions";
      return false;
    }
    return true;
  };

  // Prefill: each prompt alone into its slot (exact positions, no padding). owner[slot]
  // is the prompt a slot holds; the active slots are [0, A).
  std::vector<int64_t> owner, last;
  for (int64_t i = 0; i < N; ++i) {
    const auto& prompt = prompts[size_t(i)];
    Tensor tokens = Tensor::empty({1, int64_t(prompt.size())}, DType::I64);
    for (size_t j = 0; j < prompt.size(); ++j) tokens.data<int64_t>()[j] = prompt[j];
    const auto t0 = Clock::now();
    const Tensor& logits = g.prefill(tokens, cache, i);
    res[size_t(i)].prefill_seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    owner.push_back(i);
    last.push_back(0);
    if (choose(i, logits, 0, i))
      last.back() = res[size_t(i)].tokens.back();
    else
      last.back() = -1;  // finished at its first token
  }
  // A finished sequence leaves: the last active slot moves into its place.
  auto compact = [&]() {
    for (int64_t s = 0; s < int64_t(owner.size());) {
      if (last[size_t(s)] >= 0) {
        ++s;
        continue;
      }
      const int64_t end = int64_t(owner.size()) - 1;
      if (s != end) {
        cache.move_slot(end, s);
        owner[size_t(s)] = owner[size_t(end)];
        last[size_t(s)] = last[size_t(end)];
      }
      owner.pop_back();
      last.pop_back();
    }
  };
  compact();

  // Decode: one row per active sequence, each at its own position.
  const auto t1 = Clock::now();
  Tensor step_tokens;
  while (!owner.empty()) {
    const int64_t A = int64_t(owner.size());
    step_tokens = Tensor::empty({A, 1}, DType::I64);
    for (int64_t s = 0; s < A; ++s) step_tokens.data<int64_t>()[s] = last[size_t(s)];
    const Tensor& logits = g.forward(step_tokens, cache);
    for (int64_t s = 0; s < A; ++s) {
      GenerateResult& r = res[size_t(owner[size_t(s)])];
      ++r.decode_steps;
      if (choose(owner[size_t(s)], logits, s, s)) {
        last[size_t(s)] = r.tokens.back();
      } else {
        last[size_t(s)] = -1;
        r.decode_seconds = std::chrono::duration<double>(Clock::now() - t1).count();
      }
    }
    compact();
  }
  return res;
}

GenerateResult generate(Generator& g, KVCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, uint64_t sequence_index,
                        const std::function<void(int32_t)>& on_token) {
  MCPP_CHECK(cache.batch() == 1, "generate: runs one prompt (cache batch {})", cache.batch());
  std::function<void(size_t, int32_t)> cb;
  if (on_token) cb = [&](size_t, int32_t id) { on_token(id); };
  return generate_batch(g, cache, {prompt}, opts, sequence_index, cb).front();
}

}  // namespace mcpp::inference
