// Megatron-LM's legacy layout (--ckpt-format torch) as a training run's own checkpoint format
// (docs/checkpoint.md, "--ckpt-format torch"):
//
//   save: every TP x PP rank of data-parallel rank 0 (and context-parallel rank 0) writes its
//   own iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt (megatron_export.h's write_legacy_rank)
//   from its own parameters and Adam state, into rank 0's temporary folder; once every rank
//   has written, rank 0 renames the folder into place and writes the tracker last, as
//   commit_checkpoint does for our own format (a crash never leaves a named half-written
//   iteration). --save-retain-interval retires the previous iteration the same way.
//
//   load: megatron_import.h's reader merges the rank files to TP 1 (any saved TP x PP), and
//   each rank copies its own TP pieces into host buffers laid out like its parameters, which
//   go to the optimizer as load_training_checkpoint's do: the fp32 main params (a bf16 run's
//   fp32_from_fp16_params) exactly, the Adam moments and step, the scheduler, the counters.
//   Every rank reads the whole iteration (no fully parallel load).
#pragma once
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_export.h"
#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/parallel_state.h"

namespace mcpp::checkpoint::megatron {

struct LegacyTrainOptions {
  model::TransformerConfig config;  // the run's model (this rank's TP rank; any device)
  TransformerImpl impl = TransformerImpl::TransformerEngine;  // --transformer-impl
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;              // --adam-beta1/2, --adam-eps
  bool save_optim = true;                                     // !--no-save-optim
  std::optional<int64_t> retain_interval;                     // --save-retain-interval
  bool keep_only_latest = false;  // a non-persistent save: the older iter_* folders go
  int64_t virtual_stages = 1;     // --virtual-pipeline-model-parallel-size (model0, model1, ...)
  // --decoder-first/last-pipeline-num-layers (an uneven split)
  std::optional<int64_t> first_stage_layers, last_stage_layers;
  std::optional<std::string> layout;  // --pipeline-model-parallel-layout (written to args)
};

// Start-up, after the model exists: this stage's parameters all have a place in the layout.
void check_legacy_trainable(const LegacyTrainOptions& o, const parallel::ParallelState& ps,
                            const model::ParamStore& params);

// Collective over `world`; the checkpoint is visible to every rank on return. A rank's failed
// write fails the save on every rank, and nothing is renamed into place.
void save_legacy_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                                     const parallel::ParallelState& ps, model::ParamStore& params,
                                     optim::Optimizer& opt, const TrainingState& st,
                                     const LegacyTrainOptions& o);

// Whether `dir` (at `iteration`, default the tracker's) holds a legacy Megatron checkpoint.
bool holds_legacy_checkpoint(const std::string& dir, std::optional<int64_t> iteration = {});

struct LegacyLoaded {
  TrainingState state;
  bool has_scheduler = false;  // opt_param_scheduler was saved (not with --no-save-optim)
};
// Loads it into params and opt (the moments and step only when load_optim). The checkpoint
// must hold the optimizer state when load_optim (as Megatron's load_checkpoint requires).
// o.model: the model shape must match; o.load_rng false zeroes the RNG fields.
LegacyLoaded load_legacy_training_checkpoint(const std::string& dir,
                                             std::optional<int64_t> iteration,
                                             model::ParamStore& params, optim::Optimizer& opt,
                                             bool load_optim, const LoadOptions& o);

}  // namespace mcpp::checkpoint::megatron
