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
// The model shape comes from the checkpoint's args.
// Optimizer state (megatron_optim.cpp) is imported from the legacy layout written with
// Megatron's non-distributed optimizer (FP32Optimizer, Float16OptimizerWithFloat16Params):
// Adam's exp_avg / exp_avg_sq, the step, the fp32 main params (fp32_from_fp16_params: the
// precise weights of a bf16/fp16 run, preferred over the model's half-precision weights) and
// the LR scheduler's state, TP/PP-merged like the weights; the converted checkpoint then
// resumes at Megatron's iteration. The distributed optimizer's state (distrib_optim.pt,
// torch_dist's optimizer.* keys) is not imported (the log says so and names the flag): the
// result is then a starting point (iteration 0), as `convert --from-hf` writes.
#pragma once
#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "model/config.h"
#include "optim/lr_scheduler.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::megatron {

enum class Layout { Legacy, TorchDist };

struct Detected {
  Layout layout;
  std::string iter_dir;     // the iteration folder to read
  std::string iteration;    // "10", or "release"
  std::vector<std::string> files;  // legacy: the model_optim_rng.pt files; dist: .distcp files
  bool load_optim = true;  // false (convert --no-load-optim): the weights alone
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

// The imported optimizer state: the same names and shapes as Imported::tensors, F32.
struct OptimizerState {
  std::map<std::string, Tensor> exp_avg, exp_avg_sq;
  std::map<std::string, Tensor> main_params;  // bf16/fp16 runs only: fp32_from_fp16_params
  int64_t step = 0;                           // Adam's step (bias correction)
  // An fp16 run's DynamicGradScaler (Float16OptimizerWithFloat16Params' 'grad_scaler'):
  // {"scale", "growth_tracker", "hysteresis_tracker"}, as TrainingState::grad_scaler holds it;
  // empty when the checkpoint has none.
  nlohmann::json grad_scaler = nlohmann::json::object();
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // the first group's, for the log
  // OptimizerParamScheduler.state_dict() and the counters, when the checkpoint has them
  bool has_scheduler = false;
  double max_lr = 0, min_lr = 0, lr_warmup_steps = 0, start_wd = 0, end_wd = 0;
  int64_t lr_decay_steps = 0, wd_incr_steps = 0, num_steps = 0;
  std::string lr_decay_style, wd_incr_style;
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  double flops_so_far = 0;
};

struct Imported {
  model::TransformerConfig config;
  std::map<std::string, Tensor> tensors;  // megatron.cpp TP=1 names, F32 (the model weights)
  std::string iteration;
  bool had_optimizer = false;           // optimizer state present
  std::optional<OptimizerState> optimizer;  // imported (legacy, non-distributed optimizer)
  // Legacy layout: the first rank file's counters and scheduler (read_scheduler), whether or
  // not the optimizer state is imported (the trainer's --no-load-optim keeps them).
  OptimizerState progress;
  std::string optimizer_skipped;        // why present optimizer state was not imported
  std::vector<std::string> notes;       // what the log should say (e.g. GELU form)
  int64_t source_tp = 1, source_pp = 1;
  // Training settings of the args, as Python's str() shows them (the way a megatron.cpp run
  // records the flags it was given): bf16, fp16, the tokenizer's, the optimizer's, batch sizes.
  std::map<std::string, std::string> args_given;
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
// Parts of config_from_args (megatron_import_config.cpp): YaRN's settings (notes: what was
// imported otherwise than written), and muP's (args.use_mup set).
void import_yarn(model::TransformerConfig& c, const Value& a, const std::string& what,
                 std::vector<std::string>& notes);
void import_mup(model::TransformerConfig& c, const Value& a, const std::string& what);
// args.no_rope_freq (N or a list, 1 = no RoPE; None or 0: none) into c.no_rope_pattern.
void import_no_rope(model::TransformerConfig& c, const Value& a, const std::string& what);
// Megatron's args field <k>, or nullptr when absent or None.
const Value* arg(const Value& a, const char* k);
// The training settings of Megatron's args that a converted checkpoint records (args_given).
std::map<std::string, std::string> recorded_args(const Value& args);
// Megatron-Core name (TE or local spec) -> megatron.cpp name; "" for entries to skip
// (_extra_state). Layer numbers are left as they are.
std::string canonical_name(const std::string& key);
// How Megatron's parallel layers split a tensor (megatron.cpp name) over TP: the vocabulary,
// linear_qkv (per query group: whole groups per rank) and linear_fc1 along rows (SwiGLU:
// [gate_r; up_r] per rank), linear_proj / linear_fc2 weights along columns, the rest
// replicated.
enum class Split { Rows, Cols, Replicated, SwigluRows };
Split split_of(const std::string& name, bool swiglu);
// Checks the merged tensors against the model's parameters (names and shapes), dropping a
// tied output layer; errors name the missing or unexpected key.
void check_against_model(Imported& im, const std::string& what);
// torch_dist: reads the tensors of iter_dir (defined in megatron_dist.cpp).
void read_torch_dist(const Detected& d, Imported& im);

// ---- the legacy layout's optimizer state (megatron_optim.cpp) -----------------------------
class TorchFile;
// A trainable parameter of one rank's file, in the order of its model state dict(s)
// (model, or model0, model1, ... under virtual pipelining): Megatron's named_parameters()
// order, which is the order _get_param_groups fills each group in.
struct RankParam {
  std::string key;   // as in the file ("decoder.layers.0.self_attention.linear_qkv.weight")
  std::string name;  // megatron.cpp's name (global layer number)
  Shape shape;
  DType dtype;       // as stored (bf16/f16: a Float16Optimizer main param exists)
};
// Where a parameter's state sits: group (in param_groups), position in the group (also in
// fp32_from_fp16_params[group] among the group's half-precision parameters), and the key of
// optimizer.state (param_groups[group]['params'][position]).
struct ParamSlot {
  int64_t group = 0, position = 0, index = 0;
};
// Megatron's rule (megatron/core/optimizer/__init__.py get_standard_config_overrides): a
// parameter whose name ends in ".bias" or that is 1-D gets wd_mult 0 (no weight decay) --
// except, with --apply-wd-to-qk-layernorm (qk_norm_decay), the q/k layernorm weights and
// biases -- the others the default group; each group lists its parameters in named_parameters()
// order; the groups' order differs between releases (today the default group first; before, sorted
// tuples with wd_mult 0.0 first), so each saved group's wd_mult says which set it holds. The counts
// are checked against the saved groups; errors name `what` and the group. Returns one slot per
// param, in params' order.
bool megatron_no_weight_decay(const std::string& key, size_t dims, bool qk_norm_decay);
std::vector<ParamSlot> legacy_param_slots(const Value& param_groups,
                                          const std::vector<RankParam>& params,
                                          const std::string& what, bool qk_norm_decay = false);
// One rank's optimizer state, per megatron.cpp name: shards[name][tp] for exp_avg,
// exp_avg_sq and (half-precision runs) the main params.
struct OptimizerShards {
  std::map<std::string, std::vector<Tensor>> exp_avg, exp_avg_sq, main_params;
  std::optional<int64_t> step;
  std::optional<std::array<double, 3>> betas_eps;
  nlohmann::json grad_scaler = nlohmann::json::object();  // rank file 0's, as OptimizerState's
};
// Reads root['optimizer'] of one legacy rank file into `out` (slot tp of T). Errors name the
// file and the entry (a missing state entry, a moment whose shape is not the parameter's,
// steps that disagree, a group layout that is not Megatron's).
void read_rank_optimizer(const Value& root, const TorchFile& tf,
                         const std::vector<RankParam>& params, int64_t tp, int64_t T,
                         const std::string& path, bool qk_norm_decay, OptimizerShards& out);
// The scheduler's state and counters from a rank file's root (opt_param_scheduler, args).
void read_scheduler(const Value& root, const std::string& path, OptimizerState& out);
// The imported scheduler (has_scheduler) as megatron.cpp's scheduler state (its styles
// parsed; an unknown one is an error naming it).
optim::SchedulerState scheduler_state(const OptimizerState& os);
// After check_against_model: the merged moments (and main params of a half-precision run)
// cover exactly the model's tensors with their shapes; the tied output layer's copy dropped.
void check_optimizer(Imported& im, const std::string& what);

}  // namespace mcpp::checkpoint::megatron

namespace mcpp::checkpoint::megatron {

// `megatron convert --from-megatron SRC --save OUT`: reads SRC (detect + read), builds the
// TP=1 model, and saves it as iteration 0 of a megatron.cpp checkpoint in save_dir (defined
// in megatron_save.cpp). Returns what was imported (for the log and tests).
// load_optim false (--no-load-optim): the weights alone, iteration 0, whatever optimizer
// state the checkpoint holds.
Imported convert_to_checkpoint(const std::string& src, std::optional<int64_t> iteration,
                               const std::string& save_dir, bool load_optim = true);

}  // namespace mcpp::checkpoint::megatron
