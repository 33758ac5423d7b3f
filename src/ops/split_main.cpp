// The dispatch and argument checks of ops/split_main.h.
#include "ops/split_main.h"

#include "base/error.h"
#include "ops/dispatch.h"

namespace mcpp::ops {

int64_t check_split_main(const char* op, const Tensor& model_param, const Tensor& lo,
                         const Tensor* f32, Device dev) {
  MCPP_CHECK(model_param.defined() && model_param.dtype() == DType::BF16 &&
                 model_param.device() == dev,
             "{}: model_param is {}, expected bf16 on the stream's device", op,
             model_param.str());
  const int64_t n = model_param.numel();
  if (lo.defined())
    MCPP_CHECK(lo.dtype() == DType::U16 && lo.device() == dev && lo.numel() == n,
               "{}: lo is {}, expected u16 of {} elements beside model_param {}", op,
               lo.str(), n, model_param.str());
  if (f32)
    MCPP_CHECK(f32->defined() && f32->dtype() == DType::F32 && f32->device() == dev &&
                   f32->numel() == n,
               "{}: the fp32 values are {}, expected f32 of {} elements on the "
               "stream's device",
               op, f32->str(), n);
  return n;
}

void adamw_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m, Tensor& v,
                      const AdamWParams& p, Stream& s) {
  MCPP_DISPATCH(adamw_step_split, model_param, lo, grad, m, v, p, s);
}

void split_main_params(const Tensor& values, Tensor& model_param, Tensor& lo, Stream& s) {
  MCPP_DISPATCH(split_main_params, values, model_param, lo, s);
}

void join_main_params(const Tensor& model_param, const Tensor& lo, Tensor& out, Stream& s) {
  MCPP_DISPATCH(join_main_params, model_param, lo, out, s);
}

void clear_main_lo(Tensor& lo, Stream& s) { MCPP_DISPATCH(clear_main_lo, lo, s); }

}  // namespace mcpp::ops
