// Tensor-parallel region transitions, each with its dual (Megatron-Core's
// megatron/core/tensor_parallel/mappings.py). A layer's forward calls the left
// column, its backward the right one, at the mirrored place:
//
//   forward                         backward (the dual)
//   copy_to_tp        identity      copy_to_tp_backward        all-reduce
//   reduce_from_tp    all-reduce    reduce_from_tp_backward    identity
//   gather_from_tp    all-gather(last dim)   gather_from_tp_backward   split(last dim)
//   scatter_to_tp     split(last dim)        scatter_to_tp_backward    all-gather(last dim)
//   gather_from_sp    all-gather(dim 0)      gather_from_sp_backward   reduce-scatter(dim 0)
//   reduce_scatter_to_sp  reduce-scatter(dim 0)  reduce_scatter_to_sp_backward  all-gather(dim 0)
//
// Shapes: "last dim" functions see tensors as 2-D [rows, n] (rows = everything but the
// last dim); the sequence-parallel (sp) ones split dim 0 of sequence-first [S, B, H]
// activations, which is contiguous, into TP blocks of S/TP. All functions take the TP
// communicator and the stream explicitly; on a group of one they are copies or no-ops.
// Nothing here knows the backend: tensors + Communicator + Stream.
#pragma once
#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::parallel {

// Identity in forward (the input of a column-parallel layer is replicated).
inline void copy_to_tp(const Tensor& /*x*/, comm::Communicator& /*tp*/, Stream& /*s*/) {}
// dx: [.., n] partial input gradient of each rank -> the sum over TP, in place.
void copy_to_tp_backward(Tensor& dx, comm::Communicator& tp, Stream& s);

// x: the partial output of a row-parallel layer -> the sum over TP, in place.
void reduce_from_tp(Tensor& x, comm::Communicator& tp, Stream& s);
// The vocab-parallel cross-entropy's per-row statistics (Megatron's
// vocab_parallel_cross_entropy): the maximum over TP, in place. Forward only: the loss's
// backward needs no communication (each rank differentiates its vocabulary slice).
void max_from_tp(Tensor& x, comm::Communicator& tp, Stream& s);
// Identity in backward (the gradient of a replicated output is replicated).
inline void reduce_from_tp_backward(const Tensor& /*dy*/, comm::Communicator& /*tp*/,
                                    Stream& /*s*/) {}

// x [rows, n] -> y [rows, TP*n]: rank r's columns at [r*n, (r+1)*n).
void gather_from_tp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s);
// dy [rows, TP*n] -> dx [rows, n]: this rank's columns.
void gather_from_tp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s);
// x [rows, TP*n] -> y [rows, n]: this rank's columns.
void scatter_to_tp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s);
// dy [rows, n] -> dx [rows, TP*n].
void scatter_to_tp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s);

// Sequence parallelism. x [S/TP, ...] -> y [S, ...] (all-gather along dim 0).
void gather_from_sp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s);
// dy [S, ...] partial -> dx [S/TP, ...] = this rank's block of the sum (reduce-scatter).
void gather_from_sp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s);
// x [S, ...] partial -> y [S/TP, ...] = this rank's block of the sum (reduce-scatter).
void reduce_scatter_to_sp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s);
// dy [S/TP, ...] -> dx [S, ...] (all-gather along dim 0).
void reduce_scatter_to_sp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp,
                                   Stream& s);

}  // namespace mcpp::parallel
