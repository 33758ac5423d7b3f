// The continuous-batching loop (engine.h): rank 0 decides, every TP rank runs the model.
#include "serve/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <string>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::serve {
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

// log softmax(row)[id] over the real vocabulary [0, V).
float log_prob(const std::vector<float>& row, int64_t V, int64_t id) {
  double mx = -INFINITY;
  for (int64_t i = 0; i < V; ++i) mx = std::max(mx, double(row[size_t(i)]));
  double sum = 0;
  for (int64_t i = 0; i < V; ++i) sum += std::exp(double(row[size_t(i)]) - mx);
  return float(double(row[size_t(id)]) - mx - std::log(sum));
}

constexpr auto kIdleHeartbeat = std::chrono::seconds(5);
constexpr int64_t kMaxPrefillTokens = 8192;  // rows of one batched prefill (its activations)
constexpr int64_t kWarmupPrompt = 128;       // prompt length of the start-up prefills

}  // namespace

Engine::Engine(inference::Generator& gen, const EngineOptions& opts, comm::Communicator* tp)
    : gen_(gen), opts_(opts), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  const auto& c = gen.config();
  if (opts_.max_seq <= 0)
    opts_.max_seq = c.max_position_embeddings;
  MCPP_CHECK_HINT(opts_.max_seq >= 2 && opts_.max_seq <= c.max_position_embeddings,
                  "pass --inference-max-seq-length between 2 and max_position_embeddings",
                  "--inference-max-seq-length {} is outside [2, {}]", opts_.max_seq,
                  c.max_position_embeddings);
  MCPP_CHECK_HINT(opts_.slots >= 1 && opts_.slots <= 4096,
                  "pass --inference-max-requests between 1 and 4096",
                  "--inference-max-requests {} is out of range", opts_.slots);
  MCPP_CHECK_HINT(opts_.max_waiting >= 0, "pass --max-queued-requests N with N >= 0",
                  "--max-queued-requests {} is negative", opts_.max_waiting);
  // MCPP_SERVE_PIPELINE=0 (docs/environment.md): every greedy step runs to its tokens.
  if (const char* e = std::getenv("MCPP_SERVE_PIPELINE"); e && *e) {
    const std::string v = e;
    MCPP_CHECK_HINT(v == "0" || v == "1", "set it to 0 or 1 (docs/environment.md)",
                    "MCPP_SERVE_PIPELINE={} is not 0 or 1", v);
    pipeline_ = v == "1";
  }
  if (opts_.vocab_size <= 0 || opts_.vocab_size > c.padded_vocab_size)
    opts_.vocab_size = c.padded_vocab_size;
  // The whole KV memory, allocated once: a burst of requests waits, it never allocates.
  cache_ = std::make_unique<inference::KVCache>(c, opts_.max_seq, opts_.slots, opts_.device);
  stats_.slots = opts_.slots, stats_.max_seq = opts_.max_seq;
  stats_.kv_cache_bytes = cache_->bytes();
  // On the GPU (one rank), each batch bucket's greedy decode step runs twice before the
  // first request: its GEMMs are tuned and its CUDA graph captured and checked now, not
  // in the middle of serving. Token 0 at position 0 of the empty slots; then all reset.
  if (opts_.device != Device::CPU && !tp_) {
    for (int64_t a = 1;; ++a) {
      const int64_t bk = inference::Generator::bucket_size(a, opts_.slots);
      if (bk < a) break;
      a = bk;
      Tensor t = Tensor::zeros({bk, 1}, DType::I64);
      for (int rep = 0; rep < 2; ++rep) {
        gen_.forward_greedy(t, *cache_, opts_.vocab_size);
        cache_->reset();
      }
      if (bk == opts_.slots) break;
    }
    // Then the batched prefills the join below makes (n = 1, 2, 4, ... prompts) at prompts
    // of kWarmupPrompt tokens: their GEMMs are tuned now -- one row count per shape class
    // (ops/cuda/gemm_tuning.h), which prompts of other lengths in the same class reuse --
    // and their attention plans built, not inside the first requests' prefills (at 64
    // concurrent streams those took 0.155 s of a 0.367 s run, 2026-12-03).
    const int64_t P = std::min<int64_t>(kWarmupPrompt, opts_.max_seq - 1);
    for (int64_t n = 1; n <= opts_.slots && n * P <= kMaxPrefillTokens; n *= 2) {
      Tensor t = Tensor::zeros({n, P}, DType::I64);
      if (n == 1)
        gen_.prefill(t, *cache_, 0, false);
      else
        gen_.prefill_batch(t, *cache_, 0);
      cache_->reset();
    }
  }
}

