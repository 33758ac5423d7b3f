// make_serve_checkpoint DIR gpt|llama POSITIONS HIDDEN LAYERS [VOCAB_FILE MERGE_FILE]:
// a randomly initialised model as a checkpoint (iteration 1) for the server tests. With
// GPT-2 BPE files the checkpoint records them (vocabulary 50257, padded to 50304); without,
// the NullTokenizer with --vocab-size 100 (padded to 128).
#include <cstdio>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/gpt_model.h"

int main(int argc, char** argv) {
  if (argc != 6 && argc != 8) {
    std::fprintf(stderr,
                 "usage: make_serve_checkpoint DIR gpt|llama POSITIONS HIDDEN LAYERS "
                 "[VOCAB_FILE MERGE_FILE]\n");
    return 1;
  }
  const bool llama = std::string(argv[2]) == "llama";
  mcpp::model::TransformerConfig c;
  c.num_layers = std::stoll(argv[5]), c.hidden_size = std::stoll(argv[4]);
  c.num_attention_heads = 4, c.kv_channels = c.hidden_size / 4;
  c.seq_length = c.max_position_embeddings = std::stoll(argv[3]);
  c.hidden_dropout = 0, c.attention_dropout = 0, c.dtype = mcpp::DType::F32;
  c.init_method_std = 0.3;  // spread logits: no near-ties for greedy decoding to fall on
  c.num_query_groups = llama ? 2 : 4;
  c.ffn_hidden_size = llama ? 3 * c.hidden_size / 2 : 4 * c.hidden_size;
  c.rope = llama, c.rmsnorm = llama, c.swiglu = llama, c.tie_embeddings = !llama;
  c.add_bias_linear = !llama;
  mcpp::checkpoint::TrainingState st;
  st.iteration = 1;
  if (argc == 8) {
    c.padded_vocab_size = 50304;
    st.config = {{"tokenizer_type", "GPT2BPETokenizer"}, {"vocab_file", argv[6]},
                 {"merge_file", argv[7]}};
  } else {
    c.padded_vocab_size = 128;
    st.config = {{"tokenizer_type", "NullTokenizer"}, {"vocab_size", 100}};
  }
  mcpp::model::GPTModel m(c);
  mcpp::checkpoint::save_checkpoint(argv[1], m, nullptr, st);
  return 0;
}
