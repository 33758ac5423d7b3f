#include "optim/muon.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

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

// The sums over the group of each rank's values, in fp32 as emerging_optimizers' norm.
std::vector<double> all_reduce_sums(const std::vector<double>& v, comm::Communicator& g,
                                    Device dev, Stream& s) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = ops::on_device(Tensor::from(f, {int64_t(f.size())}), dev, s);
  g.all_reduce(t, comm::ReduceOp::Sum, s);
  Tensor h = Tensor::empty({int64_t(f.size())}, DType::F32);
  ops::copy(t, h, s);  // a host destination: complete on return
  return std::vector<double>(h.data<float>(), h.data<float>() + f.size());
}

// Matrix i of a batch [n, r, c], as [r, c] (a view).
Tensor slot(const Tensor& x, int64_t i) { return x.narrow(i, 1).view({x.size(1), x.size(2)}); }

// Each matrix's sum of squares in fp64, x [n, r, c]. On a GPU every reduction is queued,
// their partial sums gathered into one buffer and read back in one copy (summed here in
// their order, as ops::dot_end sums them): one wait for the batch, not one a matrix.
std::vector<double> sums_of_squares(const Tensor& x, Stream& s) {
  const int64_t n = x.size(0);
  std::vector<double> out(static_cast<size_t>(n), 0.0);
  if (x.device() == Device::CPU) {
    for (int64_t i = 0; i < n; ++i) out[size_t(i)] = ops::sum_squares(slot(x, i), s);
    return out;
  }
  Tensor all;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor xi = slot(x, i);
    Tensor partial;
    ops::dot_begin(xi, xi, partial, s);
    if (!all.defined()) all = Tensor::empty({n, partial.numel()}, partial.dtype(), x.device());
    Tensor dst = all.narrow(i, 1).view({partial.numel()});
    ops::copy(partial, dst, s);
  }
  Tensor host = Tensor::empty(all.shape(), DType::F64);
  ops::copy(all, host, s);  // a host destination: complete on return
  const int64_t p = all.size(1);
  for (int64_t i = 0; i < n; ++i) {
    double total = 0;
    for (int64_t j = 0; j < p; ++j) total += host.data<double>()[i * p + j];
    out[size_t(i)] = total;
  }
  return out;
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

namespace {

// newton_schulz on a batch [n, r, c] that the call may overwrite (it is scaled in place).
Tensor newton_schulz_owned(Tensor scaled, const MuonConfig& c, comm::Communicator* dist,
                           int dim, Stream& s) {
  const int64_t nb = scaled.size(0), r = scaled.size(1), cols = scaled.size(2);
  const Device dev = scaled.device();
  const Shape shape = scaled.shape();
  // Orthogonalise along the smaller dimension (distributed: the one not split over TP).
  const bool tr = dist ? dim == 0 : r > cols;
  std::vector<double> sq = sums_of_squares(scaled, s);
  if (dist) sq = all_reduce_sums(sq, *dist, dev, s);
  for (int64_t i = 0; i < nb; ++i) {
    const double norm = std::max(double(float(std::sqrt(sq[size_t(i)]))), 1e-15);
    Tensor xi = slot(scaled, i);
    ops::scale(xi, 1.0 / norm, s);
  }
  // bf16 GEMMs on CUDA; on the CPU f32 GEMMs of bf16 values, each output rounded to bf16.
  // Every GEMM below is one batched call over the nb matrices.
  const bool native = c.bf16_matmul && dev == Device::CUDA;
  const bool emulate = c.bf16_matmul && !native;
  const DType dt = native ? DType::BF16 : DType::F32;
  Tensor X = Tensor::empty(shape, dt, dev), Xn = Tensor::empty(shape, dt, dev);
  ops::copy(scaled, X, s);
  scaled = Tensor();
  if (emulate) round_to_bf16(X, s);
  const int64_t n = tr ? cols : r;
  Tensor A = Tensor::empty({nb, n, n}, dt, dev), B = Tensor::empty({nb, n, n}, dt, dev);
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
      ops::gemm_add(false, false, cc, A, A, b, A, B, s);
      if (emulate) round_to_bf16(B, s);
      P = &B;
      alpha = 1.0;
    }
    if (tr)
      ops::gemm_add(false, true, alpha, X, *P, a, X, Xn, s);
    else
      ops::gemm_add(false, false, alpha, *P, X, a, X, Xn, s);
    if (emulate) round_to_bf16(Xn, s);
    std::swap(X, Xn);
  }
  Tensor out = Tensor::empty(shape, DType::F32, dev);
  ops::copy(X, out, s);
  return out;
}

}  // namespace