Engine::~Engine() = default;

std::shared_ptr<Sequence> Engine::submit(SequenceSpec spec, SequenceEvents events) {
  std::vector<SequenceSpec> s;
  s.push_back(std::move(spec));
  std::vector<SequenceEvents> e;
  e.push_back(std::move(events));
  return submit_all(std::move(s), std::move(e)).front();
}

std::vector<std::shared_ptr<Sequence>> Engine::submit_all(std::vector<SequenceSpec> specs,
                                                          std::vector<SequenceEvents> events) {
  MCPP_CHECK(specs.size() == events.size() && !specs.empty(), "Engine::submit_all: {} specs, {} events",
             specs.size(), events.size());
  std::vector<std::shared_ptr<Sequence>> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    auto& sp = specs[i];
    MCPP_CHECK(!sp.prompt.empty() && int64_t(sp.prompt.size()) < opts_.max_seq,
               "Engine::submit: a prompt of {} tokens for slots of {} positions", sp.prompt.size(),
               opts_.max_seq);
    for (int32_t id : sp.prompt)
      MCPP_CHECK(id >= 0 && id < gen_.config().padded_vocab_size,
                 "Engine::submit: token {} outside the vocabulary", id);
    auto s = std::make_shared<Sequence>();
    s->spec = std::move(sp);
    s->events = std::move(events[i]);
    out.push_back(std::move(s));
  }
  {
    std::lock_guard lk(mu_);
    if (stopping_) throw QueueFull("the server is shutting down");
    if (int64_t(waiting_.size() + out.size()) > opts_.max_waiting + opts_.slots - live_)
      throw QueueFull(fmt::format("{} sequences already wait for one of {} slots", waiting_.size(),
                                  opts_.slots));
    for (auto& s : out) waiting_.push_back(s);
  }
  cv_.notify_all();
  return out;
}

void Engine::shutdown() {
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

EngineStats Engine::stats() const {
  std::lock_guard lk(mu_);
  EngineStats s = stats_;
  s.waiting = int64_t(waiting_.size());
  if (idle_now_)  // the wait in progress, so far
    s.idle_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - idle_since_).count();
  return s;
}

void Engine::run() {
  if (!tp_ || tp_->rank() == 0)
    run_leader();
  else
    run_follower();
}

void Engine::broadcast_op(std::vector<int64_t>& op) {
  Stream& st = ops::default_stream(Device::CPU);
  Tensor n = Tensor::zeros({1}, DType::I64);
  n.data<int64_t>()[0] = int64_t(op.size());
  tp_->broadcast(n, 0, st);
  const int64_t len = n.data<int64_t>()[0];
  Tensor body = Tensor::zeros({std::max<int64_t>(len, 1)}, DType::I64);
  if (tp_->rank() == 0) std::copy(op.begin(), op.end(), body.data<int64_t>());
  tp_->broadcast(body, 0, st);
  op.assign(body.data<int64_t>(), body.data<int64_t>() + len);
}

