#include "model/params.h"

#include <cmath>
#include <cstring>

#include "base/philox.h"
#include "ops/ops.h"

namespace mcpp::model {

ParamInfo make_param(std::string name, Shape global, TpSplit split, Init init, double init_std,
                     bool weight_decay, int layer, int64_t tp_size, bool sp) {
  Shape local = global;
  if (split == TpSplit::Rows || split == TpSplit::SwigluRows) local[0] /= tp_size;
  if (split == TpSplit::Cols) local[1] /= tp_size;
  ParamInfo p{std::move(name), global, local, split, init, init_std, weight_decay, layer, 0};
  p.sequence_parallel = sp;
  return p;
}

void ParamStore::add(ParamInfo info) {
  MCPP_CHECK(!params_.defined(), "ParamStore::add after allocate ({})", info.name);
  MCPP_CHECK(!index_.count(info.name), "duplicate parameter {}", info.name);
  index_[info.name] = infos_.size();
  infos_.push_back(std::move(info));
}

void ParamStore::allocate(DType dtype, int64_t tp_rank, int64_t tp_size) {
  allocate(dtype, dtype, Device::CPU, tp_rank, tp_size);
}

void ParamStore::allocate(DType param_dtype, DType grad_dtype, Device device, int64_t tp_rank,
                          int64_t tp_size, int64_t align) {
  allocate_impl(param_dtype, grad_dtype, device, tp_rank, tp_size, align, true);
}

void ParamStore::allocate_weights(DType dtype, Device device, int64_t tp_rank, int64_t tp_size,
                                  int64_t align) {
  allocate_impl(dtype, dtype, device, tp_rank, tp_size, align, false);
}

void ParamStore::allocate_impl(DType param_dtype, DType grad_dtype, Device device, int64_t tp_rank,
                               int64_t tp_size, int64_t align, bool grads) {
  MCPP_CHECK(align >= 1, "ParamStore::allocate: alignment {} must be positive", align);
  tp_rank_ = tp_rank, tp_size_ = tp_size;
  total_ = 0;
  for (auto& p : infos_) {
    p.offset = total_;
    // Keep every parameter aligned (16 elements: whole cache lines for SIMD).
    total_ += (p.numel() + align - 1) / align * align;
  }
  Stream& st = ops::default_stream(device);
  params_ = Tensor::empty({total_}, param_dtype, device);
  ops::fill(params_, 0.0, st);
  grads_ = Tensor();
  if (grads) {
    grads_ = Tensor::empty({total_}, grad_dtype, device);
    ops::fill(grads_, 0.0, st);
  }
  buffers_.clear();
  for (auto& b : buffer_infos_) {
    b.local_shape = b.global_shape;
    const size_t dim = b.split == TpSplit::Rows ? 0 : 1;
    if (b.split != TpSplit::None) {
      MCPP_CHECK(dim < b.global_shape.size() && b.global_shape[dim] % tp_size == 0,
                 "buffer {}: dimension {} of {} does not split over {} TP ranks", b.name, dim,
                 shape_str(b.global_shape), tp_size);
      b.local_shape[dim] /= tp_size;
    }
    Tensor t = Tensor::empty(b.local_shape, b.dtype, device);
    if (b.values.empty()) {
      ops::fill(t, b.init == Init::Ones ? 1.0 : 0.0, st);
    } else {  // this rank's shard of the given global values, through a host f64 tensor
      Tensor h = Tensor::empty(b.local_shape, DType::F64);
      const int64_t rows = b.local_shape.empty() ? 1 : b.local_shape[0];
      const int64_t cols = b.local_shape.size() > 1 ? b.local_shape[1] : 1;
      double* d = h.data<double>();
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c)
          d[r * cols + c] = b.values[size_t(
              global_flat_index(b.split, b.global_shape, b.local_shape, tp_rank_, r, c))];
      ops::copy(h, t, st);
    }
    buffers_.push_back(std::move(t));
  }
}

void ParamStore::add_buffer(BufferInfo info) {
  MCPP_CHECK(!params_.defined(), "ParamStore::add_buffer after allocate ({})", info.name);
  MCPP_CHECK(!buffer_index_.count(info.name) && !index_.count(info.name),
             "duplicate parameter or buffer {}", info.name);
  MCPP_CHECK(info.init == Init::Zeros || info.init == Init::Ones,
             "buffer {}: initialise with zeros, ones or given values", info.name);
  MCPP_CHECK(info.global_shape.size() <= 2 && info.split != TpSplit::SwigluRows,
             "buffer {}: 1-D or 2-D, split by rows, columns or not at all", info.name);
  MCPP_CHECK(info.values.empty() || int64_t(info.values.size()) == shape_numel(info.global_shape),
             "buffer {}: {} initial values for a global shape of {} elements", info.name,
             info.values.size(), shape_numel(info.global_shape));
  info.local_shape = info.global_shape;  // split by allocate(), which knows the TP size
  buffer_index_[info.name] = buffer_infos_.size();
  buffer_infos_.push_back(std::move(info));
}