Tensor newton_schulz(const Tensor& x, const MuonConfig& c, comm::Communicator* dist, int dim,
                     Stream& s) {
  MCPP_CHECK((x.dim() == 2 || x.dim() == 3) && x.dtype() == DType::F32,
             "newton_schulz: f32 [r, c] or [n, r, c] expected, got {}", x.str());
  if (x.dim() == 2)
    return newton_schulz(x.view({1, x.size(0), x.size(1)}), c, dist, dim, s).view(x.shape());
  Tensor copy = Tensor::empty(x.shape(), DType::F32, x.device());
  ops::copy(x, copy, s);
  return newton_schulz_owned(std::move(copy), c, dist, dim, s);
}

std::vector<Tensor> muon_updates(const std::vector<const model::ParamInfo*>& ps,
                                 const std::vector<Tensor>& us, const MuonConfig& c,
                                 const MuonGroups& g, Stream& s) {
  MCPP_CHECK(ps.size() == us.size(), "muon_updates: {} parameters, {} updates", ps.size(),
             us.size());
  // One matrix Newton-Schulz orthogonalises: a parameter's update or one of its QKV parts;
  // under duplicated TP the whole matrix gathered from the shards.
  struct Block {
    size_t param = 0;
    Tensor x;                              // f32 [r, c]
    comm::Communicator* dist = nullptr;    // distributed TP: x is a shard over dist
    int dim = -1;                          // ... along dim
    comm::Communicator* shard = nullptr;   // duplicated TP: keep this rank's part
    int shard_dim = -1;
    int64_t out = 0, in = 0;               // the whole layer's shape, for the scale
    int64_t at = -1;                       // QKV parts: the first row in the parts' order
    Tensor result;
  };
  struct Split {
    Tensor done, back;  // the parts' results in the parts' order; the inverse row order
  };
  std::vector<Block> blocks;
  std::vector<Split> splits(ps.size());
  int64_t group_rows = 0;
  for (int64_t v : c.qkv_split) group_rows += v;
  for (size_t k = 0; k < ps.size(); ++k) {
    const model::ParamInfo& p = *ps[k];
    const Tensor& u = us[k];
    MCPP_CHECK(u.dim() == 2 && u.dtype() == DType::F32,
               "muon_update: {}: f32 matrix expected, got {}", p.name, u.str());
    const int dim = p.split == model::TpSplit::Cols ? 1
                    : p.split == model::TpSplit::Rows || p.split == model::TpSplit::SwigluRows
                        ? 0
                        : -1;
    comm::Communicator* grp = dim < 0 ? nullptr : p.expert >= 0 ? g.expert_tp : g.tp;
    if (grp && grp->size() <= 1) grp = nullptr;
    auto add = [&](const Tensor& x, int64_t at) {
      Block b;
      b.param = k, b.x = x;
      b.out = x.size(0), b.in = x.size(1), b.at = at;
      if (grp && c.tp_mode != MuonTpMode::Blockwise) {
        (dim == 0 ? b.out : b.in) *= grp->size();
        if (c.tp_mode == MuonTpMode::Duplicated)
          b.x = gather_matrix(x, dim, *grp, s), b.shard = grp, b.shard_dim = dim;
        else
          b.dist = grp, b.dim = dim;
      }
      blocks.push_back(std::move(b));
    };
    const int64_t rows = u.size(0);
    if (group_rows == 0 || !p.name.ends_with("self_attention.linear_qkv.weight") ||
        rows % group_rows != 0) {
      add(u, -1);
      continue;
    }
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
    for (size_t j = 0; j < order.size(); ++j) back[size_t(order[j])] = int64_t(j);
    Tensor parts = Tensor::empty(u.shape(), DType::F32, u.device());
    ops::gather_rows(u, index_tensor(order, u.device(), s), parts, s);
    splits[k].done = Tensor::empty(u.shape(), DType::F32, u.device());
    splits[k].back = index_tensor(back, u.device(), s);
    int64_t at = 0;
    for (int64_t n : part_rows) {
      add(parts.narrow(at, n), at);  // rows of a row-major matrix: contiguous
      at += n;
    }
  }
  // Blocks of one shape (and TP treatment) are orthogonalised together, in the order their
  // first block came: the same collectives in the same order on every rank of a group.
  std::vector<bool> taken(blocks.size(), false);
  for (size_t i = 0; i < blocks.size(); ++i) {
    if (taken[i]) continue;
    const Block& first = blocks[i];
    std::vector<size_t> same;
    for (size_t j = i; j < blocks.size(); ++j) {
      const Block& b = blocks[j];
      if (!taken[j] && b.x.size(0) == first.x.size(0) && b.x.size(1) == first.x.size(1) &&
          b.dist == first.dist && b.dim == first.dim)
        same.push_back(j), taken[j] = true;
    }
    const int64_t r = first.x.size(0), cols = first.x.size(1), nb = int64_t(same.size());
    Tensor batch = Tensor::empty({nb, r, cols}, DType::F32, first.x.device());
    for (int64_t j = 0; j < nb; ++j) {
      Tensor dst = slot(batch, j);
      ops::copy(blocks[same[size_t(j)]].x, dst, s);
    }
    const Tensor o = newton_schulz_owned(std::move(batch), c, first.dist, first.dim, s);
    for (int64_t j = 0; j < nb; ++j) blocks[same[size_t(j)]].result = slot(o, j);
  }
  std::vector<Tensor> out(ps.size());
  for (Block& b : blocks) {
    Tensor o = b.shard ? shard_of(b.result, b.shard_dim, *b.shard, s) : b.result;
    ops::scale(o, muon_scale_factor(c.scale, b.out, b.in), s);
    if (c.extra_scale != 1.0) ops::scale(o, c.extra_scale, s);
    if (b.at < 0) {
      out[b.param] = o;
    } else {
      Tensor dst = splits[b.param].done.narrow(b.at, o.size(0));
      ops::copy(o, dst, s);
    }
  }
  for (size_t k = 0; k < ps.size(); ++k) {
    if (!splits[k].done.defined()) continue;
    out[k] = Tensor::empty(us[k].shape(), DType::F32, us[k].device());
    ops::gather_rows(splits[k].done, splits[k].back, out[k], s);
  }
  return out;
}

