// Which kernel runs a training attention call (ops::attention_forward/backward), and why:
// a pure function of the call's kind, so the choice can be logged at start-up (a user sees
// a slow path before the first step) and unit-tested on the CPU. The CUDA dispatch
// (ops/cuda/attention.cu) routes by this same function, so the log line cannot disagree
// with what runs.
//
// Order on CUDA: (1) cuDNN's fused attention for bf16/f16, head dim a multiple of 8 up to
// 128, no attention dropout (cuDNN's dropout draws its own Philox stream and cannot draw
// our global-index mask); (2) the own tensor-core flash kernel for bf16/f16, head dim 64
// or 128, with or without dropout (in-kernel mask at global (b, h, q, k) coordinates);
// (3) the CUDA-core kernel for the rest (f32, other head dims), several times slower.
// When cuDNN rejects a shape at run time, (1) falls back to (2) or (3) with a warning.
#pragma once
#include <cstdint>
#include <string>

#include "tensor/tensor.h"

namespace mcpp::ops {

enum class AttentionBackend { Cpu, Cudnn, Flash, CudaCore };

struct AttentionBackendQuery {
  Device device = Device::CPU;
  DType dtype = DType::F32;
  int64_t head_dim = 0;
  double dropout_p = 0;
  bool cudnn_available = false;  // built with cuDNN, start-up probe passed, not disabled
  bool fallback_forced = false;  // MCPP_ATTENTION_FALLBACK set: the CUDA-core kernel
};

struct AttentionBackendChoice {
  AttentionBackend backend = AttentionBackend::Cpu;
  std::string reason;  // one clause: what runs and why
  bool slow() const { return backend == AttentionBackend::CudaCore; }
};

// The shapes each tensor-core path takes (dtype, head dim); dropout is decided by
// choose_attention_backend.
bool cudnn_attention_takes(DType dt, int64_t head_dim);
bool flash_attention_takes(DType dt, int64_t head_dim);

AttentionBackendChoice choose_attention_backend(const AttentionBackendQuery& q);

// The query of this process for a model's attention: cuDNN's start-up probe and
// MCPP_ATTENTION_FALLBACK read at run time (CUDA builds); then one log line such as
// "attention (all 12 layers): own flash kernel with dropout (...)".
AttentionBackendQuery attention_backend_query(Device device, DType dtype, int64_t head_dim,
                                              double dropout_p);
std::string describe_attention_backend(Device device, DType dtype, int64_t head_dim,
                                       double dropout_p, int64_t num_layers);

}  // namespace mcpp::ops
