#include "optim/grads.h"

#include <cmath>
#include <memory>

#include "ops/ops.h"

namespace mcpp::optim {

std::vector<parallel::GradParam> grad_params(const model::ParamStore& params,
                                             const parallel::ParallelState& ps) {
  const auto& infos = params.infos();
  std::vector<std::string> names;
  // std::vector<bool> is not contiguous: the flags as a plain array.
  std::unique_ptr<bool[]> dup(new bool[infos.size()]);
  for (size_t i = 0; i < infos.size(); ++i)
    names.push_back(infos[i].name), dup[i] = infos[i].pipeline_duplicate;
  const std::vector<bool> shared =
      parallel::embedding_group_params(ps, names, std::span<const bool>(dup.get(), infos.size()));
  std::vector<parallel::GradParam> out;
  for (size_t i = 0; i < infos.size(); ++i)
    out.push_back({infos[i].offset, infos[i].numel(), infos[i].sequence_parallel, shared[i]});
  return out;
}

bool counts_in_grad_norm(const model::ParamInfo& p, int tp_rank) {
  return (tp_rank == 0 || !p.tp_duplicated()) && !p.pipeline_duplicate;
}

double grad_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                 comm::Communicator& group) {
  if (group.size() == 1) return std::sqrt(opt.grad_sq_norm());
  const auto& infos = params.infos();
  const ParamFilter counted = [&](size_t i) { return counts_in_grad_norm(infos[i], tp_rank); };
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = opt.grad_sq_norm(&counted);
  group.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return std::sqrt(t.data<double>()[0]);
}

}  // namespace mcpp::optim
