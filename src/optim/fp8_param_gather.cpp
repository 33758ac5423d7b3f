#include "optim/fp8_param_gather.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "model/fp8/fp8_linear.h"
#include "ops/fp8_grid.h"
#include "ops/ops.h"

namespace mcpp::optim {

namespace {

constexpr auto kE4M3 = ops::Fp8Format::E4M3;

// The CPU backend keeps no FP8 tensors of its own (its FP8 training is the emulation), so
// the cast to E4M3 bytes and back is here: the same values as ops::fp8_quantize (x * scale
// and the dequantisation in the model's dtype) and as the CUDA cast's bytes.
uint8_t e4m3_code(double r) {  // r on the E4M3 grid (fp8_round's result)
  static const std::array<double, 127> pos = [] {
    std::array<double, 127> v{};
    for (int c = 0; c < 127; ++c) v[size_t(c)] = ops::fp8_decode(uint8_t(c), kE4M3);
    return v;
  }();
  if (r != r) return 0x7F;
  const double a = std::fabs(r);
  const auto it = std::lower_bound(pos.begin(), pos.end(), a);
  MCPP_CHECK(it != pos.end() && *it == a, "e4m3_code: {} is not an E4M3 value", r);
  return uint8_t((std::signbit(r) ? 0x80 : 0) | int(it - pos.begin()));
}

template <typename T>
void cpu_cast(const Tensor& x, const Tensor& scale, Tensor& q, Tensor& scale_inv) {
  const float sc = scale.data<float>()[0];
  const T* xp = x.data<T>();
  auto* qp = static_cast<uint8_t*>(q.raw());
  for (int64_t i = 0; i < x.numel(); ++i) qp[i] = e4m3_code(double(ops::fp8_round(T(xp[i] * T(sc)), kE4M3)));
  scale_inv.data<float>()[0] = 1.0f / sc;
}

template <typename T>
void cpu_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& y) {
  const T inv = T(scale_inv.data<float>()[0]);
  const auto* qp = static_cast<const uint8_t*>(q.raw());
  T* yp = y.data<T>();
  for (int64_t i = 0; i < q.numel(); ++i) yp[i] = T(ops::fp8_decode(qp[i], kE4M3)) * inv;
}

}  // namespace

void fp8_param_cast(const Tensor& x, const Tensor& scale, Tensor& q, Tensor* amax,
                    Tensor& scale_inv, Stream& st) {
  if (x.device() == Device::CPU) {
    if (amax) ops::fp8_amax(x, *amax, st);
    if (x.dtype() == DType::F64)
      cpu_cast<double>(x, scale, q, scale_inv);
    else
      cpu_cast<float>(x, scale, q, scale_inv);
    return;
  }
  // Rows of 1024 (or 128, 16) for the cast kernel's 32 x 32 tiles when the length allows,
  // in chunks of at most 65535 tile rows (the grid's y limit).
  const int64_t n = x.numel();
  const int64_t C = n % 1024 == 0 ? 1024 : n % 128 == 0 ? 128 : n % 16 == 0 ? 16 : 1;
  const int64_t chunk = 65535LL * 32 * C;
  Tensor none, a = amax ? *amax : Tensor();
  for (int64_t o = 0; o < n; o += chunk) {
    const int64_t len = std::min(chunk, n - o);
    Tensor x2 = x.narrow(o, len).view({len / C, C}), q2 = q.narrow(o, len).view({len / C, C});
    ops::fp8_cast_transpose(x2, kE4M3, scale, q2, none, a, scale_inv, st);
  }
}

void fp8_param_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& y) {
  MCPP_CHECK(q.device() == Device::CPU && y.device() == Device::CPU && q.numel() == y.numel() &&
                 q.dtype() == DType::FP8E4M3,
             "fp8_param_dequantize: q {} / y {} are not CPU tensors of one size", q.str(),
             y.str());
  if (y.dtype() == DType::F64)
    cpu_dequantize<double>(q, scale_inv, y);
  else
    cpu_dequantize<float>(q, scale_inv, y);
}

namespace {
// A zero-filled tensor on dev (Tensor::zeros is host-only, and ops::fill writes no FP8).
Tensor zeros_on(const Shape& sh, DType dt, Device dev) {
  Tensor z = Tensor::zeros(sh, dt);
  if (dev == Device::CPU) return z;
  Tensor t = Tensor::empty(sh, dt, dev);
  ops::copy(z, t, ops::default_stream(dev));
  return t;
}
}  // namespace

