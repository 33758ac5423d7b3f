// The element-wise optimizers with one state buffer beside AdamW: SGD with momentum and
// Lion (Megatron's --optimizer sgd / lion; optim::Optimizer chooses by its rule).
//
// SGD, as torch.optim.SGD (dampening 0, no Nesterov) and the fused SGD Megatron wraps:
//   g = grad + wd p  (L2 weight decay, added to the gradient);
//   m = g on the first step, m = momentum m + g after it;  p -= lr m.
// With momentum 0 the buffer is neither read nor written (p -= lr g).
// Lion (Chen et al. 2023; the scalar Lion Megatron takes from emerging_optimizers, with its
// decoupled weight decay):
//   p *= 1 - lr wd;  p -= lr sign(beta1 m + (1 - beta1) g);  m = beta2 m + (1 - beta2) g.
//
// The per-step scalars are formed in f64 and rounded to the tensors' dtype once; every
// element operation is a rounded f32 (f64 on the CPU's f64 models) multiply or add, in
// the order written above, with no fused multiply-add, so the CPU and CUDA ops leave the
// same bits. The gradient is read times p.grad_scale (clipping folded into the pass,
// rounded to the gradient's dtype as ops::scale would leave it), as adamw_step does.
//
// momentum_step: param, m (state), grad: one numel; param and m f32 (or f64 on the CPU),
// grad the same dtype (bf16/f16 also accepted on CUDA); model_param (optional): the
// bf16/f16 model parameters written with the updated param rounded to nearest even, as
// adamw_step's model_param.
// momentum_step_split: the same update on fp32 main parameters held as (bf16
// model_param, u16 lo) (ops/split_main.h), both written; grad and m f32.
// m may be undefined only for SGD with momentum 0.
//
// adamuon_normalize (--optimizer adaptive_muon: emerging_optimizers' AdaptiveMuon with its
// moment2_method adamuon, as Megatron's TensorParallelAdaptiveMuon steps it), on a Muon
// update u (f32) and its second moment v (f32, state), per element:
//   v = v + (1 - beta2) (u u - v)       (torch's lerp toward u^2 with weight 1 - beta2 < 0.5)
//   u = u / (sqrt(v) + eps) * scale
// each operation rounded on its own, the same bits on the CPU and CUDA.
#pragma once
#include <cstdint>

#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops {

struct MomentumStepParams {
  enum class Rule { Sgd, Lion };
  Rule rule = Rule::Sgd;
  double lr = 0, weight_decay = 0;
  double momentum = 0.9;              // SGD
  bool first = false;                 // SGD: the buffer is set to the gradient (no state yet)
  double beta1 = 0.95, beta2 = 0.98;  // Lion (Megatron's --lion-beta1 / --lion-beta2)
  double grad_scale = 1.0;
};

#define MCPP_MOMENTUM_STEP_OPS                                                               \
  void momentum_step(Tensor& param, const Tensor& grad, Tensor& m, Tensor& model_param,     \
                     const MomentumStepParams& p, Stream& s);                                \
  void momentum_step_split(Tensor& model_param, Tensor& lo, const Tensor& grad, Tensor& m,  \
                           const MomentumStepParams& p, Stream& s);                      \
  void adamuon_normalize(Tensor& u, Tensor& v, double beta2, double eps, double scale,       \
                         Stream& s);

MCPP_MOMENTUM_STEP_OPS

namespace cpu {
MCPP_MOMENTUM_STEP_OPS
}  // namespace cpu

#ifdef MCPP_HAVE_CUDA
namespace cuda {
MCPP_MOMENTUM_STEP_OPS
}  // namespace cuda
#endif

#undef MCPP_MOMENTUM_STEP_OPS

// The argument checks both backends share (op: its name; dev: the stream's device).
void check_momentum_params(const char* op, const MomentumStepParams& p, const Tensor& m);

}  // namespace mcpp::ops
