// Choosing the next token from a row of logits: greedy (argmax), or sampling at a
// temperature from the whole vocabulary, the top-k tokens, or the top-p nucleus, as
// Megatron's text generation server (megatron/core/inference/... sample()):
//
//   temperature  0 < t <= 100 (default 1.0); logits are divided by t before the softmax
//   top_k        0 (off) .. 1000; 1 is greedy
//   top_p        0 (off) < p <= 1: the smallest set of most probable tokens whose
//                probability sum reaches p
//   top_k and top_p together are an error, as in Megatron.
//
// Draws come from Philox(seed, stream = sequence index, counter = step), so a seed fixes
// every sample of every sequence whatever the batch composition or thread count.
// Columns >= vocab_size (the padding of the output layer to Vp) are never chosen.
#pragma once
#include <cstdint>
#include <span>

namespace mcpp::inference {

struct SamplingParams {
  bool greedy = false;       // --greedy: argmax, the other fields ignored
  double temperature = 1.0;  // --temperature
  int64_t top_k = 0;         // --top-k
  double top_p = 0.0;        // --top-p
  uint64_t seed = 1234;      // --seed / random_seed
  // Greedy when asked for, or when top_k == 1 (Megatron's rule).
  bool is_greedy() const { return greedy || top_k == 1; }
};

// Throws mcpp::Error naming the flag for out-of-range or conflicting values.
void validate(const SamplingParams& p);

// Index of the largest of logits[0, vocab_size) (the first on ties).
int64_t argmax(std::span<const float> logits, int64_t vocab_size);

// The next token of sequence `seq` at generation step `step`.
int64_t sample(std::span<const float> logits, int64_t vocab_size, const SamplingParams& p,
               uint64_t seq, uint64_t step);

}  // namespace mcpp::inference
