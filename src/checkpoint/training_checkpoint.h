// A training run's checkpoint across ranks (Megatron's training/checkpointing.py
// save_checkpoint / load_checkpoint), on top of checkpoint.h's building blocks:
//
//   save: the TP/PP shard of the model (the fp32 main parameters when the optimizer holds
//   them, so a resume continues bit for bit) and, when the optimizer's state is laid out
//   like the parameters (AdamW), the Adam moments with it, are written by the ranks of DP
//   rank 0, or (SaveOptions::fully_parallel, Megatron's default) shared by bytes among the
//   DP x CP replicas, each writing its share; an optimizer whose state is sharded over DP
//   (the distributed optimizer) has every rank write its own shard of the moments
//   (write_optimizer_shard, by its segments).
//   Rank 0 starts the checkpoint, gathers every rank's shard records and commits it; the
//   checkpoint is visible to every rank when save returns. One process holding the
//   whole state writes directly (save_checkpoint), or in the background (--async-save).
//
//   load: every rank reads what it needs from any saved layout into host buffers laid out
//   like its parameters (LoadOptions::replicas: the DP x CP replicas split the reading and
//   exchange it, --ckpt-fully-parallel-load), and hands them to the optimizer
//   (Optimizer::load_state: main parameters exact, the model's parameters rounded, the
//   moments kept whole or as this rank's shard).
#pragma once
#include <optional>
#include <string>

#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "optim/optimizer.h"
#include "parallel/parallel_state.h"

namespace mcpp::checkpoint {

// Collective over `world`. save_optim: !--no-save-optim. async (may be null): the save is
// scheduled on it instead. With one process holding all of the state the background
// thread also commits it; with more (--async-save under mpirun), the snapshot and the
// checkpoint's temporary folder are made here, every rank writes its files in the
// background, and finalize_async_save commits once all of them are done.
void save_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                              const parallel::ParallelState& ps, model::ParamStore& params,
                              optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                              const SaveOptions& o, AsyncSaver* async);

// --async-save under mpirun (Megatron's maybe_finalize_async_save): collective over
// `world`, called by every rank at the same points (each iteration, before the next save,
// at the end). When a multi-rank save is pending and every rank's background write is done
// (blocking: after waiting for this rank's), rank 0 commits the checkpoint (metadata,
// tracker) and it is visible to all ranks on return. Returns true when nothing is pending
// any more. A rank's failed write is an error on every rank, and nothing is committed.
bool finalize_async_save(comm::Communicator& world, AsyncSaver& async, bool blocking);

// Loads `iteration` (default: the latest) into the model's parameters and the optimizer
// (the moments and the step count only when load_optim). nullopt, with a warning, when
// load_dir holds no checkpoint and no iteration was asked for.
std::optional<TrainingState> load_training_checkpoint(const std::string& load_dir,
                                                      std::optional<int64_t> iteration,
                                                      model::ParamStore& params,
                                                      optim::Optimizer& opt, bool load_optim,
                                                      const LoadOptions& o);

}  // namespace mcpp::checkpoint
