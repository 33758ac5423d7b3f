// rope_deinterleave's dispatch and argument checks (ops/rope_interleave.h).
#include "ops/rope_interleave.h"

#include "base/error.h"

#include "ops/dispatch.h"

namespace mcpp::ops {

int64_t check_rope_deinterleave(const Tensor& in, const RopePermuteDims& d, const Tensor& out,
                                Device dev) {
  MCPP_CHECK(d.groups > 0 && d.heads_per_group > 0 && d.head_dim > 0 && d.rot_dim > 0 &&
                 d.rot_dim % 2 == 0 && d.rot_dim <= d.head_dim,
             "rope_deinterleave: groups {}, heads per group {}, head dim {}, rotary dims {} "
             "(even, at most the head dim)",
             d.groups, d.heads_per_group, d.head_dim, d.rot_dim);
  const int64_t W = d.groups * (d.heads_per_group + 2) * d.head_dim;
  MCPP_CHECK(in.defined() && out.defined() && in.dtype() == out.dtype() &&
                 in.device() == dev && out.device() == dev && in.numel() % W == 0 &&
                 out.numel() == in.numel(),
             "rope_deinterleave: in {} and out {} must be [T, {}] of one dtype on one device",
             in.str(), out.str(), W);
  MCPP_CHECK(in.raw() != out.raw(), "rope_deinterleave: out must not alias in");
  return in.numel() / W;
}

void rope_deinterleave(const Tensor& in, const RopePermuteDims& d, bool inverse, Tensor& out,
                       Stream& s) {
  MCPP_DISPATCH(rope_deinterleave, in, d, inverse, out, s);
}

}  // namespace mcpp::ops
