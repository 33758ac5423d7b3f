// The key/value cache of incremental decoding: per transformer layer, the RoPE-rotated
// keys and the values of every position seen so far, so a decode step computes only the
// new token's row instead of the whole sequence again.
//
//   k[l], v[l]  [B, max_seq, NG, HD]   slot b's rows [0, length(b)) valid
//
// Batch-first: each sequence owns a contiguous slot, so sequences of one batch can hold
// different lengths (prompts of different lengths), a slot is itself a B = 1 cache (a
// prompt is prefilled alone into its slot), and a finished sequence leaves the batch by
// moving the last active slot into its place (the active slots stay the first ones).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::inference {

class KVCache {
 public:
  // max_seq: positions to hold per sequence (at most the model's max_position_embeddings).
  KVCache(const model::TransformerConfig& cfg, int64_t max_seq, int64_t batch,
          Device device = Device::CPU);

  int64_t max_seq() const { return max_seq_; }
  int64_t batch() const { return batch_; }
  int64_t length(int64_t slot) const { return lengths_.at(size_t(slot)); }
  // The common length when every slot holds the same (lock step); an error otherwise.
  int64_t length() const;
  const std::vector<int64_t>& lengths() const { return lengths_; }
  Tensor& k(int64_t layer) { return k_[size_t(layer)]; }
  Tensor& v(int64_t layer) { return v_[size_t(layer)]; }

  // Called by the generator after every layer has appended n positions to the slots
  // [first, first + count).
  void advance(int64_t first, int64_t count, int64_t n);
  void advance(int64_t n) { advance(0, batch_, n); }
  // Copies slot `from`'s valid rows and length into slot `to` (the batch compaction).
  void move_slot(int64_t from, int64_t to);
  void reset_slot(int64_t slot);  // slot `slot` empty (a server reuses slots one by one)
  void reset();  // every slot empty; the memory is reused for the next batch
  size_t bytes() const;

 private:
  int64_t max_seq_ = 0, batch_ = 0;
  std::vector<int64_t> lengths_;
  std::vector<Tensor> k_, v_;
};

}  // namespace mcpp::inference