Fp8ParamGather::Fp8ParamGather(model::ParamStore& ps, parallel::DataParallelGrads& grads,
                               const model::TransformerConfig& c, comm::Communicator* tp)
    : ps_(ps), cfg_(c), tp_(tp) {
  const auto& infos = ps.infos();
  const Device dev = ps.device();
  const DType mdt = ps.flat_params().dtype();
  fp8_index_.assign(infos.size(), -1);
  for (size_t i = 0; i < infos.size(); ++i) {
    if (!model::is_fp8_weight(c, infos[i])) continue;
    fp8_index_[i] = int(fp8_params_.size());
    fp8_params_.push_back(i);
    const Shape& sh = infos[i].local_shape;  // [out, in]
    MCPP_CHECK(sh.size() == 2, "--fp8-param-gather: {} is not a matrix", infos[i].name);
    model::Fp8ParamWeight& w = weights_.add(infos[i].name);  // w.q: a view, set below
    // (qt is written from q before any read: the transpose once per step)
    if (dev != Device::CPU) w.qt = Tensor::empty({sh[1], sh[0]}, DType::FP8E4M3, dev);
    w.scale_inv = zeros_on({1}, DType::F32, dev);
    w.amax = zeros_on({1}, DType::F32, dev);
    if (dev == Device::CPU) w.deq = Tensor::zeros(sh, mdt, dev);
    fp8_elements_ += infos[i].numel();
  }
  const size_t esize = dtype_size(mdt);
  for (size_t b = 0; b < grads.buckets().size(); ++b) {
    const auto& bk = grads.buckets()[b];
    Bucket B;
    B.group = bk.group;
    B.begin = bk.begin, B.len = bk.end - bk.begin, B.shard_offset = bk.shard_offset;
    B.block = grads.block(b);
    const int G = bk.group->size(), r = bk.group->rank();
    const int64_t n = grads.block(b);
    B.fp8.resize(size_t(G)), B.other.resize(size_t(G));
    B.off_f.assign(size_t(G) + 1, 0), B.off_o.assign(size_t(G) + 1, 0);
    // Rank q's chunk holds its block's FP8 elements (then, in the other buffer, its other
    // elements) in flat order, chunks in rank order, no padding: the FP8 buffer is the
    // bucket's FP8 weights back to back, and each weight is one contiguous view of it.
    std::vector<size_t> order(bk.params.begin(), bk.params.end());  // flat order
    std::sort(order.begin(), order.end(),
              [&](size_t x, size_t y) { return infos[x].offset < infos[y].offset; });
    for (int q = 0; q < G; ++q) {
      const int64_t lo = bk.begin + q * n, hi = lo + n;
      int64_t nf = 0, no = 0;
      for (size_t i : order) {
        const int64_t p0 = std::max(lo, infos[i].offset);
        const int64_t p1 = std::min(hi, infos[i].offset + infos[i].numel());
        if (p1 <= p0) continue;
        const bool f = fp8_index_[i] >= 0;
        Piece pc{i, p0, p1 - p0, f ? B.off_f[size_t(q)] + nf : B.off_o[size_t(q)] + no,
                 q == r ? bk.shard_offset + (p0 - lo) : -1};
        (f ? nf : no) += pc.len;
        (f ? B.fp8 : B.other)[size_t(q)].push_back(pc);
      }
      B.off_f[size_t(q) + 1] = B.off_f[size_t(q)] + nf;
      B.off_o[size_t(q) + 1] = B.off_o[size_t(q)] + no;
    }
    B.F = B.off_f[size_t(G)], B.O = B.off_o[size_t(G)];
    for (size_t i : bk.params) {
      B.layers.push_back(infos[i].layer);
      if (fp8_index_[i] >= 0) B.fp8_params.push_back(i);
    }
    if (B.F > 0) {
      MCPP_CHECK(!dp_ || dp_ == bk.group,
                 "--fp8-param-gather: FP8 weights in buckets of different groups");
      dp_ = bk.group;
      B.recv_f = zeros_on({B.F}, DType::FP8E4M3, dev);
      if (B.O > 0) B.recv_o = Tensor::empty({B.O}, mdt, dev);
      // each FP8 weight: its first piece's place (its pieces follow it back to back)
      for (int q = G - 1; q >= 0; --q)
        for (const Piece& pc : B.fp8[size_t(q)])
          if (pc.flat == infos[pc.param].offset)
            weights_.at(infos[pc.param].name).q =
                B.recv_f.narrow(pc.packed, infos[pc.param].numel()).view(infos[pc.param].local_shape);
      // (a weight's pieces are back to back: the last of one rank's chunk, the first of the
      // next's; checked here)
      std::vector<int64_t> first(infos.size(), -1);
      for (int q = 0; q < G; ++q)
        for (const Piece& pc : B.fp8[size_t(q)]) {
          if (first[pc.param] < 0) first[pc.param] = pc.packed - (pc.flat - infos[pc.param].offset);
          MCPP_CHECK(pc.packed - (pc.flat - infos[pc.param].offset) == first[pc.param],
                     "--fp8-param-gather: {} is not contiguous in the gathered bytes",
                     infos[pc.param].name);
        }
    }
    plain_bytes_ += (bk.end - bk.begin) * int64_t(esize);
    buckets_.push_back(std::move(B));
  }
  for (size_t k = 0; k < fp8_params_.size(); ++k)  // every weight one view, whole
    MCPP_CHECK(weights_.at(infos[fp8_params_[k]].name).q.defined(),
               "--fp8-param-gather: {} has no place in the gathered FP8 bytes",
               infos[fp8_params_[k]].name);
  if (!dp_) dp_ = &grads.dp();
  const int64_t P = int64_t(fp8_params_.size());
  if (!c.fp8.delayed() && P > 0) {
    amax_ = zeros_on({P}, DType::F32, dev);
    scale_ = Tensor::empty({P}, DType::F32, dev);
    ops::fill(scale_, 1.0, ops::default_stream(dev));
  }
  if (dev != Device::CPU) {
    dummy_x_ = zeros_on({1, 16}, DType::F32, dev);
    dummy_q_ = zeros_on({1, 16}, DType::FP8E4M3, dev);
  }
  model::attach_fp8_param_weights(&ps_, &weights_);
}

