// DistributedAdamW::muon_step: Muon under the distributed optimizer (distributed_optimizer.h).
// A matrix's elements may lie in several ranks' blocks of its bucket, but Newton-Schulz needs
// the whole matrix. Bucket by bucket, in windows of whole matrices:
//   1. each rank updates the momentum of its own elements (U: the momentum, or Nesterov's
//      combination) and sends every piece of U to the rank that owns the piece's matrix
//      (muon_owners), one all-to-all over the bucket's group;
//   2. each owner orthogonalises its whole matrices (muon_updates, batched by shape);
//   3. a second all-to-all sends each piece of the updates back to the rank whose block
//      holds it, and every rank applies them to its elements.
// Each element crosses the network once each way (4 bytes out, 4 back). Every number is the
// one the unsharded optimizer computes: the element-wise halves are the same ops on the same
// values, and Newton-Schulz sees the whole matrix.
#include <algorithm>

#include "ops/momentum_step.h"
#include "ops/ops.h"
#include "optim/distributed_optimizer.h"

namespace mcpp::optim {

namespace {

// Elements [begin, begin + len) of the flat buffer: a piece of one matrix in one rank's block.
struct Piece {
  int64_t begin = 0, len = 0;
};

}  // namespace

void DistributedAdamW::muon_step(double lr, double wd, Stream& st) {
  const auto& infos = ps_.infos();
  Tensor& flat = ps_.flat_params();
  const Device dev = flat.device();
  const int64_t window = muon_window_bytes();
  for (size_t b = 0; b < grads_.buckets().size(); ++b) {
    const auto& bk = grads_.buckets()[b];
    comm::Communicator& group = *bk.group;  // DP, or expert-DP for an expert bucket
    const int R = group.size(), me = group.rank();
    const int64_t n = grads_.block(b);
    std::vector<size_t> mats;
    for (size_t i : bk.params)
      if (muon_steps(infos[i])) mats.push_back(i);
    std::sort(mats.begin(), mats.end(),
              [&](size_t x, size_t y) { return infos[x].offset < infos[y].offset; });
    // Matrix i's piece in rank s's block [bk.begin + s n, + n) (len 0: none).
    auto piece = [&](size_t i, int s) {
      const int64_t lo = bk.begin + s * n, hi = lo + n;
      const int64_t p0 = std::max(lo, infos[i].offset);
      const int64_t p1 = std::min(hi, infos[i].offset + infos[i].numel());
      return Piece{p0, std::max<int64_t>(p1 - p0, 0)};
    };
    // Where this rank's state holds flat element f of its block.
    auto shard_pos = [&](int64_t f) { return bk.shard_offset + (f - (bk.begin + me * n)); };
    for (size_t a = 0; a < mats.size();) {
      size_t e = a;
      int64_t bytes = 0;
      while (e < mats.size() && (e == a || bytes + infos[mats[e]].numel() * 4 <= window))
        bytes += infos[mats[e++]].numel() * 4;
      std::vector<const model::ParamInfo*> ps;
      for (size_t k = a; k < e; ++k) ps.push_back(&infos[mats[k]]);
      const std::vector<int> owner = muon_owners(ps, R);
      // The window's matrices by owner, in offset order; this rank's own ones.
      std::vector<std::vector<size_t>> owned(static_cast<size_t>(R));
      for (size_t k = a; k < e; ++k) owned[size_t(owner[k - a])].push_back(mats[k]);
      const std::vector<size_t>& mine = owned[size_t(me)];
      // 1. U of this rank's pieces, laid out by destination (the owner), then matrix
      std::vector<int64_t> to_owner(static_cast<size_t>(R), 0), from_holder(to_owner);
      for (int d = 0; d < R; ++d)
        for (size_t i : owned[size_t(d)]) to_owner[size_t(d)] += piece(i, me).len;
      for (int s = 0; s < R; ++s)
        for (size_t i : mine) from_holder[size_t(s)] += piece(i, s).len;
      int64_t sent = 0, got = 0;
      for (int64_t v : to_owner) sent += v;
      for (int64_t v : from_holder) got += v;
      Tensor out = Tensor::empty({sent}, DType::F32, dev);
      int64_t pos = 0;
      for (int d = 0; d < R; ++d)
        for (size_t i : owned[size_t(d)]) {
          const Piece p = piece(i, me);
          if (p.len == 0) continue;
          Tensor u = out.narrow(pos, p.len), m = m_.narrow(shard_pos(p.begin), p.len);
          muon_momentum_span(grads_.shard().narrow(shard_pos(p.begin), p.len), m,
                             muon_->nesterov ? u : Tensor(), st);
          if (!muon_->nesterov) ops::copy(m, u, st);
          pos += p.len;
        }
      Tensor in = R > 1 ? Tensor::empty({got}, DType::F32, dev) : out;
      if (R > 1) group.all_to_allv(out, to_owner, in, from_holder, st);
      // 2. this rank's matrices assembled whole from their pieces, and orthogonalised
      std::vector<const model::ParamInfo*> mps;
      std::vector<Tensor> us;
      for (size_t i : mine) {
        mps.push_back(&infos[i]);
        us.push_back(Tensor::empty(infos[i].local_shape, DType::F32, dev));
      }
      pos = 0;
      for (int s = 0; s < R; ++s)
        for (size_t k = 0; k < mine.size(); ++k) {
          const Piece p = piece(mine[k], s);
          if (p.len == 0) continue;
          Tensor dst = us[k].view({-1}).narrow(p.begin - infos[mine[k]].offset, p.len);
          ops::copy(in.narrow(pos, p.len), dst, st);
          pos += p.len;
        }
      std::vector<Tensor> upd = muon_updates(mps, us, *muon_, muon_groups_, st);
      us.clear();
      // 3. the updates' pieces back to their holders (the reverse of step 1's layout)
      Tensor back = Tensor::empty({got}, DType::F32, dev);
      pos = 0;
      for (int s = 0; s < R; ++s)
        for (size_t k = 0; k < mine.size(); ++k) {
          const Piece p = piece(mine[k], s);
          if (p.len == 0) continue;
          Tensor dst = back.narrow(pos, p.len);
          ops::copy(upd[k].view({-1}).narrow(p.begin - infos[mine[k]].offset, p.len), dst, st);
          pos += p.len;
        }
      upd.clear();
      Tensor ret = R > 1 ? Tensor::empty({sent}, DType::F32, dev) : back;
      if (R > 1) group.all_to_allv(back, from_holder, ret, to_owner, st);
      pos = 0;
      for (int d = 0; d < R; ++d)
        for (size_t i : owned[size_t(d)]) {
          const Piece p = piece(i, me);
          if (p.len == 0) continue;
          Tensor u = ret.narrow(pos, p.len);
          pos += p.len;
          const int64_t sp = shard_pos(p.begin);
          if (muon_->adaptive) {  // adaptive_muon: element-wise, so on this rank's piece alone
            Tensor v = v_.narrow(sp, p.len);
            ops::adamuon_normalize(u, v, muon_->adaptive_beta2, muon_->adaptive_eps,
                                   muon_adaptive_scale(infos[i], *muon_), st);
          }
          muon_apply_span(flat.narrow(p.begin, p.len),
                          main_.defined() ? main_.narrow(sp, p.len) : Tensor(),
                          lo_.defined() ? lo_.narrow(sp, p.len) : Tensor(), u, lr_of(i, lr),
                          infos[i].weight_decay ? wd : 0.0, st);
        }
      a = e;
    }
  }
}

}  // namespace mcpp::optim
