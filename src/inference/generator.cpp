// The generation loop, and the inference forward built from the model's own modules
// (model/stage.h): Embedding, TransformerLayer::forward_cached (Attention appends to the
// KV cache), LmHead::logits_forward. No layer math lives here.
#include "inference/generator.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "base/error.h"
#include "model/stage.h"
#include "ops/graph.h"
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
  Tensor logits_view;  // [Sq, B, Vp] of all_positions
  Tensor ids_dev, ids_host;  // [A] i64 greedy ids (forward_greedy)
};

// ---- CUDA graphs of the greedy decode step ---------------------------------------------
// One graph per batch bucket (bucket_size): the step of A sequences runs as the bucket's
// Bk >= A rows, the padding rows feeding token 0 at position 0 of the free slots [A, Bk)
// (their rows are overwritten by the prefill of whichever sequence takes the slot next;
// no active sequence reads them). The inputs that change between steps -- the tokens and
// the positions -- live in the bucket's device tensors, copied there before each replay;
// every other address (weights, the cache, the bucket's own activation buffers) is fixed.
// Only RoPE models without TP qualify: learned position embeddings read the positions on
// the host, and a TP all-gather over MPI cannot be captured.
struct Generator::DecodeGraph {
  Buffers buf;
  // io_host/io_dev [2 Bk] i64: the tokens then the positions, one copy to the device a step;
  // tok_* [Bk, 1] and pos_* [Bk] are views of them.
  Tensor io_host, io_dev, tok_host, pos_host, tok_dev, pos_dev, ids_dev, ids_host, check_a, check_b;
  // A launched replay's inputs and ids on the host, page-locked, by the launch's parity: a
  // step is queued while the one before it may still run, whose copies read and write the
  // other pair (launch_greedy).
  ops::PinnedHost io_pin[2], ids_pin[2];
  ops::StreamFence done[2];  // the replay of that parity and the copy of its ids
  int64_t V = 0;
  ops::StreamGraph graph;
  bool checked = false;  // the first replay was compared with the eager step
};

