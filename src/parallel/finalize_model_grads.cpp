#include "parallel/finalize_model_grads.h"

#include <set>

#include "base/error.h"
#include "parallel/host_collectives.h"

namespace mcpp::parallel {

void finalize_model_grads(const ParallelState& ps, std::span<const GradParam> params,
                          Tensor& flat_grads, DataParallelGrads& dp, Tensor& opt_grads,
                          std::span<const ShardSegment> segments, const FinalizeOptions& o,
                          Stream& st) {
  auto timer = [&](bool start) {
    if (o.timer) o.timer("grads-reduce", start);
  };
  const bool pipelined = ps.layout().pp() > 1;
  if (pipelined) {
    if (ps.has(Group::Embedding) && ps.embedding().size() > 1)
      for (const GradParam& p : params)
        if (p.embedding_group) {
          Tensor g = flat_grads.narrow(p.offset, p.numel);
          ps.embedding().all_reduce(g, comm::ReduceOp::Sum, st);
        }
    if (o.overlap_grad_reduce) dp.layer_ready(-1, st);
  }
  // grads-reduce: the part of the data-parallel reduction that backward did not hide
  // (all of it without --overlap-grad-reduce): the exposed communication time.
  timer(true);
  dp.finish(st);
  timer(false);
  if (ps.tp().size() > 1)
    for (const ShardSegment& s : segments) {
      const GradParam& p = params[s.param];
      if ((o.sequence_parallel && p.sequence_parallel) || p.tp_partial) {
        Tensor g = opt_grads.narrow(s.shard, s.len);
        ps.tp().all_reduce(g, comm::ReduceOp::Sum, st);
      }
    }
}

std::vector<bool> embedding_group_params(const ParallelState& ps,
                                         std::span<const std::string> names,
                                         std::span<const bool> duplicate) {
  MCPP_CHECK(names.size() == duplicate.size(), "embedding_group_params: {} names, {} flags",
             names.size(), duplicate.size());
  std::vector<bool> out(names.size(), false);
  if (!ps.has(Group::Embedding) || ps.embedding().size() == 1) return out;
  // The names of every member's copies, '\n'-separated.
  std::string mine;
  for (size_t i = 0; i < names.size(); ++i)
    if (duplicate[i]) mine += names[i] + "\n";
  std::set<std::string> copies;
  for (const std::string& member : all_gather_strings(ps.embedding(), mine))
    for (size_t a = 0, b; a < member.size(); a = b + 1) {
      b = member.find('\n', a);
      copies.insert(member.substr(a, b - a));
    }
  for (size_t i = 0; i < names.size(); ++i) out[i] = copies.count(names[i]) > 0;
  return out;
}

comm::Communicator& grad_norm_group(const ParallelState& ps, comm::Communicator& world,
                                    bool sharded_over_dp) {
  const bool pipelined = ps.layout().pp() > 1;
  // Several distributed-optimizer instances hold the same shards: the sum runs over one
  // instance (Megatron's grad_stats_parallel_group = intra_dist_opt).
  if (sharded_over_dp && ps.layout().dist_opt_instances() > 1)
    return ps.group(Group::IntraDistOpt);
  // The distributed optimizer shards over DP x CP (the gradients' group) under CP.
  if (sharded_over_dp)
    return pipelined ? world : ps.group(ps.layout().cp() > 1 ? Group::TP_DP_CP : Group::TP_DP);
  return pipelined ? ps.mp() : ps.tp();
}

}  // namespace mcpp::parallel
