// Collectives of device tensors over the context-parallel group (and over the data-parallel
// x context-parallel group) that the model's modules need besides ring attention
// (cp_attention.h).
#pragma once
#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::parallel::context_parallel {

// x: each CP rank's partial sum over its own tokens -> the sum over the CP group, in place
// (the MoE aux-loss counts, which Megatron sums over TP x CP).
void sum_over_cp(Tensor& x, comm::Communicator& cp, Stream& s);
// x: each DP x CP rank's partial sum over its own tokens -> the sum over that group, in place
// (global_aux_loss's counts, which Megatron sums over TP x DP x CP).
void sum_over_data_cp(Tensor& x, comm::Communicator& dp_cp, Stream& s);

}  // namespace mcpp::parallel::context_parallel
