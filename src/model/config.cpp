#include "model/config.h"

namespace mcpp::model {

void TransformerConfig::validate() const {
  MCPP_CHECK(num_layers > 0 && hidden_size > 0 && num_attention_heads > 0 && kv_channels > 0,
             "model shape must be positive (layers {}, hidden {}, heads {}, kv_channels {})",
             num_layers, hidden_size, num_attention_heads, kv_channels);
  MCPP_CHECK(num_query_groups > 0 && num_attention_heads % num_query_groups == 0,
             "--num-attention-heads {} is not divisible by --num-query-groups {}",
             num_attention_heads, num_query_groups);
  MCPP_CHECK(num_query_groups % tp_size == 0 && num_attention_heads % tp_size == 0,
             "heads {} / query groups {} not divisible by --tensor-model-parallel-size {}",
             num_attention_heads, num_query_groups, tp_size);
  MCPP_CHECK(ffn_hidden_size % tp_size == 0, "--ffn-hidden-size {} not divisible by TP {}",
             ffn_hidden_size, tp_size);
  MCPP_CHECK(padded_vocab_size % tp_size == 0, "padded vocab {} not divisible by TP {}",
             padded_vocab_size, tp_size);
  MCPP_CHECK(seq_length > 0 && (rope || seq_length <= max_position_embeddings),
             "--seq-length {} exceeds --max-position-embeddings {}", seq_length,
             max_position_embeddings);
  MCPP_CHECK(!rope || (rot_dim() % 2 == 0 && rot_dim() > 0),
             "rotary dims {} (kv_channels {} x --rotary-percent {}) must be even and positive",
             rot_dim(), kv_channels, rotary_percent);
  MCPP_CHECK(dtype == DType::F32 || dtype == DType::F64, "CPU model dtype must be f32 or f64");
}

}  // namespace mcpp::model
