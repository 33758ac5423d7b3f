// Text generation with a KV cache: the GPT model's own modules run for inference (no
// dropout, nothing saved for backward, only the new positions computed), a prompt
// prefill, then one token per decode step.
//
//   Generator g(params, cfg);            // the weights of a model::GPTModel / checkpoint
//   KVCache cache(cfg, max_seq, B);
//   g.prefill(prompt /*[1, P] i64*/, cache, slot)  -> logits [1, Vp] of the prompt's end
//   g.forward(tokens /*[A, Sq] i64*/, cache)       -> logits [A, Vp] of the last new rows
//
// Both run the same layers as model::GPTModel::forward (pre-norm, grouped QKV, RoPE or
// learned position embeddings at each sequence's absolute positions, GELU or SwiGLU, tied
// or untied output layer): model::TransformerLayer::forward_cached, whose Attention
// appends to and reads from the cache. Every cache slot has its own length, so a batch
// holds prompts of different lengths: each prompt is prefilled alone into its slot (no
// padding, no masks, its positions exact), then the batch decodes one token per step,
// each sequence at its own position (generate_batch below); a finished sequence leaves
// the batch (KVCache::move_slot compacts the active slots to the front).
// On the model's device (the logits come back on the host), serial or tensor-parallel.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "inference/kv_cache.h"
#include "inference/sampling.h"
#include "model/config.h"
#include "model/params.h"
#include "model/stage.h"
#include "tensor/tensor.h"

namespace mcpp::inference {

class Generator {
 public:
  // params must outlive the generator (it keeps views of them). With cfg.tp_size > 1,
  // params hold TP rank cfg.tp_rank's shards and tp is the TP group (every rank calls
  // forward() with the same tokens; each gets the whole vocabulary's logits).
  Generator(const model::ParamStore& params, const model::TransformerConfig& cfg,
            comm::Communicator* tp = nullptr);
  ~Generator();

  const model::TransformerConfig& config() const { return cfg_; }

  // tokens [A, Sq] i64 for the cache's first A slots, slot b at positions
  // [cache.length(b), +Sq) (lengths that differ need Sq = 1); advances those slots by Sq.
  // Returns the logits [A, Vp] of the last new position, or with all_positions the
  // logits [Sq, A, Vp] of every new position (sequence-first, as GPTModel::logits()).
  // The reference stays valid until the next call.
  const Tensor& forward(const Tensor& tokens, KVCache& cache, bool all_positions = false);
  // One sequence alone: tokens [1, Sq] into cache slot `slot` at [cache.length(slot), +Sq)
  // (a prompt's prefill); logits as forward's.
  const Tensor& prefill(const Tensor& tokens, KVCache& cache, int64_t slot,
                        bool all_positions = false);
  // Prompts of one length together: tokens [n, P] into the empty slots [first, first + n)
  // (the batched prefill of a server); logits [n, Vp] of each prompt's last position.
  const Tensor& prefill_batch(const Tensor& tokens, KVCache& cache, int64_t first);
  // A greedy decode step: forward(tokens [A, 1]) with the argmax over [0, V) of each row
  // taken on the model's device (ops::argmax_rows), so a GPU step brings back A ids
  // instead of A x Vp logits. The ids (those inference::argmax gives on the logits) stay
  // valid until the next call.
  const std::vector<int64_t>& forward_greedy(const Tensor& tokens, KVCache& cache, int64_t V);
  // forward_greedy in two halves, so that the host works while the device runs the step
  // (the server's pipelined decode): launch_greedy queues the step and advances the cache;
  // greedy_ids waits for the oldest launched step and returns its ids (valid until the next
  // call of either). A token kFromLastStep takes the id that the step launched before this
  // one gave the same row -- read on the device where the step replays a CUDA graph, so the
  // host need not have waited for it. At most two steps are launched and not yet collected;
  // forward_greedy needs none.
  static constexpr int64_t kFromLastStep = -2;
  void launch_greedy(const Tensor& tokens, KVCache& cache, int64_t V);
  const std::vector<int64_t>& greedy_ids();
  // forward_greedy on the GPU replays a CUDA graph of the whole step per batch bucket (on by
  // default; RoPE models without TP; see generator.cpp). Off: every step launches its ops.
  void set_cuda_graphs(bool on);
  bool cuda_graphs() const { return cuda_graphs_; }
  // The rows a decode step of A sequences runs as under graphs (A rounded up: powers of
  // two to 8, multiples of 8 to 64, of 32 beyond; at most `slots`).
  static int64_t bucket_size(int64_t A, int64_t slots);