Fp8ParamGather::~Fp8ParamGather() { model::attach_fp8_param_weights(&ps_, nullptr); }

void Fp8ParamGather::cast_weights(const Tensor& main) {
  Stream& st = ops::default_stream(main.device());
  const auto& infos = ps_.infos();
  const int r = dp_->rank();
  const bool delayed = cfg_.fp8.delayed();
  if (!delayed && !fp8_params_.empty()) {
    // The amax of each whole weight: its pieces' over DP, its TP shards' over TP.
    ops::fill(amax_, 0.0, st);
    for (const Bucket& B : buckets_)
      if (B.F > 0)
        for (const Piece& pc : B.fp8[size_t(r)]) {
          Tensor a = amax_.narrow(fp8_index_[pc.param], 1);
          ops::fp8_amax(main.narrow(pc.shard, pc.len), a, st);
        }
    if (dp_->size() > 1) dp_->all_reduce(amax_, comm::ReduceOp::Max, st);
    if (tp_ && tp_->size() > 1) tp_->all_reduce(amax_, comm::ReduceOp::Max, st);
    Tensor h = amax_.view({1, amax_.numel()});
    // A zero weight keeps its previous scale, as the layer's own cast does.
    ops::fp8_scale_update(h, scale_, 0, 0, false, false, st);
  }
  std::vector<char> cast(fp8_params_.size(), 0);
  auto scale_of = [&](size_t i) {
    if (!delayed) return scale_.narrow(fp8_index_[i], 1);
    const std::string& name = infos[i].name;  // <prefix>.weight
    const std::string prefix = name.substr(0, name.size() - 7);
    return ps_.buffer(model::fp8_scale_name(prefix)).narrow(model::kFp8Weight, 1);
  };
  if (delayed)
    for (size_t i : fp8_params_) ops::fill(weights_.at(infos[i].name).amax, 0.0, st);
  for (Bucket& B : buckets_) {
    if (B.F == 0) continue;
    for (const Piece& pc : B.fp8[size_t(r)]) {
      model::Fp8ParamWeight& w = weights_.at(infos[pc.param].name);
      Tensor q = B.recv_f.narrow(pc.packed, pc.len);
      fp8_param_cast(main.narrow(pc.shard, pc.len), scale_of(pc.param), q,
                     delayed ? &w.amax : nullptr, w.scale_inv, st);
      cast[size_t(fp8_index_[pc.param])] = 1;
    }
  }
  // A weight with no element in this rank's blocks: its scale_inv all the same.
  for (size_t k = 0; k < fp8_params_.size(); ++k) {
    if (cast[k]) continue;
    const size_t i = fp8_params_[k];
    model::Fp8ParamWeight& w = weights_.at(infos[i].name);
    if (main.device() == Device::CPU) {
      w.scale_inv.data<float>()[0] = 1.0f / scale_of(i).data<float>()[0];
    } else {
      Tensor none;
      ops::fp8_cast_transpose(dummy_x_, kE4M3, scale_of(i), dummy_q_, none, none, w.scale_inv, st);
    }
  }
}