Tensor muon_update(const model::ParamInfo& p, const Tensor& u, const MuonConfig& c,
                   const MuonGroups& g, Stream& s) {
  return muon_updates({&p}, {u}, c, g, s).front();
}

double muon_adaptive_scale(const model::ParamInfo& p, const MuonConfig& c) {
  const Shape& s = p.local_shape;
  const int64_t out = s.at(0), in = shape_numel(s) / std::max<int64_t>(out, 1);
  return muon_scale_factor(c.scale, out, in) * c.extra_scale;
}

std::vector<int> muon_owners(const std::vector<const model::ParamInfo*>& ps, int ranks) {
  MCPP_CHECK(ranks >= 1, "muon_owners: {} ranks", ranks);
  std::vector<double> cost(ps.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const Shape& s = ps[i]->local_shape;
    const double r = double(s.at(0)), c = double(shape_numel(s)) / std::max<double>(r, 1);
    cost[i] = r * c * std::min(r, c);
  }
  std::vector<size_t> order(ps.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(size_t(ranks), 0.0);
  std::vector<int> owner(ps.size(), 0);
  for (size_t i : order) {
    const int r = int(std::min_element(load.begin(), load.end()) - load.begin());
    owner[i] = r;
    load[size_t(r)] += cost[i];
  }
  return owner;
}

}  // namespace mcpp::optim
