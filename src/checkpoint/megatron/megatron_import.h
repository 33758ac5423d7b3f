// Megatron-LM's own checkpoints -> megatron.cpp (docs/from-megatron.md).
//
// Two layouts are read, GPT and Llama models (dense), through the restricted reader of
// torch_pickle.h (no code is executed):
//  * legacy (--ckpt-format torch): DIR/latest_checkpointed_iteration.txt naming iter_N (or
//    "release"), and iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt per TP x PP rank, each a
//    torch.save of {args, iteration, model | model0.., optimizer, rng_state, ...}. Layer
//    numbers in a file are local to its pipeline stage (and virtual chunk); TP shards are
//    merged as the parallel layers split them: vocabulary and linear_qkv (per query group)
//    and linear_fc1 along rows (SwiGLU: each rank holds [gate_r; up_r], so the merged
//    tensor is [gate_0..gate_t; up_0..up_t]), linear_proj / linear_fc2 along columns, norms
//    and row-parallel biases replicated.
//  * torch_dist (Megatron's default): iter_N/ with metadata.json (sharded_backend torch_dist),
//    common.pt (args), and PyTorch Distributed Checkpoint files: .metadata (a pickle naming,
//    for every key, its global shape and its chunks, and for every chunk its file, byte
//    offset and length) and __R_N.distcp. Keys hold global tensors (TP merged already); the
//    layers of decoder.layers.* are stacked along a leading layer axis.
// Transformer Engine's names (linear_qkv.layer_norm_weight, linear_fc1.layer_norm_weight)
// map to megatron.cpp's input_layernorm / pre_mlp_layernorm; _extra_state entries are skipped.
// The model shape comes from the checkpoint's args. Optimizer state is not imported (said so
// in the log): the result is a starting point (iteration 0), as `convert --from-hf` writes.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::megatron {

enum class Layout { Legacy, TorchDist };

struct Detected {
  Layout layout;
  std::string iter_dir;     // the iteration folder to read
  std::string iteration;    // "10", or "release"
  std::vector<std::string> files;  // legacy: the model_optim_rng.pt files; dist: .distcp files
};

// Whether `dir` (a checkpoint root with a tracker and iter_*/ folders, or an iter_* /
// release folder itself) holds a Megatron-LM checkpoint; nullopt when it shows neither layout.
// `iteration` picks iter_N instead of the tracker's. Errors only on a Megatron layout that is
// broken (a tracker naming a missing folder).
std::optional<Detected> detect(const std::string& dir, std::optional<int64_t> iteration = {});
const char* layout_name(Layout l);
// For --load and the other readers of megatron.cpp checkpoints: a Megatron-LM checkpoint
// there is an error whose HINT is the convert command.
void refuse_megatron_checkpoint(const std::string& dir, std::optional<int64_t> iteration = {});  // "legacy (torch)", "torch_dist"

struct Imported {
  model::TransformerConfig config;
  std::map<std::string, Tensor> tensors;  // megatron.cpp TP=1 names, F32
  std::string iteration;
  bool had_optimizer = false;           // optimizer state present (not imported)
  std::vector<std::string> notes;       // what the log should say (e.g. GELU form)
  int64_t source_tp = 1, source_pp = 1;
};

// Reads a detected checkpoint: config from its args, every model tensor merged to TP=1.
Imported read(const Detected& d);
// One line per fact, for `inspect` (layout, iteration, ranks, model shape from args).
std::vector<std::string> describe(const Detected& d);

// ---- shared by the layout readers (megatron_import.cpp, megatron_dist.cpp) -----------------
struct Value;
// A TransformerConfig from Megatron's args (an argparse.Namespace); errors name the field.
model::TransformerConfig config_from_args(const Value& args, const std::string& what,
                                          std::vector<std::string>& notes);
// Megatron-Core name (TE or local spec) -> megatron.cpp name; "" for entries to skip
// (_extra_state). Layer numbers are left as they are.
std::string canonical_name(const std::string& key);
// Checks the merged tensors against the model's parameters (names and shapes), dropping a
// tied output layer; errors name the missing or unexpected key.
void check_against_model(Imported& im, const std::string& what);
// torch_dist: reads the tensors of iter_dir (defined in megatron_dist.cpp).
void read_torch_dist(const Detected& d, Imported& im);

}  // namespace mcpp::checkpoint::megatron

namespace mcpp::checkpoint::megatron {

// `megatron convert --from-megatron SRC --save OUT`: reads SRC (detect + read), builds the
// TP=1 model, and saves it as iteration 0 of a megatron.cpp checkpoint in save_dir (defined
// in megatron_save.cpp). Returns what was imported (for the log and tests).
Imported convert_to_checkpoint(const std::string& src, std::optional<int64_t> iteration,
                               const std::string& save_dir);

}  // namespace mcpp::checkpoint::megatron