// A launched greedy step: its ids on the host once `done` has passed (a replay), or already
// there (ids, when done is null).
struct Generator::Launched {
  int64_t rows = 0;
  ops::StreamFence* done = nullptr;
  const int64_t* pinned = nullptr;
  std::vector<int64_t> ids;
  void collect() {
    if (!done) return;
    done->wait();
    ids.assign(pinned, pinned + rows);
    done = nullptr;
  }
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

const Tensor& Generator::prefill_batch(const Tensor& tokens, KVCache& cache, int64_t first) {
  MCPP_CHECK(tokens.dim() == 2, "Generator::prefill_batch: tokens must be [n, P], got {}",
             tokens.str());
  MCPP_CHECK(first >= 0 && first + tokens.size(0) <= cache.batch(),
             "Generator::prefill_batch: slots [{}, {}) but the cache holds {}", first,
             first + tokens.size(0), cache.batch());
  for (int64_t j = 0; j < tokens.size(0); ++j)
    MCPP_CHECK(cache.length(first + j) == 0, "Generator::prefill_batch: slot {} is not empty",
               first + j);
  return run(tokens, cache, first, false);
}

const std::vector<int64_t>& Generator::forward_greedy(const Tensor& tokens, KVCache& cache,
                                                     int64_t V) {
  MCPP_CHECK(launched_.empty(),
             "Generator::forward_greedy: {} launched steps were not collected (greedy_ids)",
             launched_.size());
  launch_greedy(tokens, cache, V);
  return greedy_ids();
}

void Generator::launch_greedy(const Tensor& tokens, KVCache& cache, int64_t V) {
  MCPP_CHECK(tokens.dim() == 2 && tokens.size(1) == 1 && tokens.dtype() == DType::I64,
             "Generator::launch_greedy: tokens must be i64 [A, 1], got {}", tokens.str());
  MCPP_CHECK(launched_.size() < 2, "Generator::launch_greedy: two launched steps wait for greedy_ids()");
  const int64_t A = tokens.size(0);
  const int64_t* t = tokens.data<int64_t>();
  bool from_last = false;
  for (int64_t b = 0; b < A; ++b) {
    if (t[b] != kFromLastStep) continue;
    MCPP_CHECK(b < last_rows_,
               "Generator::launch_greedy: row {} takes the last step's id, but that step had {} rows",
               b, last_rows_);
    from_last = true;
  }
  Launched l;
  l.rows = A;
  DecodeGraph* g = graphs_usable(A, cache) ? &decode_graph(A, cache, V) : nullptr;
  if (g && g->graph.ready() && g->checked) {
    const int par = int(launches_ & 1);
    replay_greedy(*g, tokens, cache, par);
    l.done = &g->done[par];
    l.pinned = static_cast<const int64_t*>(g->ids_pin[par].data());
    last_ids_.clear();
  } else {
    Tensor resolved = tokens;
    if (from_last) {  // the last step's ids, on the host
      if (!launched_.empty()) {
        launched_.back().collect();
        last_ids_ = launched_.back().ids;
      }
      resolved = tokens.clone();
      int64_t* r = resolved.data<int64_t>();
      for (int64_t b = 0; b < A; ++b)
        if (r[b] == kFromLastStep) r[b] = last_ids_.at(size_t(b));
    }
    if (g)
      greedy_graph_first(*g, resolved, cache, l.ids);
    else
      greedy_eager(resolved, cache, V, l.ids);
    last_ids_ = l.ids;
  }
  last_rows_ = A;
  ++launches_;
  launched_.push_back(std::move(l));
}

const std::vector<int64_t>& Generator::greedy_ids() {
  MCPP_CHECK(!launched_.empty(), "Generator::greedy_ids: no launched step");
  Launched& l = launched_.front();
  l.collect();
  greedy_ids_ = std::move(l.ids);
  launched_.erase(launched_.begin());
  if (launched_.empty()) last_ids_ = greedy_ids_;
  return greedy_ids_;
}

void Generator::greedy_eager(const Tensor& tokens, KVCache& cache, int64_t V,
                             std::vector<int64_t>& ids_out) {
  const int64_t A = tokens.size(0);
  const Tensor& logits = run_on_device(tokens, cache, 0, false);
  auto& bf = *buf_;
  Stream& st = ops::default_stream(logits.device());
  model::ensure(bf.ids_dev, {A}, DType::I64, logits.device());
  ops::argmax_rows(logits, V, bf.ids_dev, st);
  const Tensor* ids = &bf.ids_dev;
  if (ids->device() != Device::CPU) {  // (a D2H copy returns once the ids are on the host)
    model::ensure(bf.ids_host, {A}, DType::I64, Device::CPU);
    ops::copy(bf.ids_dev, bf.ids_host, st);
    ids = &bf.ids_host;
    last_ids_dev_ = bf.ids_dev;
  }
  ids_out.assign(ids->data<int64_t>(), ids->data<int64_t>() + A);
}

const Tensor& Generator::run(const Tensor& tokens, KVCache& cache, int64_t first,
                             bool all_positions) {
  const Tensor* out = &run_on_device(tokens, cache, first, all_positions);
  auto& bf = *buf_;
  const auto& c = cfg_;
  if (out->device() != Device::CPU) {
    // f32 on the host for sampling (bf16/f16 logits converted by the copy).
    const DType host_dt = out->dtype() == DType::F64 ? DType::F64 : DType::F32;
    model::ensure(bf.logits_host, out->shape(), host_dt, Device::CPU);
    ops::copy(*out, bf.logits_host, ops::default_stream(out->device()));
    out = &bf.logits_host;
  }
  if (all_positions)
    bf.logits_view = out->view({tokens.size(1), tokens.size(0), c.padded_vocab_size});
  return all_positions ? bf.logits_view : *out;
}

void Generator::positions(int64_t B, int64_t Sq, const KVCache& cache, int64_t first,
                          int64_t* pos) const {
  MCPP_CHECK(first >= 0 && first + B <= cache.batch(),
             "Generator::forward: slots [{}, {}) but the cache holds {}", first, first + B,
             cache.batch());
  for (int64_t b = 0; b < B; ++b) {
    pos[b] = cache.length(first + b);
    MCPP_CHECK_HINT(pos[b] + Sq <= cache.max_seq(),
                    "shorten the prompt or --num-tokens-to-generate",
                    "positions [{}, {}) exceed the KV cache of {} positions", pos[b], pos[b] + Sq,
                    cache.max_seq());
    MCPP_CHECK_HINT(pos[b] + Sq <= cfg_.max_position_embeddings,
                    "shorten the prompt or --num-tokens-to-generate",
                    "position {} is beyond the model's max_position_embeddings {}", pos[b] + Sq - 1,
                    cfg_.max_position_embeddings);
  }
}

const Tensor& Generator::run_on_device(const Tensor& tokens, KVCache& cache, int64_t first,
                                       bool all_positions) {
  auto& bf = *buf_;
  MCPP_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64,
             "Generator::forward: tokens must be i64 [B, Sq], got {}", tokens.str());
  const int64_t B = tokens.size(0), Sq = tokens.size(1);
  // Each sequence's first new position: its slot's length.
  model::ensure(bf.pos_host, {B}, DType::I64, Device::CPU);
  positions(B, Sq, cache, first, bf.pos_host.data<int64_t>());
  const Tensor& pos_dev =
      model::on_device(bf.pos_host, bf.pos_dev, cfg_.device, ops::default_stream(cfg_.device));
  const Tensor& out = compute(tokens, bf.pos_host.data<int64_t>(), pos_dev, cache, first,
                              all_positions, bf);
  cache.advance(first, B, Sq);
  return out;
}