// op: {kPrefill, slot, all_positions, P, tokens...} | {kPrefillBatch, slot, n, P, tokens...} |
//     {kDecode, A, tokens...} | {kDecodeGreedy, A, tokens...} | {kNoop} | {kExit}
// A decode step's token -1 marks a free slot below the last active one (a hole): its cache
// length is reset and it feeds token 0 at position 0, as the padding rows of a CUDA graph's
// bucket do; nothing reads its row.
const Tensor* Engine::execute(std::vector<int64_t>& op) {
  if (tp_) broadcast_op(op);
  switch (op.at(0)) {
    case kPrefill: {
      const int64_t slot = op[1], P = op[3];
      Tensor t = Tensor::empty({1, P}, DType::I64);
      std::copy(op.begin() + 4, op.begin() + 4 + P, t.data<int64_t>());
      // A slot is reused: the prefill writes from position 0.
      cache_->reset_slot(slot);
      return &gen_.prefill(t, *cache_, slot, op[2] != 0);
    }
    case kDecode: {
      Tensor t = decode_tokens(op);
      return &gen_.forward(t, *cache_);
    }
    case kPrefillBatch: {  // {kPrefillBatch, first slot, n, P, n x P tokens}
      const int64_t first = op[1], n = op[2], P = op[3];
      Tensor t = Tensor::empty({n, P}, DType::I64);
      std::copy(op.begin() + 4, op.begin() + 4 + n * P, t.data<int64_t>());
      for (int64_t j = 0; j < n; ++j) cache_->reset_slot(first + j);
      return &gen_.prefill_batch(t, *cache_, first);
    }
    case kDecodeGreedy: {
      Tensor t = decode_tokens(op);
      greedy_ids_ = &gen_.forward_greedy(t, *cache_, opts_.vocab_size);
      return nullptr;
    }
    default:
      return nullptr;
  }
}

// A decode op's tokens as [A, 1]; the holes' slots emptied, their token 0.
Tensor Engine::decode_tokens(const std::vector<int64_t>& op) {
  const int64_t A = op.at(1);
  Tensor t = Tensor::empty({A, 1}, DType::I64);
  int64_t* p = t.data<int64_t>();
  for (int64_t i = 0; i < A; ++i) {
    p[i] = op[size_t(2 + i)];
    if (p[i] < 0) {
      cache_->reset_slot(i);
      p[i] = 0;
    }
  }
  return t;
}

void Engine::run_follower() {
  for (;;) {
    std::vector<int64_t> op{kNoop};
    broadcast_op(op);
    if (op.at(0) == kExit) return;
    // execute() would broadcast again: run the op's model part directly.
    comm::Communicator* tp = tp_;
    tp_ = nullptr;
    execute(op);
    tp_ = tp;
  }
}

bool Engine::choose(Sequence& s, const Tensor& logits, int64_t row) {
  SequenceResult& r = s.result;
  const std::vector<float> lg = row_as_f32(logits, row);
  const int64_t id = inference::sample(lg, opts_.vocab_size, s.spec.sampling, s.spec.seq_index,
                                       uint64_t(r.tokens.size()));
  const float lp = s.spec.logprobs ? log_prob(lg, opts_.vocab_size, id) : 0.f;
  return accept(s, id, lp);
}

bool Engine::accept(Sequence& s, int64_t id, float lp) {
  SequenceResult& r = s.result;
  r.tokens.push_back(int32_t(id));
  if (s.spec.logprobs) r.logprobs.push_back(lp);
  {
    std::lock_guard lk(mu_);
    ++stats_.generated_tokens;
  }
  bool go = true;
  if (s.events.on_token) {
    const auto t0 = std::chrono::steady_clock::now();
    go = s.events.on_token(int32_t(id), lp);
    count_callback(t0);
  }
  if (!s.spec.ignore_eod && id == opts_.eod) {
    finish(s, "eod");
  } else if (std::find(s.spec.stop_tokens.begin(), s.spec.stop_tokens.end(), id) !=
             s.spec.stop_tokens.end()) {
    finish(s, "stop_token");
  } else if (!go) {
    finish(s, "stop");
  } else if (int64_t(r.tokens.size()) >= s.spec.max_new_tokens) {
    finish(s, "max_tokens");
  } else if (int64_t(s.spec.prompt.size() + r.tokens.size()) - 1 >= opts_.max_seq) {
    // (the token would be fed at that position; counted from the sequence, not the cache,
    // whose length a pipelined step in flight has already advanced)
    finish(s, "max_positions");
  } else {
    s.last = int32_t(id);
    return true;
  }
  return false;
}

