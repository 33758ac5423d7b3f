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
    out.push_back({infos[i].offset, infos[i].numel(), infos[i].sequence_parallel,
                   infos[i].tp_partial, shared[i]});
  return out;
}

bool counts_in_grad_norm(const model::ParamInfo& p, int tp_rank) {
  // Duplicated over the group it would be split over (an expert's: its ETP group when that
  // is not TP): counted by that group's rank 0.
  return (p.shard_rank(tp_rank) == 0 || !p.tp_duplicated()) && !p.pipeline_duplicate;
}

namespace {

// Sums a dense and an expert partial sum over their groups (expert parallelism), or their
// total over `group` (expert_group null).
double sum_split(double dense, double expert, comm::Communicator& group,
                 comm::Communicator* expert_group) {
  Tensor t = Tensor::empty({1}, DType::F64);
  auto reduce = [&](double v, comm::Communicator& g) {
    if (g.size() == 1) return v;
    t.data<double>()[0] = v;
    g.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
    return t.data<double>()[0];
  };
  if (!expert_group) return reduce(dense + expert, group);
  return reduce(dense, group) + reduce(expert, *expert_group);
}

}  // namespace

double grad_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                 comm::Communicator& group, comm::Communicator* expert_group) {
  const auto& infos = params.infos();
  if (expert_group) {  // even of one rank: the expert part is then not summed over `group`
    const ParamFilter dense = [&](size_t i) {
      return infos[i].expert < 0 && counts_in_grad_norm(infos[i], tp_rank);
    };
    const ParamFilter expert = [&](size_t i) {
      return infos[i].expert >= 0 && counts_in_grad_norm(infos[i], tp_rank);
    };
    return std::sqrt(sum_split(opt.grad_sq_norm(&dense), opt.grad_sq_norm(&expert), group,
                               expert_group));
  }
  if (group.size() == 1) return std::sqrt(opt.grad_sq_norm());
  const ParamFilter counted = [&](size_t i) { return counts_in_grad_norm(infos[i], tp_rank); };
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = opt.grad_sq_norm(&counted);
  group.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return std::sqrt(t.data<double>()[0]);
}

double params_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                   comm::Communicator& model_parallel, comm::Communicator* expert_group) {
  // The fp32 main parameters when the optimizer holds them whole (bf16/f16 models, not
  // sharded; split ones joined a chunk at a time); otherwise the model's own (fp32 on the
  // CPU; bf16 under the distributed optimizer, whose main parameters are DP shards).
  const auto* adam = dynamic_cast<const AdamW*>(&opt);
  const Tensor& values = const_cast<model::ParamStore&>(params).flat_params();
  Stream& st = ops::default_stream(values.device());
  double sum = 0, expert = 0;
  const bool split = expert_group != nullptr;
  for (const auto& p : params.infos())
    if (counts_in_grad_norm(p, tp_rank))
      (split && p.expert >= 0 ? expert : sum) +=
          adam ? adam->main_sum_squares(p.offset, p.numel())
               : ops::sum_squares(values.narrow(p.offset, p.numel()), st);
  if (split) return std::sqrt(sum_split(sum, expert, model_parallel, expert_group));
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = sum;
  if (model_parallel.size() > 1) model_parallel.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return std::sqrt(t.data<double>()[0]);
}

int64_t count_zeros_in_grads(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                             comm::Communicator& group, comm::Communicator* expert_group) {
  const Tensor& g = opt.grads();
  Tensor host = g;
  if (g.device() != Device::CPU) {
    host = Tensor::empty(g.shape(), g.dtype());
    ops::copy(g, host, ops::default_stream(g.device()));
  }
  const auto& infos = params.infos();
  int64_t zeros_dense = 0, expert_zeros = 0;
  const bool split = expert_group != nullptr;
  for (const auto& s : opt.segments()) {
    if (!counts_in_grad_norm(infos[s.param], tp_rank)) continue;
    int64_t& zeros = split && infos[s.param].expert >= 0 ? expert_zeros : zeros_dense;
    if (host.dtype() == DType::F64) {
      const double* x = host.data<double>() + s.shard;
      for (int64_t i = 0; i < s.len; ++i) zeros += x[i] == 0.0;
    } else {
      const float* x = host.data<float>() + s.shard;
      for (int64_t i = 0; i < s.len; ++i) zeros += x[i] == 0.0f;
    }
  }
  if (split)
    return int64_t(sum_split(double(zeros_dense), double(expert_zeros), group, expert_group));
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = double(zeros_dense);
  if (group.size() > 1) group.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return int64_t(t.data<double>()[0]);
}

}  // namespace mcpp::optim