const Tensor& Generator::compute(const Tensor& tokens, const int64_t* pos, const Tensor& pos_dev,
                                 KVCache& cache, int64_t first, bool all_positions,
                                 Buffers& bf) {
  const auto& c = cfg_;
  const int64_t B = tokens.size(0), Sq = tokens.size(1), T = Sq * B, H = c.hidden_size;
  model::StepContext cx = model::make_inference_context(c, Sq, B, pos, tp_);
  cx.pos_dev = pos_dev;
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

  // Head on the rows whose logits are wanted: all, or the last position's B rows.
  const Tensor xs = all_positions ? bf.x : bf.x.narrow((Sq - 1) * B, B);
  stage_->head().logits_forward(xs, bf.head, cx);
  Tensor* out = &bf.head.logits;
  if (cx.tp_comm) {  // vocab-parallel logits: every rank gets the whole vocabulary
    model::ensure(bf.logits_full, {xs.size(0), c.padded_vocab_size}, cx.dt, cx.dev);
    parallel::gather_from_tp(*out, bf.logits_full, *cx.tp_comm, cx.stream());
    out = &bf.logits_full;
  }
  return *out;
}

int64_t Generator::bucket_size(int64_t A, int64_t slots) {
  int64_t b = 1;
  if (A <= 8)
    while (b < A) b *= 2;
  else
    b = A <= 64 ? (A + 7) / 8 * 8 : (A + 31) / 32 * 32;
  return std::min(b, slots);
}

bool Generator::graphs_usable(int64_t A, const KVCache& cache) const {
  return cuda_graphs_ && cfg_.device == Device::CUDA && !tp_ && cfg_.rope &&
         cfg_.no_rope_pattern.empty() && A >= 1 &&
         A <= cache.batch();
}

void Generator::set_cuda_graphs(bool on) { cuda_graphs_ = on; }

Generator::DecodeGraph& Generator::decode_graph(int64_t A, const KVCache& cache, int64_t V) {
  const int64_t Bk = bucket_size(A, cache.batch());
  const Device dev = cfg_.device;
  auto& slot = graphs_[Bk];
  if (!slot || slot->V != V) {
    MCPP_CHECK(launched_.empty(), "Generator: the vocabulary bound changed with steps in flight");
    slot = std::make_unique<DecodeGraph>();
  }
  DecodeGraph& g = *slot;
  g.V = V;
  if (!g.io_dev.defined()) {
    g.io_host = Tensor::empty({2 * Bk}, DType::I64, Device::CPU);
    g.io_dev = Tensor::empty({2 * Bk}, DType::I64, dev);
    g.tok_host = g.io_host.narrow(0, Bk).view({Bk, 1}), g.pos_host = g.io_host.narrow(Bk, Bk);
    g.tok_dev = g.io_dev.narrow(0, Bk).view({Bk, 1}), g.pos_dev = g.io_dev.narrow(Bk, Bk);
    for (int p = 0; p < 2; ++p) {
      g.io_pin[p] = ops::PinnedHost(size_t(2 * Bk) * sizeof(int64_t));
      g.ids_pin[p] = ops::PinnedHost(size_t(Bk) * sizeof(int64_t));
    }
  }
  model::ensure(g.ids_dev, {Bk}, DType::I64, dev);
  return g;
}

