// The all-to-all token dispatcher's communication (Megatron-Core's
// MoEAlltoAllTokenDispatcher, steps 1 and 3-4 of docs/moe.md's "Expert parallelism"), each
// step with its explicit dual. The group is the EP group (EP ranks, each holding El = E/EP
// experts: global expert e = ep_rank*El + j). The caller has permuted its rows into global
// expert order (rows of expert 0, then 1, ...: counts[e] rows each, sum = rows_in).
//
//   plan      counts [E] -> every rank's rows for my local experts (one all_to_all of the
//             counts: variable splits are known before the rows move)
//   forward (to the experts)                       backward (the dual)
//   dispatch   all_to_allv, then re-sort            dispatch_backward  un-sort, all_to_allv back
//              [source][local expert] ->
//              [local expert][source]
//   combine    un-sort, all_to_allv back            combine_backward   all_to_allv, re-sort
//
// dispatch's output is grouped by local expert (tokens_per_local_expert rows each, sources in
// rank order inside an expert), the grouped GEMM's input. Rows only move (no arithmetic),
// so every step is exact and dispatch_backward = combine, combine_backward = dispatch.
// Zero rows are fine anywhere: an expert nobody routes to, a rank that sends nothing, a rank
// that receives nothing. With no group (or a group of one) there is no exchange: the plan is
// the identity and the steps are copies.
#pragma once
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::parallel::expert_parallel {

struct AlltoallPlan {
  int ep = 1, rank = 0;
  int64_t local_experts = 0;                     // El
  std::vector<int64_t> input_splits;             // [EP] rows this rank sends to each rank
  std::vector<int64_t> output_splits;            // [EP] rows this rank gets from each rank
  std::vector<int64_t> recv_counts;              // [EP*El] from source s for local expert j at s*El+j
  std::vector<int64_t> tokens_per_local_expert;  // [El] the grouped GEMM's m splits
  int64_t rows_in = 0, rows_out = 0;             // sum counts; sum output_splits
  Tensor sort_index;    // [rows_out] i64 on the device: expert-major row n = source-major row
  Tensor unsort_index;  // [rows_out] its inverse (empty when El = 1: nothing to re-sort)
};

// counts: this rank's rows per global expert [E], E = group size x El. Collective over
// `group` (null: EP 1). The index tensors live on s's device.
AlltoallPlan plan_alltoall(std::span<const int64_t> counts, comm::Communicator* group, Stream& s);

// xp [rows_in, ...] (global expert order) -> y [rows_out, ...] (local expert order).
void dispatch_alltoall(const Tensor& xp, Tensor& y, const AlltoallPlan& p,
                       comm::Communicator* group, Stream& s);
// dy [rows_out, ...] -> dxp [rows_in, ...].
void dispatch_alltoall_backward(const Tensor& dy, Tensor& dxp, const AlltoallPlan& p,
                                comm::Communicator* group, Stream& s);
// The experts' outputs y [rows_out, ...] back to their sources: yp [rows_in, ...].
void combine_alltoall(const Tensor& y, Tensor& yp, const AlltoallPlan& p,
                      comm::Communicator* group, Stream& s);
// dyp [rows_in, ...] -> dy [rows_out, ...].
void combine_alltoall_backward(const Tensor& dyp, Tensor& dy, const AlltoallPlan& p,
                               comm::Communicator* group, Stream& s);

}  // namespace mcpp::parallel::expert_parallel