 private:
  struct Buffers;
  // The forward over cache slots [first, first + tokens.size(0)).
  const Tensor& run(const Tensor& tokens, KVCache& cache, int64_t first, bool all_positions);
  // The same, the logits left on the model's device (gathered over TP).
  const Tensor& run_on_device(const Tensor& tokens, KVCache& cache, int64_t first,
                              bool all_positions);
  // pos[b] = slot first+b's length, checked against the cache and the model's positions.
  void positions(int64_t B, int64_t Sq, const KVCache& cache, int64_t first, int64_t* pos) const;
  // The forward of tokens [B, Sq] at host positions pos (pos_dev: the same on the device)
  // into buffers bf; the cache's lengths are not advanced. Returns the device logits.
  const Tensor& compute(const Tensor& tokens, const int64_t* pos, const Tensor& pos_dev,
                        KVCache& cache, int64_t first, bool all_positions, Buffers& bf);
  struct DecodeGraph;
  bool graphs_usable(int64_t A, const KVCache& cache) const;
  // launch_greedy's three ways: a captured bucket's replay, queued (its ids come back
  // without the host waiting); a bucket's first steps (eager, capture, checked replay) and a
  // step without graphs, each run to its ids.
  DecodeGraph& decode_graph(int64_t A, const KVCache& cache, int64_t V);  // A's bucket
  void replay_greedy(DecodeGraph& g, const Tensor& tokens, KVCache& cache, int par);
  void greedy_graph_first(DecodeGraph& g, const Tensor& tokens, KVCache& cache,
                          std::vector<int64_t>& ids);
  void greedy_eager(const Tensor& tokens, KVCache& cache, int64_t V, std::vector<int64_t>& ids);
  struct Launched;  // a launched greedy step, until greedy_ids() collects it
  std::vector<Launched> launched_;  // oldest first
  std::vector<int64_t> last_ids_;  // the last launched step's ids on the host (when known)
  Tensor last_ids_dev_;            // ... and on the device: kFromLastStep reads them there
  int64_t last_rows_ = 0;          // that step's rows
  uint64_t launches_ = 0;          // the parity picks a graph's host buffers
  std::vector<int64_t> greedy_ids_;
  bool cuda_graphs_ = true;
  std::map<int64_t, std::unique_ptr<DecodeGraph>> graphs_;  // by bucket size
  model::TransformerConfig cfg_;
  comm::Communicator* tp_ = nullptr;
  std::unique_ptr<model::Stage> stage_;  // the model's modules over the given parameters
  std::unique_ptr<Buffers> buf_;
};

struct GenerateOptions {
  int64_t tokens_to_generate = 64;  // --num-tokens-to-generate (Megatron's tokens_to_generate)
  SamplingParams sampling;
  std::vector<int64_t> stop_tokens;  // --stop-token (the EOD always stops unless ignore_eod)
  bool ignore_eod = false;
  int64_t vocab_size = 0;  // tokens >= this are never sampled (0: Vp)
  int64_t eod = -1;        // the tokenizer's end of document
};

struct GenerateResult {
  std::vector<int32_t> tokens;  // generated ids (the stop token included when one stopped it)
  std::string stop_reason;      // "eod", "stop_token", "max_tokens", "max_positions"
  int64_t prompt_tokens = 0;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_steps = 0;  // forward passes after the prefill
};

// Generates continuations of up to cache.batch() prompts of any lengths at once: each
// prompt prefilled alone into its cache slot, then one decode step per token for all
// unfinished sequences together; a sequence leaves the batch when it stops. Prompt i
// samples as sequence first_sequence_index + i (see sampling.h), so its tokens do not
// depend on the batch it runs in. on_token(i, id) is called as soon as prompt i's token
// is chosen (streaming). cache is reset; a sequence that fills its slot (or the model's
// positions) stops with "max_positions". An empty prompt, one longer than the cache, or
// more prompts than slots is an mcpp::Error.
std::vector<GenerateResult> generate_batch(
    Generator& g, KVCache& cache, const std::vector<std::span<const int32_t>>& prompts,
    const GenerateOptions& opts, uint64_t first_sequence_index = 0,
    const std::function<void(size_t, int32_t)>& on_token = {});

// One prompt (generate_batch with a batch of one).
GenerateResult generate(Generator& g, KVCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, uint64_t sequence_index = 0,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace mcpp::inference
