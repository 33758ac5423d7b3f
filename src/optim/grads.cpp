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

double params_norm(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                   comm::Communicator& model_parallel) {
  // The fp32 main parameters when the optimizer holds them whole (bf16/f16 models, not
  // sharded); otherwise the model's own (fp32 on the CPU; bf16 under the distributed
  // optimizer, whose main parameters are DP shards).
  const auto* adam = dynamic_cast<const AdamW*>(&opt);
  const Tensor& values =
      adam && adam->main_params().defined() ? adam->main_params()
                                              : const_cast<model::ParamStore&>(params).flat_params();
  Stream& st = ops::default_stream(values.device());
  double sum = 0;
  for (const auto& p : params.infos())
    if (counts_in_grad_norm(p, tp_rank)) sum += ops::sum_squares(values.narrow(p.offset, p.numel()), st);
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = sum;
  if (model_parallel.size() > 1) model_parallel.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return std::sqrt(t.data<double>()[0]);
}

int64_t count_zeros_in_grads(const Optimizer& opt, const model::ParamStore& params, int tp_rank,
                             comm::Communicator& group) {
  const Tensor& g = opt.grads();
  Tensor host = g;
  if (g.device() != Device::CPU) {
    host = Tensor::empty(g.shape(), g.dtype());
    ops::copy(g, host, ops::default_stream(g.device()));
  }
  const auto& infos = params.infos();
  int64_t zeros = 0;
  for (const auto& s : opt.segments()) {
    if (!counts_in_grad_norm(infos[s.param], tp_rank)) continue;
    if (host.dtype() == DType::F64) {
      const double* x = host.data<double>() + s.shard;
      for (int64_t i = 0; i < s.len; ++i) zeros += x[i] == 0.0;
    } else {
      const float* x = host.data<float>() + s.shard;
      for (int64_t i = 0; i < s.len; ++i) zeros += x[i] == 0.0f;
    }
  }
  Tensor t = Tensor::empty({1}, DType::F64);
  t.data<double>()[0] = double(zeros);
  if (group.size() > 1) group.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return int64_t(t.data<double>()[0]);
}

}  // namespace mcpp::optim