// A captured bucket's step, queued: its inputs through the parity's page-locked buffer (the
// other parity's may still feed the step before), rows of kFromLastStep copied on the device
// from the last step's ids, the replay, its ids back to the parity's buffer, the fence.
void Generator::replay_greedy(DecodeGraph& g, const Tensor& tokens, KVCache& cache, int par) {
  const int64_t A = tokens.size(0), Bk = g.tok_dev.size(0);
  Stream& st = ops::default_stream(cfg_.device);
  // This parity's buffers were last used two launches ago; that step has been collected or
  // its fence is waited for here (greedy_ids' collect waits at most once).
  g.done[par].wait();
  Tensor io = Tensor::wrap(g.io_pin[par].data(), {2 * Bk}, DType::I64);
  int64_t* tok = io.data<int64_t>();
  int64_t* pos = tok + Bk;
  positions(A, 1, cache, 0, pos);
  const int64_t* t = tokens.data<int64_t>();
  for (int64_t b = 0; b < A; ++b) tok[b] = t[b] == kFromLastStep ? 0 : t[b];
  for (int64_t b = A; b < Bk; ++b) tok[b] = 0, pos[b] = 0;
  ops::copy(io, g.io_dev, st);  // (from page-locked memory: returns at once)
  Tensor tok_flat = g.tok_dev.flat();
  for (int64_t b = 0; b < A;) {  // each run of rows that take the last step's ids
    if (t[b] != kFromLastStep) {
      ++b;
      continue;
    }
    int64_t e = b;
    while (e < A && t[e] == kFromLastStep) ++e;
    Tensor dst = tok_flat.narrow(b, e - b);
    ops::copy(last_ids_dev_.narrow(b, e - b), dst, st);
    b = e;
  }
  g.graph.replay(st);
  Tensor ids = Tensor::wrap(g.ids_pin[par].data(), {Bk}, DType::I64);
  ops::copy_to_host_async(g.ids_dev, ids, st);
  g.done[par].record(st);
  cache.advance(0, A, 1);
  last_ids_dev_ = g.ids_dev;
}

// A bucket's first steps, each run to its ids: eagerly first (this step's answer; it
// allocates the bucket's buffers and tunes its GEMMs, so that the capture that follows
// records kernels only -- the capture runs nothing), then the first replay checked against
// the eager step.
void Generator::greedy_graph_first(DecodeGraph& g, const Tensor& tokens, KVCache& cache,
                                   std::vector<int64_t>& ids_out) {
  const int64_t A = tokens.size(0), Bk = g.tok_dev.size(0);
  const int64_t V = g.V;
  Stream& st = ops::default_stream(cfg_.device);
  int64_t* pos = g.pos_host.data<int64_t>();
  int64_t* tok = g.tok_host.data<int64_t>();
  positions(A, 1, cache, 0, pos);
  for (int64_t b = 0; b < A; ++b) tok[b] = tokens.data<int64_t>()[b];
  for (int64_t b = A; b < Bk; ++b) tok[b] = 0, pos[b] = 0;
  ops::copy(g.io_host, g.io_dev, st);
  auto step = [&]() -> const Tensor& {
    const Tensor& lg = compute(g.tok_dev, pos, g.pos_dev, cache, 0, false, g.buf);
    ops::argmax_rows(lg, V, g.ids_dev, st);
    return lg;
  };
  auto to_host = [&](const Tensor& d, Tensor& h) {
    model::ensure(h, d.shape(), d.dtype(), Device::CPU);
    ops::copy(d, h, st);
  };
  if (!g.graph.ready()) {
    step();
    if (g.graph.begin_capture(st)) {
      step();
      if (!g.graph.end_capture(st)) {
        cuda_graphs_ = false;
        std::fprintf(stderr, "[generate] CUDA graph capture of the decode step (batch %lld) "
                             "failed: decoding without graphs\n", (long long)Bk);
      }
    }
  } else {
    // The first replay against the eager step on the same inputs, bit for bit (the eager
    // step rewrites the same cache rows with the same values).
    g.graph.replay(st);
    const Tensor& lg = g.buf.head.logits;
    to_host(lg, g.check_a);
    step();
    to_host(lg, g.check_b);
    g.checked = true;
    if (std::memcmp(g.check_a.raw(), g.check_b.raw(), g.check_a.nbytes()) != 0) {
      cuda_graphs_ = false;
      std::fprintf(stderr, "[generate] the CUDA graph of the decode step (batch %lld) differs "
                           "from the eager step: decoding without graphs\n", (long long)Bk);
    }
  }
  to_host(g.ids_dev, g.ids_host);
  cache.advance(0, A, 1);
  last_ids_dev_ = g.ids_dev;
  ids_out.assign(g.ids_host.data<int64_t>(), g.ids_host.data<int64_t>() + A);
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
