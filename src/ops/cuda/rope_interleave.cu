// rope_deinterleave on the GPU (ops/rope_interleave.h): one thread per output element, a
// copy from its source dim; the element moved as a 2-, 4- or 8-byte word, so every dtype.
#include "ops/cuda/common.cuh"
#include "ops/rope_interleave.h"

namespace mcpp::ops::cuda {

namespace {

template <typename W>
__global__ void rope_deinterleave_kernel(const W* __restrict__ in, W* __restrict__ out,
                                         int64_t n, int64_t HD, int64_t heads_per_group,
                                         int64_t rot_dim, bool inverse) {
  const int64_t h = rot_dim / 2, per_group = heads_per_group + 2;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < n;
       e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = e % HD, head = e / HD;
    int64_t from = t;
    if (head % per_group <= heads_per_group && t < rot_dim)  // a query or key head
      from = !inverse ? (t < h ? 2 * t : 2 * (t - h) + 1) : (t % 2 == 0 ? t / 2 : h + t / 2);
    out[e] = in[e - t + from];
  }
}

template <typename W>
void launch(const Tensor& in, const RopePermuteDims& d, bool inverse, Tensor& out,
            cudaStream_t cs) {
  const int64_t n = in.numel();
  rope_deinterleave_kernel<W><<<grid_for(n, 256), 256, 0, cs>>>(
      static_cast<const W*>(in.raw()), static_cast<W*>(out.raw()), n, d.head_dim,
      d.heads_per_group, d.rot_dim, inverse);
  MCPP_LAUNCH_CHECK();
}

}  // namespace

void rope_deinterleave(const Tensor& in, const RopePermuteDims& d, bool inverse, Tensor& out,
                       Stream& s) {
  check_rope_deinterleave(in, d, out, Device::CUDA);
  if (in.numel() == 0) return;
  cudaStream_t cs = stream_of(s);
  switch (dtype_size(in.dtype())) {
    case 2: return launch<uint16_t>(in, d, inverse, out, cs);
    case 4: return launch<uint32_t>(in, d, inverse, out, cs);
    case 8: return launch<uint64_t>(in, d, inverse, out, cs);
    default: MCPP_FAIL("rope_deinterleave: {} elements are not 2, 4 or 8 bytes",
                       dtype_name(in.dtype()));
  }
}

}  // namespace mcpp::ops::cuda
