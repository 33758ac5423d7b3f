// The tiny GPT-2 / Llama configurations the model tests share (f64 on the CPU).
#pragma once
#include "model/config.h"

namespace mcpp::model::test {

inline TransformerConfig tiny(bool llama, int layers, double dropout) {
  TransformerConfig c;
  c.num_layers = layers, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 2;
  c.seq_length = 6, c.max_position_embeddings = 8, c.padded_vocab_size = 16;
  c.hidden_dropout = dropout, c.attention_dropout = dropout, c.dtype = DType::F64;
  c.init_method_std = 0.3;
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = llama ? 12 : 32;
  c.rope = llama, c.rmsnorm = llama, c.swiglu = llama, c.tie_embeddings = !llama;
  c.add_bias_linear = !llama;
  return c;
}

}  // namespace mcpp::model::test
