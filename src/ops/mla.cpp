// Forwards each MLA op (ops/mla.h) to the backend of the stream's device (ops/dispatch.h),
// as dispatch.cpp does for the catalogue.
#include "ops/mla.h"

#include "ops/dispatch.h"

namespace mcpp::ops {

void mla_qkv_forward(const Tensor& q, const Tensor& kv, const Tensor& kpe, const MlaDims& d,
                     const MlaRope& r, int64_t B, int64_t pos0, const Tensor& positions,
                     Tensor& qkv, Stream& s) {
  MCPP_DISPATCH(mla_qkv_forward, q, kv, kpe, d, r, B, pos0, positions, qkv, s);
}
void mla_qkv_backward(const Tensor& dqkv, const MlaDims& d, const MlaRope& r, int64_t B,
                      int64_t pos0, const Tensor& positions, Tensor& dq, Tensor& dkv, Tensor& dkpe,
                      Stream& s) {
  MCPP_DISPATCH(mla_qkv_backward, dqkv, d, r, B, pos0, positions, dq, dkv, dkpe, s);
}
void mla_ctx_narrow(const Tensor& ctx, const MlaDims& d, Tensor& out, Stream& s) {
  MCPP_DISPATCH(mla_ctx_narrow, ctx, d, out, s);
}
void mla_ctx_pad(const Tensor& dout, const MlaDims& d, Tensor& dctx, Stream& s) {
  MCPP_DISPATCH(mla_ctx_pad, dout, d, dctx, s);
}

}  // namespace mcpp::ops
