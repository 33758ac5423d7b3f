// The checks of the flags (Megatron's example scripts) and the one list of what
// megatron.cpp's trainer cannot do yet, shared by `megatron train` and `megatron plan` so
// that the planner rejects exactly what training rejects.
#pragma once
#include <optional>

#include "checkpoint/tokenizer_files.h"
#include "data/num_microbatches.h"
#include "tensor/tensor.h"
#include "training/arguments.h"

namespace mcpp::training {

// Called once by validate_args, last (it sees every derived default): --rampup-batch-size
// (Megatron's num_microbatches_calculator checks, and the sample-based train_iters of
// update_train_iters), --decoupled-lr / --decoupled-min-lr, --use-checkpoint-args.
void validate_compat(Args& a, bool training);

// --rampup-batch-size as data::BatchRampup (nullopt: constant batch size).
std::optional<data::BatchRampup> batch_rampup(const Args& a);
// --step-batch-size-schedule, parsed (thresholds in tokens / --seq-length).
std::optional<data::StepBatchSchedule> step_batch_schedule(const Args& a);

// The checkpoint a training run starts from (Megatron's load_checkpoint): --load's when it
// holds one; else --pretrained-checkpoint's, loaded as --finetune (weights only, iteration
// 0); nullopt: random weights (no --load, or an empty one, with a warning). Errors: an empty
// --pretrained-checkpoint (when --load holds nothing), and with --exit-on-missing-checkpoint
// a --load that holds nothing (trainer_checkpoint_args.cpp).
struct LoadSource {
  std::string dir;
  bool finetune = false;  // from --pretrained-checkpoint
};
std::optional<LoadSource> resolve_load_source(const Args& a);

// --use-checkpoint-args needs --load or --pretrained-checkpoint (the error `megatron train`
// and `megatron plan` give).
void check_checkpoint_args_source(const Args& a);

// --use-checkpoint-args: fills the model's flags from the checkpoint the run starts from
// (src; latest, or --ckpt-step) before validate_args (trainer_checkpoint_args.cpp).
void apply_checkpoint_args(Args& a, const std::optional<LoadSource>& src);

// A start checkpoint (src) that carries tokenizer files (convert --from-hf), no tokenizer
// flag given: the tokenizer flags point at those files (verified). Returns them, so that the
// run's own checkpoints carry them on.
std::optional<checkpoint::TokenizerFiles> apply_checkpoint_tokenizer(
    Args& a, const std::optional<LoadSource>& src);

// What the trainer rejects on `dev` after validate_args (flags whose value is valid but
// that megatron.cpp's trainer does not implement yet, and the precision a device cannot
// train in). Throws mcpp::Error naming the flag to drop. query_gpu false (`megatron plan`,
// which may plan a GPU run on a machine without one): what only the GPU itself can say
// (FP8 tensor cores) is left to the run's start-up.
void check_trainer_support(const Args& a, Device dev, bool query_gpu = true);

}  // namespace mcpp::training
