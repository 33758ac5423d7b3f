// Forwards each MLA op (ops/mla.h) to the backend of the stream's device, as dispatch.cpp
// does for the catalogue.
#include "ops/mla.h"

#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::ops {

#ifdef MCPP_HAVE_CUDA
#define MCPP_MLA_DISPATCH(name, ...)  \
  do {                                \
    if (s.device == Device::CUDA) {   \
      cuda::OpScope scope_(#name, s); \
      return cuda::name(__VA_ARGS__); \
    }                                 \
    return cpu::name(__VA_ARGS__);    \
  } while (0)
#else
#define MCPP_MLA_DISPATCH(name, ...)                                                  \
  do {                                                                                \
    MCPP_CHECK_HINT(s.device == Device::CPU, "rebuild with nvcc present to get CUDA", \
                    #name " called on a CUDA stream in a build without CUDA");        \
    return cpu::name(__VA_ARGS__);                                                    \
  } while (0)
#endif

void mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& d,
                     const MlaRope& r, int64_t B, int64_t pos0, const Tensor& positions,
                     Tensor& qkv, Stream& s) {
  MCPP_MLA_DISPATCH(mla_qkv_forward, q, kv, kpe, d, r, B, pos0, positions, qkv, s);
}
void mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r, int64_t B,
                      int64_t pos0, const Tensor& positions, Tensor& dq, Tensor& dkv, Tensor& dkpe,
                      Stream& s) {
  MCPP_MLA_DISPATCH(mla_qkv_backward, dqkv, d, r, B, pos0, positions, dq, dkv, dkpe, s);
}
void mla_ctx_narrow(const Tensor& ctx, const MlaDims& d, Tensor& out, Stream& s) {
  MCPP_MLA_DISPATCH(mla_ctx_narrow, ctx, d, out, s);
}
void mla_ctx_pad(const Tensor& dout, const MlaDims& d, Tensor& dctx, Stream& s) {
  MCPP_MLA_DISPATCH(mla_ctx_pad, dout, d, dctx, s);
}

}  // namespace mcpp::ops
