// The serving engine: continuous batching of independent sequences over one Generator and
// one KV cache of fixed size (planned once at start-up: slots x positions, never grown).
//
//   Engine e(gen, {.slots = 16, .max_seq = 2048, .max_waiting = 256}, tp_comm);
//   auto seq = e.submit(spec, events);   // any thread; a full queue is QueueFull
//   e.run();                             // the main thread of every rank, until shutdown()
//
// Each iteration of run() (a token boundary): cancelled sequences leave, waiting
// sequences join while a slot is free (each prompt prefilled into its slot -- prompts of one
// length that arrived together in one batched forward -- and its first token sampled), then every active sequence decodes one token together, each at its own
// position (when every active sequence is greedy and wants no log-probabilities, the
// argmax is taken on the model's device: Generator::forward_greedy); a sequence that stops
// leaves the batch at once, its slot free where it is (no cache moves: the steps run the
// slots up to the last active one, a free slot below it decoding a padding row), and a
// waiting one takes the lowest free slot in the next iteration. A sequence samples exactly as in inference::generate_batch (Philox stream
// = spec.seq_index, counter = its step), so its tokens do not depend on which others share
// the batch (up to the floating-point order of a batched GEMM).
//
// Pipelined decode (one rank, every active sequence greedy): each step is queued before the
// step in flight has been collected -- a sequence in that step feeds the id it gives, read on
// the device (Generator::launch_greedy, kFromLastStep) -- and that step's tokens are then
// taken, callbacks and replies included, while the device runs the new one: the GPU does
// not wait for the host between steps. A sequence that stops at the step in flight has a
// row in the next one whose id nobody takes. MCPP_SERVE_PIPELINE=0: each step runs to its
// tokens first.
//
// Tensor parallelism: every rank runs run(); rank 0 owns the queue and the sampling and
// broadcasts each model operation (prefill, decode, exit) to the TP group before
// running it, so all ranks call the Generator with the same tokens in the same order. When
// idle, rank 0 sends a no-op every few seconds so the followers' broadcast never reaches
// the communicator's timeout.
//
// Callbacks run on the engine thread (rank 0); they must not block for long.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "inference/generator.h"

namespace mcpp::serve {

struct EngineOptions {
  int64_t slots = 8;          // sequences decoded together (--inference-max-requests)
  int64_t max_seq = 0;        // positions per slot (--inference-max-seq-length)
  int64_t max_waiting = 256;  // sequences allowed to wait for a slot (--max-queued-requests)
  int64_t vocab_size = 0;     // tokens >= this are never sampled
  int64_t eod = -1;           // the tokenizer's end of document
  Device device = Device::CPU;
};

struct SequenceSpec {
  std::vector<int32_t> prompt;  // non-empty, at most max_seq - 1 ... checked by the caller
  int64_t max_new_tokens = 16;
  inference::SamplingParams sampling;
  uint64_t seq_index = 0;  // Philox stream of the sampler (prompt index inside a request)
  bool ignore_eod = false;
  std::vector<int64_t> stop_tokens;
  bool logprobs = false;  // log-probabilities of the prompt's tokens 1.. and of each new one
};

struct SequenceResult {
  std::vector<int32_t> tokens;         // generated ids (a stopping EOD/stop token included)
  std::vector<float> prompt_logprobs;  // [P - 1] when spec.logprobs
  std::vector<float> logprobs;         // one per generated token when spec.logprobs
  // "eod", "stop_token", "stop" (on_token said so), "max_tokens", "max_positions",
  // "cancelled", "shutdown"
  std::string stop_reason;
};

struct SequenceEvents {
  // A new token and its log-probability (0 unless spec.logprobs); false stops the sequence
  // (stop strings, end of line). Not called for a sequence that is cancelled.
  std::function<bool(int32_t id, float logprob)> on_token;
  // Always called exactly once, last.
  std::function<void(const SequenceResult&)> on_done;
};

class Sequence {
 public:
  void cancel() { cancelled_ = true; }
  bool cancelled() const { return cancelled_; }

