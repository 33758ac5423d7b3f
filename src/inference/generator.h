// Text generation with a KV cache: the GPT model's own modules run for inference (no
// dropout, nothing saved for backward, only the new positions computed), a prompt
// prefill, then one token per decode step.
//
//   Generator g(params, cfg);            // the weights of a model::GPTModel / checkpoint
//   KVCache cache(cfg, max_seq, B);
//   g.forward(tokens /*[B, Sq] i64*/, cache)   -> logits [B, Vp] of the last new position
//
// forward() runs positions [cache.length(), cache.length() + Sq) of all B sequences: the
// same layers as model::GPTModel::forward (pre-norm, grouped QKV, RoPE at the absolute
// position or learned position embeddings indexed by it, GELU or SwiGLU, tied or untied
// output layer): model::TransformerLayer::forward_cached, whose Attention appends to and
// reads from the cache.
// Sequences of a batch advance in lock step (one shared position), so a batch holds
// prompts of equal length; generate() runs one prompt at a time (B = 1), which keeps
// the cache dense and every prompt's positions exact without padding or masks.
// On the model's device (the logits come back on the host), serial or tensor-parallel.
#pragma once
#include <cstdint>
#include <functional>
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

  // tokens [B, Sq] i64 at positions [cache.length(), +Sq); advances the cache by Sq.
  // Returns the logits [B, Vp] of the last new position, or with all_positions the
  // logits [Sq, B, Vp] of every new position (sequence-first, as GPTModel::logits()).
  // The reference stays valid until the next call.
  const Tensor& forward(const Tensor& tokens, KVCache& cache, bool all_positions = false);

 private:
  struct Buffers;
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

// Generates a continuation of one prompt (B = 1). on_token(id) is called as soon as each
// token is chosen (streaming). cache is reset and must hold prompt + new tokens, or
// generation stops at its end ("max_positions"). A prompt longer than the cache, or an
// empty prompt, is an mcpp::Error.
GenerateResult generate(Generator& g, KVCache& cache, std::span<const int32_t> prompt,
                        const GenerateOptions& opts, uint64_t sequence_index = 0,
                        const std::function<void(int32_t)>& on_token = {});

}  // namespace mcpp::inference