void Engine::finish(Sequence& s, const std::string& reason) {
  s.result.stop_reason = reason;
  s.last = -1;
  {
    std::lock_guard lk(mu_);
    if (reason == "cancelled")
      ++stats_.cancelled;
    else
      ++stats_.completed;
  }
  if (s.events.on_done) {
    const auto t0 = std::chrono::steady_clock::now();
    s.events.on_done(s.result);
    count_callback(t0);
  }
}

void Engine::count_callback(std::chrono::steady_clock::time_point t0) {
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::lock_guard lk(mu_);
  stats_.callback_seconds += dt;
}

// Finished sequences leave the batch and free their slots where they are: no sequence's
// cache moves. The decode steps run slots [0, A), A one past the last active slot; a free
// slot below it is a hole that the next joining sequence fills (the step feeds it a
// padding token meanwhile: decode_tokens). Moving the last active sequence into each freed
// slot instead had cost 32 cache copies a move (16 layers, K and V), host time in every
// step where a group of sequences that joined together finished.
void Engine::compact() {
  std::lock_guard lk(mu_);
  for (auto& s : active_)
    if (s && s->last < 0) s.reset(), --live_;
  while (!active_.empty() && !active_.back()) active_.pop_back();
  stats_.active = live_;
}

void Engine::run_leader() {
  for (;;) {
    // A step in flight whose sequences have all finished (the one launched while the last
    // tokens were taken): collected before the engine may wait, its ids unused.
    if (live_ == 0 && !inflight_.empty()) {
      const double dt = collect_inflight();
      std::lock_guard lk(mu_);
      stats_.decode_seconds += dt;
    }
    std::vector<std::shared_ptr<Sequence>> admitted;
    bool stop = false;
    {
      std::unique_lock lk(mu_);
      const auto t_wait = std::chrono::steady_clock::now();
      idle_since_ = t_wait, idle_now_ = live_ == 0;  // (stats() counts an idle wait so far)
      const bool woke = cv_.wait_for(lk, kIdleHeartbeat, [&] {
        return stopping_ || live_ > 0 || (!waiting_.empty() && live_ < opts_.slots);
      });
      if (idle_now_)
        stats_.idle_seconds +=
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t_wait).count();
      idle_now_ = false;
      stop = stopping_;
      if (!woke && !stop) {
        lk.unlock();
        std::vector<int64_t> op{kNoop};
        execute(op);  // keeps the followers' broadcast inside its timeout
        continue;
      }
      // Cancelled waiters leave the queue without touching the model.
      for (auto it = waiting_.begin(); it != waiting_.end();) {
        if ((*it)->cancelled() || stop) {
          admitted.push_back(*it);  // finished below, outside the lock
          it = waiting_.erase(it);
        } else {
          ++it;
        }
      }
    }
    // This iteration's own host time (host_seconds): its wall time from here less the model
    // operations (ops_s) and the callbacks, added when the iteration ends, however it ends.
    double ops_s = 0;
    struct HostTime {
      Engine& e;
      const double& ops;
      const std::chrono::steady_clock::time_point t0;
      const double cb0;
      ~HostTime() {
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        std::lock_guard lk(e.mu_);
        e.stats_.host_seconds += std::max(0.0, dt - ops - (e.stats_.callback_seconds - cb0));
      }
    } host_time{*this, ops_s, std::chrono::steady_clock::now(), [&] {
                  std::lock_guard lk(mu_);
                  return stats_.callback_seconds;
                }()};
    for (auto& s : admitted) finish(*s, stop ? "shutdown" : "cancelled");
    admitted.clear();
    // Cancelled (or, on shutdown, all) active sequences leave at this token boundary.
    for (auto& s : active_)
      if (s && s->last >= 0 && (s->cancelled() || stop)) finish(*s, stop ? "shutdown" : "cancelled");
    compact();
    if (stop) {
      if (!inflight_.empty()) gen_.greedy_ids(), inflight_.clear();  // (its copies done)
      std::vector<int64_t> op{kExit};
      execute(op);
      return;
    }

    // Join: waiting sequences take the free slots, lowest first (the holes, then past the
    // last active slot). A run of prompts of one length that want no prompt
    // log-probabilities and took consecutive slots is prefilled together, n = a power of two
    // at a time (one [n, P] forward, every row at position 0: one read of the weights for n
    // prompts, not one per prompt).
    std::vector<std::shared_ptr<Sequence>> joined;
    std::vector<int64_t> slots;  // joined[i]'s slot
    {
      std::lock_guard lk(mu_);
      int64_t free = 0;  // the next slot to try
      while (!waiting_.empty() && live_ < opts_.slots) {
        while (free < int64_t(active_.size()) && active_[size_t(free)]) ++free;
        auto s = waiting_.front();
        waiting_.pop_front();
        if (free == int64_t(active_.size()))
          active_.push_back(s);
        else
          active_[size_t(free)] = s;
        ++live_;
        joined.push_back(s);
        slots.push_back(free);
        stats_.prompt_tokens += int64_t(s->spec.prompt.size());
      }
      stats_.active = live_;
      stats_.peak_active = std::max(stats_.peak_active, stats_.active);
    }
    for (size_t i = 0; i < joined.size();) {
      const Sequence& head = *joined[i];
      const int64_t P = int64_t(head.spec.prompt.size());
      size_t n = 1;
      if (!head.spec.logprobs)
        while (i + n < joined.size() && !joined[i + n]->spec.logprobs &&
               int64_t(joined[i + n]->spec.prompt.size()) == P &&
               slots[i + n] == slots[i] + int64_t(n) && int64_t(n + 1) * P <= kMaxPrefillTokens)
          ++n;
      // A power of two: the batched forwards then come in few shapes, each GEMM tuned once
      // (ops/cuda/gemm.cu tunes every new shape, tens of ms a shape).
      while (n & (n - 1)) n &= n - 1;
      const int64_t slot = slots[i];
      std::vector<int64_t> op{n == 1 ? kPrefill : kPrefillBatch, slot,
                              n == 1 ? (head.spec.logprobs ? 1 : 0) : int64_t(n), P};
      for (size_t j = 0; j < n; ++j)
        op.insert(op.end(), joined[i + j]->spec.prompt.begin(), joined[i + j]->spec.prompt.end());
      const auto t0 = std::chrono::steady_clock::now();
      const Tensor& logits = *execute(op);
      {
        const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ops_s += dt;
        std::lock_guard lk(mu_);
        stats_.prefills += 1, stats_.prefill_rows += int64_t(n);
        stats_.prefill_seconds += dt;
      }
      for (size_t j = 0; j < n; ++j) {
        Sequence& s = *joined[i + j];
        if (s.spec.logprobs) {  // (alone) logits [P, 1, Vp]: row r scores prompt token r + 1
          for (int64_t r = 0; r + 1 < P; ++r)
            s.result.prompt_logprobs.push_back(
                log_prob(row_as_f32(logits, r), opts_.vocab_size, s.spec.prompt[size_t(r + 1)]));
        }
        if (s.spec.max_new_tokens <= 0)
          finish(s, "max_tokens");
        else
          choose(s, logits, s.spec.logprobs ? P - 1 : int64_t(j));
      }
      i += n;
    }
    compact();

    // Decode: one row per slot up to the last active one, each sequence at its own position
    // (a hole: a padding row, decode_tokens).
    int64_t A = int64_t(active_.size());
    if (A == 0) continue;
    const bool greedy = std::all_of(active_.begin(), active_.end(), [](const auto& s) {
      return !s || (s->spec.sampling.is_greedy() && !s->spec.logprobs);
    });
    if (greedy && !tp_ && pipeline_) {
      // Pipelined (one rank): this step is queued before the step in flight has been
      // collected -- a sequence in it feeds the id that step gives its row, read on the
      // device (Generator::kFromLastStep) -- and that step's tokens are then taken (the
      // callbacks, the replies) while the device runs this one. A sequence that stops at
      // the step in flight has a row in this one too, whose id nobody takes.
      Tensor t = Tensor::empty({A, 1}, DType::I64);
      int64_t* p = t.data<int64_t>();
      for (int64_t i = 0; i < A; ++i) {
        const auto& s = active_[size_t(i)];
        const bool pending = s && i < int64_t(inflight_.size()) && inflight_[size_t(i)] == s;
        if (!s || (pending && cache_->length(i) >= opts_.max_seq)) {
          // A hole, or a sequence whose pending token ends it at the last position (accept's
          // max_positions): a padding row.
          cache_->reset_slot(i);
          p[i] = 0;
        } else {
          p[i] = pending ? inference::Generator::kFromLastStep : s->last;
        }
      }
      const auto t0 = std::chrono::steady_clock::now();
      gen_.launch_greedy(t, *cache_, opts_.vocab_size);
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double dw = collect_inflight();
      ops_s += dt + dw;
      {
        std::lock_guard lk(mu_);
        stats_.decode_steps += 1, stats_.decode_rows += A;
        stats_.decode_seconds += dt + dw;
      }
      inflight_ = active_;
      compact();
      continue;
    }
    // Every other step runs to its result: the step in flight is collected first.
    if (!inflight_.empty()) {
      const double dw = collect_inflight();
      ops_s += dw;
      std::lock_guard lk(mu_);
      stats_.decode_seconds += dw;
    }
    compact();
    A = int64_t(active_.size());
    if (A == 0) continue;
    std::vector<int64_t> op{greedy ? kDecodeGreedy : kDecode, A};
    for (auto& s : active_) op.push_back(s ? s->last : -1);
    const auto t0 = std::chrono::steady_clock::now();
    const Tensor* logits = execute(op);
    {
      const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      ops_s += dt;
      std::lock_guard lk(mu_);
      stats_.decode_steps += 1, stats_.decode_rows += A;
      stats_.decode_seconds += dt;
    }
    for (int64_t i = 0; i < A; ++i) {
      if (!active_[size_t(i)]) continue;
      Sequence& s = *active_[size_t(i)];
      if (s.cancelled())
        finish(s, "cancelled");
      else if (greedy)
        accept(s, (*greedy_ids_)[size_t(i)], 0.f);
      else
        choose(s, *logits, i);
    }
    compact();
  }
}

// Waits for the pipelined step in flight and takes its ids: each row's sequence, as it was
// at the launch, accepts its token unless it has finished since (stopped at the step
// before, cancelled). Returns the seconds spent waiting.
double Engine::collect_inflight() {
  if (inflight_.empty()) return 0;
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int64_t>& ids = gen_.greedy_ids();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<std::shared_ptr<Sequence>> rows;
  rows.swap(inflight_);
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i] || rows[i]->last < 0) continue;
    Sequence& s = *rows[i];
    if (s.cancelled())
      finish(s, "cancelled");
    else
      accept(s, ids[i], 0.f);
  }
  return dt;
}

}  // namespace mcpp::serve
