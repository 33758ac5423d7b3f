// Host <-> device transfers of the router's small tensors (logits [T,E], probabilities,
// index lists): through a host tensor of the device tensor's dtype, so the device copy is a
// plain memcpy and every dtype conversion is the CPU backend's (round to nearest even).
#pragma once
#include <vector>

#include "ops/ops.h"
#include "tensor/tensor.h"

namespace mcpp::model::moe {

// The values of t (any float dtype, any device) as doubles.
inline std::vector<double> to_host(const Tensor& t, Stream& st) {
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, st);  // device -> host synchronises
  Tensor d = Tensor::empty(t.shape(), DType::F64);
  ops::copy(h, d, Stream::cpu());
  const double* p = d.data<double>();
  return std::vector<double>(p, p + d.numel());
}

// dst (any float dtype, any device) = v.
inline void from_host(const std::vector<double>& v, Tensor& dst, Stream& st) {
  Tensor d = Tensor::from(v, {int64_t(v.size())});
  Tensor h = Tensor::empty(dst.shape(), dst.dtype());
  ops::copy(d, h, Stream::cpu());
  ops::copy(h, dst, st);
}

// An i64 index tensor on `dev`.
inline Tensor index_tensor(const std::vector<int64_t>& v, Device dev, Stream& st) {
  Tensor h = Tensor::from(v, {int64_t(v.size())});
  if (dev == Device::CPU) return h;
  Tensor d = Tensor::empty(h.shape(), DType::I64, dev);
  ops::copy(h, d, st);
  return d;
}

}  // namespace mcpp::model::moe
