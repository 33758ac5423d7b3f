// A training run's checkpoint across ranks (Megatron's training/checkpointing.py
// save_checkpoint / load_checkpoint), on top of checkpoint.h's building blocks:
//
//   save: every rank of DP rank 0 writes its TP/PP shard of the model (the fp32 main
//   parameters when the optimizer holds them, so a resume continues bit for bit) and, when
//   the optimizer's state is laid out like the parameters (AdamW), the Adam moments with
//   it; an optimizer whose state is sharded over DP (the distributed optimizer) has every
//   rank write its own shard of the moments (write_optimizer_shard, by its segments).
//   Rank 0 starts the checkpoint, gathers every rank's shard records and commits it; the
//   checkpoint is visible to every rank when save returns. One process holding the
//   whole state writes directly (save_checkpoint), or in the background (--async-save).
//
//   load: every rank reads what it needs from any saved layout into host buffers laid out
//   like its parameters, and hands them to the optimizer (Optimizer::load_state: main
//   parameters exact, the model's parameters rounded, the moments kept whole or as this
//   rank's shard).
#pragma once
#include <optional>
#include <string>

#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/parallel_state.h"

namespace mcpp::checkpoint {

// Collective over `world`. save_optim: !--no-save-optim. async (may be null): with one
// process holding all of the state, the save is scheduled on it instead.
void save_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                              const parallel::ParallelState& ps, model::ParamStore& params,
                              optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                              const SaveOptions& o, AsyncSaver* async);

// Loads `iteration` (default: the latest) into the model's parameters and the optimizer
// (the moments and the step count only when load_optim). nullopt, with a warning, when
// load_dir holds no checkpoint and no iteration was asked for.
std::optional<TrainingState> load_training_checkpoint(const std::string& load_dir,
                                                      std::optional<int64_t> iteration,
                                                      model::ParamStore& params,
                                                      optim::Optimizer& opt, bool load_optim,
                                                      const LoadOptions& o);

}  // namespace mcpp::checkpoint
