// make_tiny_checkpoint DIR gpt|llama: writes a randomly initialised tiny model as a
// checkpoint (iteration 1) for the `megatron generate` CLI tests. Vocabulary: the
// NullTokenizer with --vocab-size 100 (101 ids with EOD, padded to 128); 32 positions.
#include <cstdio>
#include <string>

#include "checkpoint/checkpoint.h"
#include "inference_test_util.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: make_tiny_checkpoint DIR gpt|llama\n");
    return 1;
  }
  auto cfg = mcpp::test::tiny_config(std::string(argv[2]) == "llama", mcpp::DType::F32);
  cfg.padded_vocab_size = 128;
  mcpp::model::GPTModel m(cfg);
  mcpp::checkpoint::TrainingState st;
  st.iteration = 1;
  st.config = {{"tokenizer_type", "NullTokenizer"}, {"vocab_size", 100}};
  mcpp::checkpoint::save_checkpoint(argv[1], m, nullptr, st);
  return 0;
}
