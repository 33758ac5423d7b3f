// The op catalogue's entry points. Each call dispatches on the stream's device to
// the CPU backend (src/ops/cpu) or the CUDA backend (src/ops/cuda); both implement
// the same declarations, listed once in catalogue.inc.
#pragma once
#include <span>

#include "ops/fp8_grid.h"
#include "ops/moe_route.h"
#include "ops/types.h"
#include "tensor/tensor.h"

namespace mcpp::ops {
#include "ops/catalogue.inc"

// The MLP activation a's forward / backward op on either backend: gelu_*, gelu_erf_*,
// squared_relu_*, swiglu_* (plain SwiGLU) or glu_* (quick-GEGLU, SwiGLU with an offset or a
// clamp) (x the activation's input, y its output; dx = act'(x) * dy, =).
void mlp_activation_forward(MlpAct a, const Tensor& x, Tensor& y, Stream& s);
void mlp_activation_backward(MlpAct a, const Tensor& dy, const Tensor& x, Tensor& dx,
                             Stream& s);

// The stream a device's work goes to by default: Stream::cpu(), or the CUDA backend's
// default stream (initialising the device on first use; an error in a CPU-only build).
Stream& default_stream(Device d);
// A host tensor's copy on dev (the tensor itself when dev is the CPU), on s.
Tensor on_device(const Tensor& host, Device dev, Stream& s);
}  // namespace mcpp::ops

namespace mcpp::ops::cpu {
#include "ops/catalogue.inc"
}  // namespace mcpp::ops::cpu

#ifdef MCPP_HAVE_CUDA
namespace mcpp::ops::cuda {
#include "ops/catalogue.inc"
}  // namespace mcpp::ops::cuda
#endif
