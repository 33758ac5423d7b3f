// The all-gather token dispatcher (Megatron-Core's MoEAllGatherTokenDispatcher), its
// communication only, each step with its dual. The group is the expert grid's tp-ep group
// (ETP x EP ranks); every member sees the tokens of all members and computes its local
// experts' (ETP shards of) outputs for all of them:
//
//   forward                                  backward (the dual)
//   dispatch   all-gather(dim 0)             dispatch_backward   reduce-scatter(dim 0)
//   combine    reduce-scatter(dim 0)         combine_backward    all-gather(dim 0)
//
// With EP 1 (what megatron.cpp runs today) the group is the TP group and these are the
// sequence-parallel transitions; with one member they are copies. Rows are tokens in the
// sequence-first order, member r's block at rows [r*n, (r+1)*n).
#pragma once
#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::parallel::expert_parallel {

// x [n, ...] -> y [size*n, ...]. group null: y = x (copied unless the same tensor).
void dispatch(const Tensor& x, Tensor& y, comm::Communicator* group, Stream& s);
// dy [size*n, ...] (partial) -> dx [n, ...] = this member's block of the sum.
void dispatch_backward(const Tensor& dy, Tensor& dx, comm::Communicator* group, Stream& s);
// y [size*n, ...] (partial outputs) -> out [n, ...] = this member's block of the sum.
void combine(const Tensor& y, Tensor& out, comm::Communicator* group, Stream& s);
// dout [n, ...] -> dy [size*n, ...].
void combine_backward(const Tensor& dout, Tensor& dy, comm::Communicator* group, Stream& s);

}  // namespace mcpp::parallel::expert_parallel