Tensor ParamStore::buffer(const std::string& name) const {
  auto it = buffer_index_.find(name);
  MCPP_CHECK(it != buffer_index_.end(), "no buffer named {}", name);
  MCPP_CHECK(it->second < buffers_.size(), "buffer {} read before ParamStore::allocate", name);
  return buffers_[it->second];
}

const ParamInfo& ParamStore::info(const std::string& name) const {
  auto it = index_.find(name);
  MCPP_CHECK(it != index_.end(), "no parameter named {}", name);
  return infos_[it->second];
}

Tensor ParamStore::param(size_t i) const {
  const auto& p = infos_[i];
  return params_.narrow(p.offset, p.numel()).view(p.local_shape);
}
Tensor ParamStore::grad(size_t i) const {
  if (!grads_.defined()) return {};  // allocate_weights: no gradients
  const auto& p = infos_[i];
  return grads_.narrow(p.offset, p.numel()).view(p.local_shape);
}
Tensor ParamStore::param(const std::string& n) const { return param(index_.at(info(n).name)); }
Tensor ParamStore::grad(const std::string& n) const { return grad(index_.at(info(n).name)); }

ParamView ParamStore::view(const ParamStore* store, const std::string& name) {
  if (!store || !store->has(name)) return {};
  return {store->param(name), store->grad(name)};
}

void ParamStore::zero_grads() {
  if (grads_.defined()) ops::fill(grads_, 0.0, ops::default_stream(grads_.device()));
}

int64_t ParamStore::global_index(const ParamInfo& p, int64_t r, int64_t c) const {
  return global_flat_index(p.split, p.global_shape, p.local_shape, p.shard_rank(tp_rank_), r, c);
}

int64_t ParamStore::global_flat_index(TpSplit split, const Shape& global, const Shape& local,
                                      int64_t tp_rank, int64_t r, int64_t c) {
  const int64_t lrows = local.empty() ? 1 : local[0];
  const int64_t gcols = global.size() > 1 ? global[1] : 1;
  const int64_t lcols = local.size() > 1 ? local[1] : 1;
  int64_t gr = r, gc = c;
  switch (split) {
    case TpSplit::None: break;
    case TpSplit::Rows: gr = tp_rank * lrows + r; break;
    case TpSplit::Cols: gc = tp_rank * lcols + c; break;
    case TpSplit::SwigluRows: {
      // Local [gate_r; up_r] -> global [gate; up]: half = F / TP rows each.
      const int64_t half = lrows / 2, F = global[0] / 2;
      gr = r < half ? tp_rank * half + r : F + tp_rank * half + (r - half);
      break;
    }
  }
  return gr * gcols + gc;
}

void ParamStore::initialize(uint64_t seed) {
  // CPU f32/f64 parameters are drawn in place; others (a device, bf16/f16) are drawn
  // into a host f32 tensor and copied over (rounded to nearest even).
  const bool direct = params_.device() == Device::CPU &&
                      (params_.dtype() == DType::F32 || params_.dtype() == DType::F64);
  Stream& st = ops::default_stream(params_.device());
  for (size_t i = 0; i < infos_.size(); ++i) {
    const auto& p = infos_[i];
    Tensor dst = param(i);
    Tensor t = direct ? dst : Tensor::empty(p.local_shape, DType::F32);
    const int64_t rows = p.local_shape[0];
    const int64_t cols = p.local_shape.size() > 1 ? p.local_shape[1] : 1;
    const uint64_t stream = hash_name(p.name);
    double bound = 0;  // Init::XavierUniform's, from the global [out, in]
    if (p.init == Init::XavierUniform) {
      MCPP_CHECK(p.global_shape.size() == 2, "{}: a Xavier-initialised weight must be 2-D, is {}",
                 p.name, shape_str(p.global_shape));
      bound = std::sqrt(6.0 / double(p.global_shape[0] + p.global_shape[1]));
    }
    auto fill = [&](auto* d) {
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cols; ++c) {
          const uint64_t g = global_index(p, r, c);
          double v = p.init == Init::Zeros  ? 0.0
                     : p.init == Init::Ones ? 1.0
                     : p.init == Init::XavierUniform
                         ? bound * (2.0 * double(Philox::uniform(seed, stream, g)) - 1.0)
                         : p.init_std * Philox::normal(seed, stream, g);
          d[r * cols + c] = static_cast<std::remove_pointer_t<decltype(d)>>(v);
        }
    };
    if (t.dtype() == DType::F32) fill(t.data<float>());
    else fill(t.data<double>());
    if (!direct) ops::copy(t, dst, st);  // synchronous for host sources it stages
  }
}

}  // namespace mcpp::model