void Fp8ParamGather::cast_and_gather(const Tensor& main, bool from_flat, bool async) {
  wait_all();  // the previous gathers read and write the same buffers
  cast_weights(main);
  Stream& st = ops::default_stream(main.device());
  Tensor& flat = ps_.flat_params();
  fp8_bytes_ = other_bytes_ = own_bytes_ = 0;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& B = buckets_[b];
    comm::Communicator& g = *B.group;
    const int r = g.rank(), G = g.size();
    if (B.F == 0) {
      // No FP8 weight in the bucket: every rank's block in the model dtype, in place, as
      // without the flag (from the main parameters for f32/f64 models).
      B.plain_out = flat.narrow(B.begin, B.len);
      B.plain_in = from_flat ? B.plain_out.narrow(r * B.block, B.block)
                             : main.narrow(B.shard_offset, B.block);
      other_bytes_ += int64_t(B.plain_out.nbytes());
      B.works.push_back(async ? g.all_gather_async(B.plain_in, B.plain_out, st)
                              : (g.all_gather(B.plain_in, B.plain_out, st), comm::Work()));
    } else {
      for (const Piece& pc : B.other[size_t(r)]) {  // this rank's other elements, packed
        Tensor dst = B.recv_o.narrow(pc.packed, pc.len);
        ops::copy(from_flat ? flat.narrow(pc.flat, pc.len) : main.narrow(pc.shard, pc.len), dst,
                  st);
      }
      fp8_bytes_ += int64_t(B.recv_f.nbytes());
      if (B.O > 0) other_bytes_ += int64_t(B.recv_o.nbytes());
      // An all-gather of chunks of different sizes (Megatron keeps FP8 and bf16 parameters
      // in separate buffers; here a rank's block holds both): this rank's chunks to every
      // other rank, theirs into their places, as one batch of point-to-point transfers.
      const auto chunk = [](const Tensor& t, const std::vector<int64_t>& off, int q) {
        return t.narrow(off[size_t(q)], off[size_t(q) + 1] - off[size_t(q)]);
      };
      own_bytes_ += int64_t(chunk(B.recv_f, B.off_f, r).nbytes()) +
                    (B.O > 0 ? int64_t(chunk(B.recv_o, B.off_o, r).nbytes()) : 0);
      std::vector<comm::P2POp> ops;
      for (int q = 0; q < G; ++q) {
        if (q == r) continue;
        for (const auto& [t, off] : {std::pair{&B.recv_f, &B.off_f}, std::pair{&B.recv_o, &B.off_o}}) {
          if (!t->defined()) continue;
          if (chunk(*t, *off, r).numel() > 0) ops.push_back({true, chunk(*t, *off, r), q});
          if (chunk(*t, *off, q).numel() > 0) ops.push_back({false, chunk(*t, *off, q), q});
        }
      }
      if (!ops.empty())
        for (comm::Work& w : g.batch_isend_irecv(ops, st)) B.works.push_back(std::move(w));
    }
    B.pending = true;
    if (!async) finish(b);
  }
}

// Completes bucket b's transfers and unpacks them: every rank's other pieces into the flat
// parameters; the FP8 weights (views of the received bytes) get their transposes, or on
// the CPU their dequantised values.
void Fp8ParamGather::finish(size_t b) {
  Bucket& B = buckets_[b];
  if (!B.pending) return;
  for (comm::Work& w : B.works) w.wait();
  B.works.clear();
  B.pending = false;
  B.plain_in = B.plain_out = Tensor();
  if (B.F == 0) return;
  const auto& infos = ps_.infos();
  Stream& st = ops::default_stream(ps_.device());
  Tensor& flat = ps_.flat_params();
  for (const auto& pieces : B.other)
    for (const Piece& pc : pieces) {
      Tensor dst = flat.narrow(pc.flat, pc.len);
      ops::copy(B.recv_o.narrow(pc.packed, pc.len), dst, st);
    }
  for (size_t i : B.fp8_params) {
    model::Fp8ParamWeight& w = weights_.at(infos[i].name);
    if (w.q.device() != Device::CPU)
      ops::transpose(w.q, w.qt, st);
    else
      fp8_param_dequantize(w.q, w.scale_inv, w.deq);
  }
}

void Fp8ParamGather::wait(int layer) {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& B = buckets_[b];
    if (!B.pending) continue;
    if (std::find(B.layers.begin(), B.layers.end(), layer) == B.layers.end()) {
      for (comm::Work& w : B.works) w.test();  // progress the others (MPI needs polling)
      continue;
    }
    finish(b);
  }
}

void Fp8ParamGather::wait_all() {
  for (size_t b = 0; b < buckets_.size(); ++b) finish(b);
}

}  // namespace mcpp::optim
