// --check-weight-hash-across-dp-replicas-interval N: Megatron's
// check_param_hashes_across_dp_replicas (megatron/core/utils.py, cross_check=True). Every
// data-parallel replica must hold bit-identical weights. Each rank hashes each of its
// parameters (base/hash.h's hash64 of the bytes in the model's dtype; a device tensor is
// copied to the host first); the hashes are all-gathered, one collective per group for all
// of a rank's parameters (after one for their counts): the dense parameters over DP (x CP:
// the CP ranks hold the same weights; Megatron compares over DP alone), the expert
// parameters over the expert-data-parallel group, as Megatron. Every member's hash of every
// parameter must equal the group's first member's.
//
// The verdict is the world's: what each group found is gathered over the world, so a
// mismatch in one group fails every rank with the same message instead of leaving the other
// groups waiting in their next collective.
//
// Cost per check: one read of every parameter (on the GPU a device-to-host copy of each),
// 8 bytes a parameter all-gathered over its group, two small all-gathers over the world.
#pragma once
#include <cstdint>

#include "comm/communicator.h"
#include "model/params.h"
#include "parallel/parallel_state.h"

namespace mcpp::training {

// Collective over `world` (every rank calls it at the same iteration). Throws mcpp::Error on
// every rank when two replicas disagree, naming the first differing parameters and the world
// ranks that hold each hash; `iteration` is named in the message. The parameters must be
// current: wait for an overlapped parameter all-gather first (Optimizer::wait_params_all).
void check_param_hashes_across_dp_replicas(const model::ParamStore& params,
                                           const parallel::ParallelState& ps,
                                           comm::Communicator& world, int64_t iteration);

}  // namespace mcpp::training
