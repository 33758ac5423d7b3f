// rope_deinterleave on the CPU (ops/rope_interleave.h): a permutation of element copies, so
// any dtype, by its element size.
#include <cstring>

#include "ops/rope_interleave.h"

namespace mcpp::ops::cpu {

void rope_deinterleave(const Tensor& in, const RopePermuteDims& d, bool inverse, Tensor& out,
                       Stream& s) {
  (void)s;
  const int64_t T = check_rope_deinterleave(in, d, out, Device::CPU);
  const size_t es = dtype_size(in.dtype());
  const int64_t heads = d.groups * (d.heads_per_group + 2), HD = d.head_dim;
  const auto* src = static_cast<const unsigned char*>(in.raw());
  auto* dst = static_cast<unsigned char*>(out.raw());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < T; ++r)
    for (int64_t j = 0; j < heads; ++j) {
      const int64_t base = (r * heads + j) * HD;
      const bool rotated = j % (d.heads_per_group + 2) <= d.heads_per_group;  // q and k heads
      for (int64_t t = 0; t < HD; ++t) {
        const int64_t from = rotated && t < d.rot_dim ? rope_permute_source(t, d.rot_dim, inverse)
                                                      : t;
        std::memcpy(dst + size_t(base + t) * es, src + size_t(base + from) * es, es);
      }
    }
}

}  // namespace mcpp::ops::cpu
