// megatron.cpp -> Megatron-LM's legacy checkpoint layout (--ckpt-format torch), the reverse of
// megatron_import.h's legacy reader (docs/from-megatron.md, "Back to Megatron-LM"):
//
//   DIR/iter_NNNNNNN/mp_rank_TT[_PPP]/model_optim_rng.pt   one torch.save file per TP x PP
//                                                          rank (_PPP only when PP > 1)
//   DIR/latest_checkpointed_iteration.txt                  written last
//
// Each file holds what Megatron's save_checkpoint (training/checkpointing.py,
// generate_state_dict) writes: args (an argparse.Namespace with the fields that
// load_args_from_checkpoint, check_checkpoint_args and tools/checkpoint's loaders read),
// checkpoint_version 3.0, iteration, model (the stage's Megatron-Core state dict: layer
// numbers local to the stage, names of the spec of args.transformer_impl, TP shards as
// split_of describes, Transformer Engine's _extra_state entries as None, the tied output
// layer on the last stage when it is not also the first), optimizer (the non-distributed
// optimizer: FP32Optimizer's torch state dict, or Float16OptimizerWithFloat16Params' with
// fp32_from_fp16_params; the parameter groups of _get_param_groups: weight-decayed first,
// then biases and 1-D parameters with wd_mult 0), opt_param_scheduler and
// num_floating_point_operations_so_far. No rng_state: Megatron's RNG states (Python,
// numpy, torch, CUDA, the model-parallel tracker) have no counterpart here; Megatron loads
// such a checkpoint with --no-load-rng (or --finetune).
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/config.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint::megatron {

enum class TransformerImpl { Local, TransformerEngine };
const char* transformer_impl_name(TransformerImpl t);  // "local", "transformer_engine"

struct ExportOptions {
  int64_t tp = 1, pp = 1;  // the Megatron layout to write
  // The rest of a training run's layout, recorded in the args (a conversion writes 1s and
  // false): the data- and context-parallel sizes and --sequence-parallel. Neither DP nor CP
  // shards the weights or the non-distributed optimizer's state: their rank 0 writes.
  int64_t dp = 1, cp = 1;
  bool sequence_parallel = false;
  // Virtual pipeline stages: each rank file holds model0 .. model{vp-1}, chunk v of stage pp
  // holding layers v * L / vp + pp * L / (pp * vp) onwards (Megatron's layer offset).
  int64_t vp = 1;
  // An uneven split (--decoder-first/last-pipeline-num-layers): the first and last stages'
  // layers, the others sharing the rest (parallel/pipeline/schedule.h's assign_layers).
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  // --pipeline-model-parallel-layout: every stage's layers (parallel/pipeline/layout.h);
  // recorded in args as Megatron does, so that a loader numbers the chunks' layers alike.
  std::optional<std::string> layout;
  TransformerImpl impl = TransformerImpl::Local;
  bool save_optim = true;  // false (--no-save-optim): weights, args and scheduler only
};

// What one rank file needs: the model, the run's state, and where its tensors come from.
struct ExportSource {
  model::TransformerConfig config;  // the whole model (TP 1)
  TrainingState state;              // iteration, counters, scheduler, given flags (config)
  DType params_dtype = DType::F32;  // the model's weights as Megatron holds them (bf16 / fp16
                                    // runs: rounded from the fp32 main params)
  bool has_optimizer = false;       // Adam moments exist (optimizer_steps > 0)
  int64_t optimizer_steps = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  // The TP shard `tp` of T of a tensor (megatron.cpp name, F32, contiguous); what:
  // "param" (the fp32 main params), "exp_avg" or "exp_avg_sq".
  std::function<Tensor(const std::string& name, const char* what, int64_t tp, int64_t T)> shard;
  // The parameter names to place (null: every name of the whole model, built from config).
  // A training rank passes its own stage's names: stage_entries only asks for those.
  const std::set<std::string>* names = nullptr;
};

// The bf16 / fp16 flags a run recorded (TrainingState::config "bf16"/"fp16" = "True").
DType recorded_params_dtype(const nlohmann::json& given);
// Refuses what the legacy export cannot write or the importer cannot read back (MoE, q/k
// norms, layer counts or heads that do not split); `flag_tp` / `flag_pp` name the flags.
void check_exportable(const model::TransformerConfig& c, const ExportOptions& o,
                      const char* flag_tp, const char* flag_pp);
// The same for one pipeline stage of a training run (--ckpt-format torch): every parameter
// of the stage (stage_names) has a place in stage pp's entries, and the stage holds no
// persistent buffers (FP8 scaling state) that the legacy layout could not carry.
void check_stage_exportable(const model::TransformerConfig& c, const ExportOptions& o, int64_t pp,
                            const std::set<std::string>& stage_names, bool has_buffers);
// Writes rank (tp, pp)'s model_optim_rng.pt under iter_dir (created as needed).
void write_legacy_rank(const std::string& iter_dir, const ExportSource& src, const ExportOptions& o,
                       int64_t tp, int64_t pp);
// "mp_rank_01" or "mp_rank_01_002".
std::string legacy_rank_dir(int64_t tp, int64_t pp, int64_t P);

// `megatron convert --to-megatron --load OURS --save DIR`: loads the checkpoint (TP 1, all of
// it), writes every rank of DIR/iter_N/ into a temporary folder, renames it, then the
// tracker. Refuses a DIR that is not empty and holds no Megatron checkpoint, and an iter_N/
// that exists already. Returns the iteration written.
int64_t export_to_megatron(const std::string& load_dir, std::optional<int64_t> step,
                           const std::string& save_dir, const ExportOptions& o);

}  // namespace mcpp::checkpoint::megatron