 private:
  friend class Engine;
  SequenceSpec spec;
  SequenceEvents events;
  SequenceResult result;
  int32_t last = -1;  // the token to feed at the next decode step
  std::atomic<bool> cancelled_{false};
};

struct EngineStats {
  int64_t slots = 0, max_seq = 0, active = 0, waiting = 0;
  int64_t completed = 0, cancelled = 0, generated_tokens = 0, prompt_tokens = 0;
  int64_t peak_active = 0;
  size_t kv_cache_bytes = 0;
  // Where the engine's time goes (rank 0, wall time of the model operations including the
  // copy of their result to the host): decode steps and the rows they ran, prefills.
  int64_t decode_steps = 0, decode_rows = 0, prefills = 0, prefill_rows = 0;
  double decode_seconds = 0, prefill_seconds = 0;
  // The rest of the engine thread's time: waiting for work with no sequence active, and
  // inside the sequences' callbacks (the service's token handling and replies). A run's
  // wall time less these and the model operations is the engine's own bookkeeping.
  double idle_seconds = 0, callback_seconds = 0;
  // The engine thread's own work while it has work: its loop's wall time (after the wait)
  // less the model operations and the callbacks -- joins, token bookkeeping.
  double host_seconds = 0;
};

struct QueueFull : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Engine {
 public:
  // gen must outlive the engine. tp: the TP group (nullptr for one rank).
  Engine(inference::Generator& gen, const EngineOptions& opts, comm::Communicator* tp = nullptr);
  ~Engine();

  // Rank 0, any thread. Throws QueueFull when max_waiting sequences already wait.
  std::shared_ptr<Sequence> submit(SequenceSpec spec, SequenceEvents events);
  // Several sequences of one request, all queued or none (QueueFull).
  std::vector<std::shared_ptr<Sequence>> submit_all(std::vector<SequenceSpec> specs,
                                                    std::vector<SequenceEvents> events);
  // Every rank, its main thread: serves until shutdown() (rank 0), then tells the others.
  void run();
  // Rank 0, any thread: waiting and active sequences end with "shutdown"; run() returns.
  void shutdown();
  EngineStats stats() const;
  const EngineOptions& options() const { return opts_; }

 private:
  enum Op : int64_t { kNoop = 0, kPrefill = 1, kDecode = 2, kExit = 4, kDecodeGreedy = 5,
              kPrefillBatch = 6 };
  void run_leader();
  void run_follower();
  // Broadcasts op to the TP group (rank 0) and runs it; returns the logits of prefill/decode.
  const Tensor* execute(std::vector<int64_t>& op);
  void broadcast_op(std::vector<int64_t>& op);
  // Samples sequence s's next token from logits row `row`; false when it stops.
  bool choose(Sequence& s, const Tensor& logits, int64_t row);
  // Records sequence s's new token id (its log-probability lp); false when it stops.
  bool accept(Sequence& s, int64_t id, float lp);
  double collect_inflight();  // run_leader's pipelined step: waits for it, takes its tokens
  void finish(Sequence& s, const std::string& reason);
  void count_callback(std::chrono::steady_clock::time_point t0);  // += now - t0
  void compact();  // finished sequences leave their slots (holes below the last active one)
  Tensor decode_tokens(const std::vector<int64_t>& op);  // a decode op's [A, 1] tokens

  inference::Generator& gen_;
  EngineOptions opts_;
  comm::Communicator* tp_;
  std::unique_ptr<inference::KVCache> cache_;
  std::vector<std::shared_ptr<Sequence>> active_;  // by slot; null: a free slot (a hole)
  int64_t live_ = 0;                               // non-null entries of active_
  bool idle_now_ = false;                          // run_leader waits with nothing active ...
  std::chrono::steady_clock::time_point idle_since_;  // ... since then
  const std::vector<int64_t>* greedy_ids_ = nullptr;  // the last kDecodeGreedy's ids
  // The pipelined greedy step in flight (one rank): the sequence of each of its rows as at
  // its launch (null: a hole); empty when none is in flight.
  std::vector<std::shared_ptr<Sequence>> inflight_;
  bool pipeline_ = true;  // MCPP_SERVE_PIPELINE
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Sequence>> waiting_;
  bool stopping_ = false;
  EngineStats stats_;
};

}  // namespace mcpp::serve
