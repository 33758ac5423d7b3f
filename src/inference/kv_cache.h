// The key/value cache of incremental decoding: per transformer layer, the RoPE-rotated
// keys and the values of every position seen so far, so a decode step computes only the
// new token's row instead of the whole sequence again.
//
//   k[l], v[l]  [max_seq, B, NG, HD]  rows [0, length) valid
//
// Sequence-first like the activations, so one position of the whole batch is one
// contiguous block and appending a step writes a single row. All sequences of the batch
// share `length` (the generator keeps them in lock step; see generator.h).
#pragma once
#include <cstdint>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::inference {

class KVCache {
 public:
  // max_seq: positions to hold (at most the model's max_position_embeddings).
  KVCache(const model::TransformerConfig& cfg, int64_t max_seq, int64_t batch,
          Device device = Device::CPU);

  int64_t max_seq() const { return max_seq_; }
  int64_t batch() const { return batch_; }
  int64_t length() const { return length_; }  // positions filled = next token's position
  int64_t remaining() const { return max_seq_ - length_; }
  Tensor& k(int64_t layer) { return k_[size_t(layer)]; }
  Tensor& v(int64_t layer) { return v_[size_t(layer)]; }

  // Called by the generator after every layer has appended n positions.
  void advance(int64_t n);
  void reset() { length_ = 0; }  // reuse the memory for the next prompt
  size_t bytes() const;

 private:
  int64_t max_seq_ = 0, batch_ = 0, length_ = 0;
  std::vector<Tensor> k_, v_;
};

}  // namespace mcpp::inference
