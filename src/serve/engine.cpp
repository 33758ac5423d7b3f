// The continuous-batching loop (engine.h): rank 0 decides, every TP rank runs the model.
#include "serve/engine.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

Engine::Engine(inference::Generator& gen, const EngineOptions& opts, comm::Communicator* tp)
    : gen_(gen), opts_(opts), tp_(tp && tp->size() > 1 ? tp : nullptr) {
  const auto& c = gen.config();
  if (opts_.max_seq <= 0) opts_.max_seq = c.max_position_embeddings;
  MCPP_CHECK_HINT(opts_.max_seq >= 2 && opts_.max_seq <= c.max_position_embeddings,
                  "pass --inference-max-seq-length between 2 and max_position_embeddings",
                  "--inference-max-seq-length {} is outside [2, {}]", opts_.max_seq,
                  c.max_position_embeddings);
  MCPP_CHECK_HINT(opts_.slots >= 1 && opts_.slots <= 4096,
                  "pass --inference-max-requests between 1 and 4096",
                  "--inference-max-requests {} is out of range", opts_.slots);
  MCPP_CHECK_HINT(opts_.max_waiting >= 0, "pass --max-queued-requests N with N >= 0",
                  "--max-queued-requests {} is negative", opts_.max_waiting);
  if (opts_.vocab_size <= 0 || opts_.vocab_size > c.padded_vocab_size)
    opts_.vocab_size = c.padded_vocab_size;
  // The whole KV memory, allocated once: a burst of requests waits, it never allocates.
  cache_ = std::make_unique<inference::KVCache>(c, opts_.max_seq, opts_.slots, opts_.device);
  stats_.slots = opts_.slots, stats_.max_seq = opts_.max_seq;
  stats_.kv_cache_bytes = cache_->bytes();
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
    if (int64_t(waiting_.size() + out.size()) > opts_.max_waiting + opts_.slots - int64_t(active_.size()))
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

// op: {kPrefill, slot, all_positions, P, tokens...} | {kDecode, A, tokens...} |
//     {kMove, from, to} | {kNoop} | {kExit}
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
      const int64_t A = op[1];
      Tensor t = Tensor::empty({A, 1}, DType::I64);
      std::copy(op.begin() + 2, op.begin() + 2 + A, t.data<int64_t>());
      return &gen_.forward(t, *cache_);
    }
    case kMove:
      cache_->move_slot(op[1], op[2]);
      return nullptr;
    default:
      return nullptr;
  }
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

bool Engine::choose(Sequence& s, const Tensor& logits, int64_t row, int64_t slot) {
  SequenceResult& r = s.result;
  const std::vector<float> lg = row_as_f32(logits, row);
  const int64_t id = inference::sample(lg, opts_.vocab_size, s.spec.sampling, s.spec.seq_index,
                                       uint64_t(r.tokens.size()));
  const float lp = s.spec.logprobs ? log_prob(lg, opts_.vocab_size, id) : 0.f;
  r.tokens.push_back(int32_t(id));
  if (s.spec.logprobs) r.logprobs.push_back(lp);
  {
    std::lock_guard lk(mu_);
    ++stats_.generated_tokens;
  }
  bool go = true;
  if (s.events.on_token) go = s.events.on_token(int32_t(id), lp);
  if (!s.spec.ignore_eod && id == opts_.eod) {
    finish(s, "eod");
  } else if (std::find(s.spec.stop_tokens.begin(), s.spec.stop_tokens.end(), id) !=
             s.spec.stop_tokens.end()) {
    finish(s, "stop_token");
  } else if (!go) {
    finish(s, "stop");
  } else if (int64_t(r.tokens.size()) >= s.spec.max_new_tokens) {
    finish(s, "max_tokens");
  } else if (cache_->length(slot) >= opts_.max_seq) {
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
  if (s.events.on_done) s.events.on_done(s.result);
}

void Engine::compact() {
  for (int64_t i = 0; i < int64_t(active_.size());) {
    if (active_[size_t(i)]->last >= 0) {
      ++i;
      continue;
    }
    const int64_t end = int64_t(active_.size()) - 1;
    if (i != end) {
      std::vector<int64_t> op{kMove, end, i};
      execute(op);
      active_[size_t(i)] = active_[size_t(end)];
    }
    {
      std::lock_guard lk(mu_);
      active_.pop_back();
      stats_.active = int64_t(active_.size());
    }
  }
}

void Engine::run_leader() {
  for (;;) {
    std::vector<std::shared_ptr<Sequence>> admitted;
    bool stop = false;
    {
      std::unique_lock lk(mu_);
      const bool woke = cv_.wait_for(lk, kIdleHeartbeat, [&] {
        return stopping_ || !active_.empty() ||
               (!waiting_.empty() && int64_t(active_.size()) < opts_.slots);
      });
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
    for (auto& s : admitted) finish(*s, stop ? "shutdown" : "cancelled");
    admitted.clear();
    // Cancelled (or, on shutdown, all) active sequences leave at this token boundary.
    for (auto& s : active_)
      if (s->last >= 0 && (s->cancelled() || stop)) finish(*s, stop ? "shutdown" : "cancelled");
    compact();
    if (stop) {
      std::vector<int64_t> op{kExit};
      execute(op);
      return;
    }

    // Join: each waiting sequence into the next free slot, prefilled alone.
    for (;;) {
      std::shared_ptr<Sequence> s;
      {
        std::lock_guard lk(mu_);
        if (waiting_.empty() || int64_t(active_.size()) >= opts_.slots) break;
        s = waiting_.front();
        waiting_.pop_front();
        active_.push_back(s);
        stats_.active = int64_t(active_.size());
        stats_.peak_active = std::max(stats_.peak_active, stats_.active);
        stats_.prompt_tokens += int64_t(s->spec.prompt.size());
      }
      const int64_t slot = int64_t(active_.size()) - 1, P = int64_t(s->spec.prompt.size());
      std::vector<int64_t> op{kPrefill, slot, s->spec.logprobs ? 1 : 0, P};
      op.insert(op.end(), s->spec.prompt.begin(), s->spec.prompt.end());
      const Tensor& logits = *execute(op);
      if (s->spec.logprobs) {  // logits [P, 1, Vp]: row i scores prompt token i + 1
        for (int64_t i = 0; i + 1 < P; ++i)
          s->result.prompt_logprobs.push_back(
              log_prob(row_as_f32(logits, i), opts_.vocab_size, s->spec.prompt[size_t(i + 1)]));
      }
      if (s->spec.max_new_tokens <= 0)
        finish(*s, "max_tokens");
      else
        choose(*s, logits, s->spec.logprobs ? P - 1 : 0, slot);
    }
    compact();

    // Decode: one row per active sequence, each at its own position.
    const int64_t A = int64_t(active_.size());
    if (A == 0) continue;
    std::vector<int64_t> op{kDecode, A};
    for (auto& s : active_) op.push_back(s->last);
    const Tensor& logits = *execute(op);
    for (int64_t i = 0; i < A; ++i) {
      Sequence& s = *active_[size_t(i)];
      if (s.cancelled())
        finish(s, "cancelled");
      else
        choose(s, logits, i, i);
    }
    compact();
  }
}

}  // namespace mcpp::serve
