// What `generate` and `serve` both do before their first token. parse_inference_target
// checks the flags that choose where the model runs (--tensor-model-parallel-size,
// --device, --dtype: the CPU computes in fp32; on CUDA the default dtype is the command's);
// open_inference_session then takes the launch's ranks as the TP group, loads this rank's
// weights from --load (--ckpt-step) in that dtype, drops dropout, and opens the
// checkpoint's tokenizer (checkpoint_tokenizer.h), checked against the vocabulary. `who`
// names the command in messages.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "checkpoint/weights.h"
#include "comm/world.h"
#include "data/tokenizers/tokenizer.h"
#include "tools/flags.h"

namespace mcpp::tools {

struct InferenceTarget {
  int64_t tp = 1;
  std::string dev_name, dtype_name;
  Device device = Device::CPU;
  DType dtype = DType::F32;
};

InferenceTarget parse_inference_target(const Flags& f, const char* cuda_default_dtype);

struct InferenceSession {
  std::unique_ptr<comm::World> world;
  int rank = 0;
  comm::Communicator* tp_comm = nullptr;  // null at TP 1
  std::string dir;                        // --load
  checkpoint::ModelWeights weights;
  model::TransformerConfig cfg;  // the checkpoint's, dropout 0
  data::TokenizerArgs tok_args;
  std::unique_ptr<data::Tokenizer> tok;
};

InferenceSession open_inference_session(const Flags& f, const InferenceTarget& t,
                                        const char* who);

}  // namespace mcpp::tools
