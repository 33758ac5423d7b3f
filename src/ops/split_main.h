// fp32 main parameters kept as two 16-bit halves, one of which is the bf16 model parameter.
//
// A bf16 model under AdamW holds each weight three ways in Megatron's layout: the bf16
// model parameter, the fp32 main parameter and two fp32 moments (+ the fp32 main gradient).
// The fp32 value's upper 16 bits are a bf16 number within one bf16 step of the model
// parameter, so the optimizer keeps only the lower 16 bits `lo` beside the model parameter
// and rebuilds the fp32 value from the pair, bit for bit. That needs the model parameter
// to tell how it was rounded from the fp32 value, which round-to-nearest-even cannot (at an
// exact tie, lo = 0x8000, an even model parameter comes from either neighbour). So the model
// parameter is the fp32 value rounded half away from zero:
//   hi = bits >> 16, lo = bits & 0xFFFF, model = hi + (lo >= 0x8000)
// (an integer increment of the bit pattern: the magnitude rounds up, carrying into the next
// binade and from the largest finite value to infinity as rounding to nearest does). It
// differs from round-to-nearest-even only at exact ties, one fp32 value in 65,536, by one
// bf16 step. Decoding: hi = model - (lo >= 0x8000). Every fp32 value but NaN comes back
// exactly; a NaN stays a NaN (a pattern with hi's magnitude 0x7FFF is not incremented, and
// its payload may change).
//
// Saves 2 bytes of the 16 a parameter's optimizer state costs (about 7 GB for a
// 3.5B-parameter model), and the step's pass moves 28 bytes an element instead of 30.
// optim::AdamW and optim::DistributedAdamW use it for bf16 models (not for f16 models,
// whose bits are not fp32's upper half, nor under --fp8-param-gather);
// MCPP_FP32_MAIN_PARAMS=1 keeps a whole fp32 copy instead (docs/environment.md).
//
// bf16 moments (--use-precision-aware-optimizer --exp-avg-dtype / --exp-avg-sq-dtype bf16,
// TransformerEngine's FusedAdam with bf16 state): adamw_step and adamw_step_split also take
// m and/or v as bf16 when the main parameters are f32 (whole or split) and the gradient f32.
// Each moment is widened to f32, updated as an f32 moment is, the parameter update reads
// the unrounded f32 values, and the moment is stored rounded to nearest even: the result
// is bit for bit the f32-moment step's from the same (bf16-valued) moments, with its
// moments then rounded. 2 bytes an element less each, on the step's pass too.
#pragma once
#include <cstdint>

#include "ops/types.h"
#include "tensor/tensor.h"

#if defined(__CUDACC__)
#define MCPP_SPLIT_HD __host__ __device__ __forceinline__
#else
#define MCPP_SPLIT_HD inline
#endif

namespace mcpp::ops {

// The bf16 model parameter (its bits) of the fp32 value with bits `bits`.
MCPP_SPLIT_HD uint16_t split_main_model(uint32_t bits) {
  const uint16_t hi = uint16_t(bits >> 16), lo = uint16_t(bits);
  return uint16_t((hi & 0x7FFFu) != 0x7FFFu && lo >= 0x8000u ? hi + 1u : hi);
}
// The fp32 bits from the model parameter's bits and the stored lower half.
MCPP_SPLIT_HD uint32_t split_main_join(uint16_t model, uint16_t lo) {
  const uint16_t hi = uint16_t((model & 0x7FFFu) != 0x7FFFu && lo >= 0x8000u ? model - 1u : model);
  return (uint32_t(hi) << 16) | lo;
}

#define MCPP_SPLIT_MAIN_OPS                                                                  \
  void adamw_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m,      \
                        Tensor& v, const AdamWParams& p, Stream& s);                         \
  void split_main_params(const Tensor& values, Tensor& model_param, Tensor& lo, Stream& s); \
  void join_main_params(const Tensor& model_param, const Tensor& lo, Tensor& out, Stream& s); \
  void clear_main_lo(Tensor& lo, Stream& s);

// adamw_step_split: adamw_step on the fp32 main parameters held as (model_param bf16, lo
// u16), both updated: the same fp32 arithmetic as adamw_step of the backend (bit for bit
// the main parameters adamw_step would leave), the model parameter rounded half away from
// zero. grad, m, v as adamw_step's.
// split_main_params: values (f32, any device) -> model_param (bf16) and lo (u16, or
// undefined: the model parameters alone, rounded as the step rounds them).
// join_main_params: (model_param, lo) -> out (f32), exactly.
// clear_main_lo: lo = 0 (the main parameters equal to the bf16 model parameters).
// All tensors of one call have one numel and sit on the stream's device (the optimizer's
// split_from / join_to move host values through a bounded device buffer).
MCPP_SPLIT_MAIN_OPS

namespace cpu {
MCPP_SPLIT_MAIN_OPS
}  // namespace cpu

#ifdef MCPP_HAVE_CUDA
namespace cuda {
MCPP_SPLIT_MAIN_OPS
}  // namespace cuda
#endif

#undef MCPP_SPLIT_MAIN_OPS

// The shared argument checks of the three ops (op: its name); returns the numel.
int64_t check_split_main(const char* op, const Tensor& model_param, const Tensor& lo,
                         const Tensor* f32, Device dev);

}  // namespace mcpp::ops
