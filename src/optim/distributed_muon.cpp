// DistributedAdamW::muon_step: Muon under the distributed optimizer (distributed_optimizer.h).
// A matrix's elements may lie in several ranks' blocks of its bucket, but Newton-Schulz needs
// the whole matrix: each rank updates the momentum of its own elements, a window of whole
// matrices is assembled on every rank of the bucket's group, the matrices are orthogonalised
// by their owners only, and the updates travel back the same way. Every number is the one
// the unsharded optimizer computes (the assembling sums add zeros to one rank's values).
#include <algorithm>

#include "ops/momentum_step.h"
#include "ops/ops.h"
#include "optim/distributed_optimizer.h"

namespace mcpp::optim {

void DistributedAdamW::muon_step(double lr, double wd, Stream& st) {
  const auto& infos = ps_.infos();
  Tensor& flat = ps_.flat_params();
  const int64_t window = muon_window_bytes();
  for (size_t b = 0; b < grads_.buckets().size(); ++b) {
    const auto& bk = grads_.buckets()[b];
    comm::Communicator& group = *bk.group;  // DP, or expert-DP for an expert bucket
    const int64_t n = grads_.block(b), lo = bk.begin + group.rank() * n, hi = lo + n;
    std::vector<size_t> mats;
    for (size_t i : bk.params)
      if (muon_steps(infos[i])) mats.push_back(i);
    std::sort(mats.begin(), mats.end(),
              [&](size_t x, size_t y) { return infos[x].offset < infos[y].offset; });
    // This rank's part of parameter i: flat [p0, p0 + len), at shard position p0 - lo +
    // the bucket's shard offset; len 0 when its block holds none of it.
    struct Part {
      int64_t p0, len, shard;
    };
    auto part = [&](size_t i) {
      const int64_t p0 = std::max(lo, infos[i].offset);
      const int64_t p1 = std::min(hi, infos[i].offset + infos[i].numel());
      return Part{p0, std::max<int64_t>(p1 - p0, 0), bk.shard_offset + (p0 - lo)};
    };
    for (size_t a = 0; a < mats.size();) {
      size_t e = a;
      int64_t bytes = 0;
      while (e < mats.size() && (e == a || bytes + infos[mats[e]].numel() * 4 <= window))
        bytes += infos[mats[e++]].numel() * 4;
      const int64_t w0 = infos[mats[a]].offset;
      const int64_t w1 = infos[mats[e - 1]].offset + infos[mats[e - 1]].numel();
      Tensor buf = Tensor::empty({w1 - w0}, DType::F32, flat.device());
      ops::fill(buf, 0.0, st);
      // U of this rank's elements (the momentum, or Nesterov's combination) into buf
      for (size_t k = a; k < e; ++k) {
        const Part p = part(mats[k]);
        if (p.len == 0) continue;
        Tensor m = m_.narrow(p.shard, p.len), u = buf.narrow(p.p0 - w0, p.len);
        muon_momentum_span(grads_.shard().narrow(p.shard, p.len), m,
                           muon_->nesterov ? u : Tensor(), st);
        if (!muon_->nesterov) ops::copy(m, u, st);
      }
      if (group.size() > 1) group.all_reduce(buf, comm::ReduceOp::Sum, st);
      // The window's matrices this rank orthogonalises
      std::vector<const model::ParamInfo*> ps;
      for (size_t k = a; k < e; ++k) ps.push_back(&infos[mats[k]]);
      const std::vector<int> owner = muon_owners(ps, group.size());
      std::vector<const model::ParamInfo*> mine;
      std::vector<Tensor> us;
      for (size_t k = 0; k < ps.size(); ++k) {
        if (owner[k] != group.rank()) continue;
        mine.push_back(ps[k]);
        us.push_back(buf.narrow(ps[k]->offset - w0, ps[k]->numel()).view(ps[k]->local_shape));
      }
      std::vector<Tensor> upd = muon_updates(mine, us, *muon_, muon_groups_, st);
      us.clear();
      ops::fill(buf, 0.0, st);
      for (size_t k = 0; k < mine.size(); ++k) {
        Tensor dst = buf.narrow(mine[k]->offset - w0, mine[k]->numel());
        ops::copy(upd[k].view({mine[k]->numel()}), dst, st);
      }
      upd.clear();
      if (group.size() > 1) group.all_reduce(buf, comm::ReduceOp::Sum, st);
      // This rank's elements of every matrix of the window, updated
      for (size_t k = a; k < e; ++k) {
        const size_t i = mats[k];
        const Part p = part(i);
        if (p.len == 0) continue;
        auto shard = [&](const Tensor& t) { return t.defined() ? t.narrow(p.shard, p.len) : t; };
        Tensor u = buf.narrow(p.p0 - w0, p.len);
        if (muon_->adaptive) {  // adaptive_muon: element-wise, so on this rank's part alone
          Tensor v = v_.narrow(p.shard, p.len);
          ops::adamuon_normalize(u, v, muon_->adaptive_beta2, muon_->adaptive_eps,
                                 muon_adaptive_scale(infos[i], *muon_), st);
        }
        Tensor model = flat.narrow(p.p0, p.len);
        Tensor main = main_.defined() ? shard(main_) : Tensor();
        muon_apply_span(model, main, lo_.defined() ? shard(lo_) : Tensor(),
                        u, lr_of(i, lr),
                        infos[i].weight_decay ? wd : 0.0, st);
      }
      a = e;
    }
  }
}

}  // namespace mcpp::optim
