#include "tools/inference_session.h"

#include <filesystem>

#include <fmt/format.h>

#include "base/error.h"
#include "checkpoint/checkpoint.h"
#include "tools/checkpoint_tokenizer.h"

namespace mcpp::tools {

InferenceTarget parse_inference_target(const Flags& f, const char* cuda_default_dtype) {
  InferenceTarget t;
  t.tp = f.get_int("--tensor-model-parallel-size", 1);
  MCPP_CHECK_HINT(t.tp >= 1 && t.tp <= 4096, "use --tensor-model-parallel-size N with N >= 1",
                  "--tensor-model-parallel-size {} is out of range", t.tp);
  t.dev_name = f.has("--device") ? f.get("--device") : "cpu";
  MCPP_CHECK_HINT(t.dev_name == "cpu" || t.dev_name == "cuda", "use --device cpu or --device cuda",
                  "--device '{}' is not a device", t.dev_name);
  t.device = t.dev_name == "cuda" ? Device::CUDA : Device::CPU;
#ifndef MCPP_HAVE_CUDA
  MCPP_CHECK_HINT(t.device == Device::CPU, "rebuild where nvcc is found, or use --device cpu",
                  "--device cuda: this build has no CUDA backend");
#endif
  t.dtype_name = f.has("--dtype")                 ? f.get("--dtype")
                 : t.device == Device::CUDA       ? std::string(cuda_default_dtype)
                                                  : std::string("fp32");
  MCPP_CHECK_HINT(t.dtype_name == "bf16" || t.dtype_name == "fp16" || t.dtype_name == "fp32",
                  "use --dtype bf16, fp16 or fp32", "--dtype '{}' is not a dtype", t.dtype_name);
  MCPP_CHECK_HINT(t.device == Device::CUDA || t.dtype_name == "fp32",
                  "the CPU backend computes in fp32: drop --dtype or pass --device cuda",
                  "--dtype {} on --device cpu", t.dtype_name);
  t.dtype = t.dtype_name == "bf16"   ? DType::BF16
            : t.dtype_name == "fp16" ? DType::F16
                                     : DType::F32;
  return t;
}

InferenceSession open_inference_session(const Flags& f, const InferenceTarget& t,
                                        const char* who) {
  InferenceSession s;
  // The ranks of a launch form the TP group (a plain run is a world of one).
  comm::InitOptions io;
  io.device = t.device;
  s.world = comm::init(io);
  MCPP_CHECK_HINT(s.world->size() == t.tp,
                  fmt::format("launch {} processes (mpirun -np {}) or pass "
                              "--tensor-model-parallel-size {}",
                              t.tp, t.tp, s.world->size()),
                  "megatron {}: {} processes but --tensor-model-parallel-size {}", who,
                  s.world->size(), t.tp);
  s.rank = s.world->rank();
  s.tp_comm = t.tp > 1 ? &s.world->world() : nullptr;

  // Checkpoint: shape from its metadata, then this rank's weights (no gradients).
  s.dir = f.get("--load");
  MCPP_CHECK_HINT(std::filesystem::is_directory(s.dir),
                  "pass the --save directory of a training run to --load",
                  "--load {}: no such directory", s.dir);
  MCPP_CHECK_HINT(checkpoint::latest_iteration(s.dir).has_value(),
                  "train with --save DIR first, or point --load at a directory holding iter_*/",
                  "--load {}: no checkpoint found (no iter_*/metadata.json)", s.dir);
  checkpoint::WeightsOptions wo;
  wo.tp_rank = s.rank, wo.tp_size = t.tp, wo.device = t.device, wo.dtype = t.dtype;
  s.weights = checkpoint::load_model_weights(s.dir, f.get_opt_int("--ckpt-step"), wo);
  s.cfg = s.weights.config;
  s.cfg.hidden_dropout = s.cfg.attention_dropout = 0;

  s.tok_args = checkpoint_tokenizer_args(f, s.weights.metadata, who);
  s.tok = data::make_tokenizer(s.tok_args);
  MCPP_CHECK_HINT(s.tok->vocab_size() <= s.cfg.padded_vocab_size,
                  "use the tokenizer the model was trained with",
                  "the tokenizer has {} tokens but the checkpoint's vocabulary is {}",
                  s.tok->vocab_size(), s.cfg.padded_vocab_size);
  return s;
}

}  // namespace mcpp::tools
