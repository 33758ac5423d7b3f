#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "base/error.h"
#include "comm/communicator.h"
#include "ops/ops.h"

namespace mcpp::optim {

namespace {

using Coeffs = std::vector<std::array<double, 3>>;

// emerging_optimizers' coefficient sets (muon_utils.py), each tuple (a, b, c) of one step.
const std::map<std::string, Coeffs>& coefficient_sets() {
  static const std::map<std::string, Coeffs> sets = {
      {"simple", {{3.4445, -4.7750, 2.0315}}},
      {"quintic",
       {{4.0848, -6.8946, 2.9270},
        {3.9505, -6.3029, 2.6377},
        {3.7418, -5.5913, 2.3037},
        {2.8769, -3.1427, 1.2046},
        {2.8366, -3.0525, 1.2012}}},
      {"polar_express",
       {{8.2051, -22.9019, 16.4607},
        {4.0664, -2.8612, 0.5184},
        {3.9096, -2.8234, 0.5250},
        {3.2856, -2.4153, 0.4853},
        {2.2779, -1.6198, 0.3985},
        {1.8726, -1.2307, 0.3585},
        {1.8564, -1.2132, 0.3568},
        {1.8750, -1.2500, 0.3750}}},
      {"cans",
       {{8.4703, -25.1081, 18.6293},
        {4.1828, -3.1087, 0.5806},
        {3.9619, -2.9541, 0.5630},
        {3.2866, -2.4647, 0.5074},
        {2.2737, -1.6447, 0.4162}}},
      {"aol",
       {{4.0098, -7.0585, 2.4635},
        {3.4585, -5.5479, 2.5959},
        {2.7573, -3.2939, 1.4254},
        {2.7215, -3.0494, 1.3169}}},
      {"deepseekv4",
       {{3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {3.4445, -4.7750, 2.0315},
        {2.0, -1.5, 0.5},
        {2.0, -1.5, 0.5}}},
      {"cubic5",
       {{3.3656576, -3.3420992, 0.0},
        {2.5744352, -1.4957376, 0.0},
        {2.5368962, -1.4312570, 0.0},
        {2.4418906, -1.2764040, 0.0},
        {2.2230472, -0.9630650, 0.0}}},
  };
  return sets;
}

// x rounded to bf16 values in place (an f32 tensor): what a bf16 GEMM output holds, on a
// device whose GEMMs are f32 only (the CPU).
void round_to_bf16(Tensor& x, Stream& s) {
  Tensor t = Tensor::empty(x.shape(), DType::BF16, x.device());
  ops::copy(x, t, s);
  ops::copy(t, x, s);
}

// The sum over the group of one value of each rank, in fp32 as emerging_optimizers' norm.
double all_reduce_sum(double v, comm::Communicator& g, Device dev, Stream& s) {
  Tensor t = Tensor::empty({1}, DType::F32, dev);
  ops::fill(t, v, s);
  g.all_reduce(t, comm::ReduceOp::Sum, s);
  Tensor h = Tensor::empty({1}, DType::F32);
  ops::copy(t, h, s);  // a host destination: complete on return
  return h.data<float>()[0];
}

Tensor transposed(const Tensor& x, Stream& s) {
  Tensor y = Tensor::empty({x.size(1), x.size(0)}, x.dtype(), x.device());
  ops::transpose(x, y, s);
  return y;
}

// The whole matrix from the shards of x along dim over g (rank-major, as Megatron's
// all_gather + cat).
Tensor gather_matrix(const Tensor& x, int dim, comm::Communicator& g, Stream& s) {
  const int n = g.size();
  if (dim == 0) {
    Tensor out = Tensor::empty({n * x.size(0), x.size(1)}, x.dtype(), x.device());
    g.all_gather(x, out, s);
    return out;
  }
  Tensor xt = transposed(x, s);
  Tensor out = Tensor::empty({n * xt.size(0), xt.size(1)}, x.dtype(), x.device());
  g.all_gather(xt, out, s);
  return transposed(out, s);
}

// This rank's shard along dim of a whole matrix (the inverse of gather_matrix).
Tensor shard_of(const Tensor& full, int dim, comm::Communicator& g, Stream& s) {
  const int n = g.size(), r = g.rank();
  const Tensor t = dim == 0 ? full : transposed(full, s);
  const int64_t rows = t.size(0) / n;
  Tensor part = Tensor::empty({rows, t.size(1)}, t.dtype(), t.device());
  ops::copy(t.narrow(r * rows, rows), part, s);
  return dim == 0 ? part : transposed(part, s);
}

Tensor index_tensor(const std::vector<int64_t>& idx, Device dev, Stream& s) {
  return ops::on_device(Tensor::from(idx, {int64_t(idx.size())}), dev, s);
}

}  // namespace

MuonScale parse_muon_scale(const std::string& s) {
  if (s == "spectral") return MuonScale::Spectral;
  if (s == "unit_rms_norm") return MuonScale::UnitRmsNorm;
  if (s == "shape_scaling") return MuonScale::ShapeScaling;
  throw Error(fmt::format("--muon-scale-mode {} is not one of Megatron's modes", s),
              "give spectral, unit_rms_norm or shape_scaling");
}

MuonTpMode parse_muon_tp_mode(const std::string& s) {
  if (s == "blockwise") return MuonTpMode::Blockwise;
  if (s == "duplicated") return MuonTpMode::Duplicated;
  if (s == "distributed") return MuonTpMode::Distributed;
  throw Error(fmt::format("--muon-tp-mode {} is not one of Megatron's modes", s),
              "give blockwise, duplicated or distributed");
}

std::vector<std::array<double, 3>> muon_coefficients(const std::string& type, int steps) {
  const auto& sets = coefficient_sets();
  auto it = sets.find(type);
  MCPP_CHECK_HINT(it != sets.end(), "see docs/optimizer.md for the sets",
                  "--muon-coefficient-type {} is not a Newton-Schulz coefficient set", type);
  const Coeffs& set = it->second;
  const bool repeat_last = type == "polar_express" || type == "cans" || type == "deepseekv4";
  Coeffs out;
  for (int i = 0; i < steps; ++i)
    out.push_back(repeat_last ? set[std::min<size_t>(i, set.size() - 1)] : set[i % set.size()]);
  return out;
}

double muon_scale_factor(MuonScale mode, int64_t out, int64_t in) {
  switch (mode) {
    case MuonScale::ShapeScaling: return std::sqrt(std::max(1.0, double(out) / double(in)));
    case MuonScale::Spectral: return std::sqrt(double(std::max(out, in)));
    case MuonScale::UnitRmsNorm: return std::sqrt(double(out) / double(in));
  }
  return 1.0;
}

bool muon_steps(const model::ParamInfo& p) {
  return p.local_shape.size() == 2 && !p.embedding_or_output;
}

Tensor newton_schulz(const Tensor& x, const MuonConfig& c, comm::Communicator* dist, int dim,
                     Stream& s) {
  MCPP_CHECK(x.dim() == 2 && x.dtype() == DType::F32, "newton_schulz: f32 [r, c] expected, got {}",
             x.str());
  const int64_t r = x.size(0), cols = x.size(1);
  const Device dev = x.device();
  // Orthogonalise along the smaller dimension (distributed: the one not split over TP).
  const bool tr = dist ? dim == 0 : r > cols;
  double sq = ops::sum_squares(x, s);
  if (dist) sq = all_reduce_sum(sq, *dist, dev, s);
  const double norm = std::max(double(float(std::sqrt(sq))), 1e-15);
  // bf16 GEMMs on CUDA; on the CPU f32 GEMMs of bf16 values, each output rounded to bf16.
  const bool native = c.bf16_matmul && dev == Device::CUDA;
  const bool emulate = c.bf16_matmul && !native;
  const DType dt = native ? DType::BF16 : DType::F32;
  Tensor scaled = Tensor::empty({r, cols}, DType::F32, dev);
  ops::copy(x, scaled, s);
  ops::scale(scaled, 1.0 / norm, s);
  Tensor X = Tensor::empty({r, cols}, dt, dev), Xn = Tensor::empty({r, cols}, dt, dev);
  ops::copy(scaled, X, s);
  if (emulate) round_to_bf16(X, s);
  const int64_t n = tr ? cols : r;
  Tensor A = Tensor::empty({n, n}, dt, dev), B = Tensor::empty({n, n}, dt, dev);
  for (const auto& [a, b, cc] : muon_coefficients(c.coefficients, c.ns_steps)) {
    // A = Y Y^T with Y = X (or X^T).
    ops::gemm(tr, !tr, 1.0, X, X, 0.0, A, s);
    if (dist) dist->all_reduce(A, comm::ReduceOp::Sum, s);
    if (emulate) round_to_bf16(A, s);
    // Y <- a Y + P Y with P = b A + c A A (or b A when c = 0); for Y = X^T that is
    // X <- a X + X P^T.
    const Tensor* P = &A;
    double alpha = b;
    if (cc != 0.0) {
      ops::copy(A, B, s);
      ops::gemm(false, false, cc, A, A, b, B, s);
      if (emulate) round_to_bf16(B, s);
      P = &B;
      alpha = 1.0;
    }
    ops::copy(X, Xn, s);
    if (tr)
      ops::gemm(false, true, alpha, X, *P, a, Xn, s);
    else
      ops::gemm(false, false, alpha, *P, X, a, Xn, s);
    if (emulate) round_to_bf16(Xn, s);
    std::swap(X, Xn);
  }
  Tensor out = Tensor::empty({r, cols}, DType::F32, dev);
  ops::copy(X, out, s);
  return out;
}

Tensor muon_update(const model::ParamInfo& p, const Tensor& u, const MuonConfig& c,
                   const MuonGroups& g, Stream& s) {
  MCPP_CHECK(u.dim() == 2 && u.dtype() == DType::F32, "muon_update: {}: f32 matrix expected, got {}",
             p.name, u.str());
  const int dim = p.split == model::TpSplit::Cols                                     ? 1
                  : p.split == model::TpSplit::Rows || p.split == model::TpSplit::SwigluRows ? 0
                                                                                         : -1;
  comm::Communicator* grp = dim < 0 ? nullptr : p.expert >= 0 ? g.expert_tp : g.tp;
  if (grp && grp->size() <= 1) grp = nullptr;
  // One block (the matrix, or its query / key / value rows): orthogonalised and scaled.
  auto one = [&](const Tensor& x) {
    int64_t out = x.size(0), in = x.size(1);
    Tensor o;
    if (!grp || c.tp_mode == MuonTpMode::Blockwise) {
      o = newton_schulz(x, c, nullptr, -1, s);
    } else {
      (dim == 0 ? out : in) *= grp->size();
      if (c.tp_mode == MuonTpMode::Duplicated)
        o = shard_of(newton_schulz(gather_matrix(x, dim, *grp, s), c, nullptr, -1, s), dim, *grp,
                     s);
      else
        o = newton_schulz(x, c, grp, dim, s);
    }
    ops::scale(o, muon_scale_factor(c.scale, out, in), s);
    if (c.extra_scale != 1.0) ops::scale(o, c.extra_scale, s);
    return o;
  };
  int64_t group_rows = 0;
  for (int64_t v : c.qkv_split) group_rows += v;
  const int64_t rows = u.size(0);
  if (group_rows == 0 || !p.name.ends_with("self_attention.linear_qkv.weight") ||
      rows % group_rows != 0)
    return one(u);
  // Megatron's split: the rows of every query group's query part, then its keys, then its
  // values, each orthogonalised as one matrix.
  const int64_t groups = rows / group_rows;
  std::vector<int64_t> order, back(size_t(rows), 0);
  std::vector<int64_t> part_rows;
  int64_t offset = 0;
  for (int64_t len : c.qkv_split) {
    for (int64_t q = 0; q < groups; ++q)
      for (int64_t j = 0; j < len; ++j) order.push_back(q * group_rows + offset + j);
    part_rows.push_back(groups * len);
    offset += len;
  }
  for (size_t k = 0; k < order.size(); ++k) back[size_t(order[k])] = int64_t(k);
  Tensor parts = Tensor::empty(u.shape(), DType::F32, u.device());
  ops::gather_rows(u, index_tensor(order, u.device(), s), parts, s);
  Tensor done = Tensor::empty(u.shape(), DType::F32, u.device());
  int64_t at = 0;
  for (int64_t n : part_rows) {
    Tensor block = Tensor::empty({n, u.size(1)}, DType::F32, u.device());
    ops::copy(parts.narrow(at, n), block, s);
    Tensor dst = done.narrow(at, n);
    ops::copy(one(block), dst, s);
    at += n;
  }
  Tensor out = Tensor::empty(u.shape(), DType::F32, u.device());
  ops::gather_rows(done, index_tensor(back, u.device(), s), out, s);
  return out;
}

}  // namespace mcpp::optim
